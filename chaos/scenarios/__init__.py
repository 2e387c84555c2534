"""The scenarios: what a client asks, the operator's tools it runs, the Apps the rig hosts."""
