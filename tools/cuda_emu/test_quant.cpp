// Emulator test of include/decodekit/gemm/int4.cuh (dk::cuda::quant_gemv for INT4 and INT8,
// dk::cuda::int4_dequantize) and int4_mma.cuh (dk::cuda::int4_gemm_mma, tensor cores, any M) against the CPU kernels of include/decodekit/gemm/int4.h and a
// float64 reference, on awkward shapes (N not a multiple of the 4 warps, M = 1..8, every group
// size, strided activations, bias).
#include "shim.h"
#include "emu_types.h"
#include "decodekit/gemm/int4.cuh"
#include "decodekit/gemm/int4.h"
#include "decodekit/gemm/int4_mma.cuh"
#include "decodekit/gemm/int4_marlin.cuh"
#include "decodekit/gemm/fp8_gemm.cuh"
#include "decodekit/gemm/fp8_gemm.h"
#include "decodekit/gemm/sm90_prepare.cuh"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

using namespace dk;
static std::mt19937 rng(7);
static int fails = 0, checks = 0;

template <class T> double out_tol() { return sizeof(T) == 4 ? 2e-6 : std::is_same_v<T, __half> ? 1e-3 : 8e-3; }

// Random packed weights: row_bytes code bytes and ng fp16 scales / mins per row (the kernels' layout).
struct QuantWeights { std::vector<uint8_t> q; std::vector<__half> sc, mn; };
static QuantWeights random_weights(int64_t N, int64_t row_bytes, int64_t ng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.f, 1.f);
  QuantWeights w{std::vector<uint8_t>(size_t(N * row_bytes)), std::vector<__half>(size_t(N * ng)),
                 std::vector<__half>(size_t(N * ng))};
  for (auto& x : w.q) x = uint8_t(byte(rng));
  for (auto& x : w.sc) x = __float2half(0.001f + 0.02f * std::fabs(nd(rng)));
  for (auto& x : w.mn) x = __float2half(0.1f * nd(rng));
  return w;
}

template <class T> void run(bool int4, int M, int64_t N, int64_t K, int G, int a_pad, bool with_bias,
                            bool mma = false, int splits = 1) {
  using C = typename Cpu<T>::type;
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t row_bytes = int4 ? K / 2 : K, ng = K / G;
  auto [q, sc, mn] = random_weights(N, row_bytes, ng);
  const int64_t a_stride = K + a_pad;
  std::vector<T> a(static_cast<size_t>(M * a_stride)), bias(static_cast<size_t>(N));
  for (auto& x : a) x = Conv<T>::store(nd(rng));
  for (auto& x : bias) x = Conv<T>::store(nd(rng));
  std::vector<T> out(size_t(M * N), Conv<T>::store(NAN));
  std::vector<float> partial(size_t(splits * M * N), NAN);  // split-K sums (splits > 1)
  cudaError_t err = mma ? cuda::int4_gemm_mma<T>(out.data(), a.data(), a_stride, q.data(), sc.data(), mn.data(),
                                                 with_bias ? bias.data() : nullptr, M, N, K, G, splits,
                                                 splits > 1 ? partial.data() : nullptr, nullptr)
                        : cuda::quant_gemv<T>(out.data(), a.data(), a_stride, q.data(), sc.data(),
                                              int4 ? mn.data() : nullptr, with_bias ? bias.data() : nullptr, M, N, K,
                                              G, int4, nullptr);
  // CPU kernel
  std::vector<T> ocpu(size_t(M * N));
  const cpu::Int4GemmParams P{M, N, K, G, a_stride};
  if (int4)
    cpu::int4_gemm<C>((C*)ocpu.data(), (const C*)a.data(), q.data(), (const half_t*)sc.data(), (const half_t*)mn.data(),
                      with_bias ? (const C*)bias.data() : nullptr, P);
  else
    cpu::int8_gemm<C>((C*)ocpu.data(), (const C*)a.data(), (const int8_t*)q.data(), (const half_t*)sc.data(),
                      with_bias ? (const C*)bias.data() : nullptr, P);
  ++checks;
  bool bad = err != cudaSuccess;
  for (int m = 0; m < M && !bad; ++m)
    for (int64_t n = 0; n < N && !bad; ++n) {
      double want = with_bias ? ld(bias[n]) : 0, mag = with_bias ? std::fabs(ld(bias[n])) : 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k / G;
        const float d = __half2float(sc[n * ng + g]);
        const float w = int4 ? int4_weight(int4_code(q.data() + n * row_bytes, G, k), d, __half2float(mn[n * ng + g]))
                             : d * float(int8_t(q[n * row_bytes + k]));
        want += double(w) * ld(a[m * a_stride + k]);
        mag += std::fabs(double(w) * ld(a[m * a_stride + k]));
      }
      const double got = ld(out[m * N + n]), cp = ld(ocpu[m * N + n]);
      const double tol = out_tol<T>() * (1 + mag) + 1e-6 * mag;
      if (!(std::fabs(got - want) <= tol) || !(std::fabs(cp - want) <= tol)) {
        printf("FAIL %s %s M=%d N=%ld K=%ld G=%d splits=%d: out[%d,%ld] = %g (cpu %g), want %g\n",
               mma ? "int4 mma" : int4 ? "int4" : "int8",
               tname<T>(), M, long(N), long(K), G, splits, m, long(n), got, cp, want);
        bad = true;
      }
    }
  if (bad) ++fails;
}

// The Marlin-style kernel (gemm/int4_marlin.cuh) on `ctas` CTAs: against float64 (its weights are one fused
// q * s + m in T, bf16 with the fp16 scale and min rounded to bf16 first: within out_tol), every output
// written (NaN-poisoned), counters back to zero, and bitwise the same on a second run (the in-order sum of a
// split column's slots, whatever the arrival order of its CTAs). Then the packed layout (int4_marlin_pack.h):
// the pack kernel equal to the host packing word for word, the packed kernel bitwise equal to the unpacked one
// (same decode, same sums in the same order), rows past N and features past K of the pack zero.
template <class T> void run_marlin(int M, int64_t N, int64_t K, int G, int a_pad, bool with_bias, int ctas) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t ng = K / G, a_stride = K + a_pad;
  auto [q, sc, mn] = random_weights(N, K / 2, ng);
  std::vector<T> a(size_t(M * a_stride), Conv<T>::store(NAN)), bias(static_cast<size_t>(N));
  for (int m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) a[size_t(m * a_stride + k)] = Conv<T>::store(nd(rng));
  for (auto& x : bias) x = Conv<T>::store(nd(rng));
  const int64_t cols = cuda::int4_marlin_columns(N);
  std::vector<float> partial(cuda::int4_marlin_partial_floats(M, N, ctas), NAN);
  std::vector<unsigned> counters(size_t(cols), 0u);
  auto launch = [&](std::vector<T>& o) {
    return cuda::int4_gemm_marlin<T>(o.data(), a.data(), a_stride, q.data(), sc.data(), mn.data(),
                                     with_bias ? bias.data() : nullptr, M, N, K, G, ctas, partial.data(),
                                     counters.data(), nullptr);
  };
  std::vector<T> out(size_t(M * N), Conv<T>::store(NAN)), again(size_t(M * N), Conv<T>::store(NAN));
  const cudaError_t e1 = launch(out), e2 = launch(again);
  ++checks;
  bool bad = e1 != cudaSuccess || e2 != cudaSuccess;
  {  // the packed layout
    const int64_t words = int4_marlin_packed_bytes(N, K, G) / 4;
    std::vector<uint32_t> host(static_cast<size_t>(words)), dev(static_cast<size_t>(words), 0xdeadbeefu);
    constexpr bool bf = !std::is_same_v<T, __half>;
    for (int64_t w = 0; w < words; ++w)
      host[size_t(w)] = int4_marlin_packed_word(q.data(), reinterpret_cast<const uint16_t*>(sc.data()),
                                                reinterpret_cast<const uint16_t*>(mn.data()), N, K, G, bf, w);
    const cudaError_t ep = cuda::int4_marlin_pack<T>(reinterpret_cast<T*>(dev.data()), q.data(), sc.data(), mn.data(),
                                                     N, K, G, nullptr);
    std::vector<T> pout(size_t(M * N), Conv<T>::store(NAN));
    const cudaError_t ek = cuda::int4_gemm_marlin_packed<T>(pout.data(), a.data(), a_stride,
                                                            reinterpret_cast<const T*>(host.data()),
                                                            with_bias ? bias.data() : nullptr, M, N, K, G, ctas,
                                                            partial.data(), counters.data(), nullptr);
    bool pbad = ep != cudaSuccess || ek != cudaSuccess || host != dev;
    for (unsigned c : counters) pbad |= c != 0;
    // every weight of the pack decodes to the kernel's value; padding is zero
    const uint8_t* pb = reinterpret_cast<const uint8_t*>(host.data());
    for (int64_t n = 0; n < (N + 127) / 128 * 128 && !pbad; ++n)
      for (int64_t k = 0; k < (K + 127) / 128 * 128 && !pbad; ++k) {
        const float got = int4_marlin_weight(pb, K, G, bf, n, k);
        float want = 0.f;
        if (n < N && k < K) {
          const float s = __half2float(sc[size_t(n * ng + k / G)]), m = __half2float(mn[size_t(n * ng + k / G)]);
          const float st = bf ? bf16_to_float(float_to_bf16(s)) : s, mt = bf ? bf16_to_float(float_to_bf16(m)) : m;
          const double v = double(int4_code(q.data() + n * (K / 2), G, k)) * st + mt;  // exact
          if constexpr (bf) want = __bfloat162float(__double2bfloat16(v));
          else want = __half2float(__double2half(v));
        }
        if (got != want) pbad = true;
      }
    // int4_marlin_dequantize: rows [r0, N) (all, a third on) of the pack, bit for bit its weights (poisoned out)
    for (const int64_t r0 : {int64_t(0), N / 3}) {
      const int64_t R = N - r0;
      std::vector<T> dq(size_t(R * K), Conv<T>::store(NAN));
      pbad |= cuda::int4_marlin_dequantize<T>(dq.data(), reinterpret_cast<const T*>(host.data()), N, K, G, r0, R,
                                              nullptr) != cudaSuccess;
      for (int64_t r = 0; r < R && !pbad; ++r)
        for (int64_t k = 0; k < K && !pbad; ++k)
          pbad |= ld(dq[size_t(r * K + k)]) != double(int4_marlin_weight(pb, K, G, bf, r0 + r, k));
      if (r0 == 0)  // out of range rows, a misaligned out: refused
        pbad |= cuda::int4_marlin_dequantize<T>(dq.data(), reinterpret_cast<const T*>(host.data()), N, K, G, 1, N,
                                                nullptr) != cudaErrorInvalidValue ||
                cuda::int4_marlin_dequantize<T>(dq.data() + 1, reinterpret_cast<const T*>(host.data()), N, K, G, 0, 1,
                                                nullptr) != cudaErrorInvalidValue;
    }
    if (!pbad && memcmp(pout.data(), out.data(), out.size() * sizeof(T)) != 0) pbad = true;
    if (pbad) printf("FAIL marlin packed %s M=%d N=%ld K=%ld G=%d ctas=%d: status %d / %d, or differs from the "
                     "unpacked kernel / the pack\n", tname<T>(), M, long(N), long(K), G, ctas, int(ep), int(ek));
    bad |= pbad;
  }
  for (unsigned c : counters) bad |= c != 0;
  if (bad) printf("FAIL marlin %s M=%d N=%ld K=%ld G=%d ctas=%d: status %d / %d or counters not reset\n", tname<T>(), M,
                  long(N), long(K), G, ctas, int(e1), int(e2));
  if (!bad && memcmp(out.data(), again.data(), out.size() * sizeof(T)) != 0) {
    printf("FAIL marlin %s M=%d N=%ld K=%ld G=%d ctas=%d: second run differs\n", tname<T>(), M, long(N), long(K), G,
           ctas);
    bad = true;
  }
  for (int m = 0; m < M && !bad; ++m)
    for (int64_t n = 0; n < N && !bad; ++n) {
      double want = with_bias ? ld(bias[n]) : 0, mag = with_bias ? std::fabs(ld(bias[n])) : 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k / G;
        const double w = int4_weight(int4_code(q.data() + n * (K / 2), G, k), __half2float(sc[size_t(n * ng + g)]),
                                     __half2float(mn[size_t(n * ng + g)]));
        want += w * ld(a[size_t(m * a_stride + k)]);
        mag += std::fabs(w * ld(a[size_t(m * a_stride + k)]));
      }
      const double got = ld(out[size_t(m * N + n)]);
      if (!(std::fabs(got - want) <= out_tol<T>() * (1 + mag))) {
        printf("FAIL marlin %s M=%d N=%ld K=%ld G=%d ctas=%d: out[%d,%ld] = %g, want %g\n", tname<T>(), M, long(N),
               long(K), G, ctas, m, long(n), got, want);
        bad = true;
      }
    }
  if (bad) ++fails;
}

// fp8 W8A8: quantize_fp8 (codes and scales equal to the CPU kernel's, byte for byte) and fp8_gemm
// (tensor cores) against the CPU kernel and float64.
template <class T> void run_fp8(int M, int64_t N, int64_t K, int x_pad, bool with_bias, int splits = 1) {
  using C = typename Cpu<T>::type;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t xs = K + x_pad;
  std::vector<T> x(static_cast<size_t>(M * xs)), bias(static_cast<size_t>(N));
  for (auto& v : x) v = Conv<T>::store(nd(rng) * 3.f);
  if (M > 2) for (int64_t k = 0; k < K; ++k) x[size_t(2 * xs + k)] = Conv<T>::store(0.f);  // an all-zero row
  for (auto& v : bias) v = Conv<T>::store(nd(rng));
  std::vector<uint8_t> q(static_cast<size_t>(M * K), 0x7f), qc(static_cast<size_t>(M * K));
  std::vector<float> s(static_cast<size_t>(M), NAN), sc(static_cast<size_t>(M));
  cudaError_t err = cuda::quantize_fp8<T>(q.data(), s.data(), x.data(), M, K, xs, nullptr);
  cpu::quantize_fp8<C>(qc.data(), sc.data(), (const C*)x.data(), M, K, xs);
  ++checks;
  if (err != cudaSuccess || q != qc || memcmp(s.data(), sc.data(), M * sizeof(float))) {
    printf("FAIL quantize_fp8 %s M=%d K=%ld\n", tname<T>(), M, long(K));
    ++fails;
    return;
  }
  std::vector<uint8_t> w(size_t(N * K));
  for (auto& v : w) { do v = uint8_t(byte(rng)); while ((v & 0x7f) == 0x7f); }  // no NaN codes
  std::vector<float> ws(static_cast<size_t>(N));
  for (auto& v : ws) v = 0.001f + 0.01f * std::fabs(nd(rng));
  std::vector<T> out(static_cast<size_t>(M * N), Conv<T>::store(NAN)), oc(static_cast<size_t>(M * N));
  std::vector<float> partial(size_t(splits * M * N), NAN);  // split-K sums (splits > 1)
  err = cuda::fp8_gemm<T>(out.data(), q.data(), s.data(), w.data(), ws.data(), with_bias ? bias.data() : nullptr, M,
                          N, K, splits, splits > 1 ? partial.data() : nullptr, nullptr);
  cpu::fp8_gemm<C>((C*)oc.data(), q.data(), s.data(), w.data(), ws.data(), with_bias ? (const C*)bias.data() : nullptr,
                   M, N, K);
  ++checks;
  bool bad = err != cudaSuccess;
  for (int m = 0; m < M && !bad; ++m)
    for (int64_t n = 0; n < N && !bad; ++n) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(fp8_e4m3_to_float(q[m * K + k])) * fp8_e4m3_to_float(w[n * K + k]);
        want += p;
        mag += std::fabs(p);
      }
      want = want * s[m] * ws[n];
      mag = mag * s[m] * ws[n];
      if (with_bias) { want += ld(bias[n]); mag += std::fabs(ld(bias[n])); }
      const double got = ld(out[m * N + n]), cp = ld(oc[m * N + n]);
      const double tol = out_tol<T>() * (1 + std::fabs(want)) + 1e-6 * mag;
      if (!(std::fabs(got - want) <= tol) || !(std::fabs(cp - want) <= tol)) {
        printf("FAIL fp8_gemm %s M=%d N=%ld K=%ld splits=%d: out[%d,%ld] = %g (cpu %g), want %g\n", tname<T>(), M,
               long(N), long(K), splits, m, long(n), got, cp, want);
        bad = true;
      }
    }
  if (bad) ++fails;
}

// The CUTLASS sm90 INT4 path's operand preparation (gemm/sm90_prepare.cuh): the interleaved activations
// x and the fp32 transposed scales / mins, read the way the CUTLASS mixed-input kernel reads them (qweight
// bytes as plain packed 4-bit elements, w = float(q) * s_t[g][n] + z_t[g][n]), must give the float64
// product of our layout (int4_code / int4_weight on the original activations); scales exact; x's
// padding past K never written (NaN-poisoned rows of a stride > K read only inside K).
template <class T> void run_sm90_prepare(int M, int64_t N, int64_t K, int G, int a_pad) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t ng = K / G, a_stride = K + a_pad;
  auto [q, sc, mn] = random_weights(N, K / 2, ng);
  std::vector<T> a(size_t(M * a_stride), Conv<T>::store(NAN));
  for (int m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) a[size_t(m * a_stride + k)] = Conv<T>::store(nd(rng));
  std::vector<T> x(size_t(M * K) + 8, Conv<T>::store(NAN));
  std::vector<float> s_t(size_t(N * ng) + 1, NAN), z_t(size_t(N * ng) + 1, NAN);
  const cudaError_t err = cuda::int4_sm90_prepare<T>(x.data(), s_t.data(), z_t.data(), a.data(), a_stride, sc.data(),
                                                     mn.data(), M, N, K, G, nullptr);
  ++checks;
  bool bad = err != cudaSuccess || !std::isnan(ld(x[size_t(M * K)])) || !std::isnan(s_t[size_t(N * ng)]);
  for (int64_t n = 0; n < N && !bad; ++n)
    for (int64_t g = 0; g < ng && !bad; ++g)
      bad = s_t[size_t(g * N + n)] != __half2float(sc[size_t(n * ng + g)]) ||
            z_t[size_t(g * N + n)] != __half2float(mn[size_t(n * ng + g)]);
  if (bad) printf("FAIL sm90 prepare %s M=%d N=%ld K=%ld G=%d: status, padding or scales\n", tname<T>(), M, long(N),
                  long(K), G);
  for (int m = 0; m < M && !bad; ++m)
    for (int64_t n = 0; n < N && !bad; ++n) {
      const uint8_t* row = q.data() + n * (K / 2);
      double want = 0, got = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k / G;
        const double w = int4_weight(int4_code(row, G, k), __half2float(sc[size_t(n * ng + g)]),
                                     __half2float(mn[size_t(n * ng + g)]));
        want += w * ld(a[size_t(m * a_stride + k)]);
        mag += std::fabs(w * ld(a[size_t(m * a_stride + k)]));
        const int plain = (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;  // cutlass::uint4b_t order
        got += (double(plain) * s_t[size_t(g * N + n)] + z_t[size_t(g * N + n)]) * ld(x[size_t(m * K + k)]);
      }
      if (!(std::fabs(got - want) <= 1e-12 * (1 + mag))) {
        printf("FAIL sm90 prepare %s M=%d N=%ld K=%ld G=%d: [%d,%ld] %g vs %g\n", tname<T>(), M, long(N), long(K), G,
               m, long(n), got, want);
        bad = true;
      }
    }
  if (bad) ++fails;
}

// misalign: qweight one byte off 16-byte alignment (the scalar fallback kernel; else the 16-byte chunk one)
template <class T> void run_dequant(int64_t N, int64_t K, int G, bool misalign = false) {
  using C = typename Cpu<T>::type;
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> qbuf(size_t(N * K / 2) + 16);
  const size_t off = (16 - reinterpret_cast<uintptr_t>(qbuf.data()) % 16) % 16 + (misalign ? 1 : 0);
  uint8_t* qp = qbuf.data() + off;
  std::vector<uint8_t> q(size_t(N * K / 2));
  for (auto& x : q) x = uint8_t(byte(rng));
  memcpy(qp, q.data(), q.size());
  std::vector<__half> sc(size_t(N * K / G)), mn(size_t(N * K / G));
  for (size_t i = 0; i < sc.size(); ++i) { sc[i] = __float2half(0.01f * float(i % 7 + 1)); mn[i] = __float2half(-0.03f * float(i % 5)); }
  std::vector<T> w(size_t(N * K), Conv<T>::store(NAN)), wc(size_t(N * K));
  cuda::int4_dequantize<T>(w.data(), qp, sc.data(), mn.data(), N, K, G, nullptr);
  cpu::int4_dequantize<C>((C*)wc.data(), q.data(), (const half_t*)sc.data(), (const half_t*)mn.data(), N, K, G);
  ++checks;
  if (memcmp(w.data(), wc.data(), w.size() * sizeof(T))) {
    printf("FAIL int4_dequantize %s N=%ld K=%ld G=%d misaligned %d\n", tname<T>(), long(N), long(K), G, int(misalign));
    ++fails;
  }
}

template <class T> void run_rows() {
  using C = typename Cpu<T>::type;
  const int64_t N = 50, K = 96;
  std::vector<int8_t> q(size_t(N * K));
  for (size_t i = 0; i < q.size(); ++i) q[i] = int8_t(int(i * 37 % 255) - 127);
  std::vector<__half> sc(size_t(N * K / 32));
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = __float2half(0.003f * float(i % 11 + 1));
  std::vector<int64_t> ids = {3, 0, 49, 3, 17};
  std::vector<T> w(ids.size() * K, Conv<T>::store(NAN)), wc(ids.size() * K);
  cuda::int8_dequantize_rows<T>(w.data(), q.data(), sc.data(), ids.data(), int64_t(ids.size()), N, K, 32, nullptr);
  cpu::int8_dequantize_rows<C>((C*)wc.data(), q.data(), (const half_t*)sc.data(), ids.data(), int64_t(ids.size()), K, 32);
  ++checks;
  if (memcmp(w.data(), wc.data(), w.size() * sizeof(T))) { printf("FAIL int8_dequantize_rows %s\n", tname<T>()); ++fails; }
  std::vector<int64_t> bad = {1, 50};  // out of range: NaN row, nothing read outside
  std::vector<T> wb(2 * K);
  cuda::int8_dequantize_rows<T>(wb.data(), q.data(), sc.data(), bad.data(), 2, N, K, 32, nullptr);
  ++checks;
  if (std::isnan(ld(wb[0])) || !std::isnan(ld(wb[K + 5]))) { printf("FAIL int8_dequantize_rows bad id %s\n", tname<T>()); ++fails; }
}

template <class T> void run_all() {
  run_rows<T>();
  for (bool int4 : {true, false})
    for (int G : {32, 64, 128})
      for (int M : {1, 2, 3, 5, 8}) {
        run<T>(int4, M, 37, 4 * G, G, 0, M % 2 == 1);
        run<T>(int4, M, 8, 576 - 576 % G + (G == 32 ? 0 : G), G, 3, false);
      }
  run<T>(true, 1, 1025, 1536, 32, 0, true);
  run<T>(false, 4, 130, 2048, 32, 5, false);
  // tensor-core GEMM (half / bf16): every MT (M <= 16, <= 32, more), M and N tails, all groups
  if constexpr (!std::is_same_v<T, float>) {
    for (int G : {32, 64, 128})
      for (int M : {9, 16, 17, 33, 64, 100})
        run<T>(true, M, M % 2 ? 191 : 64, 2 * G + (G == 32 ? 64 : 0), G, M % 3 ? 0 : 5, M % 2 == 0, true);
    run<T>(true, 130, 577, 576, 64, 0, true, true);
    run<T>(true, 3, 70, 1536, 32, 1, false, true);  // small M works too
    // split-K (blockIdx.z over the groups, partial sums then the in-order reduction; bias added once):
    // uneven group ranges (ng = 9 over 2 and 5 ways), more splits than groups (zero-group splits), tails
    for (int G : {32, 64, 128})
      for (int S : {2, 3, 5})
        run<T>(true, S == 3 ? 40 : 17, S == 5 ? 200 : 130, 9 * G, G, S == 2 ? 3 : 0, S != 3, true, S);
    run<T>(true, 9, 64, 128, 64, 0, true, true, 4);  // 2 groups over 4 splits
    ++checks;
    if (cuda::int4_gemm_mma<T>(nullptr, nullptr, 32, nullptr, nullptr, nullptr, nullptr, 9, 1, 32, 32, 2, nullptr,
                               nullptr) != cudaErrorInvalidValue) { printf("FAIL splits without workspace accepted\n"); ++fails; }
    // the plan: 1 for a full grid, more for a small one, bounded by traffic, 16 and the groups
    ++checks;
    if (cuda::int4_mma_splits(16, 4096, 4096, 128, 132) != 4 || cuda::int4_mma_splits(64, 4096, 4096, 128, 132) != 1 ||
        cuda::int4_mma_splits(9, 28672, 4096, 128, 132) != 2 || cuda::int4_mma_splits(9, 576, 576, 32, 132) != 1 ||
        cuda::int4_mma_splits(9, 4096, 14336, 128, 132) != 9 || cuda::fp8_mma_splits(16, 4096, 4096, 132) != 8 ||
        cuda::fp8_mma_splits(64, 4096, 4096, 132) != 2 || cuda::fp8_mma_splits(9, 576, 64, 132) != 1) {
      printf("FAIL int4_mma_splits plan\n");
      ++fails;
    }
    // Marlin-style (M <= 64): every MT (M 1..16, ..32, ..64), N tails (8, 200: 1.56 columns), K tails of
    // the 128-deep unit (K = 576, 9 G, one group), one CTA (no split), a few (columns split mid-way, segments
    // of several units), one per unit (every column split k_tiles ways), strided a, bias
    for (int G : {32, 64, 128})
      for (int M : {1, 3, 16, 17, 40, 64}) {
        const int64_t N = M % 2 ? 200 : 8, K = M < 17 ? 576 - 576 % G + (G == 32 ? 0 : G) : 9 * G;
        const int units = int(cuda::int4_marlin_units(N, K));
        for (int ctas : {1, 3, units}) run_marlin<T>(M, N, K, G, M % 3 ? 0 : 8, M % 2 == 0, std::min(ctas, units));
      }
    run_marlin<T>(2, 300, 1536, 32, 0, true, 7);
    run_marlin<T>(1, 64, 64, 64, 0, false, 1);  // K below one unit
    {
      std::vector<T> o(4096), aa(4096);
      std::vector<uint8_t> qq(4096);
      std::vector<__half> ss(64);
      std::vector<float> ws(1 << 16);
      std::vector<unsigned> cn(4, 0u);
      auto call = [&](int M, int64_t stride, int G, int ctas) {
        return cuda::int4_gemm_marlin<T>(o.data(), aa.data(), stride, qq.data(), ss.data(), ss.data(), nullptr, M, 8,
                                         64, G, ctas, ws.data(), cn.data(), nullptr);
      };
      ++checks;
      if (call(65, 64, 32, 1) != cudaErrorInvalidValue || call(1, 67, 32, 1) != cudaErrorInvalidValue ||
          call(1, 64, 16, 1) != cudaErrorInvalidValue || call(1, 64, 32, 2) != cudaErrorInvalidValue ||
          call(1, 64, 32, 0) != cudaErrorInvalidValue || call(1, 64, 32, 1) != cudaSuccess) {
        printf("FAIL marlin argument checks\n");
        ++fails;
      }
    }
    // the plan: all SMs (2 an SM at most), never more CTAs than units
    ++checks;
    if (cuda::int4_marlin_ctas(4096, 4096, 132, 4) != 264 || cuda::int4_marlin_ctas(576, 576, 132, 1) != 25 ||
        cuda::int4_marlin_ctas(4096, 4096, 132, 1) != 132 || cuda::int4_marlin_rows(17) != 32 ||
        cuda::int4_marlin_smem_bytes(16) != 4 * (8192 + 4096 + 2048)) {
      printf("FAIL int4_marlin plan\n");
      ++fails;
    }
    for (int G : {64, 128})
      for (int M : {1, 5, 130}) run_sm90_prepare<T>(M, M == 130 ? 40 : 72, G == 64 ? 192 : 384, G, M % 2 ? 3 : 0);
    std::vector<float> fo(4);
    ++checks;
    if (cuda::int4_gemm_mma<float>(fo.data(), fo.data(), 4, nullptr, nullptr, nullptr, nullptr, 9, 1, 32, 32, 1,
                                   nullptr, nullptr) != cudaErrorInvalidValue) { printf("FAIL mma fp32 accepted\n"); ++fails; }
  }
  for (int M : {1, 5, 16, 17, 40, 70})
    run_fp8<T>(M, M % 2 ? 191 : 64, M % 3 ? 96 : 576, M % 4 ? 0 : 3, M % 2 == 0);
  run_fp8<T>(3, 130, 32, 1, true);
  // split-K: uneven step ranges (K = 576: 9 steps of 64; K = 160: 2.5 steps), more splits than steps, scales and
  // bias applied once after the in-order sum
  for (int S : {2, 3, 5}) run_fp8<T>(S == 3 ? 40 : 17, S == 5 ? 200 : 130, S == 2 ? 160 : 576, S == 2 ? 3 : 0, S != 3, S);
  run_fp8<T>(9, 64, 96, 0, true, 4);
  run_dequant<T>(13, 256, 32);
  run_dequant<T>(7, 384, 128);
  run_dequant<T>(5, 192, 64);
  run_dequant<T>(3, 4096, 128);
  run_dequant<T>(13, 96, 32, true);
  // invalid: M = 9, K not a multiple of 32
  std::vector<T> o(16), a(16);
  std::vector<uint8_t> q(16);
  std::vector<__half> s(4);
  ++checks;
  if (cuda::quant_gemv<T>(o.data(), a.data(), 8, q.data(), s.data(), s.data(), nullptr, 9, 1, 32, 32, true, nullptr) !=
      cudaErrorInvalidValue) { printf("FAIL M=9 accepted\n"); ++fails; }
}

int main() {
  run_all<float>();
  run_all<__half>();
  run_all<__nv_bfloat16>();
  printf("test_quant: %d checks, %d failures, %ld launches\n", checks, fails, dk_emu::launches.load());
  return fails != 0;
}
