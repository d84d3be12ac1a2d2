"""`python -m jax_aiter <command>`; the only command so far is `info`."""
from __future__ import annotations

import sys

USAGE = "usage: python -m jax_aiter info [--verify] [--json]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "info":
        from jax_aiter.settings import SettingError

        try:
            from jax_aiter import info

            return info.main(argv[1:])
        except SettingError as e:  # a checkout's pyproject.toml that is not TOML: the file and line, not a traceback
            print(f"python -m jax_aiter info: error: {e}", file=sys.stderr)
            return 2
    print(f"python -m jax_aiter: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
