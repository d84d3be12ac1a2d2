// ThreadSanitizer driver for the threaded CPU kernels (`nox -s tsan`, jatools/native/sanitize.py).
//
// ja::parallel_for (csrc/common/parallel.cpp) splits each kernel's rows over threads; XLA may also
// call a kernel from several of its own threads at once. This program calls every CPU kernel that
// way, with the libraries built by the ordinary native build under JA_SANITIZE=thread:
// librmsnorm_fwd.so, libmha_fwd.so and libmha_bwd.so through their C ABI, and SiLU-and-mul
// through its kernel header (its CPU kernel lives in its FFI shim, which has no C ABI). Four
// caller threads each run every kernel with JA_NUM_THREADS=4 inner threads, and each result must
// equal the one-thread reference; any data race aborts with a ThreadSanitizer report.
//
// It runs outside Python on purpose: jaxlib is not instrumented, and its own synchronisation
// (absl, LLVM) is invisible to ThreadSanitizer, so a Python process reports races inside jaxlib
// whose stacks also hold our frames; no suppression could tell those from ours.
//
//   build/sanitize-thread/tsan_driver [--plant-race]   (--plant-race: a deliberate race, to prove TSan is on)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "activation/silu_and_mul_cpu.h"
#include "ja/api.h"
#include "ja/kernels/mha.h"
#include "ja/kernels/rmsnorm.h"

namespace {

constexpr int kCallers = 4;
constexpr const char* kInnerThreads = "4";

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// One kernel case: run(outputs) fills its outputs from fixed inputs; returns the kernel's error or nullptr.
struct Case {
  std::string name;
  std::vector<size_t> out_sizes;
  std::function<const char*(std::vector<std::vector<float>>&)> run;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  {  // rms_norm and rms_norm_with_add
    const int64_t rows = 1024, hidden = 512;
    auto x = std::make_shared<std::vector<float>>(random_vec(rows * hidden, 1));
    auto r = std::make_shared<std::vector<float>>(random_vec(rows * hidden, 2));
    auto w = std::make_shared<std::vector<float>>(random_vec(hidden, 3));
    for (bool add : {false, true}) {
      out.push_back({add ? "rms_norm_with_add" : "rms_norm", {size_t(rows * hidden), size_t(rows * hidden)},
                     [=](std::vector<std::vector<float>>& o) {
                       JaRmsNormArgs a{0, rows, hidden, x->data(), add ? r->data() : nullptr, w->data(),
                                       o[0].data(), add ? o[1].data() : nullptr, 1e-6f};
                       return ja_rmsnorm_fwd_cpu(&a);
                     }});
    }
  }
  {  // silu_and_mul
    const int64_t rows = 1024, d = 512;
    auto x = std::make_shared<std::vector<float>>(random_vec(rows * 2 * d, 4));
    out.push_back({"silu_and_mul", {size_t(rows * d)}, [=](std::vector<std::vector<float>>& o) {
                     JaSiluAndMulArgs a{0, rows, d, x->data(), o[0].data()};
                     return ja::silu_and_mul_cpu<float>(a);
                   }});
  }
  {  // flash attention forward and backward, GQA, both mask kinds
    const int64_t b = 2, sq = 64, sk = 96, hq = 4, hkv = 2, hd = 64;
    const size_t nq = b * sq * hq * hd, nk = b * sk * hkv * hd, nl = b * hq * sq;
    auto q = std::make_shared<std::vector<float>>(random_vec(nq, 5));
    auto k = std::make_shared<std::vector<float>>(random_vec(nk, 6));
    auto v = std::make_shared<std::vector<float>>(random_vec(nk, 7));
    auto dout = std::make_shared<std::vector<float>>(random_vec(nq, 8));
    const float scale = 1.0f / std::sqrt(float(hd));
    for (int causal : {0, 1}) {
      std::string tag = causal ? " causal" : "";
      JaMhaProblem pr{};  // float32, dense or bottom-right causal (mask 0 or 1), no other feature
      pr.batch = b, pr.seq_q = sq, pr.seq_k = sk, pr.heads_q = hq, pr.heads_kv = hkv;
      pr.head_dim = pr.head_dim_v = hd, pr.mask = causal, pr.scale = scale;
      out.push_back({"mha_fwd" + tag, {nq, nl}, [=](std::vector<std::vector<float>>& o) {
                       JaMhaFwdArgs a{pr, q->data(), k->data(), v->data(), o[0].data(), o[1].data(),
                                      nullptr, 0};  // no workspace: the CPU kernel needs none
                       return ja_mha_fwd_cpu(&a);
                     }});
      // outputs: o, lse (forward, inputs of the backward), dq, dk, dv, then the two workspaces
      out.push_back({"mha_bwd" + tag, {nq, nl, nq, nk, nk, nq, nl}, [=](std::vector<std::vector<float>>& o) {
                       JaMhaFwdArgs f{pr, q->data(), k->data(), v->data(), o[0].data(), o[1].data(),
                                      nullptr, 0};  // no workspace: the CPU kernel needs none
                       if (const char* e = ja_mha_fwd_cpu(&f)) return e;
                       JaMhaBwdArgs a{};
                       a.p = pr;
                       a.q = q->data(), a.k = k->data(), a.v = v->data(), a.o = o[0].data();
                       a.dout = dout->data(), a.lse = o[1].data();
                       a.dq = o[2].data(), a.dk = o[3].data(), a.dv = o[4].data();
                       a.dq_accum = o[5].data(), a.delta = o[6].data();
                       return ja_mha_bwd_cpu(&a);
                     }});
    }
  }
  return out;
}

std::vector<std::vector<float>> fresh(const Case& c) {
  std::vector<std::vector<float>> o;
  for (size_t n : c.out_sizes) o.emplace_back(n, std::nanf(""));
  return o;
}

bool same(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want, size_t n_check) {
  for (size_t i = 0; i < n_check && i < got.size(); ++i) {
    for (size_t j = 0; j < got[i].size(); ++j) {
      const float g = got[i][j], w = want[i][j];
      if (std::isnan(w) && std::isnan(g)) continue;  // an output the case leaves unwritten on purpose
      if (!(std::fabs(g - w) <= 1e-5f * (1.0f + std::fabs(w)))) return false;
    }
  }
  return true;
}

int plant_race() {
  // Every chunk adds into one shared counter without synchronisation: ThreadSanitizer must report it.
  setenv("JA_NUM_THREADS", kInnerThreads, 1);
  long counter = 0;
  ja::parallel_for(1 << 16, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) counter += 1;
  });
  std::printf("tsan_driver: planted race ran (counter %ld); ThreadSanitizer should have reported it\n", counter);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--plant-race") == 0) return plant_race();
  const auto all = cases();
  // References with one thread, before any other thread exists (setenv is not thread-safe).
  setenv("JA_NUM_THREADS", "1", 1);
  std::vector<std::vector<std::vector<float>>> want;
  for (const auto& c : all) {
    want.push_back(fresh(c));
    if (const char* e = c.run(want.back())) {
      std::fprintf(stderr, "tsan_driver: %s failed: %s\n", c.name.c_str(), e);
      return 1;
    }
  }
  setenv("JA_NUM_THREADS", kInnerThreads, 1);
  std::vector<std::string> failures(kCallers);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (size_t i = 0; i < all.size(); ++i) {
        auto got = fresh(all[i]);
        const char* e = all[i].run(got);
        // mha_bwd's last two outputs are workspaces: compared only through what they produce
        const size_t n_check = all[i].name.rfind("mha_bwd", 0) == 0 ? 5 : got.size();
        if (e || !same(got, want[i], n_check)) {
          failures[t] += all[i].name + (e ? std::string(": ") + e : ": differs from the one-thread result") + "; ";
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  int bad = 0;
  for (int t = 0; t < kCallers; ++t) {
    if (!failures[t].empty()) {
      std::fprintf(stderr, "tsan_driver: caller %d: %s\n", t, failures[t].c_str());
      bad = 1;
    }
  }
  if (!bad) {
    std::printf("tsan_driver: %zu kernel cases x %d caller threads x %s inner threads: equal to the one-thread "
                "results, no data race reported\n", all.size(), kCallers, kInnerThreads);
  }
  return bad;
}
