"""invoke tasks: hash verification, wheel checks, clean-room validation, JIT-library transport, release.

Tasks are thin: each parses its arguments, calls one jatools module, and turns
its errors into `Exit` with a message and a code. `invoke --list` shows them.
"""
from __future__ import annotations

from invoke import Collection

ns = Collection()
