// CUDA rms_norm / fused_add_rms_norm (include/decodekit/norm.cuh) vs. the CPU kernels
// (norm.h, verified against double precision by test_norm). Exits 77 (skipped) without
// an sm_90 GPU. Shapes cover every launch plan of norm.cuh: lane groups / a warp per row
// (small hidden), one CTA per row with 1, 2 or 4 accesses per thread in registers, the
// two-pass path (huge rows), 16-byte (vector) and scalar accesses (odd hidden or strides,
// misaligned pointers), and many rows.
#include "cuda_util.h"
#include "decodekit/norm.cuh"
#include "decodekit/norm.h"

using namespace dk_test;

namespace {

constexpr int kGuard = 16;
double rel32_norm(int hidden) { return (hidden / 2.0 + 9.0) * 0x1.0p-24; }  // see test_norm.cpp (+u for z)

template <class T>
std::vector<T> rows_buffer(Rng& rng, int64_t rows, int hidden, int64_t stride) {
  std::vector<T> b(size_t(rows > 0 ? (rows - 1) * stride + hidden : 0) + kGuard, poison<T>());
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < hidden; ++i) b[r * stride + i] = from_d<T>((r % 3 == 1 ? 30.0 : 1.0) * rng.normal());
  return b;
}

CompareStats g_stats;

template <class T>
void test_rms_norm(Rng& rng, int64_t rows, int hidden, int64_t stride, size_t misalign) {
  const std::vector<T> in = rows_buffer<T>(rng, rows, hidden, stride);
  std::vector<T> w(hidden + kGuard, poison<T>());
  for (int i = 0; i < hidden; ++i) w[i] = from_d<T>(1.0 + 0.5 * rng.normal());
  std::vector<T> out(size_t(rows * hidden) + kGuard, poison<T>());
  DeviceBuffer<T> d_in(in, misalign), d_w(w), d_out(out, misalign);
  dk::cpu::rms_norm<T>(out.data(), in.data(), stride, w.data(), rows, hidden, 1e-6f);
  CUDA_OK(dk::cuda::rms_norm<cuda_t<T>>(d_out.dev(), d_in.dev(), stride, d_w.dev(), rows, hidden, 1e-6f, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const double rel32 = rel32_norm(hidden);
  const std::string what = std::string("rms_norm ") + TypeInfo<T>::name + " rows " + std::to_string(rows) +
                           " hidden " + std::to_string(hidden) + " stride " + std::to_string(stride) + " misalign " +
                           std::to_string(misalign);
  auto tol = [&](size_t, double c) { return 2 * store_tol<T>(c, rel32, std::fabs(c)); };
  const CompareStats s = compare_buffers(d_out.download(), out, tol, what);
  compare_buffers(d_in.download(), in, [](size_t, double) { return -1.0; }, what + " (input unchanged)");
  g_stats.exact += s.exact;
  g_stats.near += s.near;
}

template <class T>
void test_fused(Rng& rng, int64_t rows, int hidden, int64_t x_stride, int64_t r_stride, size_t misalign) {
  std::vector<T> x = rows_buffer<T>(rng, rows, hidden, x_stride), res = rows_buffer<T>(rng, rows, hidden, r_stride);
  std::vector<T> w(hidden + kGuard, poison<T>());
  for (int i = 0; i < hidden; ++i) w[i] = from_d<T>(1.0 + 0.5 * rng.normal());
  DeviceBuffer<T> d_x(x, misalign), d_res(res), d_w(w);
  dk::cpu::fused_add_rms_norm<T>(x.data(), x_stride, res.data(), r_stride, w.data(), rows, hidden, 1e-6f);
  CUDA_OK(dk::cuda::fused_add_rms_norm<cuda_t<T>>(d_x.dev(), x_stride, d_res.dev(), r_stride, d_w.dev(), rows, hidden,
                                                 1e-6f, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const double rel32 = rel32_norm(hidden);
  const std::string what = std::string("fused_add_rms_norm ") + TypeInfo<T>::name + " rows " + std::to_string(rows) +
                           " hidden " + std::to_string(hidden) + " strides " + std::to_string(x_stride) + "/" +
                           std::to_string(r_stride) + " misalign " + std::to_string(misalign);
  const CompareStats s =
      compare_buffers(d_x.download(), x, [&](size_t, double c) { return 2 * store_tol<T>(c, rel32, std::fabs(c)); },
                      what + " x");
  // residual = round(x + residual): one fp32 add and one rounding on both sides: bitwise equal
  compare_buffers(d_res.download(), res, [](size_t, double) { return -1.0; }, what + " residual");
  g_stats.exact += s.exact;
  g_stats.near += s.near;
}

template <class T>
void run_type(Rng& rng) {
  g_stats = {};
  for (int hidden : {8, 64, 200, 576, 769, 1024, 4096, 5120, 8192, 16384, 40000})
    for (int64_t rows : {1, 7, 83}) {
      if (hidden > 1024 && rows == 83) continue;  // keeps the CPU side quick (7 rows exercise the grid)
      test_rms_norm<T>(rng, rows, hidden, hidden, 0);
      test_rms_norm<T>(rng, rows, hidden, hidden + 8, 0);   // strided, still 16-byte accesses
      test_rms_norm<T>(rng, rows, hidden, hidden + 13, 0);  // strided, scalar
      test_rms_norm<T>(rng, rows, hidden, hidden, 1);       // misaligned pointers: scalar
      test_fused<T>(rng, rows, hidden, hidden, hidden, 0);
      test_fused<T>(rng, rows, hidden, 2 * hidden + 8, hidden + 16, 0);
      test_fused<T>(rng, rows, hidden, hidden + 3, hidden, 0);
      test_fused<T>(rng, rows, hidden, hidden, hidden, 1);
    }
  for (int hidden : {64, 576, 4096}) {  // many rows
    test_rms_norm<T>(rng, 3001, hidden, hidden, 0);
    test_fused<T>(rng, 3001, hidden, hidden, hidden, 0);
  }
  test_rms_norm<T>(rng, 0, 64, 64, 0);  // no-op
  test_fused<T>(rng, 0, 64, 64, 64, 0);
  std::printf("%s: elements bitwise equal to CPU (incl. untouched): %lld, within tolerance: %lld\n", TypeInfo<T>::name,
              g_stats.exact, g_stats.near);
}

}  // namespace

int main() {
  require_gpu_or_skip("test_norm_cuda");
  Rng rng(77);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_norm_cuda");
}
