"""The store: create, append, epochs, checksums, the key index, refusals, PostgreSQL."""
