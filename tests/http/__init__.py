"""The HTTP API: routes, limits, schedules, its start, tenants."""
