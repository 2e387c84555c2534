"""The faults: the boundary hook in the worker, damage, the model of a power loss."""
