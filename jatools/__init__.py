"""Build, packaging and CI tooling for jax-aiter (not shipped in the wheel).

Grouped by the stage of the data flow each folder owns (docs/architecture.md):

    native/    sources -> libraries: toolchain, compile-only and sanitizer builds
    jitlibs/   the JIT libraries' record and verify, what a wheel expects, reuse decision, fetch, publish, merge
    wheel/     libraries -> wheels: layout, deterministic writer, RECORD/contents/ELF/floor checks
    validate/  wheels -> clean room: install with no checkout visible, smoke tests
    testing/   tiers, tag filters, GPU slots, the pytest plugins
    ci/        environment report, convergence check, GitHub outputs, retries
    bench/     tooling benchmarks against the reference's tools
    release.py the main job; config.py the settings; atomic_write.py the one way to write;
    stages.py  which stage may import which

A stage imports only from itself and the stages before it: the table is jatools/stages.py;
noxfile.py, tasks.py and the ci/ scripts wire them to the command line.
"""
import sys as _sys


def _settings_error_in_one_line(kind, value, tb, _default=_sys.excepthook) -> None:
    """A settings error (jax_aiter.settings.SettingError: a bad value, a pyproject.toml that is not TOML) that reaches
    the top of any tooling command (invoke's task module, python -m jatools.X, ci/build.py) is printed as its one
    line, which names the file or variable and the fix; anything else keeps its traceback."""
    from jax_aiter.settings import SettingError

    if isinstance(value, SettingError):
        print(f"error: {value}", file=_sys.stderr)
    else:
        _default(kind, value, tb)


_sys.excepthook = _settings_error_in_one_line
