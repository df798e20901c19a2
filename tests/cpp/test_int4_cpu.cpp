// CPU INT4 / INT8 weight-only GEMM (include/decodekit/gemm/int4.h and the kernels it routes to: the
// GEMV and 2 .. 8-row kernels, AVX-512 quant_small_m.h or AVX2 quant_small_m_avx2.h; the tiled
// larger-M path int4_tiled.h; the portable loop where neither ISA is there) vs. a double-precision
// reference on the decoded weights (int4_code / int4_weight), for fp32/fp16/bf16, every row-block
// tail, N not a multiple of the column strip, several K blocks, group sizes 32/64/128, bias / no
// bias, rows of a strided with NaN padding. bf16 from 9 rows on AMX CPUs (quant_amx.h): the oracle
// rounds the decoded weight to bf16, as the tile unit's products do (and VDPBF16PS's on AVX512-BF16 CPUs without
// AMX: int4_tiled_bf16.h, also called directly at every M); fp32 / fp16 from 9 rows there
// (quant_amx_exact.h): the bound adds each block's fixed-point error. Rows 1 .. 8 must also be bitwise the rows computed
// alone (speculative verification reproduces plain decoding).
//
// CMake builds this file for -march=native and, where the compiler can, for x86-64-v3 (AVX2 + FMA +
// F16C, no AVX-512: the AVX2 kernels on any x86 CI machine; skipped, exit 77, on CPUs without AVX2)
// and plain x86-64 (the portable loops).
//
// Tolerance: the kernels sum K products in fp32 and round once to T: |err| <= K * 2^-24 * S (+ the
// store's rounding, store_tol). The tiled kernel multiplies decoded weights (S = sum_k |a w| +
// |bias|); the row kernels sum codes per group, scale them and add min * sum(a) (S = sum_k |a| (|d q|
// + |min|) + |bias|, since d q and min may cancel in w).
#include <vector>

#include "check.h"
#include "decodekit/gemm/int4.h"

using namespace dk_test;

namespace {

constexpr int kGuard = 16;

struct Quant {  // one random weight, both formats' codes
  int64_t N, K;
  int G;
  std::vector<uint8_t> q4;       // [N, K / 2]
  std::vector<int8_t> q8;        // [N, K]
  std::vector<dk::half_t> s, m;  // [N, K / G]
  Quant(Rng& rng, int64_t N_, int64_t K_, int G_) : N(N_), K(K_), G(G_) {
    q4.resize(size_t(N * K / 2));
    q8.resize(size_t(N * K));
    s.resize(size_t(N * K / G));
    m.resize(size_t(N * K / G));
    for (auto& b : q4) b = uint8_t(rng.u32());
    for (auto& b : q8) b = int8_t(rng.u32());
    for (auto& x : s) x.bits = dk::float_to_half(float(rng.uniform(0.002, 0.05)));
    for (auto& x : m) x.bits = dk::float_to_half(float(0.2 * rng.normal()));
  }
  double part_abs(bool int8, int64_t n, int64_t k) const {  // |d q| + |min|: the row kernels' terms
    const int64_t g = n * (K / G) + k / G;
    const double d = dk::half_to_float(s[g].bits);
    if (int8) return std::fabs(d * q8[size_t(n * K + k)]);
    return std::fabs(d * dk::int4_code(q4.data() + n * (K / 2), G, k)) + std::fabs(dk::half_to_float(m[g].bits));
  }
  double w(bool int8, int64_t n, int64_t k) const {
    const int64_t g = n * (K / G) + k / G;
    const float d = dk::half_to_float(s[g].bits);
    if (int8) return double(d) * q8[size_t(n * K + k)];
    return dk::int4_weight(dk::int4_code(q4.data() + n * (K / 2), G, k), d, dk::half_to_float(m[g].bits));
  }
};

enum class Path { kEntry, kTiled, kTiledBf16 };

// out = a @ w^T (+ bias) through int4_gemm / int8_gemm (entry) or the tiled kernel itself.
template <class T>
void gemm(Path path, const Quant& W, bool int8, T* out, const T* a, int64_t lda, const T* bias, int64_t M) {
  const int64_t N = W.N, K = W.K;
  if (path == Path::kEntry) {
    const dk::cpu::Int4GemmParams P{M, N, K, W.G, lda};
    if (int8) dk::cpu::int8_gemm<T>(out, a, W.q8.data(), W.s.data(), bias, P);
    else dk::cpu::int4_gemm<T>(out, a, W.q4.data(), W.s.data(), W.m.data(), bias, P);
    return;
  }
#if defined(DK_TILED_QUANT_BF16)
  if constexpr (std::is_same_v<T, dk::bf16_t>)
    if (path == Path::kTiledBf16) {
      const bool ran = int8 ? dk::cpu::int8_gemm_tiled_bf16(out, a, lda, W.q8.data(), W.s.data(), bias, M, N, K, W.G)
                            : dk::cpu::int4_gemm_tiled_bf16(out, a, lda, W.q4.data(), W.s.data(), W.m.data(), bias, M,
                                                            N, K, W.G);
      CHECK(ran) << "int4_gemm_tiled_bf16 did not run";
      return;
    }
#endif
#if defined(DK_TILED_QUANT_GEMM)
  if (int8) dk::cpu::int8_gemm_tiled<T>(out, a, lda, W.q8.data(), W.s.data(), bias, M, N, K, W.G);
  else dk::cpu::int4_gemm_tiled<T>(out, a, lda, W.q4.data(), W.s.data(), W.m.data(), bias, M, N, K, W.G);
#endif
}

template <class T>
void test_gemm(Rng& rng, const Quant& W, bool int8, int64_t M, bool with_bias, Path path) {
  const int64_t N = W.N, K = W.K, lda = K + 5;
  std::vector<T> a(size_t(M * lda), poison<T>()), bias(static_cast<size_t>(N));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) a[size_t(r * lda + k)] = from_d<T>(rng.normal());
  for (auto& b : bias) b = from_d<T>(rng.normal());
  const T* bp = with_bias ? bias.data() : nullptr;
  std::vector<T> out(size_t(M * N) + kGuard, poison<T>());
  gemm(path, W, int8, out.data(), a.data(), lda, bp, M);
  // the tiled kernel's bound uses sum |a w|; the row kernels' (entry, M <= 8) sum |a| (|d q| + |min|)
  // bf16 through the entry past the few-row kernels: the tile unit from kTiledQuantGemmMinM rows (AMX CPUs), else
  // the tiled kernels from kTiledVectorMinM
  constexpr bool kBf16 = std::is_same_v<T, dk::bf16_t>;
#if defined(DK_AMX_QUANT_GEMM)
  const bool amx_bf16 = kBf16 && path == Path::kEntry && M >= dk::cpu::kTiledQuantGemmMinM && dk::cpu::amx_enabled();
#else
  const bool amx_bf16 = false;
#endif
  const int64_t bf16_tiled_min = amx_bf16 ? dk::cpu::kTiledQuantGemmMinM : dk::cpu::kTiledVectorMinM;
#if defined(DK_TILED_QUANT_GEMM)
  const bool parts = path == Path::kEntry && (M < bf16_tiled_min || !kBf16);
#else
  const bool parts = true;
#endif
  // bf16 there on an AMX CPU (quant_amx.h) or one with AVX512-BF16 (int4_tiled_bf16.h): products of the
  // bf16-rounded decoded weight
  [[maybe_unused]] const bool entry_bf16 = kBf16 && path == Path::kEntry && M >= bf16_tiled_min;
  bool amx = amx_bf16;
#if defined(DK_TILED_QUANT_BF16)
  amx = amx || path == Path::kTiledBf16 || (entry_bf16 && dk::cpu::bf16_dot_enabled());
#endif
  // fp32 / fp16 from 9 rows on an AMX CPU (quant_amx_exact.h): each 32-element block of a row is a
  // 23-bit fixed point, |a - a'| <= 2^-22 max |a| over the block; the products are exact, the block
  // sums scaled as the row kernels' (parts)
#if defined(DK_AMX_EXACT_GEMM)
  const bool exact = !std::is_same_v<T, dk::bf16_t> && path == Path::kEntry && M >= dk::cpu::kTiledQuantGemmMinM &&
                     dk::cpu::amx_enabled();
#else
  const bool exact = false;
#endif
  const double rel32 = double(K) * 0x1.0p-24;
  std::vector<double> wrow(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const double w = W.w(int8, n, k);
      wrow[size_t(k)] = amx ? double(dk::bf16_to_float(dk::float_to_bf16(float(w)))) : w;
    }
    for (int64_t r = 0; r < M; ++r) {
      double want = with_bias ? to_d(bias[size_t(n)]) : 0.0, scale = std::fabs(want), fixed = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double x = to_d(a[size_t(r * lda + k)]), p = x * wrow[size_t(k)];
        want += p;
        scale += parts ? std::fabs(x) * W.part_abs(int8, n, k) : std::fabs(p);
      }
      for (int64_t b = 0; exact && b < K / 32; ++b) {  // the fixed-point error of each block
        double amax = 0.0, wsum = 0.0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
          amax = std::max(amax, std::fabs(to_d(a[size_t(r * lda + k)])));
          wsum += W.part_abs(int8, n, k);
        }
        fixed += 0x1.0p-22 * amax * wsum;
      }
      CHECK_NEAR(to_d(out[size_t(r * N + n)]), want, store_tol<T>(want, rel32, scale) + fixed)
          << (int8 ? "int8" : "int4") << TypeInfo<T>::name << "M" << M << "N" << N << "K" << K << "G" << W.G
          << "row" << r << "col" << n << (amx ? "bf16 products" : exact ? "amx-exact" : path == Path::kEntry ? "entry" : "tiled");
    }
  }
  for (int i = 0; i < kGuard; ++i) CHECK(same_bits(out[size_t(M * N + i)], poison<T>())) << "wrote past the output";
}

// Rows 1 .. 8 through the entry: each row bitwise what it gets alone (M = 1).
template <class T>
void test_rows_alone(Rng& rng, const Quant& W, bool int8) {
  const int64_t N = W.N, K = W.K, M = 8;
  std::vector<T> a(size_t(M * K)), bias(static_cast<size_t>(N));
  for (auto& x : a) x = from_d<T>(rng.normal());
  for (auto& b : bias) b = from_d<T>(rng.normal());
  std::vector<T> alone(size_t(M * N)), out(size_t(M * N));
  for (int64_t r = 0; r < M; ++r) gemm(Path::kEntry, W, int8, alone.data() + r * N, a.data() + r * K, K, bias.data(), 1);
  for (int64_t m = 2; m <= M; ++m) {
    std::fill(out.begin(), out.end(), poison<T>());
    gemm(Path::kEntry, W, int8, out.data(), a.data(), K, bias.data(), m);
    int64_t differ = 0;
    for (int64_t i = 0; i < m * N; ++i) differ += !same_bits(out[size_t(i)], alone[size_t(i)]);
    CHECK(differ == 0) << (int8 ? "int8" : "int4") << TypeInfo<T>::name << "M" << m << "N" << N << "K" << K << "G"
                       << W.G << ":" << differ << "elements differ from the rows computed alone";
  }
}

}  // namespace

int main() {
  skip_without_avx2("test_int4_cpu");
  Rng rng(7);
  const int64_t shapes[][3] = {{191, 576, 32}, {577, 256, 64}, {96, 640, 128}, {33, 1536, 32}, {5, 64, 32}};
  for (const auto& sh : shapes) {
    const Quant W(rng, sh[0], sh[1], int(sh[2]));
    for (bool int8 : {false, true}) {
      for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 24, 37, 100}) {
        const bool with_bias = (M + int8) % 2;
        for (Path path : {Path::kEntry, Path::kTiled}) {
#if !defined(DK_TILED_QUANT_GEMM)
          if (path == Path::kTiled) continue;
#endif
          test_gemm<float>(rng, W, int8, M, with_bias, path);
          test_gemm<dk::half_t>(rng, W, int8, M, !with_bias, path);
          test_gemm<dk::bf16_t>(rng, W, int8, M, with_bias, path);
        }
#if defined(DK_TILED_QUANT_BF16)
        test_gemm<dk::bf16_t>(rng, W, int8, M, !with_bias, Path::kTiledBf16);
#endif
      }
      test_rows_alone<float>(rng, W, int8);
      test_rows_alone<dk::bf16_t>(rng, W, int8);
    }
  }
#if defined(DK_AMX_QUANT_GEMM)
  std::printf("test_int4_cpu: AVX-512 kernels%s\n", !dk::cpu::amx_enabled() ? ""
#if defined(DK_AMX_EXACT_GEMM)
                                                   : ", AMX from 9 rows (bf16; fp32 / fp16 exact products)");
#else
                                                   : ", AMX for bf16 from 9 rows");
#endif
#elif defined(DK_TILED_QUANT_BF16)
  std::printf("test_int4_cpu: AVX-512 kernels, AVX512-BF16 products for bf16 from 9 rows\n");
#elif defined(DK_TILED_QUANT_AVX512)
  std::printf("test_int4_cpu: AVX-512 kernels\n");
#elif defined(DK_QUANT_SMALL_M_AVX2)
  std::printf("test_int4_cpu: AVX2 kernels\n");
#else
  std::printf("test_int4_cpu: portable loops\n");
#endif
  return finish("test_int4_cpu");
}
