"""Benchmarks of the cluster: moves, throughput and TLS, on one machine and across hosts."""
