"""What must hold: the invariants, each read from the real files and the replies."""
