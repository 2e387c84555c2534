"""The chaos rig: its sweep, cases, scenarios, mutants, reports and budget."""
