"""The commands on a session's files that need no daemon: inspect, verify, salvage, fork."""
