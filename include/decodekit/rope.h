// Rotary position embedding: shared per-pair math and the CPU kernel (torch-free).
// cos_sin_cache[pos] holds rot_dim floats: cos for the rot_dim/2 frequencies, then sin.
// NeoX style rotates pairs (i, i + rot_dim/2); GPT-J style rotates (2i, 2i + 1).
// Elements past rot_dim (partial rotary) are left unchanged.
#pragma once
#include <type_traits>

#include "decodekit/common/dtype.h"
#if defined(__AVX512F__)
#include "decodekit/common/avx512.h"  // load16 / store16 (fp16 heads: the scalar conversions do not vectorize)
#endif

namespace dk {

// Offsets of the two elements of rotary pair i inside a head.
DK_HD void rope_pair(int i, int rot_dim, bool is_neox, int& ix, int& iy) {
  if (is_neox) { ix = i; iy = i + rot_dim / 2; }
  else { ix = 2 * i; iy = 2 * i + 1; }
}

// Rotate (x, y) by the angle whose cosine is c and sine is s.
DK_HD void rope_rotate(float& x, float& y, float c, float s) {
  const float x2 = x * c - y * s;
  const float y2 = y * c + x * s;
  x = x2;
  y = y2;
}

namespace cpu {

// Rotates every head of one token in place.
template <class T>
inline void rope_heads(T* base, int64_t head_stride, int num_heads, const float* cs, int rot_dim,
                       bool is_neox) {
  const int half = rot_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    T* p = base + h * head_stride;
#if defined(DK_AVX512_LOAD_STORE16)
    if constexpr (std::is_same_v<T, half_t>)
      if (is_neox) {  // 16 pairs at a time (fp16 only: fp32 / bf16 vectorize by themselves, faster)
        for (int i = 0; i < half; i += 16) {
          const __mmask16 m = lanes_mask(half - i);
          const __m512 x = load16(p + i, m), y = load16(p + i + half, m);
          const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, cs + half + i);
          store16(p + i, _mm512_sub_ps(_mm512_mul_ps(x, c), _mm512_mul_ps(y, s)), m);
          store16(p + i + half, _mm512_add_ps(_mm512_mul_ps(y, c), _mm512_mul_ps(x, s)), m);
        }
        continue;
      }
#endif
    if (is_neox) {
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        float x = to_float(p[i]), y = to_float(p[i + half]);
        rope_rotate(x, y, cs[i], cs[half + i]);
        p[i] = from_float<T>(x);
        p[i + half] = from_float<T>(y);
      }
    } else {
      for (int i = 0; i < half; ++i) {
        float x = to_float(p[2 * i]), y = to_float(p[2 * i + 1]);
        rope_rotate(x, y, cs[i], cs[half + i]);
        p[2 * i] = from_float<T>(x);
        p[2 * i + 1] = from_float<T>(y);
      }
    }
  }
}

template <class T>
void rotary_embedding(const int64_t* DK_RESTRICT positions,  // [num_tokens]
                      T* query,                                // [num_tokens, num_q_heads, head_size] (strided)
                      int64_t q_token_stride, int64_t q_head_stride, int num_q_heads,
                      T* key,                                  // [num_tokens, num_kv_heads, head_size] or null
                      int64_t k_token_stride, int64_t k_head_stride, int num_kv_heads,
                      const float* DK_RESTRICT cos_sin_cache,  // [max_position, rot_dim]
                      int rot_dim, bool is_neox, int64_t num_tokens) {
  DK_OMP_PARALLEL_FOR_IF(num_tokens * int64_t(num_q_heads + num_kv_heads) * rot_dim >= kParallelGrain)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cs = cos_sin_cache + positions[t] * int64_t(rot_dim);
    rope_heads(query + t * q_token_stride, q_head_stride, num_q_heads, cs, rot_dim, is_neox);
    if (key) rope_heads(key + t * k_token_stride, k_head_stride, num_kv_heads, cs, rot_dim, is_neox);
  }
}

}  // namespace cpu
}  // namespace dk
