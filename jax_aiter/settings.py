"""Numeric settings: the one table of their bounds and the one parser, for the runtime and the tooling.

Every number a user can set (environment variable or flag) is read through
``number(name, text)``: it must parse, be finite and lie in the setting's
range, or the error names the setting, the value given and the accepted range.
So ``nan``, ``inf``, ``0`` where zero makes no sense, negatives and huge values
stop at once instead of waiting forever, overflowing later or eating memory.

The runtime (jax-aiter-fetch-mha) and the build tooling (the GPU slot runner,
the test tiers, the wheel build) both read it, so it imports only the standard
library.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Numeric:
    kind: type  # int or float
    lo: float
    hi: float
    default: float | None
    unit: str = ""

    def show(self, value: float) -> str:
        return str(int(value)) if self.kind is int else f"{value:g}"

    def range_text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{'an integer' if self.kind is int else 'a number'} from {self.show(self.lo)} to {self.show(self.hi)}{unit}"


# name -> bounds. Flags that set the same thing are read under the variable's bounds.
NUMERIC: dict[str, Numeric] = {
    "JA_FETCH_TIMEOUT_S": Numeric(float, 0.1, 3600, 60.0, "seconds"),
    "JA_FETCH_RETRIES": Numeric(int, 0, 20, 4),
    "JA_FETCH_BACKOFF_S": Numeric(float, 0, 600, 2.0, "seconds"),
    "JA_FETCH_LOCK_TIMEOUT_S": Numeric(float, 0, 7 * 86400, 3600.0, "seconds"),
    "JA_GPU_SLOT_TIMEOUT": Numeric(float, 0, 7 * 86400, 900.0, "seconds"),
    # 0.9 / n must stay >= 0.01 as XLA_PYTHON_CLIENT_MEM_FRACTION with two decimals
    "JA_TESTS_PER_GPU": Numeric(int, 1, 64, 1),
    "JA_GPU_COUNT": Numeric(int, 0, 1024, None),
    "JA_TEST_WORKERS": Numeric(int, 0, 1024, None),
    "JA_TEST_RERUNS": Numeric(int, 0, 10, None),  # default per platform (the test tiers decide)
    "SOURCE_DATE_EPOCH": Numeric(int, 0, 2**32 - 1, None, "seconds since 1970"),
}


class SettingError(ValueError):
    """A setting's value is not usable; the message names it, the value and the accepted range."""


def number(name: str, text: str, flag: str | None = None) -> int | float:
    """Parse `text` as the setting `name` (its table entry decides type and range)."""
    spec = NUMERIC[name]
    shown = flag or name
    try:
        value = spec.kind(str(text).strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not spec.lo <= value <= spec.hi:
        raise SettingError(f"{shown}={text!r} is not valid: give {spec.range_text()}"
                           + (f" (default {spec.show(spec.default)})" if spec.default is not None else ""))
    return value


def from_env(name: str, env: Mapping[str, str] | None = None) -> int | float | None:
    """The setting from the environment (blank or unset: its default)."""
    env = os.environ if env is None else env
    text = env.get(name)
    if text is None or not text.strip():
        return NUMERIC[name].default
    return number(name, text)


def flag_type(name: str, flag: str):
    """An argparse `type=` that parses a flag under the bounds of the setting it overrides."""
    def parse(text: str):
        import argparse

        try:
            return number(name, text, flag)
        except SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = flag  # argparse names it in "invalid <name> value"
    return parse
