// Gated activations: shared per-element math and the CPU kernel (torch-free).
//   silu_and_mul: out[..., i] = silu(x[..., i]) * x[..., d + i],  i < d
#pragma once
#include <cmath>
#include "decodekit/common/dtype.h"
#if !defined(__CUDACC__)
#include "decodekit/common/avx2.h"
#include "decodekit/common/avx512.h"
#endif

namespace dk {

DK_HD float silu(float x) { return x / (1.0f + expf(-x)); }

namespace cpu {

#if defined(DK_AVX512_LOAD_STORE16) && !defined(__CUDACC__)
// silu on 16 lanes without libm (which does not vectorize here): with e = exp(-|x|) <= 1 (no
// overflow), silu(x) = x / (1 + e) for x >= 0 and x e / (1 + e) below -- the same function as
// silu() to a few ulp (exp_nonpos16: < 2e-7 relative). e is 0 past |x| = 87 (where silu() rounds
// to x or -0 anyway), so the specials are silu()'s too: silu(inf) = inf, silu(-inf) = NaN, NaN -> NaN.
inline __m512 silu16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(87.0f), _CMP_LE_OQ),
                                       exp_nonpos16(_mm512_sub_ps(_mm512_setzero_ps(), ax)));
  const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_div_ps(_mm512_mask_mul_ps(x, neg, x, e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#elif defined(DK_AVX2)
// silu16's formulation on 8 lanes (AVX2 without AVX-512): e = exp(-|x|), x / (1 + e) or x e / (1 + e).
inline __m256 silu8(__m256 x) {
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 e = _mm256_and_ps(_mm256_cmp_ps(ax, _mm256_set1_ps(87.0f), _CMP_LE_OQ),
                                 exp_nonpos8(_mm256_sub_ps(_mm256_setzero_ps(), ax)));
  const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_div_ps(_mm256_blendv_ps(x, _mm256_mul_ps(x, e), neg), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

template <class T>
void silu_and_mul(T* DK_RESTRICT out,       // [rows, d], contiguous
                  const T* DK_RESTRICT in,  // [rows, 2 * d], row stride in_stride
                  int64_t in_stride, int64_t rows, int64_t d) {
  DK_OMP_PARALLEL_FOR_IF(rows * d >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = in + r * in_stride;
    const T* u = g + d;
    T* y = out + r * d;
#if defined(DK_AVX512_LOAD_STORE16) && !defined(__CUDACC__)
    for (int64_t i = 0; i < d; i += 16) {  // the tail masked: every element takes the same path
      const __mmask16 m = lanes_mask(d - i);
      store16(y + i, _mm512_mul_ps(silu16(load16(g + i, m)), load16(u + i, m)), m);
    }
#elif defined(DK_AVX2) && !defined(__CUDACC__)
    for (int64_t i = 0; i < d; i += 8) {  // the tail through load8 / store8's partial lanes: one path
      const int64_t n = d - i;
      store8(y + i, _mm256_mul_ps(silu8(load8(g + i, n)), load8(u + i, n)), n);
    }
#else
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) y[i] = from_float<T>(silu(to_float(g[i])) * to_float(u[i]));
#endif
  }
}

}  // namespace cpu
}  // namespace dk
