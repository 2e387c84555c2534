"""Which cases to run: the sweep, its seeded samples, the pool of processes that runs them."""
