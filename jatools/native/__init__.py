"""Native build: toolchain detection (build/config.mk for make), compile-only and sanitizer builds.

Owns how the C++/CUDA/HIP sources become libraries. May import: jatools.config,
jatools.atomic_write, jatools.steps, the standard library. Nothing else in jatools imports
from the later stages into this one.
"""
