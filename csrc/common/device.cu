// GPU device queries for GPU builds of the umbrella.
#include "ja/api.h"
#include "ja/gpu.h"

#if defined(JA_GPU_HIP)
#define JA_GET_DEVICE_COUNT hipGetDeviceCount
#else
#define JA_GET_DEVICE_COUNT cudaGetDeviceCount
#endif

JA_API int ja_gpu_device_count(const char** why) {
  int n = 0;
  const ja_error_t err = JA_GET_DEVICE_COUNT(&n);
  if (err != ja_success) {
    if (why) *why = ja_get_error_string(err);
    (void)ja_get_last_error();
    return -1;
  }
  return n;
}
