// The XLA FFI handler traits of every GPU handler (one home for the fact and its reasons).
#pragma once
#include "xla/ffi/api/ffi.h"

// kCmdBufferCompatible: XLA may record the handler into a command buffer (a CUDA graph, captured
// from the stream) together with the kernels around it, and replay it without calling the handler
// again. Our GPU handlers qualify, as XLA's conditions in xla/ffi/api/api.h ask:
//   1. they only enqueue work on XLA's stream (kernel launches, cudaMemsetAsync of a workspace);
//      nothing is autotuned, and the launch parameters depend only on the shapes, attributes and
//      the device (cudaDeviceGetAttribute), which do not change between replays;
//   2. they use no memory but their buffers: every workspace (the decode path's split results,
//      the backward's dQ accumulator and rowsum) is an XLA-allocated result;
//   3. they never synchronise or query the stream or an event.
// A handler that breaks one of these must drop the trait, or a replay runs stale work.
#define JA_GPU_HANDLER_TRAITS {xla::ffi::Traits::kCmdBufferCompatible}
