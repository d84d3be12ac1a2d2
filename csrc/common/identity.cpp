// Build identity baked in at compile time from build/config.mk.
#include "ja/api.h"
#include "xla/ffi/api/c_api.h"

#ifndef JA_BUILD_BACKEND
#error "JA_BUILD_BACKEND must be defined by the build"
#endif
#define JA_STR2(x) #x
#define JA_STR(x) JA_STR2(x)

JA_API const char* ja_build_identity(void) {
  return "{\"backend\": \"" JA_BUILD_BACKEND "\", \"archs\": \"" JA_BUILD_ARCHS "\", \"cxx\": \"" JA_BUILD_CXX
         "\", \"gpu_compiler\": \"" JA_BUILD_GPUCC
         "\", \"ffi_api_version\": \"" JA_STR(XLA_FFI_API_MAJOR) "." JA_STR(XLA_FFI_API_MINOR) "\"}";
}

#if !defined(JA_HAS_GPU)
JA_API int ja_gpu_device_count(const char** why) {
  if (why) *why = "this is a CPU-only build (JA_BACKEND=cpu)";
  return 0;
}
#endif
