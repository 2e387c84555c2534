"""The loopd chaos rig: crash injection at every write boundary, and its oracle."""
