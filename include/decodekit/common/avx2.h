// Small AVX2 helpers shared by the CPU kernels on machines without AVX-512 (host only; compiled where
// AVX2, FMA and F16C are all set: DK_AVX2). The AVX-512 kernels keep their own helpers (avx512.h);
// a build uses one family or the other, never both (the AVX-512 paths win where both are available).
//  - hsum8: the 8 lanes' sum in one fixed order (lanes 0+4, 1+5, 2+6, 3+7, then pairs), so every
//    kernel that reduces with it gets the same bits for the same accumulator,
//  - exp_nonpos8: exp(x) for x <= 0 on 8 lanes (exp_nonpos16's reduction and polynomial),
//  - load8 / store8: the first n (<= 8) lanes of float / bf16_t / half_t as fp32 and back, bit for bit
//    the scalar Conv<T> conversions (round to nearest even; NaN: bf16 quieted, fp16 sign | 0x7e00).
#pragma once
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__CUDACC__)
#define DK_AVX2 1
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "decodekit/common/dtype.h"

namespace dk::cpu {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// exp(x) for x <= 0 on 8 lanes (inputs below -87 give ~1.6e-38).
inline __m256 exp_nonpos8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.3981999507e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Lanes i < n (n <= 8) all ones: the mask of _mm256_maskload_ps / _mm256_maskstore_ps.
inline __m256i lanes_mask8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 raw 16-bit values (lanes past n read as 0).
inline __m128i load8_u16(const void* p, int64_t n) {
  if (n >= 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint16_t t[8] = {};
  std::memcpy(t, p, size_t(n) * 2);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}
inline void store8_u16(void* p, __m128i v, int64_t n) {
  if (n >= 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
  alignas(16) uint16_t t[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), v);
  std::memcpy(p, t, size_t(n) * 2);
}

inline __m256 load8(const float* p, int64_t n = 8) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_mask8(n));
}
inline __m256 load8(const bf16_t* p, int64_t n = 8) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load8_u16(p, n)), 16));
}
inline __m256 load8(const half_t* p, int64_t n = 8) { return _mm256_cvtph_ps(load8_u16(p, n)); }

// 8 x int32 (each < 2^16) packed to 8 x uint16 in lane order.
inline __m128i pack8_u16(__m256i v) {
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

inline void store8(float* p, __m256 x, int64_t n = 8) {
  if (n >= 8) _mm256_storeu_ps(p, x);
  else _mm256_maskstore_ps(p, lanes_mask8(n), x);
}
inline void store8(bf16_t* p, __m256 x, int64_t n = 8) {  // float_to_bf16 on 8 lanes
  const __m256i u = _mm256_castps_si256(x);
  const __m256i rne = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                           _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                                            _mm256_set1_epi32(1))));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(_mm256_srli_epi32(rne, 16),
                                       _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040)), nan);
  store8_u16(p, pack8_u16(r), n);
}
inline void store8(half_t* p, __m256 x, int64_t n = 8) {  // float_to_half on 8 lanes (NaN: sign | 0x7e00)
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16),
                                                        _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7e00));
  const __m128i nan = pack8_u16(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)), 16));
  store8_u16(p, _mm_blendv_epi8(h, pack8_u16(qnan), nan), n);
}

}  // namespace dk::cpu

#endif
