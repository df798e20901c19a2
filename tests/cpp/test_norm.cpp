// CPU rms_norm / fused_add_rms_norm (include/decodekit/norm.h) vs. a double-precision
// reference, for fp32/fp16/bf16, awkward sizes and strided rows.
//
// Tolerance (see store_tol in check.h): the kernel computes in fp32 and rounds once to T.
// fp32 error of out = x * w / sqrt(sum(x^2)/n + eps), relative to the exact result, for
// n = hidden and u = 2^-24 (worst case, any summation order; all terms are >= 0):
//   squares + sum: n*u;  /n, +eps: 2u;  sqrt halves the relative error: (n+2)u/2 + u;
//   1/sqrt: u;  two products: 2u   =>  rel32 <= (n/2 + 5) u  (we allow (n/2 + 8) u).
// fused_add_rms_norm first forms z = x + residual in fp32 (one more u).
// Then |got - want| <= eps_T * |want| + tiny_T + rel32 * |want|  (eps_T = 2^-24/2^-11/2^-8).
#include <functional>
#include <vector>

#include "check.h"
#include "decodekit/norm.h"

using namespace dk_test;

namespace {

constexpr int kGuard = 16;  // poisoned elements after every buffer

double g_worst_rms = 0, g_worst_fused = 0;  // largest |err| / tol seen, per type (for the log)

double rel32_norm(int hidden) { return (hidden / 2.0 + 8.0) * 0x1.0p-24; }

// Row r of a test input: mostly N(0,1) * scale with a few row scales (tiny, large) and an
// all-zero row (output must be exactly 0: x * rsqrt(eps) * w with x = 0).
template <class T>
void fill_row(Rng& rng, T* row, int hidden, int64_t r) {
  static const double kScale[] = {1.0, 0.01, 50.0, 3.0};
  const double s = kScale[r % 4];
  const bool zero = r == 5;
  for (int i = 0; i < hidden; ++i) row[i] = from_d<T>(zero ? 0.0 : s * rng.normal());
}

template <class T>
std::vector<T> make_weight(Rng& rng, int hidden) {
  std::vector<T> w(hidden + kGuard, poison<T>());
  for (int i = 0; i < hidden; ++i) w[i] = from_d<T>(1.0 + 0.5 * rng.normal());
  return w;
}

// Every element of buf that is not in [row * stride, row * stride + hidden) for some row
// must still be bitwise equal to `before` (strided gaps and guards are never written).
template <class T>
void check_untouched(const std::vector<T>& buf, const std::vector<T>& before, int64_t rows, int64_t stride, int hidden,
                     const char* what) {
  long long bad = 0;
  for (size_t j = 0; j < buf.size(); ++j) {
    const int64_t r = int64_t(j) / stride, c = int64_t(j) % stride;
    const bool inside = r < rows && c < hidden;
    if (!inside) bad += !same_bits(buf[j], before[j]);
  }
  CHECK(bad == 0) << what << ":" << bad << "elements outside the rows were written";
}

template <class T>
void test_rms_norm(Rng& rng, int64_t rows, int hidden, int64_t in_stride, float eps) {
  const char* tn = TypeInfo<T>::name;
  std::vector<T> in(size_t(rows > 0 ? (rows - 1) * in_stride + hidden : 0) + kGuard, poison<T>());
  for (int64_t r = 0; r < rows; ++r) fill_row(rng, in.data() + r * in_stride, hidden, r);
  const std::vector<T> w = make_weight<T>(rng, hidden);
  std::vector<T> out(size_t(rows * hidden) + kGuard, poison<T>());
  const std::vector<T> in0 = in, out0 = out;

  dk::cpu::rms_norm<T>(out.data(), in.data(), in_stride, w.data(), rows, hidden, eps);

  const double rel32 = rel32_norm(hidden);
  double worst = 0;  // largest |err| / tol, for the log
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in.data() + r * in_stride;
    double ss = 0;
    for (int i = 0; i < hidden; ++i) ss += to_d(x[i]) * to_d(x[i]);
    const double inv = 1.0 / std::sqrt(ss / hidden + double(eps));
    for (int i = 0; i < hidden; ++i) {
      const double want = to_d(x[i]) * inv * to_d(w[i]);
      const double got = to_d(out[r * hidden + i]);
      const double tol = store_tol<T>(want, rel32, std::fabs(want));
      worst = std::max(worst, std::fabs(got - want) / tol);
      CHECK_NEAR(got, want, tol) << "rms_norm" << tn << "rows" << rows << "hidden" << hidden << "stride" << in_stride
                                 << "at" << r << i;
    }
  }
  // The input is const and the output's guard is never written.
  CHECK(std::memcmp(in.data(), in0.data(), in.size() * sizeof(T)) == 0) << "rms_norm wrote its input";
  check_untouched(out, out0, rows, hidden, hidden, "rms_norm out");
  g_worst_rms = std::max(g_worst_rms, worst);
}

template <class T>
void test_fused_add(Rng& rng, int64_t rows, int hidden, int64_t x_stride, int64_t r_stride, float eps) {
  const char* tn = TypeInfo<T>::name;
  auto alloc = [&](int64_t stride) {
    return std::vector<T>(size_t(rows > 0 ? (rows - 1) * stride + hidden : 0) + kGuard, poison<T>());
  };
  std::vector<T> x = alloc(x_stride), res = alloc(r_stride);
  for (int64_t r = 0; r < rows; ++r) {
    fill_row(rng, x.data() + r * x_stride, hidden, r);
    fill_row(rng, res.data() + r * r_stride, hidden, r + 1);  // other scale: x and residual differ in size
  }
  const std::vector<T> w = make_weight<T>(rng, hidden);
  const std::vector<T> x0 = x, res0 = res;

  dk::cpu::fused_add_rms_norm<T>(x.data(), x_stride, res.data(), r_stride, w.data(), rows, hidden, eps);

  const double rel32 = rel32_norm(hidden) + 0x1.0p-24;
  double worst = 0;
  std::vector<double> z(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) {
      z[i] = to_d(x0[r * x_stride + i]) + to_d(res0[r * r_stride + i]);  // exact in double
      ss += z[i] * z[i];
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + double(eps));
    for (int i = 0; i < hidden; ++i) {
      // residual <- x + residual: one fp32 add (rel. error u), one rounding to T
      const double got_r = to_d(res[r * r_stride + i]);
      CHECK_NEAR(got_r, z[i], store_tol<T>(z[i], 0x1.0p-24, std::fabs(z[i])))
          << "fused_add residual" << tn << "rows" << rows << "hidden" << hidden << "at" << r << i;
      // x <- z * inv * w from the unrounded fp32 sum
      const double want = z[i] * inv * to_d(w[i]);
      const double got = to_d(x[r * x_stride + i]);
      const double tol = store_tol<T>(want, rel32, std::fabs(want));
      worst = std::max(worst, std::fabs(got - want) / tol);
      CHECK_NEAR(got, want, tol) << "fused_add x" << tn << "rows" << rows << "hidden" << hidden << "strides"
                                 << x_stride << r_stride << "at" << r << i;
    }
  }
  check_untouched(x, x0, rows, x_stride, hidden, "fused_add x");
  check_untouched(res, res0, rows, r_stride, hidden, "fused_add residual");
  g_worst_fused = std::max(g_worst_fused, worst);
}

template <class T>
void run_type(Rng& rng) {
  for (int64_t rows : {1, 7, 83}) {
    for (int hidden : {64, 769, 5120}) {
      const float eps = hidden == 769 ? 1e-5f : 1e-6f;
      test_rms_norm<T>(rng, rows, hidden, hidden, eps);       // contiguous
      test_rms_norm<T>(rng, rows, hidden, hidden + 13, eps);  // strided rows
      test_fused_add<T>(rng, rows, hidden, hidden, hidden, eps);
      test_fused_add<T>(rng, rows, hidden, 2 * hidden + 3, hidden + 8, eps);
    }
  }
  // rows = 0 is a no-op
  test_rms_norm<T>(rng, 0, 64, 64, 1e-6f);
  test_fused_add<T>(rng, 0, 64, 64, 64, 1e-6f);
  std::printf("%s: max |err|/tol rms_norm %.3f, fused_add_rms_norm %.3f\n", TypeInfo<T>::name, g_worst_rms,
              g_worst_fused);
  g_worst_rms = g_worst_fused = 0;
}

}  // namespace

int main() {
  Rng rng(1234);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_norm");
}
