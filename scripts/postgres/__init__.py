"""Benchmarks of the PostgreSQL store against bare psycopg, and the server they start."""
