"""The worker's loop: its control channel, direct and TLS connections, replies, record pages."""
