// argmax_rows: the greedy token of each row of logits, torch.argmax's rule: the largest value, ties
// -> the lowest index, a NaN beats everything (the first NaN wins), -0.0 == +0.0. Written once as an
// order-preserving 32-bit key (argmax_key: sort_desc.h's key, reversed) so the CPU (AVX-512 or scalar) and CUDA kernels compare
// the same integers: the row's token is the lowest index whose key is the row's largest key.
#pragma once
#include <cstdint>

#include "decodekit/common/macros.h"
#include "decodekit/sampling/sort_desc.h"
#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace dk {

// x's rank as an unsigned key: NaN (any payload) -> 0xffffffff above +inf; -0.0 and +0.0 -> the
// same key; otherwise a < b as floats <=> key(a) < key(b). The sampler's sort key reversed.
DK_HD uint32_t argmax_key(float x) { return ~sort_desc_key(x); }

// The scalar rule over one row (x[0 .. V), contiguous); V >= 1.
DK_HD int64_t argmax_row_scalar(const float* x, int64_t V) {
  uint32_t best = argmax_key(x[0]);
  int64_t bi = 0;
  for (int64_t v = 1; v < V; ++v) {
    const uint32_t k = argmax_key(x[v]);
    if (k > best) {
      best = k;
      bi = v;
    }
  }
  return bi;
}

#if defined(__AVX512F__) && !defined(__CUDACC__)
// 16 lanes of argmax_key.
DK_FORCE_INLINE __m512i argmax_key16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __mmask16 neg = _mm512_cmpgt_epu32_mask(u, _mm512_set1_epi32(int(0x80000000u)));  // sign set, not -0.0
  __m512i k = _mm512_or_si512(abs, _mm512_set1_epi32(int(0x80000000u)));                 // +x (and +-0.0)
  k = _mm512_mask_mov_epi32(k, neg, _mm512_xor_si512(u, _mm512_set1_epi32(-1)));          // ~u for negatives
  return _mm512_mask_mov_epi32(k, nan, _mm512_set1_epi32(-1));
}

// The same rule, 16 lanes at a time: the largest key (one pass), then its first index (a second
// pass, from L2). V >= 1.
inline int64_t argmax_row_avx512(const float* x, int64_t V) {
  __m512i m = _mm512_setzero_si512();
  int64_t v = 0;
  for (; v + 16 <= V; v += 16) m = _mm512_max_epu32(m, argmax_key16(_mm512_loadu_ps(x + v)));
  const __mmask16 tail = __mmask16((1u << (V - v)) - 1);
  if (V > v) m = _mm512_mask_max_epu32(m, tail, m, argmax_key16(_mm512_maskz_loadu_ps(tail, x + v)));
  const uint32_t best = _mm512_reduce_max_epu32(m);
  const __m512i b = _mm512_set1_epi32(int(best));
  for (v = 0; v + 16 <= V; v += 16) {
    const __mmask16 hit = _mm512_cmpeq_epi32_mask(argmax_key16(_mm512_loadu_ps(x + v)), b);
    if (hit) return v + __builtin_ctz(unsigned(hit));
  }
  const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(tail, argmax_key16(_mm512_maskz_loadu_ps(tail, x + v)), b);
  return v + __builtin_ctz(unsigned(hit));  // the best key is somewhere: here if not before
}
#endif

// One row on the CPU: the vector path where there is one.
inline int64_t argmax_row(const float* x, int64_t V) {
#if defined(__AVX512F__) && !defined(__CUDACC__)
  return argmax_row_avx512(x, V);
#else
  return argmax_row_scalar(x, V);
#endif
}

}  // namespace dk
