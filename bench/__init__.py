"""Benchmarks: `python -m bench.<name>` from the repository root."""
