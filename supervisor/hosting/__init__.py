"""Production hosting: operator intent, logs, events, metrics, systemd, configuration."""
