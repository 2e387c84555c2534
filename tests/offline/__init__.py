"""A session's files with no worker: verify, damage tools, salvage, fork, backup and restore."""
