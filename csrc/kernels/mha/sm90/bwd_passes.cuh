// The passes around the Hopper backward's main kernel (the preprocess: delta and the zeroed dq_accum; the dQ
// conversion), the main kernel's launch, whether the backward takes a call, and the whole backward in order.
#pragma once
#include "mha/sm90/bwd_epilogue.cuh"

namespace ja {
namespace mha_sm90 {

// delta = rowsum(dO * O) over the dv columns, dq_accum's rows zeroed over the d columns: one 8-lane
// group per (batch, row, query head), 16-byte loads and stores (d and dv are multiples of 8).
template <typename T>
__global__ void __launch_bounds__(256) bwd_preprocess(const T* o, const T* dout, float* delta, float* dq_accum,
                                                      int64_t rows, int sq, int hq, int d, int dv) {
  const int lane8 = threadIdx.x % 8;
  for (int64_t base = int64_t(blockIdx.x) * 32; base < rows; base += int64_t(gridDim.x) * 32) {
    const int64_t row = base + threadIdx.x / 8;  // (b * sq + i) * hq + h
    float sum = 0.0f;
    if (row < rows) {
      for (int c = lane8 * 8; c < dv; c += 64) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + row * dv + c);
        const uint4 gv = *reinterpret_cast<const uint4*>(dout + row * dv + c);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* ge = reinterpret_cast<const T*>(&gv);
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 8; ++e) sum += to_f32(oe[e]) * to_f32(ge[e]);
      }
      for (int c = lane8 * 4; c < d; c += 32)
        *reinterpret_cast<float4*>(dq_accum + row * d + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if (row < rows && lane8 == 0) {
      const int64_t h = row % hq, bi = row / hq, b = bi / sq, i = bi % sq;
      delta[(b * hq + h) * sq + i] = sum;
    }
  }
}

// Row r = (b, i, h) of dq = dq_accum rounded to the input dtype, by one warp (d a multiple of 8, dq_accum and dq
// 16-byte aligned), four columns a lane at a time; whether some value of it is NaN or infinite.
template <typename Element>
CUTE_DEVICE bool convert_dq_row(const float* acc, Element* dq, int64_t r, int d, int lane) {
  bool bad = false;
  CUTLASS_PRAGMA_UNROLL
  for (int t = 0; t < 2; ++t) {  // d <= 256
    const int c = 4 * lane + 128 * t;
    if (c >= d) break;
    const float4 v = *reinterpret_cast<const float4*>(acc + r * d + c);
    bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
    cutlass::Array<Element, 4> o;
    o[0] = Element(v.x);
    o[1] = Element(v.y);
    o[2] = Element(v.z);
    o[3] = Element(v.w);
    *reinterpret_cast<cutlass::Array<Element, 4>*>(dq + r * d + c) = o;
  }
  return __any_sync(0xffffffffu, bad);
}

// Row r of dq, which came out NaN or infinite, computed again, exactly, by the calling warp (common/exact.cuh); r
// back (see convert_dq_rows).
template <typename Element, bool CAUSAL>
__device__ __noinline__ int64_t convert_dq_exact(JaMhaProblem const& pr, mha_gpu::ExactBwd<Element> const& in,
                                                 Element* dq, int64_t r) {
  __syncwarp();  // the warp's stores of the row come first
  const int h = int(r % pr.heads_q), i = int((r / pr.heads_q) % pr.seq_q), b = int(r / (pr.heads_q * pr.seq_q));
  mha_gpu::exact_dq_row(pr, in, dq, b, h, i, sm90_row<CAUSAL>(pr, b, i));
  return r;
}

// dq = dq_accum rounded to the input dtype, one warp a row (b, i, h). A row that came out NaN or infinite (a K,
// V or dO value hidden from it can put 0 x NaN into dq_accum) is computed again, exactly (convert_dq_exact).
// The row index goes through that call and comes back as its result, so that no value of the loop lives
// across it: one that did kept the loop's state in local memory, which made this memory-bound pass several
// times slower (the perf gate's 1k attention backward, `bench_gpu.py --quick --only attention`). Eight blocks
// a multiprocessor (32 registers): the occupancy of the element-wise conversion it replaced, which this pass
// needs (at 64 registers the backward timed slower there); the rare recomputation spills instead.
template <typename Element, bool CAUSAL>
__global__ void __launch_bounds__(256, 8)
    convert_dq_rows(CUTE_GRID_CONSTANT JaMhaProblem const pr, CUTE_GRID_CONSTANT mha_gpu::ExactBwd<Element> const in,
                    const float* acc, Element* dq) {
  const int64_t rows = pr.batch * pr.seq_q * pr.heads_q;
  for (int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32; r < rows; r += int64_t(gridDim.x) * 8)
    if (convert_dq_row(acc, dq, r, int(pr.head_dim), int(threadIdx.x % 32)))
      r = convert_dq_exact<Element, CAUSAL>(pr, in, dq, r);
}

// Launches `kernel` (Tr::kThreads threads, Tr::kSmemBytes of shared memory) on one block per
// (BN keys, kv head, batch), with the call's parameters (bwd_args: FEAT kernels take softcap and ALiBi).
template <typename Tr, typename Kernel>
const char* bwd_launch(Kernel kernel, const JaMhaBwdArgs& a, bool feat, cudaStream_t stream, const char* what) {
  const JaMhaProblem& pr = a.p;
  const auto loads = bwd_loads<Tr>(a);
  typename Tr::Params p{bwd_args<typename Tr::Element>(a, feat),
                        loads.tma_q,
                        loads.tma_do,
                        loads.tma_k,
                        loads.tma_v,
                        Tr::DqStage::tma(a.dq_accum, int(pr.seq_q), int(pr.head_dim), int(pr.heads_q), int(pr.batch))};
  const dim3 grid(unsigned((pr.seq_k + Tr::BN - 1) / Tr::BN), unsigned(pr.heads_kv), unsigned(pr.batch));
  p.chunk = causal_chunk(grid.x);  // read only by causal grids (grid_place)
  // deterministic, causal, grouped heads, a (kv head, batch)'s blocks resident at once (the top of this file)
  p.heavy_first = p.sync && pr.mask == kMaskCausal && p.group > 1 && grid.x <= multiprocessors();
  return mha_gpu::launch_with_smem(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p, what);
}

// Whether the Hopper backward of instance head dim D runs call a (besides the device): the forward's rule
// (sm90_applies), 16-byte aligned tensors, the mask's cols, and, deterministic, enough sync words.
template <int D>
bool bwd_sm90_applies(const JaMhaBwdArgs& a) {
  const JaMhaProblem& pr = a.p;
  if (!sm90_applies<D>(pr, kBwdFeatures) || mha_unhandled_feature(a, kBwdFeatures)) return false;
  if (pr.batch * pr.seq_q * pr.heads_q * D >= (int64_t(1) << 31)) return false;
  for (const void* ptr : {a.q, a.k, a.v, a.o, a.dout, static_cast<const void*>(a.dq), static_cast<const void*>(a.dk),
                          static_cast<const void*>(a.dv), static_cast<const void*>(a.dq_accum)})
    if (!mha_gpu::aligned16(ptr)) return false;
  if (pr.mask == kMaskRows && a.cols == nullptr) return false;
  if (a.deterministic) {
    const int64_t words = pr.batch * pr.heads_q * ((pr.seq_q + kBwdTileRows - 1) / kBwdTileRows);
    if (a.sync == nullptr || a.sync_words < words) return false;
  }
  return true;
}

// The whole backward around the main kernel (launch(): preprocess; deterministic, the semaphores;
// the main kernel; the dQ conversion).
template <typename T, int BN, bool CAUSAL, typename Main>
const char* bwd_run(const JaMhaBwdArgs& a, cudaStream_t s, Main launch_main) {
  const JaMhaProblem& pr = a.p;
  const int64_t q_rows = pr.batch * pr.seq_q * pr.heads_q;
  const int64_t max_blocks = int64_t(1) << 20;
  {
    const int64_t blocks = std::min<int64_t>((q_rows + 31) / 32, max_blocks);
    bwd_preprocess<T><<<unsigned(blocks), 256, 0, s>>>(static_cast<const T*>(a.o), static_cast<const T*>(a.dout),
                                                       a.delta, a.dq_accum, q_rows, int(pr.seq_q), int(pr.heads_q),
                                                       int(pr.head_dim), int(pr.head_dim_v));
    if (const char* e = mha_gpu::launch_status("mha_bwd (preprocess)")) return e;
  }
  if (a.deterministic) {
    const int m_tiles = int((pr.seq_q + kBwdTileRows - 1) / kBwdTileRows);
    const int64_t words = pr.batch * pr.heads_q * m_tiles;
    bwd_init_sync<kBwdTileRows, BN, CAUSAL>
        <<<unsigned((words + 255) / 256), 256, 0, s>>>(pr, a.cols, a.cols_batch_stride, a.sync, m_tiles);
    if (const char* e = mha_gpu::launch_status("mha_bwd (deterministic order)")) return e;
  }
  if (const char* e = launch_main()) return e;
  {
    using E = typename CutlassType<T>::type;
    const int64_t blocks = std::min<int64_t>((q_rows + 7) / 8, max_blocks);
    convert_dq_rows<E, CAUSAL>
        <<<unsigned(blocks), 256, 0, s>>>(pr, mha_gpu::exact_bwd<E>(a), a.dq_accum, static_cast<E*>(a.dq));
    if (const char* e = mha_gpu::launch_status("mha_bwd (convert dQ)")) return e;
  }
  return nullptr;
}

}  // namespace mha_sm90
}  // namespace ja
