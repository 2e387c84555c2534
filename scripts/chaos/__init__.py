"""Benchmarks and tools of the chaos rig: its speed, its mutants, the pinned cases."""
