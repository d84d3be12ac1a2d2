// The query tiles each key block of the Hopper backward works on, and the deterministic order of its dQ updates.
//
// Deterministic backward (JaMhaBwdArgs::deterministic): the dQ of a (query head, query tile) is the sum
// of the contributions of the key blocks that see it, added by TMA reduce-adds (float32 adds in L2) whose
// order decides the rounding. Here they are added in a fixed order, the key blocks from the last to the
// first, by a semaphore per (batch, query head, 64-row query tile) in the caller's `sync` workspace: the
// preprocess sets each to -2 * (the last key block that sees the tile); a block's warpgroup waits until
// its tile's semaphore reaches -2 * (its key block) before it adds its half of the columns, and adds 1 once
// that add has completed (a later iteration, so the wait is off the critical path). The blocks of a (kv
// head, batch) then start from the last key block (a block only ever waits for blocks started before it,
// so no wait can deadlock however many blocks are resident), which makes each key block follow its
// predecessor by about one query tile. dK and dV need nothing: one block accumulates them over every
// query head of its group in registers, in a fixed order.
//
// Causal with grouped query heads, that order starts each (kv head, batch)'s heaviest block last: a block
// walks every query head of its group, so its first key block runs group times as long as a query head's
// and the last wave waits on it. There (BwdArgs::heavy_first, where a (kv head, batch)'s key blocks fit the
// multiprocessors) the blocks start heaviest first, as without the order, and walk their iterations
// tile-major (every query head of a tile, then the next tile): a block then reaches each tile 2 x group
// iterations after the next key block, which started beside it, so its wait finds that add done. A block
// still waits only on the blocks of its own (kv head, batch), and the pairs start a chunk at a time
// (causal_chunk: as many pairs as the multiprocessors hold all the blocks of): the first chunk not yet
// finished has its blocks resident or free multiprocessors to start them on, so it always finishes, and no
// wait can deadlock.
#pragma once
#include <climits>  // INT_MIN: bwd_sync_wait's `seen` when none was read

#include "mha/sm90/bwd_args.cuh"

namespace ja {
namespace mha_sm90 {

// The query rows that see key j, [q_lo, q_hi), clamped (mha_gpu::exact_col; causal, without reading the mask).
template <bool CAUSAL>
CUTE_HOST_DEVICE MhaCol sm90_col(JaMhaProblem const& pr, const int32_t* cols, int64_t cols_batch_stride, int b, int j) {
  if (CAUSAL) return MhaCol{mha_clamp(j - (pr.seq_k - pr.seq_q), 0, pr.seq_q), pr.seq_q};
  return mha_gpu::exact_col(pr, cols, cols_batch_stride, b, j);
}

// The query tiles key block n of batch b works on, [m_begin, m_end) (every tile that meets the rows that
// see one of its keys), and those whose rows all see every one of its keys, [full_lo, full_hi) (no
// per-element mask). m_begin and m_end are non-decreasing in n (as q_lo and q_hi are in the key), which
// the deterministic order's counts rely on.
struct BwdRange {
  int m_begin, m_end, full_lo, full_hi;
};
template <int BM, int BN, bool CAUSAL>
CUTE_HOST_DEVICE BwdRange bwd_range(JaMhaProblem const& pr, const int32_t* cols, int64_t cols_batch_stride, int b,
                                    int n) {
  const int sk = int(pr.seq_k), k0 = n * BN, kl = min(k0 + BN, sk) - 1;
  const MhaCol f = sm90_col<CAUSAL>(pr, cols, cols_batch_stride, b, k0);
  const MhaCol l = sm90_col<CAUSAL>(pr, cols, cols_batch_stride, b, kl);
  BwdRange r;
  r.m_begin = int(f.q_lo) / BM;
  r.m_end = max(r.m_begin, int(l.q_hi + BM - 1) / BM);
  const bool whole = kl - k0 + 1 == BN;
  r.full_lo = int(l.q_lo + BM - 1) / BM;
  r.full_hi = whole ? int(f.q_hi) / BM : 0;
  return r;
}

// Deterministic order: the semaphore of each (batch b, query head h, query tile m) set to -2 * (the last
// key block whose range holds tile m), found by bisection (the ranges' starts are non-decreasing); 0 where
// no block holds it (then no block waits on it). One thread per semaphore.
template <int BM, int BN, bool CAUSAL>
__global__ void __launch_bounds__(256)
    bwd_init_sync(JaMhaProblem const pr, const int32_t* cols, int64_t cols_batch_stride, int32_t* sync, int m_tiles) {
  const int64_t idx = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= pr.batch * pr.heads_q * m_tiles) return;
  const int m = int(idx % m_tiles), b = int(idx / (int64_t(m_tiles) * pr.heads_q));
  const int n_blocks = int((pr.seq_k + BN - 1) / BN);
  int lo = 0, hi = n_blocks;  // the blocks [0, lo) hold a start <= m; [hi, n_blocks) do not
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (bwd_range<BM, BN, CAUSAL>(pr, cols, cols_batch_stride, b, mid).m_begin <= m) lo = mid + 1;
    else hi = mid;
  }
  sync[idx] = lo > 0 ? -2 * (lo - 1) : 0;
}

// Issued by a warpgroup's leader before its first dQ add of a tile: waits (acquire) until the tile's
// semaphore reaches -2 * n_block, i.e. both warpgroups of every later key block holding the tile have
// completed their adds. A wait past 10 s means the counts and the ranges disagree (malformed cols): it
// traps rather than hang. Not inlined: inlined into the leader's branch, its loop made the compiler
// serialize the kernel's wgmmas (ptxas C7518). `seen`: the semaphore as bwd_sync_peek read it half an
// iteration earlier (it only grows); at or past the target the poll, an L2 round trip that the warpgroup's
// next wgmma would wait for, is skipped. That read is relaxed, not an acquire: the add it lets through is
// issued only once the branch on its value has resolved (the SM issues in order and does not speculate), and
// the adds it orders are performed in L2, which the gpu-scope read also reads, so the earlier blocks' adds,
// complete before their release, are performed first. A fence.acq_rel.gpu to make it a formal acquire cost
// more than the poll it saves (the deterministic timings of benchmarks/gpu/check_mha_bwd_sm90.cu), and
// bitwise equal gradients run after run are checked by that harness and tests/ops/test_attention_gpu_paths.py.
static __device__ __noinline__ void bwd_sync_wait(const int32_t* sem, int n_block, int seen = INT_MIN) {
  const int target = -2 * n_block;
  if (seen < target) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
    if (v < target) {
      uint64_t t0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      for (int spin = 0;; ++spin) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
        if (v >= target) break;
        if ((spin & 1023) == 1023) {
          uint64_t t;
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
          if (t - t0 > 10000000000ull) __trap();
        }
      }
    }
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");  // every exit: the TMA adds that follow come after
}

// A tile's semaphore, read (relaxed) by a warpgroup's leader right after a block barrier, for bwd_sync_wait's
// `seen`.
CUTE_DEVICE int bwd_sync_peek(const int32_t* sem) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
  return v;
}

// Issued by a warpgroup's leader after its last dQ add of a tile was committed: waits until every bulk
// copy it issued but the last PENDING groups has completed (its writes performed, not only its shared
// memory read), then releases the tile's semaphore by 1. Not inlined, as bwd_sync_wait.
template <int PENDING = 0>
__device__ __noinline__ void bwd_sync_release(int32_t* sem) {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(PENDING) : "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

}  // namespace mha_sm90
}  // namespace ja
