// Warp-level matrix-multiply-accumulate behind the portability header.
//
// Kernels that use the matrix units test JA_HAS_WARP_MMA and otherwise keep a
// SIMT path, so the same kernel source compiles with nvcc and hipcc. The
// primitives follow the m16n8k16 register layout of NVIDIA's mma.sync
// (16-bit A/B operands, float32 accumulators), with ldmatrix for moving 8x8
// 16-bit tiles from shared memory into fragments and cp.async for
// asynchronous global -> shared copies with zero fill.
//
// Fragment layout for one warp (lane = 4 * g + t, g in [0, 8), t in [0, 4)):
//   A (16x16, row-major) a[0..3]: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B (16x8, k-major)    b[0..1]: (k 2t..2t+1, n g), (k 2t+8.., n g)
//   C (16x8, float)      c[0..3]: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
//
// HIP/CDNA: the MFMA builtins have a different register layout (64-wide
// wavefronts), so JA_HAS_WARP_MMA stays 0 there and kernels take their SIMT
// path; an MFMA implementation of the same kernel structure goes here later.
#pragma once
#include <cstdint>

#include "ja/dtype.h"
#include "ja/gpu.h"

#if defined(JA_GPU_CUDA)
#define JA_HAS_WARP_MMA 1  // host and device pass agree: dispatch is decided on the host
#else
#define JA_HAS_WARP_MMA 0
#endif

#if JA_HAS_WARP_MMA && (defined(__CUDACC__))
namespace ja {
namespace mma {

// Whether the device pass has the sm_80 instructions (mma.sync bf16, cp.async,
// ldmatrix). Older targets compile the kernels to a trap; the instance code
// never launches them there because the build targets sm_80 or newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define JA_MMA_SM80 1
#else
#define JA_MMA_SM80 0
#endif

template <typename T>
struct is_mma_type {
  static constexpr bool value = false;
};
template <>
struct is_mma_type<bf16_t> {
  static constexpr bool value = true;
};
template <>
struct is_mma_type<f16_t> {
  static constexpr bool value = true;
};

JA_DEVICE uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// D = A * B + C, m16n8k16, float32 accumulate.
template <typename T>
JA_DEVICE void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <>
JA_DEVICE void mma_16816<bf16_t>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if JA_MMA_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

template <>
JA_DEVICE void mma_16816<f16_t>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if JA_MMA_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// Four 8x8 16-bit matrices; lane l gives the row address of matrix l / 8.
JA_DEVICE void ldmatrix_x4(uint32_t r[4], const void* p) {
#if JA_MMA_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#else
  __trap();
#endif
}

// The same, each matrix transposed.
JA_DEVICE void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
#if JA_MMA_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#else
  __trap();
#endif
}

// 16-byte global -> shared copy; when !valid the destination is zero-filled
// and nothing is read (src must still be a mapped address). PF is an L2
// prefetch-size hint: 128 or 256 bytes around the address come from memory
// into L2 at once (the .L2::128B / .L2::256B qualifier); 0 is the plain copy.
template <int PF = 0>
JA_DEVICE void cp_async_16(void* dst, const void* src, bool valid) {
  static_assert(PF == 0 || PF == 128 || PF == 256, "the L2 prefetch size is 0, 128 or 256 bytes");
#if JA_MMA_SM80
  const int n = valid ? 16 : 0;
  if constexpr (PF == 0)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
  else if constexpr (PF == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
  else asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
#else
  __trap();
#endif
}
// 4-byte global -> shared copy (e.g. per-row float vectors that are not 16-byte
// aligned); when !valid the destination is zero-filled and nothing is read.
JA_DEVICE void cp_async_4(void* dst, const void* src, bool valid) {
#if JA_MMA_SM80
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
#else
  __trap();
#endif
}
JA_DEVICE void cp_async_commit() {
#if JA_MMA_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
JA_DEVICE void cp_async_wait() {
#if JA_MMA_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Hopper (sm_90) asynchronous copies: the tensor memory accelerator (TMA) moves a box of a
// tensor, described by a CUtensorMap encoded on the host, into shared memory and reports the
// bytes it wrote on an mbarrier (the "transaction count"). One thread issues the copies;
// every thread that reads the data waits on the barrier's phase. Older targets trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define JA_MMA_SM90 1
#else
#define JA_MMA_SM90 0
#endif

// An mbarrier in shared memory that completes a phase after `count` arrivals (and their bytes).
JA_DEVICE void mbar_init(uint64_t* bar, int count) {
#if JA_MMA_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) before its first copy.
JA_DEVICE void mbar_fence_init() {
#if JA_MMA_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also expects `bytes` more bytes of copies before the phase completes.
JA_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if JA_MMA_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#else
  __trap();
#endif
}
// Waits until the phase with this parity (0, 1, 0, ... for its uses in order) has completed.
JA_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity) {
#if JA_MMA_SM90
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}
// Orders this thread's earlier shared-memory writes (generic proxy) before later asynchronous-proxy accesses
// of the same memory (a TMA copy that refills a buffer the thread wrote), as the PTX memory model asks.
JA_DEVICE void fence_proxy_async() {
#if JA_MMA_SM90
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Fetches a tensor map (a __grid_constant__ kernel parameter) into the descriptor cache.
JA_DEVICE void tma_prefetch_map(const void* map) {
#if JA_MMA_SM90
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#endif
}
// The box of a 4-d tensor map at coordinates (c0 innermost .. c3) -> dst (shared memory, aligned as the
// map's swizzle needs); elements past the tensor's ends are zero-filled. Completes its bytes on bar.
JA_DEVICE void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
#if JA_MMA_SM90
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();
#endif
}

// Thread-block clusters (sm_90): every thread of every block of the cluster arrives, then waits; shared
// memory written before it by any block is visible to the cluster's blocks after it (release / acquire).
JA_DEVICE void cluster_sync() {
#if JA_MMA_SM90
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// The same barrier with no memory ordering (CUTLASS's cluster_arrive_relaxed + cluster_wait): for a block
// that must not exit while another still reads its shared memory, once its own loads have returned. No
// fence, so it does not wait for the block's outstanding global stores, which cluster_sync's release does.
JA_DEVICE void cluster_sync_relaxed() {
#if JA_MMA_SM90
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// The address in the cluster's shared-memory window of this shared-memory address in block `rank`.
JA_DEVICE uint32_t cluster_map(const void* p, uint32_t rank) {
  uint32_t remote = 0;
#if JA_MMA_SM90
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
#else
  __trap();
#endif
  return remote;
}
// The four floats at this (16-byte aligned) shared-memory address in block `rank` of the cluster.
JA_DEVICE float4 cluster_load4(const float* p, uint32_t rank) {
  float4 v{};
#if JA_MMA_SM90
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_map(p, rank))
               : "memory");
#endif
  return v;
}
// The float at this shared-memory address in block `rank` of the cluster.
JA_DEVICE float cluster_load(const float* p, uint32_t rank) {
  float v = 0.0f;
#if JA_MMA_SM90
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(cluster_map(p, rank)) : "memory");
#endif
  return v;
}

// Two floats -> one register of two 16-bit values (low half = x).
template <typename T>
JA_DEVICE uint32_t pack2(float x, float y);
template <>
JA_DEVICE uint32_t pack2<bf16_t>(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
JA_DEVICE uint32_t pack2<f16_t>(float x, float y) {
  const __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace mma
}  // namespace ja
#endif
