"""The rig at the PostgreSQL seam: faults at a fenced write's COMMIT, judged by the same oracle.

A case runs a store-level scenario against ``PostgresStore`` in a schema of its own
(docs/chaos.md, "The PostgreSQL seam").
"""
