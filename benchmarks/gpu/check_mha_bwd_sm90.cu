// Standalone check and timing of the Hopper attention backward (csrc/kernels/mha/sm90/bwd_kernel.cuh; head dims
// 192 and 256: sm90/bwd_kernel_d256.cuh) against a float64 host reference, with every feature it takes; no JAX.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/kernels -Ibenchmarks/gpu -isystem <nvidia-cutlass>/cutlass_library/source/include \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 -DNDEBUG benchmarks/gpu/check_mha_bwd_sm90.cu -o check_mha_bwd_sm90
//   ./check_mha_bwd_sm90 [reps] [filter]        (-DJA_CHK_ONLY_D=128: the bf16 d128 kernels alone, mha_sm90_check.h)
//     reps 0: the checks only; filter: run only the checks and timings whose name holds it ("-": no check)
//
// o and lse come from the float64 reference (o rounded to the input dtype). The outputs are filled with NaN
// first; the entry point the dispatch would call (sm90/dims.h) must take the call; each gradient is
// compared by ||x - ref|| / ||ref|| with the bounds of tests/ops/reference.py (bfloat16 1e-2, float16
// 2e-3). Every check runs the default backward and the deterministic one three times: the three must agree
// bit for bit (dq, dk, dv) and with float64. The timings give the whole backward (preprocess, main kernel,
// dQ conversion) in ms and TFLOP/s (FLOPs of the visible pairs: 2 * (3 d + 2 dv) each), and each feature's
// ratio to the plain backward on the same shape: the issue-56 targets.
#include <cstdlib>

#include "mha/sm90/bwd_launch.cuh"
#include "mha_sm90_check.h"

using namespace chk;
using RunFn = const char* (*)(const JaMhaBwdArgs*, void*, int*);

template <typename T, int D, bool C>
const char* run(const JaMhaBwdArgs* a, void* s, int* handled) {
  return ja::mha_sm90::mha_bwd_sm90<T, D, C>(*a, s, handled);
}

// The instances this harness is built with (the dispatch's rule, sm90/dims.h): bfloat16 at every
// instance head dim, float16 at 64 and 128.
static RunFn pick(const Problem& p) {
  const int D = ja::mha_sm90::sm90_instance_head_dim(p.d, p.dv);
  const bool c = p.mask == ja::kMaskCausal;
#define P(T, DD)                \
  if constexpr (built<T, DD>()) \
    if (D == DD) return c ? run<T, DD, true> : run<T, DD, false>;
  if (p.bf) {
    P(ja::bf16_t, 64) P(ja::bf16_t, 96) P(ja::bf16_t, 128) P(ja::bf16_t, 256)
  } else {
    P(ja::f16_t, 64) P(ja::f16_t, 128)
  }
#undef P
  return nullptr;
}

static JaMhaBwdArgs args(const Problem& p, const Dev& m, bool deterministic) {
  JaMhaBwdArgs a{};
  a.p = problem(p, m);
  a.deterministic = deterministic;
  a.q = m.q, a.k = m.k, a.v = m.v, a.o = m.o, a.dout = m.g, a.lse = m.lse;
  a.cols = m.cols, a.cols_batch_stride = p.rows_batch == 1 ? 0 : 2 * int64_t(p.sk);
  a.dq = m.dq, a.dk = m.dk, a.dv = m.dv, a.dq_accum = m.acc, a.delta = m.delta;
  a.sync = deterministic ? m.sync : nullptr, a.sync_words = deterministic ? m.sync_words : 0;
  return a;
}

static bool check(const Problem& p, uint32_t seed) {
  RunFn f = pick(p);
  if (left_out(f != nullptr, p.name, "  ")) return true;
  Dev m(p, true);
  const Host x = host_data(p, seed);
  m.upload(p, x);
  const Ref r = reference(p, x, true);
  p.bf ? Dev::up<ja::bf16_t>(m.o, r.o) : Dev::up<ja::f16_t>(m.o, r.o);
  std::vector<float> lse(r.lse.begin(), r.lse.end());
  CK(cudaMemcpy(m.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  const double bound = p.bf ? 1e-2 : 2e-3;
  bool ok = true;
  std::vector<double> first[3];
  std::printf("%-28s %s b%d sq%-4d sk%-4d h%d/%d d%d/%d mask%d:", p.name.c_str(), p.bf ? "bf16" : "f16 ", p.b, p.sq,
              p.sk, p.hq, p.hkv, p.d, p.dv, p.mask);
  for (int run_i = 0; run_i < 4; ++run_i) {  // 0: default; 1-3: deterministic
    const bool det = run_i > 0;
    const JaMhaBwdArgs a = args(p, m, det);
    CK(cudaMemset(m.dq, 0xff, m.nq * 2));  // NaN
    CK(cudaMemset(m.dk, 0xff, m.nk * 2));
    CK(cudaMemset(m.dv, 0xff, m.nv * 2));
    CK(cudaMemset(m.acc, 0xff, m.nq * 4));
    if (det) CK(cudaMemset(m.sync, 0x7f, size_t(m.sync_words) * 4));  // garbage: the kernel sets what it uses
    int handled = 0;
    const char* err = f ? f(&a, nullptr, &handled) : "no instance in this harness";
    CK(cudaDeviceSynchronize());
    if (err || !handled) {
      std::printf(" FAIL (%s)\n", err ? err : "not handled");
      return false;
    }
    const std::vector<double> g[3] = {m.get(p, m.dq, m.nq), m.get(p, m.dk, m.nk), m.get(p, m.dv, m.nv)};
    const std::vector<double>* ref[3] = {&r.dq, &r.dk, &r.dv};
    const char* names[3] = {"dq", "dk", "dv"};
    if (run_i <= 1) {
      std::printf(" %s", det ? "| det" : "");
      for (int i = 0; i < 3; ++i) {
        const double e = rel_err(*ref[i], g[i]);
        const bool good = e < bound;  // NaN fails
        ok &= good;
        std::printf(" %s %.2e%s", names[i], e, good ? "" : " FAIL");
      }
    }
    if (run_i == 1) {
      for (int i = 0; i < 3; ++i) first[i] = g[i];
    } else if (run_i > 1) {
      bool same = true;
      for (int i = 0; i < 3; ++i) same &= std::memcmp(first[i].data(), g[i].data(), g[i].size() * 8) == 0;
      if (!same) std::printf(" | run %d differs FAIL", run_i);
      ok &= same;
    }
  }
  std::printf(" | det x3 bitwise %s\n", ok ? "ok" : "FAIL");
  return ok;
}

// The feature checks: each mask, softcap, ALiBi, GQA, head dims, and the combinations users run.
static std::vector<Problem> checks() {
  std::vector<Problem> v;
  v.push_back(dense("dense gqa", 2, 200, 333, 4, 2, 128, 128, false));
  v.push_back(dense("causal sq>sk", 1, 333, 200, 4, 1, 128, 128, true));
  v.push_back(dense("causal f16", 1, 300, 300, 2, 2, 128, 128, true, false));
  v.push_back(dense("d64 causal", 2, 190, 257, 4, 4, 64, 64, true));
  v.push_back(window("window causal", 2, 333, 333, 4, 2, 128, 64, 0));
  v.push_back(window("window both f16", 1, 400, 400, 2, 1, 64, 100, 50, false));
  v.push_back(window("window (0,0)", 1, 300, 300, 2, 2, 128, 0, 0));
  v.push_back(varlen("varlen causal (empty seq)", {0, 0, 77, 377, 378, 628}, {0, 0, 77, 377, 378, 628}, 640, 640, 4, 2,
                     128, -1, 0));
  v.push_back(varlen("varlen q!=k", {0, 50, 250, 260}, {0, 100, 150, 500}, 260, 500, 4, 2, 128, -1, -1));
  v.push_back(varlen("varlen causal window", {0, 300, 310, 700}, {0, 300, 310, 700}, 700, 700, 2, 2, 128, 64, 0));
  v.push_back(segments("segments causal", 2, 400, 4, 2, 64, true, 7));
  {
    Problem p = dense("softcap causal", 1, 400, 400, 4, 4, 128, 128, true);
    p.softcap = 5.0f;
    v.push_back(p);
  }
  {
    Problem p = dense("alibi gqa", 2, 300, 300, 4, 2, 128, 128, false);
    with_alibi(p, 2);
    v.push_back(p);
  }
  {
    Problem p = window("d256 window softcap", 1, 300, 300, 2, 1, 256, 128, 0);
    p.softcap = 8.0f;
    v.push_back(p);
  }
  {
    Problem p = varlen("varlen alibi softcap", {0, 200, 450}, {0, 200, 450}, 450, 450, 4, 1, 128, -1, 0);
    p.softcap = 6.0f;
    with_alibi(p, 1);
    v.push_back(p);
  }
  v.push_back(dense("d40", 1, 300, 300, 2, 2, 40, 40, false));
  v.push_back(dense("d80 causal", 1, 300, 300, 2, 1, 80, 80, true));
  v.push_back(dense("d96 causal", 1, 257, 300, 4, 2, 96, 96, true));
  v.push_back(window("d112 window", 1, 300, 300, 2, 2, 112, 64, 0));
  {
    Problem p = dense("d160 causal alibi", 1, 300, 300, 2, 2, 160, 160, true);
    with_alibi(p, 1);
    v.push_back(p);
  }
  v.push_back(dense("d192/128 causal", 2, 257, 300, 4, 2, 192, 128, true));
  v.push_back(dense("d192", 1, 300, 300, 2, 2, 192, 192, false));
  v.push_back(dense("d256 causal", 2, 129, 421, 4, 2, 256, 256, true));
  v.push_back(varlen("d256 varlen", {0, 100, 400}, {0, 100, 400}, 400, 400, 2, 2, 256, -1, 0));
  v.push_back(window("decode window", 2, 1, 1000, 8, 2, 128, 256, 0));
  return v;
}

struct Timed {
  Problem p;
  std::string base;  // the timing this one is compared with ("": none)
  double target;     // the issue's bound on the ratio printed (0: none)
  bool det;          // the deterministic backward
};

// The issue-56 timings, as check_mha_fwd_sm90.cu's, plus the deterministic backward against the default.
static std::vector<Timed> timings() {
  std::vector<Timed> t;
  const int S = 16384, H = 32;
  t.push_back({dense("t dense", 1, S, S, H, H, 128, 128, false), "", 0, false});
  t.push_back({dense("t causal", 1, S, S, H, H, 128, 128, true), "", 0, false});
  // The perf gate's attention case (bench_gpu.py --quick: batch 4, 1k tokens, 32 heads of 128), whose fixed
  // costs (the preprocess, the dQ conversion, a block's prologue and epilogue) weigh more than at 16k.
  t.push_back({dense("t b4 1k", 4, 1024, 1024, H, H, 128, 128, false), "", 0, false});
  t.push_back({dense("t b4 1k causal", 4, 1024, 1024, H, H, 128, 128, true), "", 0, false});
  const std::vector<int> cu = doc_bounds();
  t.push_back({varlen("t varlen causal", cu, cu, S, S, H, H, 128, -1, 0), "t causal", 0.9, false});
  t.push_back({varlen("t varlen", cu, cu, S, S, H, H, 128, -1, -1), "t dense", 0.9, false});
  for (int w : {1024, 4096}) {
    t.push_back({window("t window causal " + std::to_string(w), 1, S, S, H, H, 128, w, 0), "t dense", 1.2, false});
    t.push_back({window("t window " + std::to_string(w), 1, S, S, H, H, 128, w, w), "t dense", 1.2, false});
  }
  for (bool c : {true, false}) {
    const std::string n = c ? "t causal" : "t dense";
    Problem p = dense(n + " softcap", 1, S, S, H, H, 128, 128, c);
    p.softcap = 50.0f;
    t.push_back({p, n, 1.15, false});
    Problem a = dense(n + " alibi", 1, S, S, H, H, 128, 128, c);
    with_alibi(a, 1);
    t.push_back({a, n, 1.1, false});
  }
  for (const char* n : {"t dense", "t causal", "t varlen causal"}) {
    Problem p = std::string(n) == "t varlen causal" ? varlen(n, cu, cu, S, S, H, H, 128, -1, 0)
                                                    : dense(n, 1, S, S, H, H, 128, 128, std::string(n) == "t causal");
    p.name = std::string(n) + " det";
    t.push_back({p, n, 1.3, true});
  }
  {
    Problem g = dense("t causal gqa 32/8", 1, S, S, H, 8, 128, 128, true);
    t.push_back({g, "", 0, false});
    Problem gd = g;
    gd.name = "t causal gqa 32/8 det";
    t.push_back({gd, "t causal gqa 32/8", 1.3, true});
  }
  for (int d : {64, 96, 128, 192, 256})
    t.push_back({dense("t d" + std::to_string(d), 2, 8192, 8192, 16, 16, d, d, false), "", 0, false});
  for (int d : {40, 80, 112, 160, 192}) {
    const int next = d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : 256;
    t.push_back({dense("t hd" + std::to_string(d), 2, 8192, 8192, 16, 16, d, d, false), "t d" + std::to_string(next),
                 0.85, false});
  }
  t.push_back({dense("t d192/128 causal", 2, 8192, 8192, 16, 16, 192, 128, true), "", 0, false});
  t.push_back({window("t d256 window4k", 1, 8192, 8192, 16, 8, 256, 4096, 0), "", 0, false});
  {
    Problem s = window("t d256 window4k softcap", 1, 8192, 8192, 16, 8, 256, 4096, 0);
    s.softcap = 50.0f;
    t.push_back({s, "t d256 window4k", 1.15, false});
  }
  {
    Problem g = dense("t d256 causal", 2, 8192, 8192, 16, 8, 256, 256, true);
    t.push_back({g, "", 0, false});
    Problem gd = g;
    gd.name = "t d256 causal det";
    t.push_back({gd, "t d256 causal", 1.3, true});
  }
  return t;
}

static double flops(const Problem& p) {
  return 2.0 * p.b * p.hq * double(p.sq) * p.sk * (3 * p.d + 2 * p.dv) * p.flops_scale;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::string filter = argc > 2 ? argv[2] : "";
  int fails = 0, ran = 0;
  uint32_t seed = 4321;
  for (const Problem& p : checks())
    if (filter.empty() || p.name.find(filter) != std::string::npos) fails += !check(p, seed++), ++ran;
  if (reps > 0) {
    const std::vector<Timed> all = timings();
    std::vector<float> ms(all.size(), 0.0f);
    auto base_of = [&](const std::string& n) -> int {
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i].p.name == n && ms[i] > 0) return int(i);
      return -1;
    };
    for (size_t i = 0; i < all.size(); ++i) {
      const Timed& t = all[i];
      const Problem& p = t.p;
      if (!filter.empty() && filter != "-" && p.name.find(filter) == std::string::npos) continue;
      RunFn f = pick(p);
      if (left_out(f != nullptr, p.name, "time ")) continue;  // before its buffers are allocated
      Dev m(p, true);
      m.hash_fill<ja::bf16_t>(77);
      fill_random<ja::bf16_t><<<1024, 256>>>(static_cast<ja::bf16_t*>(m.o), int64_t(m.no), 78);
      std::vector<float> lse(m.nl, 12.0f);  // a plausible log-sum-exp for these inputs: no overflow in P
      CK(cudaMemcpy(m.lse, lse.data(), m.nl * 4, cudaMemcpyHostToDevice));
      const JaMhaBwdArgs a = args(p, m, t.det);
      int handled = 0;
      ms[i] = time_ms(reps, [&] {
        const char* e = f ? f(&a, nullptr, &handled) : "no instance";
        if (e || !handled) std::printf("%s: %s\n", p.name.c_str(), e ? e : "not handled"), std::exit(2);
      });
      std::printf("time %-26s %8.3f ms %7.1f TFLOP/s (visible %.3f)", p.name.c_str(), ms[i], flops(p) / ms[i] * 1e-9,
                  p.flops_scale);
      const int bi = t.base.empty() ? -1 : base_of(t.base);
      if (bi >= 0) {
        const double rate = flops(p) / ms[i], rate_b = flops(all[bi].p) / ms[bi];
        if (t.target == 1.2)
          std::printf("  time / (visible x %s) %.3f (target <= 1.2)", t.base.c_str(), ms[i] / (p.flops_scale * ms[bi]));
        else if (t.target < 1.0)
          std::printf("  FLOP rate / %s's %.3f (target >= %.2f)", t.base.c_str(), rate / rate_b, t.target);
        else std::printf("  time / %s's %.3f (target <= %.2f)", t.base.c_str(), ms[i] / ms[bi], t.target);
      }
      std::printf("\n");
    }
  }
  std::printf("%s: %d of %d checks failing\n", fails ? "FAIL" : "PASS", fails, ran);
  return fails ? 1 : 0;
}
