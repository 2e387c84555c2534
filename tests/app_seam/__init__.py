"""Hosting an App: its contract and imports, named Apps, versions, templates, timers."""
