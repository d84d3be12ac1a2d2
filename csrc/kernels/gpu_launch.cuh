// Kernel launches with programmatic dependent launch (PDL, CUDA on sm_90+).
//
// A model runs the memory-bound ops back to back (RMSNorm, then a matmul, then
// RMSNorm again ...). Launched normally, a kernel's blocks are scheduled only
// after the previous kernel in the stream has finished, so each launch leaves
// the GPU idle for its launch latency. With PDL the next kernel is scheduled
// while the previous one drains its last wave; its blocks wait in pdl_wait()
// until every grid it depends on (stream order) has finished and its writes
// are visible, so the results are those of ordinary stream order.
//
// Kernels launched through launch_pdl must call pdl_wait() before their first
// global memory access (reads and writes: a buffer they write may still be
// read by the previous kernel). pdl_launch_dependents() lets the next
// PDL-launched kernel be scheduled once every block of this grid has called it
// (or exited). Against a previous kernel that was launched normally, pdl_wait()
// returns at once: stream order already held.
//
// PDL is used where the device has it (compute capability 9.0+, CUDA) unless
// JA_GPU_PDL=0 is set in the environment (read once per process), for A/B
// measurements. HIP builds launch normally.
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "ja/env.h"
#include "ja/gpu.h"

namespace ja {

JA_DEVICE void pdl_wait() {
#if defined(JA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

JA_DEVICE void pdl_launch_dependents() {
#if defined(JA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// -1: by device and JA_GPU_PDL (the default); 0 or 1: forced (benchmarks/gpu/tune_rmsnorm.cu).
inline int& pdl_force() {
  static int force = -1;
  return force;
}

#if defined(JA_GPU_CUDA)
// The current device, or -1 when it cannot be read (the error is cleared: no launch check sees it).
inline int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return dev;
}

// Device d's compute capability as 10 * major + minor (90: Hopper), or 0 when it cannot be read
// (the error is cleared).
inline int compute_capability(int d) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return 10 * major + minor;
}

// query(dev), computed once per device into cache (one slot per device; devices past 64 share slot 0).
// query must not return 0: a slot holding 0 is not known yet.
template <typename Query>
int per_device(std::atomic<int> (&cache)[64], int dev, Query query) {
  const int slot = dev >= 0 && dev < 64 ? dev : 0;
  int v = cache[slot].load(std::memory_order_relaxed);
  if (v == 0) {
    v = query(dev);
    cache[slot].store(v, std::memory_order_relaxed);
  }
  return v;
}

// Multiprocessors of the current device (cached per device).
inline int multiprocessors() {
  static std::atomic<int> cache[64];
  const int dev = current_device();
  return per_device(cache, dev < 0 ? 0 : dev, [](int d) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();  // leave no sticky error for the launch check
      n = 108;
    }
    return n;
  });
}
#endif

inline bool pdl_enabled() {
#if defined(JA_GPU_CUDA)
  if (pdl_force() >= 0) return pdl_force() == 1;
  static std::atomic<int> cache[64];  // per device: 1 off, 2 on
  const int dev = current_device();
  if (dev < 0) return false;
  return per_device(cache, dev, [](int d) { return compute_capability(d) >= 90 && !env_off("JA_GPU_PDL") ? 2 : 1; }) ==
         2;
#else
  return false;
#endif
}

#if defined(JA_GPU_CUDA)
// A launch configuration with its attributes held beside it: PDL where asked, and thread-block clusters of
// `cluster` blocks along x when cluster > 1. Not copyable (cfg.attrs points into it).
struct LaunchConfig {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2]{};
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl, unsigned cluster) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    if (pdl) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs++].val.clusterDim = {cluster, 1, 1};
    }
    cfg.attrs = attr;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// Clusters of `cluster` blocks of kernel (`block` threads and `smem` dynamic shared memory bytes each) that the
// current device holds at once (cudaOccupancyMaxActiveClusters), or 0 when it cannot say (the error is cleared).
template <typename... KArgs>
int max_active_clusters(void (*kernel)(KArgs...), dim3 block, size_t smem, unsigned cluster) {
  LaunchConfig lc(dim3(cluster), block, smem, nullptr, false, cluster);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &lc.cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // no sticky error for a later launch check
    n = 0;
  }
  return n;
}
#endif

// kernel<<<grid, block, smem, s>>>(args...) in thread-block clusters of `cluster` blocks along x (1: none;
// more needs CUDA and a device of compute capability 9.0+, and grid.x a multiple of it), with PDL where
// pdl_enabled(); returns the launch status.
template <typename... KArgs, typename... Args>
ja_error_t launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, ja_stream_t s,
                            unsigned cluster, Args&&... args) {
#if defined(JA_GPU_CUDA)
  const bool pdl = pdl_enabled();
  if (pdl || cluster > 1) {
    LaunchConfig lc(grid, block, smem, s, pdl, cluster);
    return cudaLaunchKernelEx(&lc.cfg, kernel, std::forward<Args>(args)...);
  }
#else
  if (cluster > 1) return hipErrorInvalidValue;  // HIP has no clusters; callers ask only on CUDA
#endif
  kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
  return ja_get_last_error();
}

// kernel<<<grid, block, smem, s>>>(args...), with PDL where pdl_enabled(); returns the launch status.
template <typename... KArgs, typename... Args>
ja_error_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, ja_stream_t s, Args&&... args) {
  return launch_clustered(kernel, grid, block, smem, s, 1u, std::forward<Args>(args)...);
}

}  // namespace ja
