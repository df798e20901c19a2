// CPU INT4 / INT8 weight-only GEMM, tiled larger-M path (include/decodekit/gemm/int4_tiled.h),
// vs. a double-precision reference on the decoded weights (int4_code / int4_weight), for
// fp32/fp16/bf16, every row-block tail (M % 12), N not a multiple of the 32-column strip, several
// K blocks, group sizes 32/64/128, bias / no bias, rows of a strided with NaN padding.
//
// Tolerance: the kernel sums K products in fp32 (blocks of <= 256, then across blocks) and rounds
// once to T: |err| <= K * 2^-24 * sum_k |a w| (+ |bias|) before the store (store_tol).
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
  double w(bool int8, int64_t n, int64_t k) const {
    const int64_t g = n * (K / G) + k / G;
    const float d = dk::half_to_float(s[g].bits);
    if (int8) return double(d) * q8[size_t(n * K + k)];
    return dk::int4_weight(dk::int4_code(q4.data() + n * (K / 2), G, k), d, dk::half_to_float(m[g].bits));
  }
};

template <class T>
void test_gemm(Rng& rng, const Quant& W, bool int8, int64_t M, bool with_bias) {
  const int64_t N = W.N, K = W.K, lda = K + 5;
  std::vector<T> a(size_t(M * lda), poison<T>()), bias(static_cast<size_t>(N));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) a[size_t(r * lda + k)] = from_d<T>(rng.normal());
  for (auto& b : bias) b = from_d<T>(rng.normal());
  const T* bp = with_bias ? bias.data() : nullptr;
  std::vector<T> out(size_t(M * N) + kGuard, poison<T>());
  if (int8)
    dk::cpu::int8_gemm_tiled<T>(out.data(), a.data(), lda, W.q8.data(), W.s.data(), bp, M, N, K, W.G);
  else
    dk::cpu::int4_gemm_tiled<T>(out.data(), a.data(), lda, W.q4.data(), W.s.data(), W.m.data(), bp, M, N, K, W.G);
  const double rel32 = double(K) * 0x1.0p-24;
  std::vector<double> wrow(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) wrow[size_t(k)] = W.w(int8, n, k);
    for (int64_t r = 0; r < M; ++r) {
      double want = with_bias ? to_d(bias[size_t(n)]) : 0.0, scale = std::fabs(want);
      for (int64_t k = 0; k < K; ++k) {
        const double p = to_d(a[size_t(r * lda + k)]) * wrow[size_t(k)];
        want += p;
        scale += std::fabs(p);
      }
      CHECK_NEAR(to_d(out[size_t(r * N + n)]), want, store_tol<T>(want, rel32, scale))
          << (int8 ? "int8" : "int4") << TypeInfo<T>::name << "M" << M << "N" << N << "K" << K << "G" << W.G
          << "row" << r << "col" << n;
    }
  }
  for (int i = 0; i < kGuard; ++i) CHECK(same_bits(out[size_t(M * N + i)], poison<T>())) << "wrote past the output";
}

}  // namespace

int main() {
#if defined(DK_TILED_QUANT_GEMM)
  Rng rng(7);
  const int64_t shapes[][3] = {{191, 576, 32}, {577, 256, 64}, {96, 640, 128}, {33, 1536, 32}, {5, 64, 32}};
  for (const auto& sh : shapes) {
    const Quant W(rng, sh[0], sh[1], int(sh[2]));
    for (int64_t M : {1, 2, 5, 8, 9, 12, 13, 24, 37, 100}) {
      for (bool int8 : {false, true}) {
        const bool with_bias = (M + int8) % 2;
        test_gemm<float>(rng, W, int8, M, with_bias);
        test_gemm<dk::half_t>(rng, W, int8, M, !with_bias);
        test_gemm<dk::bf16_t>(rng, W, int8, M, with_bias);
      }
    }
  }
#else
  std::printf("test_int4_tiled: built without AVX-512, nothing to test\n");
#endif
  return finish("test_int4_tiled");
}
