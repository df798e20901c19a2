// Small AVX-512 helpers shared by the CPU kernels (host only; compiled where __AVX512F__ is set):
//  - exp_nonpos16: exp(x) for x <= 0 on 16 lanes (the range reduction and polynomial of
//    attention/cpu.h's scalar exp_nonpos, with FMAs),
//  - prefetch_row_ahead: software prefetch of the weight rows a GEMV / GEMM tile reads next,
//  - load16 / store16 (with AVX-512 BW + VL and F16C: DK_AVX512_LOAD_STORE16): the lanes of a mask
//    (lanes_mask(n): the first n) of float / bf16_t / half_t as fp32 and back, bit for bit the scalar
//    Conv<T> conversions (round to nearest even; NaN: bf16 quieted, fp16 sign | 0x7e00).
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"

namespace dk::cpu {

// The same bytes of a weight row one block ahead (a block's rows are contiguous, so NB rows on; the GEMV
// of int4.h: kGemvRows; dense_cpu.h's tiles: NT rows), once per 64 bytes of the row (offset: the group's byte offset in the row); a
// no-op past the weight's end. The hardware prefetcher follows the block's interleaved row streams
// poorly: on 2 Xeon cores SmolLM2's projections from DRAM ran 1.6-1.9x faster with it (3072 x 576 GEMV:
// 104-110 -> 62-65 us); cache-resident, unchanged.
template <class Q>
DK_FORCE_INLINE void prefetch_row_ahead(const Q* ahead, int64_t offset) {
  if ((offset & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
}

// The first min(n, 16) lanes (n >= 0).
inline __mmask16 lanes_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// exp(x) for x <= 0 on 16 lanes (inputs below -87 give ~1.6e-38).
inline __m512 exp_nonpos16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.3981999507e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define DK_AVX512_LOAD_STORE16 1

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const bf16_t* p, __mmask16 m) {
  const __m256i v = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
inline __m512 load16(const half_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

inline void store16(float* p, __m512 x, __mmask16 m) { _mm512_mask_storeu_ps(p, m, x); }
inline void store16(bf16_t* p, __m512 x, __mmask16 m) {  // float_to_bf16 on 16 lanes
  const __m512i u = _mm512_castps_si512(x);
  const __m512i rne = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                           _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                                            _mm512_set1_epi32(1))));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i r = _mm512_mask_or_epi32(_mm512_srli_epi32(rne, 16), nan, _mm512_srli_epi32(u, 16),
                                         _mm512_set1_epi32(0x0040));
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
}
inline void store16(half_t* p, __m512 x, __mmask16 m) {  // float_to_half on 16 lanes (NaN: sign | 0x7e00)
  const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i qnan = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 16),
                                                        _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7e00));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  _mm256_mask_storeu_epi16(p, m, _mm256_mask_mov_epi16(h, nan, _mm512_cvtepi32_epi16(qnan)));
}
#endif  // BW, VL, F16C

}  // namespace dk::cpu

#endif
