"""``loopd chaos cluster``: its certificates, checker, findings and a seeded slice."""
