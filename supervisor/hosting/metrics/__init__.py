"""The daemon's metrics: its counters and its workers', workers' memory, the text over HTTP."""
