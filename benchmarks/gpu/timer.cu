// Device-side timing for the GPU benchmarks, as XLA FFI custom calls.
//
// ja_bench_record(token, *deps) -> token: records event `slot` on XLA's stream
// once every dep is computed. The Python side threads the token through
// lax.optimization_barrier with a kernel's inputs, so the kernel runs after
// the start event, and passes every output as a dep of the stop event.
// ja_bench_copy(x) -> y: a device-to-device memcpy, the copy-bandwidth ceiling.
// ja_bench_spin(token) -> token: one GPU thread busy for `cycles` clock cycles, so the GPU is
// still working when the host enqueues what follows (the host gets ahead of the GPU).
// ja_bench_elapsed_ms(a, b): milliseconds between two recorded events.
#include <mutex>
#include <vector>

#include "ja/api.h"
#include "ja/ffi_util.h"
#include "ja/gpu.h"

namespace ffi = xla::ffi;

static std::mutex g_mu;
static std::vector<ja_event_t> g_events;

static ja_event_t event(int64_t slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  while (int64_t(g_events.size()) <= slot) {
    ja_event_t e;
    if (ja_event_create(&e) != ja_success) return nullptr;
    g_events.push_back(e);
  }
  return g_events[size_t(slot)];
}

static ffi::Error record(ja_stream_t stream, ffi::AnyBuffer token, ffi::RemainingArgs deps,
                         ffi::Result<ffi::AnyBuffer> token_out, int64_t slot) {
  ja_event_t e = event(slot);
  if (!e) return ffi::Error::Internal("ja_bench_record: cannot create an event");
  if (ja_event_record(e, stream) != ja_success) return ffi::Error::Internal("ja_bench_record: event record failed");
  return ffi::Error::Success();
}

static ffi::Error copy(ja_stream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (ja_memcpy_d2d_async(y->untyped_data(), x.untyped_data(), x.size_bytes(), stream) != ja_success)
    return ffi::Error::Internal("ja_bench_copy: memcpy failed");
  return ffi::Error::Success();
}

JA_GLOBAL void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
}

static ffi::Error spin(ja_stream_t stream, ffi::AnyBuffer token, ffi::Result<ffi::AnyBuffer> token_out,
                       int64_t cycles) {
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  if (ja_get_last_error() != ja_success) return ffi::Error::Internal("ja_bench_spin: launch failed");
  return ffi::Error::Success();
}

JA_FFI_HANDLER(JaBenchRecord);
JA_FFI_HANDLER(JaBenchSpin);
JA_FFI_HANDLER(JaBenchCopy);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaBenchRecord, record,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<ja_stream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("slot"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaBenchSpin, spin,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<int64_t>(
        "cycles"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaBenchCopy, copy,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<ja_stream_t>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

JA_API float ja_bench_elapsed_ms(int64_t a, int64_t b) {
  float ms = -1.f;
  ja_event_t ea = event(a), eb = event(b);
  if (!ea || !eb || ja_event_synchronize(eb) != ja_success) return -1.f;
  if (ja_event_elapsed_time(&ms, ea, eb) != ja_success) return -1.f;
  return ms;
}
