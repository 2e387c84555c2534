"""A node's life in a cluster: registration, claims, failover, cordon and drain."""
