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
