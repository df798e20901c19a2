// fp8 e4m3 W8A8 (CPU kernels, torch-free): dynamic per-token activation quantization and the
// fp8 x fp8 GEMM with per-token and per-output-channel scales. Per-element logic (the e4m3
// conversions, the dynamic scale) is common/fp8.h's, shared with the CUDA kernels
// (gemm/fp8_gemm.cuh) and mirrored by the torch reference.
//
//   quantize_fp8:  scale[m] = fp8_dynamic_scale(max_k |x[m, k]|),  q[m, k] = fp8(x[m, k] / scale[m])
//   fp8_gemm:      out[m, n] = (sum_k float(a[m, k]) * float(w[n, k])) * a_scale[m] * w_scale[n] + bias[n]
//                  (products exact in fp32, fp32 sums; one rounding to T at the store)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"
#include "decodekit/common/macros.h"

namespace dk::cpu {

// The 256 e4m3 codes as floats.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = fp8_e4m3_to_float(uint8_t(i));
  }
};
inline const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

template <class T>
void quantize_fp8(uint8_t* q,            // [M, K] e4m3 codes, contiguous
                  float* scale,          // [M]
                  const T* x,            // [M, K], row stride x_stride
                  int64_t M, int64_t K, int64_t x_stride) {
  DK_OMP_PARALLEL_FOR_IF(M * K >= kParallelGrain)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * x_stride;
    float amax = 0.f;
    bool nan = false;
    for (int64_t k = 0; k < K; ++k) {
      const float v = to_float(row[k]);
      nan |= v != v;
      amax = std::max(amax, std::fabs(v));
    }
    const float s = fp8_dynamic_scale(nan ? NAN : amax);
    scale[m] = s;
    for (int64_t k = 0; k < K; ++k) q[m * K + k] = quantize_fp8_e4m3(to_float(row[k]), s);
  }
}

template <class T>
void fp8_gemm(T* out,                 // [M, N]
              const uint8_t* a,       // [M, K] e4m3, contiguous
              const float* a_scale,   // [M]
              const uint8_t* w,       // [N, K] e4m3, contiguous
              const float* w_scale,   // [N]
              const T* bias,          // [N] or null
              int64_t M, int64_t N, int64_t K) {
  const float* lut = fp8_table().v;
  std::vector<float> af(size_t(M * K));  // activations decoded once
  for (int64_t i = 0; i < M * K; ++i) af[size_t(i)] = lut[a[i]];
  constexpr int64_t kRows = 4;  // activation rows per pass over a decoded weight row
#pragma omp parallel if (N * K * M >= kParallelGrain)
  {
    std::vector<float> wf(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = w + n * K;
      for (int64_t k = 0; k < K; ++k) wf[size_t(k)] = lut[wr[k]];
      const float ws = w_scale[n];
      const float b = bias ? to_float(bias[n]) : 0.f;
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int64_t mm = std::min(kRows, M - m0);
        float acc[kRows] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t r = 0; r < mm; ++r) {
          const float* ar = &af[size_t((m0 + r) * K)];
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t k = 0; k < K; ++k) s += ar[k] * wf[size_t(k)];
          acc[r] = s;
        }
        for (int64_t r = 0; r < mm; ++r)
          out[(m0 + r) * N + n] = from_float<T>(acc[r] * a_scale[m0 + r] * ws + b);
      }
    }
  }
}

}  // namespace dk::cpu
