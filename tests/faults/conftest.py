"""The fault tests' fixtures: the wheel tests' own (tests/wheel/conftest.py: one real CPU build per session, and a
private copy of it a test may damage), shared, not written again."""
from tests.wheel.conftest import build_copy, layout, native_build  # noqa: F401  (fixtures)
