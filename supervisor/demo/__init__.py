"""``loopd demo``'s steps: the store, a hosted supervisor under kills, hosting features."""
