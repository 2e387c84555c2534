"""``loopd chaos cluster``: namespaced hosts, their faults, the load, the history, the checker."""
