// Export macro and the shared runtime services of libjax_aiter.so (the umbrella).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#define JA_API extern "C" __attribute__((visibility("default")))

// Error convention for every C entry point of the JIT libraries: return nullptr
// on success, else a message that names the problem (owned by the umbrella,
// valid until the calling thread's next error).
JA_API const char* ja_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Build identity of this build of the umbrella: a JSON object (backend, archs,
// compilers, FFI API version). The Python runtime prints it in `info`.
JA_API const char* ja_build_identity(void);

// Number of visible GPUs for the backend this umbrella was built for; 0 on a
// CPU build, -1 with a reason in *why when the GPU runtime cannot be reached.
JA_API int ja_gpu_device_count(const char** why);

namespace ja {
// Runs fn(begin, end) over [0, n) on up to hardware_concurrency threads, in
// chunks of at least `grain` items. Runs inline when one chunk suffices.
__attribute__((visibility("default"))) void parallel_for(int64_t n, int64_t grain,
                                                         const std::function<void(int64_t, int64_t)>& fn);
}  // namespace ja
