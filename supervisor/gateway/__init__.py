"""A node's TLS port: the handshake and roles, the direct path and its handover."""
