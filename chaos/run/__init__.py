"""Running a case: the worker forked with its fault, the rig's clients, the probes after it."""
