"""What the suites and the benchmarks share: daemons, real servers, certificates, polling."""
