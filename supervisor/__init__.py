"""The loopd supervisor daemon and the operator CLI."""
