"""Durable timers: which sessions have requests scheduled, and their delivery."""
