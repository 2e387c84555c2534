"""loopd nodes coordinated by etcd: fenced ownership and safe migration (docs/scaling.md)."""
