"""App templates: one process per App that imports it once and forks that App's workers."""
