"""One hosted session and its worker: state, owner, spawn, hang and poison, relay, handover."""
