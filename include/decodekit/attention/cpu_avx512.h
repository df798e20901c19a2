// AVX-512 inner kernel of the CPU paged attention (included by attention/cpu.h): R query rows
// that see the same keys of one KV block, processed together so that every key and value
// chunk is loaded and converted once for all R rows (the rows of one GQA group, for a decode
// token). Vector arithmetic is fp32 FMA throughout (the products of bf16/fp16 inputs are exact
// in fp32); only the summation order differs from the scalar attend_block.
//
// Chunk order: the cache is read 32 elements at a time as two fp32 vectors. For bf16 those are
// the even and the odd elements (a 32-bit lane holds elements 2i, 2i+1: a shift and a mask give
// them as fp32, with no shuffle); the query and accumulator rows are kept in that same order
// (to_chunk_order / from_chunk_order), which leaves dot products and the per-element P.V sums
// unchanged. fp16 (hardware conversion), fp8 e4m3 (via fp16, scaled by 2^-8) and fp32 rows
// are read in natural order.
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "decodekit/attention/common.h"
#include "decodekit/common/avx512.h"  // exp_nonpos16
#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"

// GCC 12 reports the register arrays below (and its own intrinsics' undefined operands) as
// maybe-uninitialized at -O3; every element read is written first.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dk::cpu {

template <class E> struct Chunk32;
template <> struct Chunk32<bf16_t> {
  static constexpr bool kPairOrder = true;
  static inline void load(const bf16_t* p, __m512& lo, __m512& hi) {
    const __m512i w = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));                                      // even elements
    hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))));  // odd elements
  }
};
template <> struct Chunk32<half_t> {
  static constexpr bool kPairOrder = false;
  static inline void load(const half_t* p, __m512& lo, __m512& hi) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
};
#if defined(__AVX512BW__) && defined(__AVX512VL__)
// fp8 e4m3, read as 2^-8 times its value (the caller folds the 256 into its scales): the byte
// sign-extended to 16 bits and shifted left by 7 puts the sign at bit 15 (and 14) and
// exponent+mantissa at bits 7..13; masking bit 14 leaves an fp16 whose exponent bias is 8 too
// large -- subnormals included, exactly -- which the hardware widens to fp32 (vcvtph2ps does
// not consult MXCSR.DAZ). The NaN code S.1111.111 is patched in, so every code converts as
// fp8_e4m3_to_float(code) / 256.
inline constexpr bool kFp8Chunks = true;
inline constexpr float kFp8ChunkScale = 256.0f;
template <> struct Chunk32<fp8_e4m3_t> {
  static constexpr bool kPairOrder = false;
  static inline __m512 load16(const fp8_e4m3_t* p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(int16_t(0xbf80)));
    const __m256i em = _mm256_set1_epi16(0x3f80);
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, em), em);
    return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan, _mm512_set1_ps(NAN));
  }
  static inline void load(const fp8_e4m3_t* p, __m512& lo, __m512& hi) {
    lo = load16(p);
    hi = load16(p + 16);
  }
};
#else
inline constexpr bool kFp8Chunks = false;
inline constexpr float kFp8ChunkScale = 1.0f;
#endif
template <> struct Chunk32<float> {
  static constexpr bool kPairOrder = false;
  static inline void load(const float* p, __m512& lo, __m512& hi) {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
};

// A natural-order row of D (a multiple of 32) floats into chunk order, and back.
template <class E>
inline void to_chunk_order(const float* in, float* out, int D) {
  if constexpr (!Chunk32<E>::kPairOrder) {
    for (int d = 0; d < D; ++d) out[d] = in[d];
  } else {
    for (int c = 0; c < D; c += 32)
      for (int i = 0; i < 16; ++i) {
        out[c + i] = in[c + 2 * i];
        out[c + 16 + i] = in[c + 2 * i + 1];
      }
  }
}
template <class E>
inline float from_chunk_order(const float* row, int d) {  // natural element d of a chunk-order row
  if constexpr (!Chunk32<E>::kPairOrder) return row[d];
  const int c = d & ~31, i = d & 31;
  return row[c + (i & 1) * 16 + (i >> 1)];
}

// out[j] = sum of v[j]'s 16 lanes, for 16 vectors at once (45 instructions instead of 16
// horizontal reductions): pairwise unpack+add at 32 and 64 bits, then across 128-bit lanes.
inline __m512 hsum16(const __m512 (&v)[16]) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [v2i(0+2), v2i+1(0+2), v2i(1+3), v2i+1(1+3)]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: the lane sums of v4k .. v4k+3
    const __m512d x = _mm512_castps_pd(a[2 * k]), y = _mm512_castps_pd(a[2 * k + 1]);
    b[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 d01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 d23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d01, d23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(d01, d23, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __mmask16 first_lanes(int n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// Starts the loads of one row of the next block (a random page) while this block computes.
inline void prefetch_row(const char* p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// R query rows against keys 0 .. valid-1 of one block (all R rows see the same keys):
//   s_r[j] = q_r . k_j (q pre-scaled), the online-softmax update of sm[r], and
//   acc_r = acc_r * corr_r + sum_j p_rj v_j.
// q: [R, D] fp32 in chunk order (row stride D); k, v: [valid, D] cache rows of type E;
// acc: [R, D] fp32 in chunk order; s: [R, s_stride] scratch (s_stride >= valid).
// next_k / next_v: the next block's K / V rows (prefetched a row per key), or null.
template <int D, int R, class E>
inline void attend_rows_avx512(const float* q, const E* k, const E* v, int valid, OnlineSoftmax* sm, float* acc,
                               float* s, int s_stride, const char* next_k, const char* next_v) {
  static_assert(D % 32 == 0 && R >= 1 && R <= 4, "D a multiple of 32, 1..4 rows");
  constexpr int NP = D / 32;                                       // 32-element chunks per row
  constexpr int kRowBytes = D * int(sizeof(E));
  // scores, 16 keys at a time: per key and row a vector of partial products, reduced together
  for (int j0 = 0; j0 < valid; j0 += 16) {
    const int n = std::min(16, valid - j0);
    __m512 t[R][16];
    for (int jj = 0; jj < n; ++jj) {
      const E* kr = k + size_t(j0 + jj) * D;
      if (next_k) prefetch_row(next_k + size_t(j0 + jj) * kRowBytes, kRowBytes);
      __m512 a0[R], a1[R], lo, hi;
      Chunk32<E>::load(kr, lo, hi);
      for (int r = 0; r < R; ++r) {
        a0[r] = _mm512_mul_ps(_mm512_loadu_ps(q + r * D), lo);
        a1[r] = _mm512_mul_ps(_mm512_loadu_ps(q + r * D + 16), hi);
      }
      for (int c = 1; c < NP; ++c) {
        Chunk32<E>::load(kr + 32 * c, lo, hi);
        for (int r = 0; r < R; ++r) {
          const float* qr = q + r * D + 32 * c;
          a0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qr), lo, a0[r]);
          a1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16), hi, a1[r]);
        }
      }
      for (int r = 0; r < R; ++r) t[r][jj] = _mm512_add_ps(a0[r], a1[r]);
    }
    for (int r = 0; r < R; ++r) {
      for (int jj = n; jj < 16; ++jj) t[r][jj] = _mm512_setzero_ps();
      _mm512_mask_storeu_ps(s + r * s_stride + j0, first_lanes(n), hsum16(t[r]));
    }
  }
  // online softmax per row: p = exp(s - m_new), corr = exp(m_old - m_new)
  float corr[R];
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * s_stride;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < valid; j0 += 16)
      mv = _mm512_mask_max_ps(mv, first_lanes(valid - j0), mv, _mm512_loadu_ps(sr + j0));
    corr[r] = sm[r].rescale(_mm512_reduce_max_ps(mv));
    const __m512 m = _mm512_set1_ps(sm[r].m);
    __m512 lsum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < valid; j0 += 16) {
      const __mmask16 km = first_lanes(valid - j0);
      const __m512 p = _mm512_maskz_mov_ps(km, exp_nonpos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, sr + j0), m)));
      _mm512_mask_storeu_ps(sr + j0, km, p);
      lsum = _mm512_add_ps(lsum, p);
    }
    sm[r].add(_mm512_reduce_add_ps(lsum));
  }
  // acc = acc * corr + P V, PP chunks of every row in registers per pass over the keys
  constexpr int PP = R == 1 ? NP : (R == 2 ? std::min(NP, 4) : std::min(NP, 2));
  static_assert(NP % PP == 0, "chunks per pass must divide the row");
  for (int c0 = 0; c0 < NP; c0 += PP) {
    __m512 a[R][2 * PP];
    for (int r = 0; r < R; ++r) {
      const __m512 cv = _mm512_set1_ps(corr[r]);
      for (int i = 0; i < 2 * PP; ++i) a[r][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + 32 * c0 + 16 * i), cv);
    }
    for (int j = 0; j < valid; ++j) {
      const E* vr = v + size_t(j) * D;
      if (next_v && c0 == 0) prefetch_row(next_v + size_t(j) * kRowBytes, kRowBytes);
      __m512 lo[PP], hi[PP];
      for (int i = 0; i < PP; ++i) Chunk32<E>::load(vr + 32 * (c0 + i), lo[i], hi[i]);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(s[r * s_stride + j]);
        for (int i = 0; i < PP; ++i) {
          a[r][2 * i] = _mm512_fmadd_ps(p, lo[i], a[r][2 * i]);
          a[r][2 * i + 1] = _mm512_fmadd_ps(p, hi[i], a[r][2 * i + 1]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 2 * PP; ++i) _mm512_storeu_ps(acc + r * D + 32 * c0 + 16 * i, a[r][i]);
  }
}

// attend_rows_avx512 for a run-time row count (1..4) and head_dim (64, 128 or 256); false for
// any other head_dim (the caller then takes the scalar path).
template <class E>
inline bool attend_rows(int D, int R, const float* q, const E* k, const E* v, int valid, OnlineSoftmax* sm, float* acc,
                        float* s, int s_stride, const char* next_k, const char* next_v) {
#define DK_ATTEND_ROWS_CASE(DD)                                                                      \
  case DD:                                                                                           \
    switch (R) {                                                                                     \
      case 1: attend_rows_avx512<DD, 1, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      case 2: attend_rows_avx512<DD, 2, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      case 3: attend_rows_avx512<DD, 3, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      default: attend_rows_avx512<DD, 4, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
    }
  switch (D) {
    DK_ATTEND_ROWS_CASE(64)
    DK_ATTEND_ROWS_CASE(128)
    DK_ATTEND_ROWS_CASE(256)
    default: return false;
  }
#undef DK_ATTEND_ROWS_CASE
}

}  // namespace dk::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // __AVX512F__
