// Emulator test of include/decodekit/attention/paged.cuh (dk::cuda::reshape_and_cache and
// dk::cuda::paged_attention) against the CPU kernels of include/decodekit/attention/cpu.h
// and a float64 reference, on the cases of tests/ops/test_attention.py plus GPU-specific ones.
#include "shim.h"
#include "emu_types.h"
#include "decodekit/attention/paged.cuh"
#include "decodekit/attention/cpu.h"

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>

using namespace dk;
static std::mt19937 rng(123);
static int fails = 0, checks = 0, split_cases = 0, tc_cases = 0, tc_decode_cases = 0;
// paged_attention's decode kernel for half / bf16 (its tensor_core_decode argument): main runs both
static bool tc_decode = true;
static bool wgmma_prefill = false;  // paged_attention's prefill batches on the wgmma variant (the bad-metadata runs)

template <class T> float tol_abs() { return sizeof(T) == 4 ? 2e-5f : std::is_same_v<T, __half> ? 1e-3f : 8e-3f; }

template <class T> std::vector<T> randn(size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<T> v(n);
  for (auto& x : v) x = Conv<T>::store(d(rng));
  return v;
}
template <class T> T nanv() { return Conv<T>::store(NAN); }

struct Stat { double emu_cpu = 0, emu_ref = 0, cpu_ref = 0, lse_emu_cpu = 0, lse_emu_ref = 0, ulp_emu_cpu = 0, ulp_emu_ref = 0, ulp_cpu_ref = 0; long n = 0; };
// One unit in the last place of the storage type T at x (normal range; subnormals use the min exponent).
// Error scale of the tests' tolerance model (atol = rtol): eps(T) * (1 + |x|), eps = ulp at 1.
template <class T> double ulp(double x) {
  const int mant = sizeof(T) == 4 ? 23 : std::is_same_v<T, __half> ? 10 : 7;
  return std::ldexp(1.0, -mant) * (1 + std::fabs(x));
}
static std::map<std::string, Stat> stats;  // per dtype

struct Case {
  std::vector<int> ctx, nnew;
  int hq, hk, d, bs;
  int splits = 0;          // 0: the launcher's plan for 132 SMs; > 0 forced (split-KV)
  int fp8 = 0;             // 1: fp8 e4m3 cache with per-head scales (2: one scale per tensor)
  int q_pad = 0;           // extra elements per query token row (strided query)
  bool with_lse = true;
  int pad_tokens = 0;      // tokens past query_start_loc[S] (out 0, lse -inf)
  bool force_tc = false;   // call the tensor-core kernel (paged_prefill) directly, whatever the batch
  int tc_warps = 0;        // force_tc: the prefill kernel's warps a CTA (4 / 8; 0: the launcher's choice)
  bool wgmma = false;      // force_tc: the prefill kernel's wgmma variant
  float q_mag = 1.f;       // queries times this (fp16: at most 1e4, its range)
  float scale_mul = 1.f;   // softmax scale times this (negative: the kernels flip Q's signs; 0: uniform weights)
  int window = 0;          // sliding window (0: none); the blocks before each sequence's first window
                           // point at a NaN-filled block, so reading them shows
  std::string name;
};

// Returns false on failure (and prints why).
template <class T, class KV> void run_attention_impl(const Case& c) {
  using C = typename Cpu<T>::type;
  constexpr bool FP8 = std::is_same_v<KV, fp8_e4m3_t>;
  using CK = std::conditional_t<FP8, fp8_e4m3_t, C>;  // the CPU kernel's cache type
  const int S = int(c.ctx.size()), D = c.d, bs = c.bs, Hq = c.hq, Hk = c.hk, group = Hq / Hk;
  std::vector<int> need(S);
  int total = 0, maxb = 0;
  for (int s = 0; s < S; ++s) { need[s] = (c.ctx[s] + bs - 1) / bs; total += need[s]; maxb = std::max(maxb, need[s]); }
  maxb += 1;
  const int num_blocks = total + 4;  // the last one: the NaN block of window cases
  std::vector<int> perm(num_blocks - 1);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> bt(size_t(S) * maxb, -7);
  for (int s = 0, used = 0; s < S; ++s) {
    // blocks wholly before the first new token's window are never read: NaN block
    const int64_t skip = c.nnew[s] > 0 ? window_first_key(causal_last_key(c.ctx[s], c.nnew[s], 0), c.window) / bs : 0;
    for (int b = 0; b < need[s]; ++b) {
      const int id = perm[used++];
      bt[size_t(s) * maxb + b] = b < skip ? num_blocks - 1 : id;
    }
  }
  const PagedLayout L{Hk, bs, D};
  const size_t cache_n = size_t(num_blocks) * Hk * bs * D;
  std::vector<KV> kc(cache_n), vc(cache_n);
  std::vector<float> ksc(Hk, 1.f), vsc(Hk, 1.f);  // fp8: per-head scales (all equal for c.fp8 == 2)
  if constexpr (FP8) {
    std::uniform_real_distribution<float> u(0.05f, 0.6f);
    const float k1 = u(rng), v1 = u(rng);
    for (int h = 0; h < Hk; ++h) { ksc[h] = c.fp8 == 2 ? k1 : u(rng); vsc[h] = c.fp8 == 2 ? v1 : u(rng); }
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& x : kc) x.bits = float_to_fp8_e4m3(nd(rng));
    for (auto& x : vc) x.bits = float_to_fp8_e4m3(nd(rng));
  } else {
    kc = randn<T>(cache_n);
    vc = randn<T>(cache_n);
  }
  const size_t nan_block = size_t(num_blocks - 1) * Hk * bs * D;
  for (size_t i = nan_block; i < cache_n; ++i) {
    if constexpr (FP8) kc[i].bits = vc[i].bits = 0x7f;
    else kc[i] = vc[i] = nanv<T>();
  }
  const KVScales kvs = FP8 ? KVScales{ksc.data(), vsc.data(), c.fp8 == 2 ? 0 : 1, c.fp8 == 2 ? 0 : 1} : KVScales{};
  // the value the kernels read for cache element i of KV head h
  auto kval = [&](const std::vector<KV>& cache, const std::vector<float>& sc, int64_t i, int h) -> double {
    if constexpr (FP8) return double(fp8_e4m3_to_float(cache[i].bits)) * sc[c.fp8 == 2 ? 0 : h];
    else return double(ld(cache[i]));
  };
  std::vector<int32_t> qsl(S + 1, 0), lens(c.ctx.begin(), c.ctx.end());
  for (int s = 0; s < S; ++s) qsl[s + 1] = qsl[s] + c.nnew[s];
  const int64_t Tn = qsl[S] + c.pad_tokens;
  const int64_t q_stride = int64_t(Hq) * D + c.q_pad;
  std::vector<T> q = randn<T>(size_t(std::max<int64_t>(Tn, 1)) * q_stride);
  if (c.q_mag != 1.f) {
    const float mag = std::is_same_v<T, __half> ? std::min(c.q_mag, 1e4f) : c.q_mag;
    for (auto& x : q) x = Conv<T>::store(ld(x) * mag);
  }
  for (int64_t t = 0; t < Tn; ++t)
    for (int i = Hq * D; i < q_stride; ++i) q[t * q_stride + i] = nanv<T>();  // padding poisoned
  const float scale = c.scale_mul / std::sqrt(float(D));

  // CPU kernel (real tokens only: it requires query_start_loc[S] == num_tokens)
  const int64_t Treal = qsl[S];
  std::vector<T> out_cpu(size_t(Treal) * Hq * D);
  std::vector<float> lse_cpu(size_t(Treal) * Hq);
  cpu::PagedAttentionParams P{Treal, S, Hq, maxb, q_stride, scale, L, c.window};
  cpu::paged_attention<C, CK>((C*)out_cpu.data(), lse_cpu.data(), (const C*)q.data(), (const CK*)kc.data(),
                              (const CK*)vc.data(), bt.data(), lens.data(), qsl.data(), P, kvs);

  // emulated CUDA kernel, outputs poisoned
  std::vector<T> out(size_t(Tn) * Hq * D, nanv<T>());
  std::vector<float> lse(size_t(Tn) * Hq, NAN);
  const long l0 = dk_emu::launches;
  const int64_t table_keys = int64_t(maxb) * bs;
  const int splits = c.splits ? c.splits
                              : paged_attention_num_splits(Tn, Hk, Hq, c.window > 0 ? std::min<int64_t>(c.window, table_keys)
                                                                                    : table_keys, 132);
  std::vector<float> ws(size_t(paged_attention_workspace_floats(splits, Tn, Hq, D)), NAN);
  const bool tc = c.force_tc || paged_attention_uses_prefill_kernel(cuda::kIsMmaType<T>, D, Tn, S);
  if (c.force_tc && !cuda::kIsMmaType<T>) return;  // the tensor-core kernel takes half / bf16 only
  cudaError_t err = c.force_tc
      ? cuda::paged_prefill<T, KV>(out.data(), c.with_lse ? lse.data() : nullptr, q.data(), q_stride, kc.data(),
                                   vc.data(), bt.data(), maxb, lens.data(), qsl.data(), S, Tn, Hq, num_blocks, L,
                                   scale, kvs, c.window, nullptr, c.tc_warps, c.wgmma)
      : cuda::paged_attention<T, KV>(out.data(), c.with_lse ? lse.data() : nullptr, q.data(), q_stride, kc.data(),
                                     vc.data(), bt.data(), maxb, lens.data(), qsl.data(), S, Tn, Hq, num_blocks, L,
                                     scale, kvs, c.window, splits, splits > 1 ? ws.data() : nullptr, nullptr,
                                     tc_decode);
  if (tc) {
    ++tc_cases;
  } else {
    split_cases += splits > 1;
    tc_decode_cases += tc_decode && cuda::kIsMmaType<T> && (D == 64 || D == 128);
  }
  ++checks;
  if (err != cudaSuccess || (Tn > 0) != (dk_emu::launches > l0)) {
    printf("FAIL %s %s: err=%d launches=%ld\n", c.name.c_str(), tname<T>(), int(err), dk_emu::launches - l0);
    ++fails;
    return;
  }
  // float64 reference + comparisons
  Stat& st = stats[tname<T>()];
  bool bad = false;
  double worst = 0;
  for (int s = 0; s < S; ++s) {
    const int n = c.nnew[s];
    for (int i = 0; i < n; ++i) {
      const int64_t t = qsl[s] + i;
      const int64_t last = causal_last_key(lens[s], n, i), first = window_first_key(last, c.window);
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / group;
        std::vector<double> sc(last + 1, -INFINITY);
        double mx = -INFINITY;
        for (int64_t k = first; k <= last; ++k) {
          const int64_t row = L.row(bt[size_t(s) * maxb + k / bs], kvh, int(k % bs));
          double dot = 0;
          for (int e = 0; e < D; ++e)
            dot += double(ld(q[t * q_stride + int64_t(h) * D + e])) * scale * kval(kc, ksc, row + e, kvh);
          sc[k] = dot;
          mx = std::max(mx, dot);
        }
        double l = 0;
        for (auto& x : sc) { x = std::exp(x - mx); l += x; }  // (exp(-inf) = 0 before the window)
        const double lse_ref = mx + std::log(l);
        for (int e = 0; e < D; ++e) {
          double o = 0;
          for (int64_t k = first; k <= last; ++k)
            o += sc[k] * kval(vc, vsc, L.row(bt[size_t(s) * maxb + k / bs], kvh, int(k % bs)) + e, kvh);
          o /= l;
          const size_t idx = (size_t(t) * Hq + h) * D + e;
          const double g = ld(out[idx]), cp = ld(out_cpu[idx]);
          if (std::isnan(g) || std::fabs(g - o) > tol_abs<T>() * (1 + std::fabs(o))) {
            if (!bad) printf("FAIL %s %s: out[t=%ld h=%d e=%d] = %g, want %g (cpu %g)\n", c.name.c_str(), tname<T>(),
                             long(t), h, e, g, o, cp);
            bad = true;
          }
          st.emu_cpu = std::max(st.emu_cpu, std::fabs(g - cp));
          st.ulp_emu_cpu = std::max(st.ulp_emu_cpu, std::fabs(g - cp) / ulp<T>(cp));
          st.ulp_emu_ref = std::max(st.ulp_emu_ref, std::fabs(g - o) / ulp<T>(o));
          st.ulp_cpu_ref = std::max(st.ulp_cpu_ref, std::fabs(cp - o) / ulp<T>(o));
          st.emu_ref = std::max(st.emu_ref, std::fabs(g - o));
          st.cpu_ref = std::max(st.cpu_ref, std::fabs(cp - o));
          worst = std::max(worst, std::fabs(g - o));
          ++st.n;
        }
        if (c.with_lse) {
          const size_t li = size_t(t) * Hq + h;
          const double g = lse[li];
          if (std::isnan(g) || std::fabs(g - lse_ref) > 2e-5 * (1 + std::fabs(lse_ref))) {
            if (!bad) printf("FAIL %s %s: lse[t=%ld h=%d] = %g, want %g\n", c.name.c_str(), tname<T>(), long(t), h, g, lse_ref);
            bad = true;
          }
          st.lse_emu_cpu = std::max(st.lse_emu_cpu, std::fabs(g - lse_cpu[li]));
          st.lse_emu_ref = std::max(st.lse_emu_ref, std::fabs(g - lse_ref));
        }
      }
    }
  }
  for (int64_t t = Treal; t < Tn; ++t)  // padding tokens: zeros and -inf
    for (int h = 0; h < Hq; ++h) {
      for (int e = 0; e < D; ++e)
        if (ld(out[(size_t(t) * Hq + h) * D + e]) != 0.f) { if (!bad) printf("FAIL %s: padding token out != 0\n", c.name.c_str()); bad = true; }
      if (c.with_lse && lse[size_t(t) * Hq + h] != -INFINITY) { if (!bad) printf("FAIL %s: padding lse\n", c.name.c_str()); bad = true; }
    }
  if (!c.with_lse)
    for (float x : lse) if (!std::isnan(x)) { if (!bad) printf("FAIL %s: lse written though null\n", c.name.c_str()); bad = true; break; }
  if (bad) ++fails;
}

template <class T> void run_attention(const Case& c) {
  if (c.fp8) return run_attention_impl<T, fp8_e4m3_t>(c);
  return run_attention_impl<T, T>(c);
}

// Inconsistent metadata the CPU launcher rejects: rows come out NaN, nothing read outside.
template <class T> void run_bad_metadata(int splits) {
  // (splits > 1: the bad rows must come out NaN through the split-KV merge as well)
  const int Hq = 8, Hk = 2, D = 64, bs = 16, S = 3, maxb = 3, num_blocks = 6;
  const PagedLayout L{Hk, bs, D};
  std::vector<T> kc = randn<T>(size_t(num_blocks) * Hk * bs * D), vc = randn<T>(kc.size()), q = randn<T>(size_t(6) * Hq * D);
  // seq 0: 2 new tokens but seq_len 1; seq 1: block id 99 in its window; seq 2: seq_len 60 > 3 blocks * 16
  std::vector<int32_t> bt = {0, 1, 2, 3, 99, 4, 5, 0, 1}, lens = {1, 20, 60}, qsl = {0, 2, 4, 6};
  std::vector<T> out(size_t(6) * Hq * D, Conv<T>::store(7.f));
  std::vector<float> lse(size_t(6) * Hq, 7.f);
  std::vector<float> ws(size_t(paged_attention_workspace_floats(splits, 6, Hq, D)));
  cuda::paged_attention<T, T>(out.data(), lse.data(), q.data(), Hq * D, kc.data(), vc.data(), bt.data(), maxb,
                              lens.data(), qsl.data(), S, 6, Hq, num_blocks, L, 0.125f, KVScales{}, 0, splits,
                              splits > 1 ? ws.data() : nullptr, nullptr, tc_decode, wgmma_prefill);
  ++checks;
  // token 2 (seq 1, i = 0) sees keys 0..18: block 99 is in its window -> NaN; so does token 3.
  for (int t = 0; t < 6; ++t)
    for (int h = 0; h < Hq; ++h)
      if (!std::isnan(ld(out[(size_t(t) * Hq + h) * D + 5])) || !std::isnan(lse[t * Hq + h])) {
        printf("FAIL bad metadata %s splits %d: token %d head %d not NaN\n", tname<T>(), splits, t, h);
        ++fails;
        return;
      }
}

// A bad block id inside a key tile that lies wholly within every row's range (the prefill kernel's unmasked
// fast path): the rows that see it still come out NaN. One sequence, ctx 200, 2 new tokens, block 1 (keys
// 16..31) -> id 99 (inside key tile 0 of 64 keys); head_dim 64 and 128.
template <class T> void run_bad_block_interior(int D) {
  const int Hq = 8, Hk = 2, bs = 16, maxb = 13, num_blocks = 13;
  const PagedLayout L{Hk, bs, D};
  std::vector<T> kc = randn<T>(size_t(num_blocks) * Hk * bs * D), vc = randn<T>(kc.size()), q = randn<T>(size_t(2) * Hq * D);
  std::vector<int32_t> bt(maxb), lens = {200}, qsl = {0, 2};
  for (int b = 0; b < maxb; ++b) bt[b] = b == 1 ? 99 : b;
  std::vector<T> out(size_t(2) * Hq * D, Conv<T>::store(7.f));
  std::vector<float> lse(size_t(2) * Hq, 7.f);
  cuda::paged_attention<T, T>(out.data(), lse.data(), q.data(), Hq * D, kc.data(), vc.data(), bt.data(), maxb,
                              lens.data(), qsl.data(), 1, 2, Hq, num_blocks, L, 0.125f, KVScales{}, 0, 1, nullptr,
                              nullptr, tc_decode, wgmma_prefill);
  ++checks;
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < Hq; ++h)
      if (!std::isnan(ld(out[(size_t(t) * Hq + h) * D + 3])) || !std::isnan(lse[t * Hq + h])) {
        printf("FAIL bad block inside a full tile %s d=%d: token %d head %d not NaN\n", tname<T>(), D, t, h);
        ++fails;
        return;
      }
}

// The same for decode batches (one new token per sequence: the decode kernels, not the prefill one):
// seq 0's window holds block id 99, seq 1 has seq_len 60 > 3 blocks * 16 -> NaN; seq 2 is consistent and
// must come out finite (the poison stays with its token).
template <class T> void run_bad_metadata_decode(int splits, int D) {
  const int Hq = 8, Hk = 2, bs = 16, S = 3, maxb = 3, num_blocks = 6;
  const PagedLayout L{Hk, bs, D};
  std::vector<T> kc = randn<T>(size_t(num_blocks) * Hk * bs * D), vc = randn<T>(kc.size()), q = randn<T>(size_t(3) * Hq * D);
  std::vector<int32_t> bt = {0, 99, 1, 2, 3, 4, 5, 0, 1}, lens = {30, 60, 40}, qsl = {0, 1, 2, 3};
  std::vector<T> out(size_t(3) * Hq * D, Conv<T>::store(7.f));
  std::vector<float> lse(size_t(3) * Hq, 7.f);
  std::vector<float> ws(size_t(paged_attention_workspace_floats(splits, 3, Hq, D)));
  cuda::paged_attention<T, T>(out.data(), lse.data(), q.data(), Hq * D, kc.data(), vc.data(), bt.data(), maxb,
                              lens.data(), qsl.data(), S, 3, Hq, num_blocks, L, 0.125f, KVScales{}, 0, splits,
                              splits > 1 ? ws.data() : nullptr, nullptr, tc_decode);
  ++checks;
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < Hq; ++h) {
      const bool nan_out = std::isnan(ld(out[(size_t(t) * Hq + h) * D + 5])), nan_lse = std::isnan(lse[t * Hq + h]);
      if (nan_out != (t < 2) || nan_lse != (t < 2)) {
        printf("FAIL bad metadata (decode) %s d=%d splits %d tc=%d: token %d head %d NaN %d / %d\n", tname<T>(), D,
               splits, int(tc_decode), t, h, int(nan_out), int(nan_lse));
        ++fails;
        return;
      }
    }
}

template <class T> void run_cache(int T_, int hk, int d, int bs, int nb, int key_pad, int off, unsigned cap) {
  using C = typename Cpu<T>::type;
  const int64_t stride = int64_t(9 + 2 * hk) * d + key_pad;  // fused qkv row
  std::vector<T> qkv = randn<T>(size_t(T_) * stride + off + 16);
  const T* k = qkv.data() + off + 9 * d;
  const T* v = qkv.data() + off + (9 + hk) * d;
  const size_t cn = size_t(nb) * hk * bs * d;
  std::vector<T> kc(cn + 8, nanv<T>()), vc(cn + 8, nanv<T>());
  std::vector<T> kr(cn, nanv<T>()), vr(cn, nanv<T>());
  std::vector<int64_t> slots(nb * bs);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T_);
  if (T_ > 20) { slots[3] = -1; slots[20] = -1; }
  const PagedLayout L{hk, bs, d};
  cpu::reshape_and_cache<C>((const C*)k, (const C*)v, stride, stride, (C*)kr.data(), (C*)vr.data(), slots.data(), T_, L);
  if (T_ > 5) slots[5] = int64_t(nb) * bs + 3;  // outside the cache: the GPU kernel skips it
  if (T_ > 5) { /* the CPU result must then not have token 5 either */
    std::vector<T> k2(cn, nanv<T>()), v2(cn, nanv<T>());
    std::vector<int64_t> s2 = slots;
    s2[5] = -1;
    cpu::reshape_and_cache<C>((const C*)k, (const C*)v, stride, stride, (C*)k2.data(), (C*)v2.data(), s2.data(), T_, L);
    kr = k2; vr = v2;
  }
  // caches offset by `off` elements from the 16-byte alignment too (scalar path)
  T* kcp = kc.data() + (off ? 1 : 0);
  T* vcp = vc.data() + (off ? 1 : 0);
  dk_emu::grid_cap_x = cap;
  cuda::reshape_and_cache<T, T>(k, v, stride, stride, kcp, vcp, slots.data(), T_, int64_t(nb) * bs, L, KVScales{},
                                nullptr);
  dk_emu::grid_cap_x = 1u << 30;
  ++checks;
  if (memcmp(kcp, kr.data(), cn * sizeof(T)) || memcmp(vcp, vr.data(), cn * sizeof(T))) {
    printf("FAIL reshape_and_cache %s T=%d hk=%d d=%d bs=%d pad=%d off=%d\n", tname<T>(), T_, hk, d, bs, key_pad, off);
    ++fails;
  }
}

// reshape_and_cache into an fp8 cache: the emulated CUDA kernel equals the CPU kernel byte for byte.
template <class T> void run_cache_fp8() {
  using C = typename Cpu<T>::type;
  const int T_ = 29, hk = 3, d = 64, bs = 16, nb = 4;
  const int64_t stride = int64_t(2 * hk) * d;
  std::vector<T> kv = randn<T>(size_t(T_) * stride);
  for (size_t i = 0; i < kv.size(); i += 7) kv[i] = Conv<T>::store(ld(kv[i]) * 300.f);  // some saturate
  const T* k = kv.data();
  const T* v = kv.data() + hk * d;
  std::vector<int64_t> slots(nb * bs);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T_);
  slots[4] = -1;
  std::vector<float> ks = {0.5f, 0.25f, 2.f}, vs = {1.f, 0.125f, 3.f};
  const KVScales sc{ks.data(), vs.data(), 1};
  const PagedLayout L{hk, bs, d};
  const size_t cn = size_t(nb) * hk * bs * d;
  std::vector<fp8_e4m3_t> kr(cn, fp8_e4m3_t{0x7f}), vr(cn, fp8_e4m3_t{0x7f}), kg(cn, fp8_e4m3_t{0x7f}), vg(cn, fp8_e4m3_t{0x7f});
  cpu::reshape_and_cache<C, fp8_e4m3_t>((const C*)k, (const C*)v, stride, stride, kr.data(), vr.data(), slots.data(), T_, L, sc);
  cuda::reshape_and_cache<T, fp8_e4m3_t>(k, v, stride, stride, kg.data(), vg.data(), slots.data(), T_, int64_t(nb) * bs, L,
                                         sc, nullptr);
  ++checks;
  if (memcmp(kg.data(), kr.data(), cn) || memcmp(vg.data(), vr.data(), cn)) {
    printf("FAIL reshape_and_cache fp8 %s\n", tname<T>());
    ++fails;
  }
}

static std::vector<Case> test_cases() {
  struct Cfg { int hq, hk, d, bs; };
  const std::vector<Cfg> cfgs = {{9, 3, 64, 16}, {32, 8, 128, 16}, {8, 8, 128, 32}, {64, 8, 64, 32}, {9, 3, 128, 32}};
  std::vector<int> b37_ctx, b37_new(30, 1);
  for (int i = 0; i < 37; ++i) b37_ctx.push_back(int(1.f + float(i) * (699.f / 36.f)));
  for (int x : {3, 5, 7, 1, 2, 9, 4}) b37_new.push_back(x);
  const std::vector<std::tuple<std::string, std::vector<int>, std::vector<int>>> cs = {
      {"decode-1", {1}, {1}},
      {"decode-mixed", {15, 16, 17, 1000, 4097}, {1, 1, 1, 1, 1}},
      {"prefill", {83}, {83}},
      {"chunk-mid-block", {37, 50}, {13, 50}},
      {"mixed", {1, 300, 17, 64}, {1, 45, 17, 1}},
      {"batch-37", b37_ctx, b37_new},
  };
  std::vector<Case> out;
  for (auto& [name, ctx, nn] : cs)
    for (auto& f : cfgs) {
      Case c{ctx, nn, f.hq, f.hk, f.d, f.bs};
      c.name = name + " h" + std::to_string(f.hq) + "x" + std::to_string(f.hk) + "-d" + std::to_string(f.d) + "-b" +
               std::to_string(f.bs);
      out.push_back(c);
    }
  return out;
}

static std::vector<Case> extra_cases() {
  std::vector<Case> out;
  auto add = [&](std::string name, std::vector<int> ctx, std::vector<int> nn, int hq, int hk, int d, int bs) {
    Case c{ctx, nn, hq, hk, d, bs};
    c.name = name;
    out.push_back(c);
    return &out.back();
  };
  add("d256 g4", {70, 300, 5}, {1, 9, 5}, 8, 2, 256, 16);
  add("d256 g1", {130}, {3}, 4, 4, 256, 32);
  add("group16 (z split 8+8)", {33, 200}, {2, 1}, 32, 2, 128, 16);
  add("group12 (z split 6+6)", {40, 7}, {3, 7}, 12, 1, 64, 16);
  add("group5", {90}, {4}, 10, 2, 128, 16);
  add("group2", {257}, {2}, 4, 2, 64, 32);
  add("group9 (5+4)", {45}, {2}, 9, 1, 128, 16);
  add("block 1", {19, 3}, {4, 3}, 4, 2, 64, 1);
  add("block 5", {23, 11}, {6, 1}, 4, 1, 128, 5);
  add("block 8", {100}, {7}, 6, 2, 64, 8);
  add("block 128", {300, 129}, {2, 129}, 8, 2, 128, 128);
  add("empty seqs", {10, 5, 12, 3}, {0, 5, 0, 1}, 4, 2, 64, 16);
  add("strided q", {50, 9}, {3, 9}, 6, 3, 128, 16)->q_pad = 24;
  add("no lse", {40}, {5}, 8, 2, 64, 16)->with_lse = false;
  add("padding tokens", {20, 33}, {2, 1}, 8, 2, 128, 16)->pad_tokens = 3;
  add("zero tokens", {5}, {0}, 4, 2, 64, 16);
  add("long ctx", {9000}, {1}, 8, 1, 128, 16);
  // split-KV: forced split counts (incl. more splits than key pieces: empty splits) and the plan
  for (int sp : {2, 3, 7, 32, 128}) {  // 128 = kMaxSplits (bench_attention's sweep)
    add("split" + std::to_string(sp) + " decode", {1, 600, 4097}, {1, 1, 1}, 32, 8, 128, 16)->splits = sp;
    add("split" + std::to_string(sp) + " mixed", {37, 300, 17}, {13, 45, 17}, 9, 3, 64, 16)->splits = sp;
  }
  add("split plan b1 ctx 20000", {20000}, {1}, 32, 8, 128, 16);
  add("split5 d256 g5", {999}, {2}, 10, 2, 256, 32)->splits = 5;
  { Case* c = add("split4 padding", {70, 5}, {1, 2}, 8, 2, 128, 16); c->pad_tokens = 2; c->splits = 4; }
  // fp8 caches (per-head and per-tensor scales), with and without split-KV
  for (int d : {64, 128, 256})
    for (int g : {1, 3, 8}) add("fp8 d" + std::to_string(d) + " g" + std::to_string(g), {29, 300}, {1, 7}, 2 * g, 2, d, 16)->fp8 = 1;
  add("fp8 per-tensor", {100, 17}, {3, 17}, 9, 3, 64, 16)->fp8 = 2;
  { Case* c = add("fp8 split6", {5000}, {1}, 32, 8, 128, 16); c->fp8 = 1; c->splits = 6; }
  // fp8 decode batches (the tensor-core decode kernel: raw tiles widened in shared memory; bf16 queries in
  // fp16 rescaled per CTA, 1e6-sized ones too), awkward lengths, GQA 1 / 3 / 8 / 20, per-tensor scales, splits
  for (int d : {64, 128})
    for (int g : {1, 3, 8, 20})
      add("fp8 decode d" + std::to_string(d) + " g" + std::to_string(g), {1, 15, 17, 300, 2049}, {1, 1, 1, 1, 1},
          2 * g, 2, d, g == 3 ? 32 : 16)->fp8 = 1;
  { Case* c = add("fp8 decode q1e6", {100, 700}, {1, 1}, 16, 2, 128, 32); c->fp8 = 1; c->q_mag = 1e6f; }
  { Case* c = add("fp8 decode q1e-6", {100, 33}, {1, 1}, 9, 3, 64, 16); c->fp8 = 1; c->q_mag = 1e-6f; }
  { Case* c = add("fp8 decode per-tensor split3", {999, 40}, {1, 1}, 9, 3, 128, 16); c->fp8 = 2; c->splits = 3; }
  // the tensor-core kernel on every kind of row: decode-only batches, long prefills (many 64-row
  // tiles and key tiles), GQA groups 1..8, fp8 caches, padding tokens, bad-free empty sequences
  auto tc = [&](std::string name, std::vector<int> ctx, std::vector<int> nn, int hq, int hk, int d, int bs) {
    Case* c = add("tc " + name, ctx, nn, hq, hk, d, bs);
    c->force_tc = true;
    return c;
  };
  tc("decode-mixed", {15, 16, 17, 1000, 4097}, {1, 1, 1, 1, 1}, 32, 8, 128, 16);
  tc("decode g3", {1, 70, 129}, {1, 1, 1}, 9, 3, 64, 32);
  tc("prefill 300 g1", {300}, {300}, 2, 2, 64, 16);
  tc("prefill 190 g4 d128", {190}, {190}, 8, 2, 128, 16);
  // 128-row CTAs (22 of them) over 11 key tiles: the 3-stage ring wraps several times; fp8 tiles widened into
  // alternating buffers over as many tiles, both head dims
  tc("prefill 700 g4 d128", {700}, {700}, 8, 2, 128, 16);
  // the score scale inside the exponent: a negative scale (Q's signs flipped), a zero one (every visible key
  // weighs the same), through the prefill kernel, the tensor-core decode kernel and an fp8 cache
  for (float m : {-1.f, 0.f}) {
    const std::string ms = m < 0 ? "negative scale" : "zero scale";
    tc(ms + " prefill", {200, 70}, {130, 1}, 8, 2, 64, 16)->scale_mul = m;
    add(ms + " decode", {200, 70, 1}, {1, 1, 1}, 9, 3, 128, 16)->scale_mul = m;
    Case* c = tc(ms + " fp8 prefill", {90}, {90}, 8, 2, 128, 16);
    c->scale_mul = m;
    c->fp8 = 1;
  }
  tc("fp8 long d128", {520, 90}, {300, 90}, 8, 2, 128, 32)->fp8 = 1;
  tc("fp8 long d64 g3", {450}, {450}, 9, 3, 64, 16)->fp8 = 2;
  tc("chunk mid-block g3", {1000, 61}, {77, 20}, 9, 3, 64, 16);
  tc("group 8 (8 tokens a tile)", {130, 33}, {70, 33}, 8, 1, 128, 32);
  tc("block 5", {23, 11}, {6, 11}, 4, 1, 128, 5);
  tc("fp8 per-head", {200, 40}, {65, 40}, 9, 3, 64, 16)->fp8 = 1;
  tc("fp8 per-tensor d128", {150}, {150}, 8, 2, 128, 16)->fp8 = 2;
  tc("padding tokens", {20, 33}, {2, 1}, 8, 2, 128, 16)->pad_tokens = 5;
  tc("empty seqs", {10, 5, 12, 3}, {0, 5, 0, 1}, 4, 2, 64, 16);
  tc("no lse", {40}, {17}, 8, 2, 64, 16)->with_lse = false;
  tc("strided q", {50, 9}, {3, 9}, 6, 3, 128, 16)->q_pad = 24;
  // sliding windows (the blocks before each sequence's first window are NaN blocks): decode with and without
  // split-KV, prefill / chunks through both kernels, windows of 1, below / above a block, past the context
  auto win = [&](std::string name, std::vector<int> ctx, std::vector<int> nn, int hq, int hk, int d, int bs, int w) {
    Case* c = add("window " + name, ctx, nn, hq, hk, d, bs);
    c->window = w;
    return c;
  };
  win("decode w40", {15, 100, 4097, 41}, {1, 1, 1, 1}, 9, 3, 64, 16, 40);
  win("decode w1", {7, 300}, {1, 1}, 8, 2, 128, 16, 1);
  win("decode w4096 ctx 9000", {9000, 4097}, {1, 1}, 32, 8, 128, 16, 4096);
  win("decode split5 w700", {3000, 20}, {1, 1}, 32, 8, 128, 16, 700)->splits = 5;
  win("decode split7 w33", {3000}, {1}, 8, 2, 64, 32, 33)->splits = 7;
  win("prefill w50", {300}, {300}, 9, 3, 64, 16, 50);
  win("prefill w7 d128", {190}, {190}, 8, 2, 128, 16, 7);
  win("chunk w100", {1000, 61, 5}, {77, 20, 1}, 9, 3, 64, 16, 100);
  win("chunk w64 b32", {500, 64}, {64, 64}, 4, 4, 128, 32, 64);
  win("w past ctx", {30, 12}, {5, 12}, 6, 3, 64, 16, 1000);
  win("fp8 w30", {200, 40}, {65, 1}, 9, 3, 64, 16, 30)->fp8 = 1;
  win("tc decode w20", {150, 33}, {1, 1}, 9, 3, 64, 16, 20)->force_tc = true;
  win("tc w3 g8", {130, 33}, {70, 33}, 8, 1, 128, 32, 3)->force_tc = true;
  win("block 5 w9", {23, 11}, {6, 1}, 4, 1, 128, 5, 9);
  win("d256 w17", {70, 300}, {1, 9}, 8, 2, 256, 16, 17);
  for (int d : {64, 128, 256})  // every (head_dim, heads-per-CTA) kernel
    for (int g : {1, 2, 4, 8}) add("cover d" + std::to_string(d) + " g" + std::to_string(g), {29, 6}, {1, 6}, 2 * g, 2, d, 16);
  // every case forced through the prefill kernel runs with both CTA sizes (128 rows / 8 warps, 64 / 4), by
  // mma.sync and by wgmma
  const size_t n0 = out.size();
  for (size_t i = 0; i < n0; ++i)
    if (out[i].force_tc) {
      out[i].tc_warps = 8;
      for (int v = 1; v < 4; ++v) {
        Case c = out[i];
        c.tc_warps = v & 1 ? 4 : 8;
        c.wgmma = v >= 2;
        c.name += std::string(c.wgmma ? " wgmma" : "") + (c.tc_warps == 4 ? " w4" : "");
        out.push_back(c);
      }
    }
  return out;
}

static std::string filter;
template <class T> void run_all(bool full) {
  const int V = 16 / sizeof(T);
  for (auto& c : test_cases())
    if (c.name.find(filter) != std::string::npos) run_attention<T>(c);
  for (auto& c : extra_cases()) {
    if (!full && c.name.find(filter) == std::string::npos) continue;
    run_attention<T>(c);
  }
  for (bool wg : {false, true}) {  // the prefill kernel's bad-row handling by mma.sync and by wgmma
    if (wg && !cuda::kIsMmaType<T>) continue;
    wgmma_prefill = wg;
    run_bad_metadata<T>(1);
    run_bad_metadata<T>(3);
    for (int d : {64, 128}) run_bad_block_interior<T>(d);
  }
  wgmma_prefill = false;
  for (int d : {64, 128})
    for (int sp : {1, 3}) run_bad_metadata_decode<T>(sp, d);
  run_cache_fp8<T>();
  run_cache<T>(37, 3, 64, 16, 9, 0, 0, 1u << 30);     // as tests/ops: strided views of a fused qkv
  run_cache<T>(37, 3, 64, 16, 9, V, 0, 4);            // grid-stride (4 CTAs)
  run_cache<T>(37, 3, 64, 16, 9, 1, 0, 1u << 30);     // token stride not a multiple of V: scalar
  run_cache<T>(37, 3, 64, 16, 9, 0, 1, 1u << 30);     // misaligned: scalar
  run_cache<T>(11, 8, 128, 32, 4, 0, 0, 1u << 30);    // 8 heads x 128: 256 threads
  run_cache<T>(11, 1, 7, 5, 4, 0, 0, 1u << 30);       // head_dim 7, block 5: scalar
  run_cache<T>(300, 2, 256, 16, 20, 0, 0, 7);
}

int main(int argc, char** argv) {
  bool full = true;
  std::string decode = "both";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (dk_emu::parse_common_arg(argc, argv, i)) continue;
    if (a == "--cp-async") {  // when cp.async copies land: early | late | mixed (default)
      const std::string m = argv[++i];
      dk_emu::cp_async_mode = m == "early" ? dk_emu::kCpEarly : m == "late" ? dk_emu::kCpLate : dk_emu::kCpMixed;
    }
    if (a == "--only") { filter = argv[++i]; full = false; }
    if (a == "--decode") decode = argv[++i];  // both (default) | tc | simt
  }
  run_all<float>(full);
  // half / bf16 decode batches: the tensor-core kernel (decode_tc.cuh, the default), then the SIMT one
  // (bf16 only when both: the same code for both types)
  if (decode != "simt") {
    tc_decode = true;
    run_all<__half>(full);
    run_all<__nv_bfloat16>(full);
  }
  if (decode != "tc") {
    tc_decode = false;
    if (decode == "simt") run_all<__half>(full);
    run_all<__nv_bfloat16>(full);
  }
  printf("max |error| over all cases (out elements; lse):\n");
  for (auto& [k, s] : stats)
    printf("  %-4s  out abs: emu-vs-cpu %.3g  emu-vs-fp64 %.3g  cpu-vs-fp64 %.3g | err/(eps*(1+|x|)): emu-vs-cpu %.2f  emu-vs-fp64 %.2f  "
           "cpu-vs-fp64 %.2f | lse abs: emu-vs-cpu %.3g  emu-vs-fp64 %.3g  (%ld outputs)\n",
           k.c_str(), s.emu_cpu, s.emu_ref, s.cpu_ref, s.ulp_emu_cpu, s.ulp_emu_ref, s.ulp_cpu_ref, s.lse_emu_cpu,
           s.lse_emu_ref, s.n);
  printf("%d checks (%d split-KV, %d tensor-core prefill, %d tensor-core decode), %d failures, %ld launches, "
         "%zu distinct kernels\n", checks, split_cases, tc_cases, tc_decode_cases, fails,
         dk_emu::launches.load(), dk_emu::distinct.size());
  return fails != 0;
}
