"""Native build: toolchain detection (build/config.mk for make), the JIT build (jit_*.py), the native-build
sequence, compile-only and sanitizer builds.

Owns how the C++/CUDA/HIP sources become libraries. Its modules sit in two stages (jatools/stages.py):
the toolchain and the JIT build early, the native-build sequence (whose consumer check reads jitlibs) later.
"""
