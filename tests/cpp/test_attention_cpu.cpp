// CPU paged attention (include/decodekit/attention/cpu.h and the vector kernel it routes to:
// cpu_avx512.h, cpu_avx2.h, or the scalar attend_block) vs. a float64 reference over the same
// paged cache: decodes and prefill chunks mixed in one batch (chunks that start mid-block), GQA
// groups 1 / 3 / 4 / 8, head_dim 64 / 96 (scalar path) / 128, block sizes 16 / 32, fp32 / fp16 / bf16
// queries over caches of the same type or fp8 e4m3 with per-head scales, block tables that are a
// random permutation of the pool, outputs poisoned first, the log-sum-exp too.
//
// CMake builds this file for -march=native, x86-64-v3 (AVX2, no AVX-512; skipped, exit 77, on CPUs
// without AVX2) and plain x86-64, so every CI machine checks every path (the Python tests only see
// the one -march=native picks).
//
// Tolerance: the kernel works in fp32 on the values it reads (the reference uses the same cache
// values in float64, and the queries rounded to T as the kernel reads them): the output is a convex
// combination of V rows, so |err| <= (c1 * max_j |s_j| + c2) * 2^-24 * ctx-ish terms; we bound it by
// 2e-5 * max |v| (fp32 accumulation over <= 1100 keys, exp to a few ulp) plus the output's rounding
// to T (eps_T * |out|). lse: 1e-5 * (1 + |lse|).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "check.h"
#include "decodekit/attention/cpu.h"

using namespace dk_test;

namespace {

struct Case {
  int Hq, Hk, D, bs;
  std::vector<int> ctx, n;  // per sequence: context length incl. new tokens, new tokens
};

template <class C> C cache_from(double x, float scale) {
  if constexpr (dk::kIsFp8<C>) return C{dk::quantize_fp8_e4m3(float(x), scale)};
  else return from_d<C>(x);
}
template <class C> double cache_to(const C& c, float scale) {
  if constexpr (dk::kIsFp8<C>) return double(dk::fp8_e4m3_to_float(c.bits)) * scale;
  else return to_d(c);
}

template <class T, class C>
void run_case(Rng& rng, const Case& cs) {
  const int S = int(cs.ctx.size()), Hq = cs.Hq, Hk = cs.Hk, D = cs.D, bs = cs.bs, group = Hq / Hk;
  std::vector<int32_t> qstart(size_t(S) + 1, 0), seq_lens(cs.ctx.begin(), cs.ctx.end());
  for (int s = 0; s < S; ++s) qstart[size_t(s) + 1] = qstart[size_t(s)] + cs.n[size_t(s)];
  const int64_t NT = qstart[size_t(S)];
  int max_blocks = 0, total_blocks = 0;
  for (int s = 0; s < S; ++s) {
    max_blocks = std::max(max_blocks, (cs.ctx[size_t(s)] + bs - 1) / bs);
    total_blocks += (cs.ctx[size_t(s)] + bs - 1) / bs;
  }
  const int pool = total_blocks + 3;
  std::vector<int32_t> perm(static_cast<size_t>(pool));
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = pool - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.u32() % uint32_t(i + 1))]);
  std::vector<int32_t> tables(size_t(S) * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < (cs.ctx[size_t(s)] + bs - 1) / bs; ++b) tables[size_t(s) * max_blocks + b] = perm[size_t(next++)];
  const dk::PagedLayout L{Hk, bs, D};
  std::vector<float> ks(static_cast<size_t>(Hk), 1.f), vs(static_cast<size_t>(Hk), 1.f);
  if constexpr (dk::kIsFp8<C>)
    for (int h = 0; h < Hk; ++h) {
      ks[size_t(h)] = float(rng.uniform(0.005, 0.02));
      vs[size_t(h)] = float(rng.uniform(0.005, 0.02));
    }
  const size_t cache_elems = size_t(pool) * Hk * bs * D;
  std::vector<C> kc(cache_elems), vc(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) {
    const int h = int((i / (size_t(bs) * D)) % size_t(Hk));
    kc[i] = cache_from<C>(rng.normal(), ks[size_t(h)]);
    vc[i] = cache_from<C>(rng.normal(), vs[size_t(h)]);
  }
  std::vector<T> q(size_t(NT) * Hq * D), out(size_t(NT) * Hq * D, poison<T>());
  for (auto& x : q) x = from_d<T>(rng.normal());
  std::vector<float> lse(size_t(NT) * Hq, NAN);
  const float scale = float(1.0 / std::sqrt(double(D)));
  dk::cpu::PagedAttentionParams P{NT, S, Hq, max_blocks, int64_t(Hq) * D, scale, L};
  const dk::KVScales kvs = dk::kIsFp8<C> ? dk::KVScales{ks.data(), vs.data(), 1, 1} : dk::KVScales{};
  dk::cpu::paged_attention<T, C>(out.data(), lse.data(), q.data(), kc.data(), vc.data(), tables.data(), seq_lens.data(),
                                 qstart.data(), P, kvs);
  std::vector<double> sc, acc(static_cast<size_t>(D));
  for (int s = 0; s < S; ++s)
    for (int64_t t = qstart[size_t(s)]; t < qstart[size_t(s) + 1]; ++t) {
      const int64_t last = dk::causal_last_key(cs.ctx[size_t(s)], cs.n[size_t(s)], t - qstart[size_t(s)]);
      for (int hq = 0; hq < Hq; ++hq) {
        const int h = hq / group;
        const T* qr = q.data() + (t * Hq + hq) * D;
        sc.assign(size_t(last + 1), 0.0);
        double mx = -INFINITY, vmax = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const int64_t row = L.row(tables[size_t(s) * max_blocks + j / bs], h, int(j % bs));
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += to_d(qr[d]) * cache_to(kc[size_t(row + d)], ks[size_t(h)]);
          sc[size_t(j)] = dot * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          const double p = std::exp(sc[size_t(j)] - mx);
          l += p;
          const int64_t row = L.row(tables[size_t(s) * max_blocks + j / bs], h, int(j % bs));
          for (int d = 0; d < D; ++d) {
            const double v = cache_to(vc[size_t(row + d)], vs[size_t(h)]);
            acc[size_t(d)] += p * v;
            vmax = std::max(vmax, std::fabs(v));
          }
        }
        for (int d = 0; d < D; ++d) {
          const double want = acc[size_t(d)] / l;
          const double got = to_d(out[size_t((t * Hq + hq) * D + d)]);
          CHECK_NEAR(got, want, 2e-5 * vmax + TypeInfo<T>::eps * std::fabs(want) + TypeInfo<T>::tiny)
              << TypeInfo<T>::name << (dk::kIsFp8<C> ? "kv=fp8" : "") << "heads" << Hq << "/" << Hk << "D" << D
              << "bs" << bs << "seq" << s << "token" << t << "head" << hq << "d" << d;
        }
        const double want_lse = mx + std::log(l);
        CHECK_NEAR(double(lse[size_t(t * Hq + hq)]), want_lse, 1e-5 * (1 + std::fabs(want_lse)))
            << "lse" << TypeInfo<T>::name << "seq" << s << "token" << t << "head" << hq;
      }
    }
}

template <class T>
void run_all_caches(Rng& rng, const Case& c) {
  run_case<T, T>(rng, c);
  run_case<T, dk::fp8_e4m3_t>(rng, c);
  if constexpr (std::is_same_v<T, float>) {  // a float32 model's 16-bit cache (--kv-cache-dtype bfloat16|float16)
    run_case<T, dk::bf16_t>(rng, c);
    run_case<T, dk::half_t>(rng, c);
  }
}

}  // namespace

int main() {
  skip_without_avx2("test_attention_cpu");
  Rng rng(11);
  // decodes (1 new token), prefill chunks that start mid-block, a whole prompt, a single-key sequence
  const std::vector<int> ctx = {1, 17, 33, 200, 61, 1100}, n = {1, 1, 9, 1, 40, 3};
  const Case cases[] = {
      {9, 3, 64, 16, ctx, n}, {32, 8, 128, 16, ctx, n}, {8, 8, 128, 32, ctx, n},
      {4, 1, 64, 32, ctx, n}, {6, 2, 96, 16, {5, 40}, {5, 3}},  // head_dim 96: the scalar path
  };
  for (const Case& c : cases) {
    run_all_caches<float>(rng, c);
    run_all_caches<dk::half_t>(rng, c);
    run_all_caches<dk::bf16_t>(rng, c);
  }
#if defined(__AVX512F__)
  std::printf("test_attention_cpu: AVX-512 kernel\n");
#elif defined(DK_ATTN_AVX2)
  std::printf("test_attention_cpu: AVX2 kernel\n");
#else
  std::printf("test_attention_cpu: scalar kernel\n");
#endif
  return finish("test_attention_cpu");
}
