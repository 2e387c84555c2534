"""The operator's CLI: the demo, input errors, unloadable Apps, the operator's commands."""
