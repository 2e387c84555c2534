"""A run's reports: progress, the HTML page, violations by cause, the mutants' score."""
