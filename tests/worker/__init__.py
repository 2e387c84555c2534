"""The worker process: its wire, loop, turns, deadlines, the data path and its imports."""
