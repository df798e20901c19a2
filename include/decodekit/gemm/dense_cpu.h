// Dense weight GEMM for small M on the CPU (decode): out[m, n] = sum_k a[m, k] w[n, k] + bias[n].
// Memory-bound at small M: each weight row is streamed once and dotted with all M rows of
// `a` (kept in L1). bf16 uses AVX512-BF16 dot products (vdpbf16ps, fp32 accumulate) when
// the compiler targets them; every other case uses a plain loop the compiler vectorizes.
#pragma once
#include <algorithm>

#include "decodekit/common/dtype.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace dk::cpu {

// Largest M handled here; above it the caller uses a blocked GEMM library (oneDNN/MKL).
constexpr int64_t kDenseGemvMaxM = 64;

template <class T>
inline void dense_row_generic(float* acc,            // [mt]
                              const T* a, int64_t a_stride, int mt,
                              const T* w, int64_t K) {
  for (int m = 0; m < mt; ++m) {
    const T* am = a + m * a_stride;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < K; ++k) s += to_float(am[k]) * to_float(w[k]);
    acc[m] = s;
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// MT rows of a (<= 4) against NT weight rows (<= 2) at once: per 32-wide k chunk, NT + MT
// loads feed NT * MT dot-product instructions (vdpbf16ps, fp32 accumulate).
template <int MT, int NT>
inline void dense_tile_bf16(float* acc,  // [MT][NT]
                            const bf16_t* a, int64_t a_stride, const bf16_t* w, int64_t K) {
  __m512 s[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) s[m][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
    for (int m = 0; m < MT; ++m) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + m * a_stride + k);
      for (int j = 0; j < NT; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], av, wv[j]);
    }
  }
  if (k < K) {
    const __mmask32 mask = (__mmask32)((1ull << (K - k)) - 1);
    __m512bh wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * K + k);
    for (int m = 0; m < MT; ++m) {
      const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(mask, a + m * a_stride + k);
      for (int j = 0; j < NT; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], av, wv[j]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) acc[m * NT + j] = _mm512_reduce_add_ps(s[m][j]);
}

template <int NT>
inline void dense_tile_bf16_m(float* acc, int mt, const bf16_t* a, int64_t a_stride, const bf16_t* w, int64_t K) {
  switch (mt) {
    case 4: return dense_tile_bf16<4, NT>(acc, a, a_stride, w, K);
    case 3: return dense_tile_bf16<3, NT>(acc, a, a_stride, w, K);
    case 2: return dense_tile_bf16<2, NT>(acc, a, a_stride, w, K);
    default: return dense_tile_bf16<1, NT>(acc, a, a_stride, w, K);
  }
}
#endif

// acc[m * nt + j] = dot(a row m, weight row j) for mt <= 4 rows of a and nt <= 2 weight rows.
template <class T>
inline void dense_tile(float* acc, const T* a, int64_t a_stride, int mt, const T* w, int nt, int64_t K) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (nt == 2) return dense_tile_bf16_m<2>(acc, mt, a, a_stride, w, K);
    return dense_tile_bf16_m<1>(acc, mt, a, a_stride, w, K);
  }
#endif
  float tmp[4];
  for (int j = 0; j < nt; ++j) {
    dense_row_generic(tmp, a, a_stride, mt, w + j * K, K);
    for (int m = 0; m < mt; ++m) acc[m * nt + j] = tmp[m];
  }
}

template <class T>
void dense_gemm(T* out,            // [M, N] contiguous
                const T* a,        // [M, K], row stride a_stride
                int64_t a_stride,
                const T* w,        // [N, K] contiguous
                const T* bias,     // [N] or null
                int64_t M, int64_t N, int64_t K) {
  // Parallel over blocks of output columns; each thread streams its weight rows once
  // per 4 rows of a (the block of 16 weight rows stays in L1 across the passes over M).
  DK_OMP_PARALLEL_FOR_IF(N * K >= kParallelGrain)
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t n1 = std::min(N, n0 + 16);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mt = int(std::min<int64_t>(4, M - m0));
      for (int64_t n = n0; n < n1; n += 2) {
        const int nt = int(std::min<int64_t>(2, n1 - n));
        float acc[8];
        dense_tile(acc, a + m0 * a_stride, a_stride, mt, w + n * K, nt, K);
        for (int j = 0; j < nt; ++j) {
          const float b = bias ? to_float(bias[n + j]) : 0.f;
          for (int m = 0; m < mt; ++m) out[(m0 + m) * N + n + j] = from_float<T>(acc[m * nt + j] + b);
        }
      }
    }
  }
}

}  // namespace dk::cpu
