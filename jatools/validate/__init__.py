"""Clean-room validation: install a wheel where no checkout is visible and run the smoke tests.

Owns the clean room (venv or container), the offline wheelhouse and the validation
image; what it may import: jatools/stages.py.
cleanroom_smoke.py runs inside the clean room and imports nothing from jatools.
"""
