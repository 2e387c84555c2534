"""Benchmarks of the direct data path into workers, alone and against Redis."""
