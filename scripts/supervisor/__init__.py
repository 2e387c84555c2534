"""Benchmarks of the supervisor: restarts, density, fork memory, templates, timers, imports."""
