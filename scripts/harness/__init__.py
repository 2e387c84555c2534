"""What the benchmarks share: the docs/benchmarks.md section writer, the serve they start."""
