"""Benchmarks of the build and release tooling against the reference's tools (`nox -s bench`; docs/benchmarks.md)."""
