"""Epochs: a log read and checked, sealed and bound to the next, the state it carries."""
