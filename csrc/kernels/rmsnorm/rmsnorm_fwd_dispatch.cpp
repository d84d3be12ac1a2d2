// Entry points of librmsnorm_fwd.so: pick the generated instance for the dtype.
#include "ja/dtype.h"
#include "ja/kernels/rmsnorm.h"

#define JA_INSTANCE(symbol, dt) extern "C" const char* symbol(const JaRmsNormArgs*);
#include "rmsnorm_fwd_cpu_instances.inc"
#undef JA_INSTANCE

JA_API const char* ja_rmsnorm_fwd_cpu(const JaRmsNormArgs* a) {
#define JA_INSTANCE(symbol, dt) \
  if (a->dtype == int(ja::dt_##dt)) return symbol(a);
#include "rmsnorm_fwd_cpu_instances.inc"
#undef JA_INSTANCE
  return ja_error("rmsnorm: no CPU instance for dtype id %d in this build", a->dtype);
}

#if defined(JA_HAS_GPU)
#define JA_INSTANCE(symbol, dt) extern "C" const char* symbol(const JaRmsNormArgs*, void*);
#include "rmsnorm_fwd_gpu_instances.inc"
#undef JA_INSTANCE

JA_API const char* ja_rmsnorm_fwd_gpu(const JaRmsNormArgs* a, void* stream) {
#define JA_INSTANCE(symbol, dt) \
  if (a->dtype == int(ja::dt_##dt)) return symbol(a, stream);
#include "rmsnorm_fwd_gpu_instances.inc"
#undef JA_INSTANCE
  return ja_error("rmsnorm: no GPU instance for dtype id %d in this build", a->dtype);
}
#endif
