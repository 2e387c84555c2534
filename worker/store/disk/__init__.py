"""The store's disk: durable writes, the directory layout, the session lock and its fork guard."""
