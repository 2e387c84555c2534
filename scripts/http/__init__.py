"""Benchmarks of the HTTP API (serve --http) and the App they host."""
