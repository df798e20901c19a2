// CPU fp8 e4m3 W8A8 GEMM (include/decodekit/gemm/fp8_gemm.h: the AVX-512 or AVX2 kernel, or the portable
// loop; from 9 rows, with AVX512-BF16, the tiled bf16-product kernel) vs. a float64 reference on the same codes:
// M 1 .. 40 (every row-block tail), N odd or over two 32-column strips, K a multiple of 32, of 8 only, and of
// neither (the portable loop), per-row / per-column scales, bias or none,
// fp32 / fp16 / bf16 outputs, output guard poisoned.
//
// CMake builds it for -march=native, x86-64-v3 (AVX2, no AVX-512; skipped, exit 77, without AVX2) and
// plain x86-64.
//
// Tolerance: products of e4m3 values are exact in fp32; K of them summed in fp32, then times
// a_scale * w_scale (two roundings) plus bias, rounded once to T:
// |err| <= (K + 3) * 2^-24 * (sum_k |a w| * |a_scale w_scale| + |bias|) + the store's rounding.
#include <cmath>
#include <vector>

#include "check.h"
#include "decodekit/gemm/fp8_gemm.h"

using namespace dk_test;

namespace {

constexpr int kGuard = 8;

uint8_t finite_code(Rng& rng) {
  for (;;) {
    const uint8_t c = uint8_t(rng.u32());
    if ((c & 0x7f) != 0x7f) return c;  // S.1111.111 is NaN
  }
}

template <class T>
void test_gemm(Rng& rng, int64_t M, int64_t N, int64_t K, bool with_bias) {
  std::vector<uint8_t> a(size_t(M * K)), w(size_t(N * K));
  for (auto& c : a) c = finite_code(rng);
  for (auto& c : w) c = finite_code(rng);
  std::vector<float> as(static_cast<size_t>(M)), ws(static_cast<size_t>(N));
  for (auto& s : as) s = float(rng.uniform(0.001, 0.1));
  for (auto& s : ws) s = float(rng.uniform(0.001, 0.1));
  std::vector<T> bias(static_cast<size_t>(N)), out(size_t(M * N) + kGuard, poison<T>());
  for (auto& b : bias) b = from_d<T>(rng.normal());
  dk::cpu::fp8_gemm<T>(out.data(), a.data(), as.data(), w.data(), ws.data(), with_bias ? bias.data() : nullptr, M, N,
                       K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(dk::fp8_e4m3_to_float(a[size_t(m * K + k)])) * dk::fp8_e4m3_to_float(w[size_t(n * K + k)]);
        dot += p;
        mag += std::fabs(p);
      }
      const double sc = double(as[size_t(m)]) * ws[size_t(n)], b = with_bias ? to_d(bias[size_t(n)]) : 0.0;
      const double want = dot * sc + b;
      CHECK_NEAR(to_d(out[size_t(m * N + n)]), want,
                 store_tol<T>(want, double(K + 3) * 0x1.0p-24, mag * sc + std::fabs(b)))
          << "fp8_gemm" << TypeInfo<T>::name << "M" << M << "N" << N << "K" << K << "at" << m << n;
    }
  for (int i = 0; i < kGuard; ++i) CHECK(same_bits(out[size_t(M * N + i)], poison<T>())) << "wrote past the output";
}

}  // namespace

int main() {
  skip_without_avx2("test_fp8_gemm_cpu");
  Rng rng(5);
  for (int64_t K : {576, 200, 13, 96})
    for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 13, 17, 40})
      for (int64_t N : {37, 70}) {  // 70: two column strips of 32 and a tail of 6
        if (N == 70 && M % 2) continue;
        test_gemm<float>(rng, M, N, K, M % 2);
        test_gemm<dk::half_t>(rng, M, N, K, !(M % 2));
        test_gemm<dk::bf16_t>(rng, M, N, K, true);
      }
#if defined(DK_FP8_GEMM_AVX512) && defined(DK_TILED_QUANT_BF16)
  std::printf("test_fp8_gemm_cpu: AVX-512 kernel, bf16 products from %d rows\n", int(dk::cpu::kFp8TiledMinM));
#elif defined(DK_FP8_GEMM_AVX512)
  std::printf("test_fp8_gemm_cpu: AVX-512 kernel\n");
#elif defined(DK_AVX2)
  std::printf("test_fp8_gemm_cpu: AVX2 kernel\n");
#else
  std::printf("test_fp8_gemm_cpu: portable loop\n");
#endif
  return finish("test_fp8_gemm_cpu");
}
