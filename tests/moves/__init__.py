"""A session between nodes: move, its steps under kills, takeover of stored sessions."""
