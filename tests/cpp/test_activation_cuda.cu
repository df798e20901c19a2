// CUDA silu_and_mul (include/decodekit/activation.cuh) vs. the CPU kernel (activation.h,
// verified against double precision by test_activation). Exits 77 (skipped) without an
// sm_90 GPU. Covers 16-byte and scalar accesses (odd d, odd strides, misaligned
// pointers), decode-sized and many rows.
#include "cuda_util.h"
#include "decodekit/activation.cuh"
#include "decodekit/activation.h"

using namespace dk_test;

namespace {

CompareStats g_stats;

template <class T>
void test_silu_and_mul(Rng& rng, int64_t rows, int64_t d, int64_t in_stride, size_t misalign) {
  std::vector<T> in(size_t(rows > 0 ? (rows - 1) * in_stride + 2 * d : 0) + 16, poison<T>());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) {
      in[r * in_stride + i] = from_d<T>(i % 101 == 3 ? -100.0 : 3.0 * rng.normal());
      in[r * in_stride + d + i] = from_d<T>(rng.normal());
    }
  std::vector<T> out(size_t(rows * d) + 16, poison<T>());
  DeviceBuffer<T> d_in(in, misalign), d_out(out, misalign);
  dk::cpu::silu_and_mul<T>(out.data(), in.data(), in_stride, rows, d);
  CUDA_OK(dk::cuda::silu_and_mul<cuda_t<T>>(d_out.dev(), d_in.dev(), in_stride, rows, d, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const std::string what = std::string("silu_and_mul ") + TypeInfo<T>::name + " rows " + std::to_string(rows) + " d " +
                           std::to_string(d) + " stride " + std::to_string(in_stride) + " misalign " +
                           std::to_string(misalign);
  // 8u relative per kernel (see test_activation.cpp); 1e-36 covers expf overflow (g < -88.7)
  auto tol = [](size_t, double c) { return 2 * store_tol<T>(c, 8 * 0x1.0p-24, std::fabs(c)) + 1e-36; };
  const CompareStats s = compare_buffers(d_out.download(), out, tol, what);
  compare_buffers(d_in.download(), in, [](size_t, double) { return -1.0; }, what + " (input unchanged)");
  g_stats.exact += s.exact;
  g_stats.near += s.near;
}

template <class T>
void run_type(Rng& rng) {
  g_stats = {};
  for (int64_t d : {8, 64, 769, 1536, 5120, 14336})
    for (int64_t rows : {1, 7, 83}) {
      test_silu_and_mul<T>(rng, rows, d, 2 * d, 0);
      test_silu_and_mul<T>(rng, rows, d, 2 * d + 8, 0);  // strided, still 16-byte accesses
      test_silu_and_mul<T>(rng, rows, d, 2 * d + 7, 0);  // strided, scalar
      test_silu_and_mul<T>(rng, rows, d, 2 * d, 1);      // misaligned: scalar
    }
  test_silu_and_mul<T>(rng, 5000, 64, 128, 0);  // many rows
  test_silu_and_mul<T>(rng, 2, 1 << 21, 1 << 22, 0);  // long rows
  test_silu_and_mul<T>(rng, 0, 64, 128, 0);     // no-op
  std::printf("%s: elements bitwise equal to CPU (incl. untouched): %lld, within tolerance: %lld\n", TypeInfo<T>::name, g_stats.exact,
              g_stats.near);
}

}  // namespace

int main() {
  require_gpu_or_skip("test_activation_cuda");
  Rng rng(5);
  run_type<float>(rng);
  run_type<dk::half_t>(rng);
  run_type<dk::bf16_t>(rng);
  return finish("test_activation_cuda");
}
