// Tile copies of the matrix-unit kernels (the mma.sync forward and backward, the split-KV decode): a global
// tile into shared memory by cp.async, and a pair of output columns back.
#pragma once
#include "ja/mma.h"
#include "mha/common/gpu.cuh"

#if JA_HAS_WARP_MMA
namespace ja {
namespace mha_gpu {

// Copies rows [0, rows_valid) x columns [0, cols) of a global tile to shared memory [ROWS][D] (row stride LD),
// zero elsewhere: with 16-byte cp.async (L2 prefetch size PF, see mma::cp_async_16) when `vec` (cols and the
// row stride whole 16-byte vectors; zero-filled parts are not read), else with element loads and stores
// (odd head dims; the callers' barriers order them as they order the asynchronous copies).
template <typename T, int ROWS, int D, int LD, int NTHREADS, int PF = 0>
JA_DEVICE void cp_async_tile(T* smem, const T* g, int64_t stride, int rows_valid, int cols = D, bool vec = true) {
  constexpr int kVec = 16 / int(sizeof(T));
  constexpr int kPerRow = D / kVec;
  static_assert(D % kVec == 0 && (ROWS * kPerRow) % NTHREADS == 0, "tile copy must split evenly over the threads");
  if (vec) {
#pragma unroll
    for (int it = 0; it < ROWS * kPerRow / NTHREADS; ++it) {
      const int idx = int(threadIdx.x) + it * NTHREADS;
      const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
      const bool ok = r < rows_valid && c < cols;
      mma::cp_async_16<PF>(smem + r * LD + c, ok ? g + r * stride + c : g, ok);
    }
  } else {
    for (int idx = int(threadIdx.x); idx < ROWS * D; idx += NTHREADS) {
      const int r = idx / D, c = idx % D;
      smem[r * LD + c] = r < rows_valid && c < cols ? g[r * stride + c] : from_f32<T>(0.0f);
    }
  }
}

// Columns col, col + 1 (col even) of a row of `cols` columns, rounded to T: one 4-byte store where cols is
// even (the row then starts 4-byte aligned), else each column inside the row.
template <typename T>
JA_DEVICE void store_pair(T* row, int col, int cols, float x, float y) {
  if (cols % 2 == 0) {
    if (col < cols) *reinterpret_cast<uint32_t*>(row + col) = mma::pack2<T>(x, y);
  } else {
    if (col < cols) row[col] = from_f32<T>(x);
    if (col + 1 < cols) row[col + 1] = from_f32<T>(y);
  }
}

}  // namespace mha_gpu
}  // namespace ja
#endif  // JA_HAS_WARP_MMA
