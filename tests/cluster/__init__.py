"""A cluster on etcd: nodes, ownership, keepalive, hosts in namespaces, PostgreSQL."""
