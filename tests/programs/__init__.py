"""Programs the tests run as processes of their own: clients, nodes, stand-in servers."""
