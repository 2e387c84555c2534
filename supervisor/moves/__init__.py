"""A session between nodes: move, takeover, and its files between homes."""
