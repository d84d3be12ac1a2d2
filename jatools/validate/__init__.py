"""Clean-room validation: install a wheel where no checkout is visible and run the smoke tests.

Owns the clean room (venv or container), the offline wheelhouse and the validation
image. May import: jatools.wheel, jatools.jitlibs, jatools.ci, jatools.config, jatools.steps.
cleanroom_smoke.py runs inside the clean room and imports nothing from jatools.
"""
