"""A node's TLS port: the direct path over TCP, TLS rules, hostile peers, tenants."""
