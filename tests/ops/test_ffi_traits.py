"""What each FFI handler tells XLA about itself: XLA's metadata query, made the way XLA makes it.

At registration XLA calls a handler with a call frame whose extension is XLA_FFI_Metadata_Extension
(xla/ffi/api/c_api.h); the handler fills in the FFI API version it was built against and its traits,
and XLA keeps them. Every GPU handler must declare COMMAND_BUFFER_COMPATIBLE
(csrc/ffi/gpu_handler_traits.h): without it XLA launches our calls one by one between its command
buffers (CUDA graphs), which costs a model step with many short kernels (docs/gpu.md). The query
runs on the CPU handlers in every build (the version they report is the shim's), and on the GPU
handlers where the shims were built for a GPU; a CPU build has none and says so.
"""
from __future__ import annotations

import ctypes

import pytest

from jax_aiter import _loader

EXTENSION_METADATA = 1            # XLA_FFI_Extension_Metadata
COMMAND_BUFFER_COMPATIBLE = 1     # XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE


class ExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", ApiVersion), ("traits", ctypes.c_uint32),
                ("state_type_id", ctypes.c_int64)]


class MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", ExtensionBase), ("metadata", ctypes.POINTER(Metadata))]


class Span(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets: struct_size, extension, size, types, values
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.c_void_p), ("values", ctypes.c_void_p)]


class Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.c_void_p), ("names", ctypes.c_void_p), ("attrs", ctypes.c_void_p)]


class CallFrame(ctypes.Structure):  # up to attrs: the size the handler checks (XLA_FFI_CallFrame_STRUCT_SIZE)
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("api", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int), ("args", Span), ("rets", Span), ("attrs", Attrs)]


def query(handler) -> tuple[tuple[int, int], int]:
    """((major, minor), traits) that the handler reports to XLA's metadata query."""
    meta = Metadata(struct_size=ctypes.sizeof(Metadata))
    ext = MetadataExtension(ExtensionBase(ctypes.sizeof(MetadataExtension), EXTENSION_METADATA, None),
                            ctypes.pointer(meta))
    frame = CallFrame(struct_size=ctypes.sizeof(CallFrame), extension_start=ctypes.addressof(ext))
    handler.restype = ctypes.c_void_p
    handler.argtypes = [ctypes.POINTER(CallFrame)]
    error = handler(ctypes.byref(frame))
    assert error is None, "the handler answered the metadata query with an error"
    return (meta.api_version.major_version, meta.api_version.minor_version), meta.traits


def shims():
    for op, spec in _loader.OPS.items():
        try:
            path = _loader.find_library(spec.shim)
        except Exception as e:  # noqa: BLE001 -- the reason is the skip message
            pytest.skip(f"{op}: no shim to query ({e})")
        _loader.ensure_registered(op)  # loads its libraries in order, as the ops do
        lib = _loader._load(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.ja_ffi_api_version(ctypes.byref(major), ctypes.byref(minor))
        yield op, spec, lib, (major.value, minor.value)


def test_cpu_handlers_answer_the_metadata_query_with_their_shims_api_version():
    for op, spec, lib, version in shims():
        for _, prefix in spec.targets:
            assert query(getattr(lib, prefix + "Cpu"))[0] == version, f"{op}: {prefix}Cpu"


def test_every_gpu_handler_is_command_buffer_compatible():
    seen = []
    for op, spec, lib, version in shims():
        for _, prefix in spec.targets:
            if not hasattr(lib, prefix + "Gpu"):
                continue
            got_version, traits = query(getattr(lib, prefix + "Gpu"))
            assert got_version == version, f"{op}: {prefix}Gpu"
            assert traits & COMMAND_BUFFER_COMPATIBLE, (
                f"{op}: {prefix}Gpu does not declare kCmdBufferCompatible (csrc/ffi/gpu_handler_traits.h)")
            seen.append(prefix)
    if not seen:
        pytest.skip("the shims hold no GPU handlers (a CPU build: JA_BACKEND=cpu); the GPU tier checks them")
