"""Benchmarks and developer tools, one folder per room of loopd they measure or serve."""
