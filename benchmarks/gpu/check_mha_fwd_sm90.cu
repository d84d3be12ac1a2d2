// Standalone check and timing of the Hopper attention forward (csrc/kernels/mha/sm90/fwd_kernel.cuh) against
// a float64 host reference, with every feature it takes; no JAX.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/kernels -Ibenchmarks/gpu -isystem <nvidia-cutlass>/cutlass_library/source/include \
//        -DJA_HAS_GPU=1 -DJA_BACKEND_CUDA=1 -DNDEBUG benchmarks/gpu/check_mha_fwd_sm90.cu -o check_mha_fwd_sm90
//   ./check_mha_fwd_sm90 [reps] [filter]        (-DJA_CHK_ONLY_D=128: the bf16 d128 kernels alone, mha_sm90_check.h)
//     reps 0: the checks only; filter: run only the checks and timings whose name holds it ("-": no check)
//
// Every check fills out and lse with NaN first (an unwritten element fails), runs the instance the
// dispatch would pick (sm90/dims.h) through its entry point (which must take the call), and compares
// out by ||out - ref|| / ||ref|| and lse by max |diff| against float64 (rows that see no key must be 0 and
// +inf). The timings give ms and TFLOP/s (FLOPs of the visible pairs, 4 * d per pair) of each feature and
// its ratio to the plain kernel on the same shape: the issue-56 targets.
#include <cstdlib>

#include "mha/sm90/fwd_launch.cuh"
#include "mha_sm90_check.h"

using namespace chk;
using RunFn = const char* (*)(const JaMhaFwdArgs*, void*, int*);

template <typename T, int D, bool C>
const char* run(const JaMhaFwdArgs* a, void* s, int* handled) {
  return ja::mha_sm90::mha_fwd_sm90<T, D, C>(*a, s, handled);
}
// The kernel itself, past the entry's rules (for decode shapes, which the entry leaves to the split-KV kernel).
template <typename T, int D, bool C>
const char* run_direct(const JaMhaFwdArgs* a, void* s, int* handled) {
  *handled = 1;
  return ja::mha_sm90::mha_fwd_sm90_terms<T, D, D, C>(*a, static_cast<cudaStream_t>(s));
}

// The instances this harness is built with (the dispatch's rule, sm90/dims.h): bfloat16 at every
// instance head dim, float16 at 64 and 128.
static RunFn pick(const Problem& p) {
  const int D = ja::mha_sm90::sm90_instance_head_dim(p.d, p.dv);
  const bool c = p.mask == ja::kMaskCausal;
  if constexpr (built<ja::bf16_t, 128>())
    if (p.name.find("(direct)") != std::string::npos && p.bf && D == 128 && p.d == 128 && p.dv == 128)
      return c ? run_direct<ja::bf16_t, 128, true> : run_direct<ja::bf16_t, 128, false>;
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

static JaMhaFwdArgs args(const Problem& p, const Dev& m) {
  JaMhaFwdArgs a{};
  a.p = problem(p, m);
  a.q = m.q, a.k = m.k, a.v = m.v, a.o = m.o, a.lse = m.lse;
  return a;
}

static bool check(const Problem& p, uint32_t seed) {
  RunFn f = pick(p);
  if (left_out(f != nullptr, p.name, "  ")) return true;
  Dev m(p, false);
  const Host x = host_data(p, seed);
  m.upload(p, x);
  const JaMhaFwdArgs a = args(p, m);
  CK(cudaMemset(m.o, 0xff, m.no * 2));  // NaN in both dtypes
  CK(cudaMemset(m.lse, 0xff, m.nl * 4));
  int handled = 0;
  const char* err = f ? f(&a, nullptr, &handled) : "no instance in this harness";
  CK(cudaDeviceSynchronize());
  if (err || !handled) {
    std::printf("%-28s FAIL (%s)\n", p.name.c_str(), err ? err : "not handled");
    return false;
  }
  const Ref r = reference(p, x, false);
  const std::vector<double> o = m.get(p, m.o, m.no);
  std::vector<float> l(m.nl);
  CK(cudaMemcpy(l.data(), m.lse, m.nl * 4, cudaMemcpyDeviceToHost));
  double lmax = 0;
  size_t bad = 0;
  for (size_t i = 0; i < m.nl; ++i) {
    if (std::isinf(r.lse[i])) bad += !(std::isinf(l[i]) && l[i] > 0);
    else if (!std::isfinite(l[i])) ++bad;
    else lmax = std::max(lmax, std::fabs(double(l[i]) - r.lse[i]));
  }
  for (double e : o) bad += !std::isfinite(e);
  const double rel = rel_err(r.o, o);
  const bool ok = bad == 0 && rel < (p.bf ? 1e-2 : 3e-3) && lmax < 8e-3;
  std::printf("%-28s %s b%d sq%-5d sk%-5d h%d/%d d%d/%d mask%d  rel %.2e  lse %.2e  bad %zu  %s\n", p.name.c_str(),
              p.bf ? "bf16" : "f16 ", p.b, p.sq, p.sk, p.hq, p.hkv, p.d, p.dv, p.mask, rel, lmax, bad,
              ok ? "ok" : "FAIL");
  return ok;
}

// The feature checks: each mask, softcap, ALiBi, GQA, head dims, and the combinations users run.
static std::vector<Problem> checks() {
  std::vector<Problem> v;
  v.push_back(dense("dense", 2, 300, 500, 4, 2, 128, 128, false));
  v.push_back(dense("causal sq>sk", 2, 513, 200, 4, 4, 128, 128, true));
  v.push_back(dense("causal f16", 1, 1000, 1000, 8, 1, 128, 128, true, false));
  v.push_back(window("window causal", 2, 333, 333, 4, 2, 64, 64, 0, false));
  v.push_back(window("window both", 1, 700, 700, 2, 1, 128, 100, 50));
  v.push_back(window("window (0,0)", 1, 300, 300, 2, 2, 128, 0, 0));
  v.push_back(window("window > seq", 1, 300, 260, 2, 2, 128, 5000, 5000));
  v.push_back(window("window right only", 1, 400, 500, 2, 2, 128, -1, 37));
  v.push_back(varlen("varlen causal (empty seq)", {0, 0, 77, 377, 378, 628}, {0, 0, 77, 377, 378, 628}, 640, 640, 4, 2,
                     128, -1, 0));
  v.push_back(varlen("varlen q!=k", {0, 50, 250, 260}, {0, 100, 150, 500}, 260, 500, 4, 2, 128, -1, -1));
  v.push_back(varlen("varlen causal window", {0, 300, 310, 700}, {0, 300, 310, 700}, 700, 700, 2, 2, 128, 64, 0));
  v.push_back(segments("segments causal", 2, 400, 4, 2, 64, true, 7));
  v.push_back(segments("segments", 2, 333, 2, 1, 128, false, 8));
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
    Problem p = dense("alibi gqa causal d64", 1, 257, 333, 8, 2, 64, 64, true);
    with_alibi(p, 1);
    v.push_back(p);
  }
  {
    Problem p = window("d256 window softcap", 1, 500, 500, 2, 1, 256, 128, 0);
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
  v.push_back(window("d112 window", 1, 300, 300, 2, 2, 112, 64, 0));
  {
    Problem p = dense("d160 causal alibi", 1, 300, 300, 2, 2, 160, 160, true);
    with_alibi(p, 1);
    v.push_back(p);
  }
  v.push_back(dense("d192/128 causal", 2, 257, 300, 4, 2, 192, 128, true));
  v.push_back(dense("d192", 1, 300, 300, 2, 2, 192, 192, false));
  v.push_back(dense("d128/64", 1, 300, 300, 2, 2, 128, 64, false));
  v.push_back(dense("d48 f16", 1, 300, 300, 2, 2, 48, 48, false, false));
  v.push_back(dense("d256 causal", 2, 129, 421, 4, 2, 256, 256, true));
  v.push_back(varlen("d256 varlen", {0, 100, 400}, {0, 100, 400}, 400, 400, 2, 2, 256, -1, 0));
  // Decode shapes: the entry leaves them to the split-KV kernel; the kernel itself must still be right.
  v.push_back(window("decode window (direct)", 2, 1, 1000, 8, 2, 128, 256, 0));
  v.push_back(varlen("decode varlen (direct)", {0, 1, 2}, {0, 300, 700}, 2, 700, 8, 2, 128, -1, 0));
  return v;
}

struct Timed {
  Problem p;
  std::string base;  // the timing this one is compared with ("": none)
  double target;     // the issue's bound on the ratio printed (0: none)
};

// The issue-56 timings: (problem, what it is compared with). Ratio = time / base's time, except for the
// windows (time / (unmasked fraction x dense time)), varlen and head dims (FLOP rate / base's FLOP rate).
static std::vector<Timed> timings() {
  std::vector<Timed> t;
  const int S = 16384, H = 32;
  t.push_back({dense("t dense", 1, S, S, H, H, 128, 128, false), "", 0});
  t.push_back({dense("t causal", 1, S, S, H, H, 128, 128, true), "", 0});
  const std::vector<int> cu = doc_bounds();
  t.push_back({varlen("t varlen causal", cu, cu, S, S, H, H, 128, -1, 0), "t causal", 0.9});
  t.push_back({varlen("t varlen", cu, cu, S, S, H, H, 128, -1, -1), "t dense", 0.9});
  for (int w : {1024, 4096}) {
    t.push_back({window("t window causal " + std::to_string(w), 1, S, S, H, H, 128, w, 0), "t dense", 1.2});
    t.push_back({window("t window " + std::to_string(w), 1, S, S, H, H, 128, w, w), "t dense", 1.2});
  }
  for (bool c : {true, false}) {
    const std::string n = c ? "t causal" : "t dense";
    Problem p = dense(n + " softcap", 1, S, S, H, H, 128, 128, c);
    p.softcap = 50.0f;
    t.push_back({p, n, 1.15});
    Problem a = dense(n + " alibi", 1, S, S, H, H, 128, 128, c);
    with_alibi(a, 1);
    t.push_back({a, n, 1.1});
  }
  // Head dims: b2 s8k h16, non-causal; 40, 80, 112, 160, 192 against the issue's next supported head dim
  // (64, 96, 128, 256, 256) at its own.
  for (int d : {64, 96, 128, 192, 256})
    t.push_back({dense("t d" + std::to_string(d), 2, 8192, 8192, 16, 16, d, d, false), "", 0});
  for (int d : {40, 80, 112, 160, 192}) {
    const int next = d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : 256;
    t.push_back(
        {dense("t hd" + std::to_string(d), 2, 8192, 8192, 16, 16, d, d, false), "t d" + std::to_string(next), 0.85});
  }
  t.push_back({dense("t d192/128 causal", 2, 8192, 8192, 16, 16, 192, 128, true), "", 0});
  // The Gemma-like shape (d256, window 4k, softcap 50, 8k): softcap against the same kernel without it.
  t.push_back({window("t d256 window4k", 1, 8192, 8192, 16, 8, 256, 4096, 0), "", 0});
  Problem s = window("t d256 window4k softcap", 1, 8192, 8192, 16, 8, 256, 4096, 0);
  s.softcap = 50.0f;
  t.push_back({s, "t d256 window4k", 1.15});
  return t;
}

// FLOPs of the visible pairs: 2 * (d + dv) each.
static double flops(const Problem& p) { return 2.0 * p.b * p.hq * double(p.sq) * p.sk * (p.d + p.dv) * p.flops_scale; }

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::string filter = argc > 2 ? argv[2] : "";
  int fails = 0, ran = 0;
  uint32_t seed = 1234;
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
      Dev m(p, false);
      m.hash_fill<ja::bf16_t>(99);
      const JaMhaFwdArgs a = args(p, m);
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
  if (reps > 0 && (filter.empty() || filter == "-" || filter == "emu")) {
    // The share of exp2 on the FMA pipe (exp2_fma): every EMU-th column, 0 none; softcap kernels (where
    // the multifunction unit does tanh and exp2) and the head-dim-64 kernel (where exp2 alone keeps pace
    // with the tensor cores), against the same problem's plain kernel.
    using L = const char* (*)(const JaMhaFwdArgs&, cudaStream_t);
    using B = ja::bf16_t;
    namespace s9 = ja::mha_sm90;
    struct Emu {
      Problem p;
      L fn[4];  // EMU 0, 2, 3, 4
    };
    const int S = 16384, H = 32;
    Problem sc = dense("e causal softcap", 1, S, S, H, H, 128, 128, true),
            sd = dense("e dense softcap", 1, S, S, H, H, 128, 128, false);
    sc.softcap = sd.softcap = 50.0f;
    const Emu emus[] = {
        {sc,
         {s9::mha_fwd_sm90_launch<B, 128, 128, true, true, false, 0>,
          s9::mha_fwd_sm90_launch<B, 128, 128, true, true, false, 2>,
          s9::mha_fwd_sm90_launch<B, 128, 128, true, true, false, 3>,
          s9::mha_fwd_sm90_launch<B, 128, 128, true, true, false, 4>}},
        {sd,
         {s9::mha_fwd_sm90_launch<B, 128, 128, false, true, false, 0>,
          s9::mha_fwd_sm90_launch<B, 128, 128, false, true, false, 2>,
          s9::mha_fwd_sm90_launch<B, 128, 128, false, true, false, 3>,
          s9::mha_fwd_sm90_launch<B, 128, 128, false, true, false, 4>}},
        {dense("e d64", 2, 8192, 8192, 16, 16, 64, 64, false),
         {s9::mha_fwd_sm90_launch<B, 64, 64, false, false, false, 0>,
          s9::mha_fwd_sm90_launch<B, 64, 64, false, false, false, 2>,
          s9::mha_fwd_sm90_launch<B, 64, 64, false, false, false, 3>,
          s9::mha_fwd_sm90_launch<B, 64, 64, false, false, false, 4>}},
    };
    for (const Emu& e : emus) {
      Dev m(e.p, false);
      m.hash_fill<B>(99);
      const JaMhaFwdArgs a = args(e.p, m);
      std::printf("emu  %-22s", e.p.name.c_str());
      const int emu[4] = {0, 2, 3, 4};
      for (int i = 0; i < 4; ++i) {
        const float t_ms = time_ms(reps, [&] {
          if (const char* err = e.fn[i](a, nullptr)) std::printf("%s\n", err), std::exit(2);
        });
        std::printf("  EMU %d %.3f ms", emu[i], t_ms);
      }
      std::printf("\n");
    }
  }
  std::printf("%s: %d of %d checks failing\n", fails ? "FAIL" : "PASS", fails, ran);
  return fails ? 1 : 0;
}
