"""The daemon: restarts, the control socket under load, hibernation, tenants, its soak."""
