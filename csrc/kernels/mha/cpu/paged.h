// Attention over a paged KV cache on the CPU (ja/kernels/paged.h): decode, prefill over a sequence's history, and
// FP8 attention (whose dense and packed K and V the Python op hands over as a page table). The reference path.
//
// One task is one (sequence, kv head, tile of Br rows), a row being one (query token, query head of the kv head's
// GQA group), token-major: a decode step's tile holds the group's heads of its one token, so the keys and values
// are read once per kv head, not once per query head. The key and value tiles of Bc keys are gathered row by row
// through the page table (key j of sequence s lives at pool row paged_slot(s, j): the pages are read in place,
// never copied out) and widened to float32 from the pools' dtype; the online softmax over them is the dense
// forward's (cpu/online_softmax.h). The descales fold in where they cost nothing: q's and k's into the score's
// multiplier, v's into the output's.
//
// D is the instance's padded head dim: head_dim and head_dim_v (each <= D) are read at run time and the tiles are
// zero-padded on load. The dtypes of q, the pools and the output are read at run time too (cpu/elements.h).
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "ja/api.h"
#include "ja/kernels/paged.h"
#include "ja/kernels/paged_rows.h"
#include "mha/cpu/common.h"
#include "mha/cpu/elements.h"
#include "mha/cpu/online_softmax.h"

namespace ja {

template <int D>
struct PagedAttnCpu {
  static constexpr int Br = 64;  // rows per tile
  static constexpr int Bc = 64;  // keys per tile

  struct Task {
    int64_t seq, kv_head, row0;
  };
  struct Job {
    const JaPagedAttnArgs* a;
    const Task* tasks;
  };

  struct Scratch {
    float q[Br * D];   // the rows' queries, times the score's multiplier
    float kt[D * Bc];  // key tile, transposed
    float v[Bc * D];   // value tile
    mha_cpu::OnlineSoftmax<Br, Bc, D> sm;
  };

  template <typename V>
  JA_CPU_INLINE static void tile(const JaPagedAttnArgs& a, const Task& t, Scratch& w) {
    using namespace mha_cpu;
    const JaPagedKv& kv = a.kv;
    const int64_t s = t.seq, hk = t.kv_head, hq = a.heads_q, hkv = kv.heads_kv, group = hq / hkv;
    const int dq = int(kv.head_dim), dv = int(kv.head_dim_v);
    const int64_t q_begin = a.cu_seqlens_q[s], seq_q = a.cu_seqlens_q[s + 1] - q_begin;
    const int64_t seq_k = paged_seq_k(kv, s);
    const int rows = int(std::min<int64_t>(Br, seq_q * group - t.row0));
    const float qk_mul = (a.softcap > 0.0f ? a.scale / a.softcap : a.scale * kLog2e) *
                         paged_descale(a.q_descale, s, hk) * paged_descale(a.k_descale, s, hk);
    const ScoreTerms terms{a.softcap > 0.0f ? a.softcap * kLog2e : 0.0f, 0.0f, nullptr, seq_k};
    const int32_t q_elem = int32_t(dtype_size(a.q_dtype)), kv_elem = int32_t(dtype_size(kv.dtype));
    const int64_t pool_row = hkv * dq;  // elements from one pool row (token) of K to the next
    const int64_t pool_row_v = hkv * dv;
    auto token = [&](int r) { return (t.row0 + r) / group; };
    auto head = [&](int r) { return hk * group + (t.row0 + r) % group; };
    auto& sm = w.sm;

    for (int r = 0; r < Br; ++r) {
      if (r < rows) {
        const char* src = static_cast<const char*>(a.q) + ((q_begin + token(r)) * hq + head(r)) * dq * q_elem;
        load_row_as<D>(w.q + r * D, src, a.q_dtype, dq, qk_mul);
      } else {
        std::fill(w.q + r * D, w.q + (r + 1) * D, 0.0f);
      }
    }
    sm.reset();
    sm.rows.init_with(
        rows, seq_k, [&](int r) { return paged_row(token(r), seq_q, seq_k, a.causal, a.window_left, a.window_right); });

    // Keys outside [kv_lo, kv_hi) are seen by no row of the tile: never loaded.
    for (int64_t kv0 = sm.rows.kv_lo; kv0 < sm.rows.kv_hi; kv0 += Bc) {
      const int nk = int(std::min<int64_t>(Bc, sm.rows.kv_hi - kv0));
      for (int j = 0; j < Bc; ++j) {
        if (j < nk) {
          const int64_t slot = paged_slot(kv, s, kv0 + j);
          const char* k = static_cast<const char*>(kv.k_pool) + (slot * pool_row + hk * dq) * kv_elem;
          const char* v = static_cast<const char*>(kv.v_pool) + (slot * pool_row_v + hk * dv) * kv_elem;
          load_col_as<D>(w.kt, Bc, j, k, kv.dtype, dq);
          load_row_as<D>(w.v + j * D, v, kv.dtype, dv, 1.0f);
        } else {
          for (int c = 0; c < D; ++c) w.kt[c * Bc + j] = 0.0f;
          std::fill(w.v + j * D, w.v + (j + 1) * D, 0.0f);
        }
      }
      sm.template add<V>(w.q, w.kt, w.v, kv0, nk, 0, terms, NoDropout{});
    }

    const float v_mul = paged_descale(a.v_descale, s, hk);
    const int32_t o_elem = int32_t(dtype_size(a.out_dtype));
    for (int r = 0; r < rows; ++r) {
      const int64_t row = q_begin + token(r), h = head(r);
      store_row_as(static_cast<char*>(a.out) + (row * hq + h) * dv * o_elem, a.out_dtype, sm.o + r * D, dv,
                   sm.out_mul(r) * v_mul);
      if (a.lse) a.lse[h * a.total_q + row] = sm.lse(r);
    }
  }

  template <typename V>
  JA_CPU_INLINE static void tasks(const Job& job, int64_t t0, int64_t t1) {
    auto w = std::make_unique<Scratch>();
    for (int64_t i = t0; i < t1; ++i) tile<V>(*job.a, job.tasks[i], *w);
  }

  // Rows past the last sequence's queries belong to no sequence: output 0, lse +inf.
  static void clear_unowned_rows(const JaPagedAttnArgs& a) {
    const int64_t first = a.cu_seqlens_q[a.kv.num_seqs], dv = a.kv.head_dim_v, o_elem = dtype_size(a.out_dtype);
    const std::vector<float> zeros(size_t(dv), 0.0f);
    for (int64_t row = first; row < a.total_q; ++row)
      for (int64_t h = 0; h < a.heads_q; ++h) {
        char* o = static_cast<char*>(a.out) + (row * a.heads_q + h) * dv * o_elem;
        mha_cpu::store_row_as(o, a.out_dtype, zeros.data(), int(dv), 0.0f);
        if (a.lse) a.lse[h * a.total_q + row] = mha_cpu::kInf;
      }
  }

  static const char* run(const JaPagedAttnArgs& a) {
    const int64_t group = a.heads_q / a.kv.heads_kv;
    std::vector<Task> work;
    for (int64_t s = 0; s < a.kv.num_seqs; ++s) {
      const int64_t rows = int64_t(a.cu_seqlens_q[s + 1] - a.cu_seqlens_q[s]) * group;
      for (int64_t hk = 0; hk < a.kv.heads_kv; ++hk)
        for (int64_t r0 = 0; r0 < rows; r0 += Br) work.push_back(Task{s, hk, r0});
    }
    mha_cpu::run_tasks<PagedAttnCpu>(Job{&a, work.data()}, int64_t(work.size()));
    clear_unowned_rows(a);
    return nullptr;
  }
};

}  // namespace ja
