"""Benchmarks of kubedl-prefect (run by hand, never as tests): see docs/benchmarks.md."""
