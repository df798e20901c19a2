// Dense weight GEMM for small M on the CPU (decode): out[m, n] = sum_k a[m, k] w[n, k] + bias[n].
// Memory-bound at small M: each weight row is streamed once and dotted with all M rows of
// `a` (kept in L1). With AVX-512, bf16 and fp16 weights are widened to fp32 in registers (fp32 loaded
// as is) for fp32 FMAs in a register tile; without it a plain loop the compiler vectorizes.
#pragma once
#include <algorithm>

#include "decodekit/common/dtype.h"
#include <type_traits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace dk::cpu {

// Largest M handled here; above it the caller uses a blocked GEMM library (oneDNN/MKL).
constexpr int64_t kDenseGemvMaxM = 64;
// How a dense bf16 / fp16 projection is routed on the CPU (ops.linear and decoder_layer, which must
// agree bit for bit): dense_gemm up to kDenseRouteMaxM rows; bf16 from kBf16UpcastMinM rows (prefill)
// an fp32 GEMM on upcast operands (torch's bf16 CPU matmul without AMX is slower: 1.45x at M=256,
// 1.8x at M=2048), in between torch's bf16 matmul; fp16 past kDenseRouteMaxM always the upcast fp32
// GEMM (torch's fp16 CPU matmul ran 30-40x slower than bf16 at 4-32 rows). python/decodekit/ops/__init__.py holds the same two
// numbers (_DENSE_ROUTE_MAX_M, _BF16_UPCAST_MIN_M); tests/ops/test_decoder_layer.py checks they agree.
constexpr int64_t kDenseRouteMaxM = 32;
constexpr int64_t kBf16UpcastMinM = 128;

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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
#define DK_DENSE_WIDEN_AVX512 1
// bf16 / fp16 weights, fp32 activations: each 16-wide chunk of a weight row is widened to fp32 in
// registers (bf16: zero-extend + shift; fp16: vcvtph2ps; both exact) and fed to fp32 FMAs. On this
// class of CPU that beats vdpbf16ps (measured 99 vs 82 GMAC/s at M=32) and keeps the activations
// exact. MT rows of a (<= 4) times NT weight rows (<= 4): per chunk NT widenings + MT loads feed
// MT * NT FMAs.
inline __m512 dk_widen16(const bf16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m512 dk_widen16(const bf16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 dk_widen16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 dk_widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 dk_widen16(const half_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline __m512 dk_widen16(const half_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MT, int NT, class W>
inline void dense_tile_widen(float* acc,  // [MT][NT]
                             const float* a, int64_t K, const W* w) {
  __m512 s[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) s[m][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = dk_widen16(w + j * K + k);
    for (int m = 0; m < MT; ++m) {
      const __m512 av = _mm512_loadu_ps(a + m * K + k);
      for (int j = 0; j < NT; ++j) s[m][j] = _mm512_fmadd_ps(av, wv[j], s[m][j]);
    }
  }
  if (k < K) {
    const __mmask16 mask = (__mmask16)((1u << (K - k)) - 1);
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = dk_widen16(w + j * K + k, mask);
    for (int m = 0; m < MT; ++m) {
      const __m512 av = _mm512_maskz_loadu_ps(mask, a + m * K + k);
      for (int j = 0; j < NT; ++j) s[m][j] = _mm512_fmadd_ps(av, wv[j], s[m][j]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) acc[m * NT + j] = _mm512_reduce_add_ps(s[m][j]);
}

template <int NT, class W>
inline void dense_tile_widen_m(float* acc, int mt, const float* a, int64_t K, const W* w) {
  switch (mt) {
    case 4: return dense_tile_widen<4, NT>(acc, a, K, w);
    case 3: return dense_tile_widen<3, NT>(acc, a, K, w);
    case 2: return dense_tile_widen<2, NT>(acc, a, K, w);
    default: return dense_tile_widen<1, NT>(acc, a, K, w);
  }
}

template <class W>
inline void dense_tile_widen_any(float* acc, int mt, const float* a, int64_t K, const W* w, int nt) {
  switch (nt) {
    case 4: return dense_tile_widen_m<4>(acc, mt, a, K, w);
    case 3: return dense_tile_widen_m<3>(acc, mt, a, K, w);
    case 2: return dense_tile_widen_m<2>(acc, mt, a, K, w);
    default: return dense_tile_widen_m<1>(acc, mt, a, K, w);
  }
}
#endif

#if defined(__AVX512BF16__) && defined(DK_DENSE_WIDEN_AVX512)
#define DK_DENSE_DPBF16 1
// For M = 1 (memory-bound decode) the bf16 dot-product instruction is cheaper per weight
// byte than widening: MT rows of a (<= 4) against NT weight rows (<= 2), per 32-wide k chunk
// NT + MT loads feed NT * MT vdpbf16ps (fp32 accumulate; products of bf16 are exact).
template <int MT, int NT>
inline void dense_tile_dpbf16(float* acc,  // [MT][NT]
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
inline void dense_tile_dpbf16_m(float* acc, int mt, const bf16_t* a, int64_t a_stride, const bf16_t* w, int64_t K) {
  switch (mt) {
    case 4: return dense_tile_dpbf16<4, NT>(acc, a, a_stride, w, K);
    case 3: return dense_tile_dpbf16<3, NT>(acc, a, a_stride, w, K);
    case 2: return dense_tile_dpbf16<2, NT>(acc, a, a_stride, w, K);
    default: return dense_tile_dpbf16<1, NT>(acc, a, a_stride, w, K);
  }
}
#endif

// acc[m * nt + j] = dot(a row m, weight row j) for mt <= 4 rows of a and nt <= 4 weight rows.
template <class T>
inline void dense_tile(float* acc, const T* a, int64_t a_stride, int mt, const T* w, int nt, int64_t K) {
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
#if defined(DK_DENSE_WIDEN_AVX512)
  constexpr bool kBf16 = std::is_same_v<T, bf16_t>;
  constexpr bool kWiden = kBf16 || std::is_same_v<T, half_t> || std::is_same_v<T, float>;
#else
  constexpr bool kBf16 = false, kWiden = false;
#endif
#if defined(DK_DENSE_DPBF16)
  const bool dot = kBf16 && M == 1;  // measured: dot wins at M=1, widening from M=2
#else
  const bool dot = false;
#endif
  const bool widen = kWiden && !dot;
  // widen: the activations are widened to fp32 once ([M, K], small), the weights per chunk.
  // Reused across calls (no allocation per layer per step). thread_local is the calling
  // thread's buffer: the parallel region below must use the pointer, not the name.
  thread_local std::vector<float> af_buf;
  if (widen) af_buf.resize(size_t(M * K));
  float* const af = af_buf.data();
  if (widen) {
    for (int64_t m = 0; m < M; ++m) {
      int64_t k = 0;
#if defined(DK_DENSE_WIDEN_AVX512)
      if constexpr (kWiden)
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(af + m * K + k, dk_widen16(a + m * a_stride + k));
#endif
      for (; k < K; ++k) af[m * K + k] = to_float(a[m * a_stride + k]);
    }
  }
  // Parallel over blocks of 16 output columns; the block's weight rows (16 x K) stay in L1/L2
  // while all M rows of a pass over them, so each weight byte comes from DRAM once.
  DK_OMP_PARALLEL_FOR_IF(N * K >= kParallelGrain)
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t n1 = std::min(N, n0 + 16);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mt = int(std::min<int64_t>(4, M - m0));
      for (int64_t n = n0; n < n1; n += 4) {
        const int nt = int(std::min<int64_t>(4, n1 - n));
        float acc[16];
#if defined(DK_DENSE_WIDEN_AVX512)
        if constexpr (kWiden) {
          bool done = false;
#if defined(DK_DENSE_DPBF16)
          if constexpr (kBf16) {
            if (dot) {
              for (int j0 = 0; j0 < nt; j0 += 2) {  // dot-product tiles are 2 weight rows wide
                const int jn = std::min(2, nt - j0);
                float part[8];
                if (jn == 2) dense_tile_dpbf16_m<2>(part, mt, a + m0 * a_stride, a_stride, w + (n + j0) * K, K);
                else dense_tile_dpbf16_m<1>(part, mt, a + m0 * a_stride, a_stride, w + (n + j0) * K, K);
                for (int m = 0; m < mt; ++m)
                  for (int j = 0; j < jn; ++j) acc[m * nt + j0 + j] = part[m * jn + j];
              }
              done = true;
            }
          }
#endif
          if (!done) dense_tile_widen_any(acc, mt, af + m0 * K, K, w + n * K, nt);
        } else
#endif
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
