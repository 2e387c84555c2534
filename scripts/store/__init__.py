"""Benchmarks of the session store: append, open, key index, history, an older commit."""
