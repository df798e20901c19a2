// RMSNorm: shared per-row math and the CPU kernels (torch-free).
//   rms_norm:           out = x * rsqrt(mean(x^2) + eps) * w
//   fused_add_rms_norm: z = x + residual; residual <- z; x <- z * rsqrt(mean(z^2) + eps) * w
// All arithmetic in fp32; one rounding to the storage type at each store.
#pragma once
#include <cmath>
#include <type_traits>
#include <vector>
#include "decodekit/common/dtype.h"
#if defined(__AVX512F__)
#include "decodekit/common/avx512.h"  // load16 / store16 (fp16 rows: the scalar conversions do not vectorize)
#endif

namespace dk {

// Inverse RMS of a row from its sum of squares (same formula on host and device).
DK_HD float rms_inv(float sum_sq, int hidden, float eps) {
  return 1.0f / sqrtf(sum_sq / float(hidden) + eps);
}

namespace cpu {

template <class T>
void rms_norm(T* DK_RESTRICT out,          // [rows, hidden], contiguous
              const T* DK_RESTRICT in,     // [rows, hidden], row stride in_stride
              int64_t in_stride,
              const T* DK_RESTRICT weight, // [hidden]
              int64_t rows, int hidden, float eps) {
  DK_OMP_PARALLEL_FOR_IF(rows * hidden >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * in_stride;
    T* y = out + r * int64_t(hidden);
#if defined(DK_AVX512_LOAD_STORE16)
    if constexpr (std::is_same_v<T, half_t>) {  // fp16 only: fp32 / bf16 vectorize by themselves
      __m512 acc = _mm512_setzero_ps();
      for (int i = 0; i < hidden; i += 16) {
        const __m512 v = load16(x + i, lanes_mask(hidden - i));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
      }
      const __m512 inv = _mm512_set1_ps(rms_inv(_mm512_reduce_add_ps(acc), hidden, eps));
      for (int i = 0; i < hidden; i += 16) {
        const __mmask16 m = lanes_mask(hidden - i);
        store16(y + i, _mm512_mul_ps(_mm512_mul_ps(load16(x + i, m), inv), load16(weight + i, m)), m);
      }
      continue;
    }
#endif
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < hidden; ++i) {
      const float v = to_float(x[i]);
      ss += v * v;
    }
    const float inv = rms_inv(ss, hidden, eps);
#pragma omp simd
    for (int i = 0; i < hidden; ++i) y[i] = from_float<T>(to_float(x[i]) * inv * to_float(weight[i]));
  }
}

template <class T>
void fused_add_rms_norm(T* DK_RESTRICT x,          // [rows, hidden], row stride x_stride; in: input, out: normed
                        int64_t x_stride,
                        T* DK_RESTRICT residual,   // [rows, hidden], row stride r_stride; in/out: x + residual
                        int64_t r_stride,
                        const T* DK_RESTRICT weight,  // [hidden]
                        int64_t rows, int hidden, float eps) {
#pragma omp parallel if (rows * hidden >= kParallelGrain)
  {
    std::vector<float> z((hidden + 15) / 16 * 16);  // the unrounded sum, one row per thread
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* xr = x + r * x_stride;
      T* rr = residual + r * r_stride;
      float* zr = z.data();
#if defined(DK_AVX512_LOAD_STORE16)
      if constexpr (std::is_same_v<T, half_t>) {  // fp16 only: fp32 / bf16 vectorize by themselves
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < hidden; i += 16) {
          const __mmask16 m = lanes_mask(hidden - i);
          const __m512 v = _mm512_add_ps(load16(xr + i, m), load16(rr + i, m));
          _mm512_storeu_ps(zr + i, v);  // (z holds hidden rounded up to 16: see below)
          store16(rr + i, v, m);
          acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
        }
        const __m512 inv = _mm512_set1_ps(rms_inv(_mm512_reduce_add_ps(acc), hidden, eps));
        for (int i = 0; i < hidden; i += 16) {
          const __mmask16 m = lanes_mask(hidden - i);
          store16(xr + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(zr + i), inv), load16(weight + i, m)), m);
        }
        continue;
      }
#endif
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int i = 0; i < hidden; ++i) {
        const float v = to_float(xr[i]) + to_float(rr[i]);
        zr[i] = v;
        rr[i] = from_float<T>(v);
        ss += v * v;
      }
      const float inv = rms_inv(ss, hidden, eps);
#pragma omp simd
      for (int i = 0; i < hidden; ++i) xr[i] = from_float<T>(zr[i] * inv * to_float(weight[i]));
    }
  }
}

}  // namespace cpu
}  // namespace dk
