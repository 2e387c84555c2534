"""Hosting features: configuration, events, intent, metrics, sd_notify, session logs."""
