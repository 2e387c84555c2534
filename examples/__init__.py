"""Example session Apps, and deliberately broken ones that the chaos rig must report."""
