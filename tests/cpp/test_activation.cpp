// CPU silu_and_mul (include/decodekit/activation.h) vs. a double-precision reference, for
// fp32/fp16/bf16, awkward sizes and strided input rows.
//
// Tolerance: the kernel computes silu(g) * u = g / (1 + expf(-g)) * u in fp32 and rounds
// once to T. With u = 2^-24: expf is within 4u (glibc's scalar expf is < 1 ulp; vector
// variants <= 4 ulp); 1 + e keeps that relative bound (e / (1 + e) <= 1) and adds u; the
// division and the product add u each  =>  rel32 <= 7u (we allow 8u), relative to |want|
// (no cancellation anywhere). One exception: for g < -88.72, expf(-g) overflows, silu
// returns -0 and the exact |silu(g)| < 88.73 * e^-88.72 < 3e-37, so we add 3e-37 * |u| to
// the absolute tolerance. Then |got - want| <= eps_T |want| + tiny_T + rel32 |want| + ...
#include <vector>

#include "check.h"
#include "decodekit/activation.h"

using namespace dk_test;

namespace {

constexpr int kGuard = 16;
double g_worst = 0;

template <class T>
void test_silu_and_mul(Rng& rng, int64_t rows, int64_t d, int64_t in_stride) {
  const char* tn = TypeInfo<T>::name;
  std::vector<T> in(size_t(rows > 0 ? (rows - 1) * in_stride + 2 * d : 0) + kGuard, poison<T>());
  static const double kSpecial[] = {0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 87.0, -87.0, -88.8, -100.0, 100.0, 1e-3};
  for (int64_t r = 0; r < rows; ++r) {
    T* row = in.data() + r * in_stride;
    for (int64_t i = 0; i < d; ++i) {
      // gate: mostly N(0, 3^2), some special values; up: N(0, 1)
      const double g = (i % 97 == 5) ? kSpecial[(r + i / 97) % 12] : 3.0 * rng.normal();
      row[i] = from_d<T>(g);
      row[d + i] = from_d<T>(rng.normal());
    }
  }
  std::vector<T> out(size_t(rows * d) + kGuard, poison<T>());
  const std::vector<T> in0 = in, out0 = out;

  dk::cpu::silu_and_mul<T>(out.data(), in.data(), in_stride, rows, d);

  const double rel32 = 8 * 0x1.0p-24;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = in.data() + r * in_stride;
    for (int64_t i = 0; i < d; ++i) {
      const double g = to_d(row[i]), u = to_d(row[d + i]);
      const double want = g / (1.0 + std::exp(-g)) * u;
      const double tol = store_tol<T>(want, rel32, std::fabs(want)) + 3e-37 * std::fabs(u);
      const double got = to_d(out[r * d + i]);
      g_worst = std::max(g_worst, std::fabs(got - want) / tol);
      CHECK_NEAR(got, want, tol) << "silu_and_mul" << tn << "rows" << rows << "d" << d << "stride" << in_stride << "at"
                                 << r << i << "g" << g << "u" << u;
    }
  }
  CHECK(std::memcmp(in.data(), in0.data(), in.size() * sizeof(T)) == 0) << "silu_and_mul wrote its input";
  long long bad = 0;
  for (size_t j = size_t(rows * d); j < out.size(); ++j) bad += !same_bits(out[j], out0[j]);
  CHECK(bad == 0) << "silu_and_mul wrote past the output";
}

template <class T>
void run_type(Rng& rng) {
  for (int64_t rows : {1, 7, 83})
    for (int64_t d : {64, 769, 5120}) {
      test_silu_and_mul<T>(rng, rows, d, 2 * d);            // contiguous [rows, 2d]
      test_silu_and_mul<T>(rng, rows, d, 2 * d + 7);        // strided rows
      test_silu_and_mul<T>(rng, rows, d, 4 * d);            // e.g. a column slice of a wider buffer
    }
  test_silu_and_mul<T>(rng, 0, 64, 128);  // no-op
  std::printf("%s: max |err|/tol %.3f\n", TypeInfo<T>::name, g_worst);
  g_worst = 0;
}

// The shared scalar helper used by the CUDA kernels.
void test_silu_scalar() {
  for (double step = -30; step <= 30; step += 0.037) {
    const float g = float(step);
    const double want = g / (1 + std::exp(-double(g)));
    CHECK_NEAR(dk::silu(g), want, 8 * 0x1.0p-24 * std::fabs(want) + 1e-30) << "silu" << g;
  }
  CHECK(dk::silu(0.0f) == 0.0f);
  CHECK(dk::silu(-200.0f) == 0.0f);  // expf overflow -> -0
  CHECK(dk::silu(200.0f) == 200.0f);
}

}  // namespace

int main() {
  test_silu_scalar();
  Rng rng(2024);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_activation");
}
