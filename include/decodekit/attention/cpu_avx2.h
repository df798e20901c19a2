// AVX2 inner kernel of the CPU paged attention (included by attention/cpu.h) for CPUs with AVX2 +
// FMA + F16C but no AVX-512: the AVX-512 kernel's algorithm (cpu_avx512.h) on 8-lane vectors. R query
// rows that see the same keys of one KV block are processed together, so every key and value chunk
// is loaded and converted once for all R rows; fp32 FMA throughout (products of bf16/fp16 inputs
// are exact in fp32).
//
// Chunk order: the cache is read 16 elements at a time as two fp32 vectors. For bf16 those are the
// even and the odd elements (a 32-bit lane holds elements 2i, 2i+1: a shift and a mask give them as
// fp32); the query and accumulator rows are kept in that order (to_chunk_order / from_chunk_order).
// fp16 (hardware conversion), fp8 e4m3 (via fp16, scaled by 2^-8: Chunk16<fp8_e4m3_t>) and fp32 rows
// are read in natural order.
#pragma once
#include "decodekit/common/avx2.h"
#if defined(DK_AVX2) && !defined(__AVX512F__)
#define DK_ATTN_AVX2 1
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "decodekit/attention/common.h"
#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dk::cpu {

template <class E> struct Chunk16;
template <> struct Chunk16<bf16_t> {
  static constexpr bool kPairOrder = true;
  static inline void load(const bf16_t* p, __m256& lo, __m256& hi) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));                                      // even elements
    hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u))));  // odd elements
  }
};
template <> struct Chunk16<half_t> {
  static constexpr bool kPairOrder = false;
  static inline void load(const half_t* p, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
};
// fp8 e4m3 read as 2^-8 times its value, as the AVX-512 Chunk32 does: the byte sign-extended to 16
// bits and shifted left by 7, bit 14 masked: an fp16 with an exponent bias 8 too large (subnormals
// exact), widened by vcvtph2ps; the NaN code S.1111.111 patched in.
inline constexpr bool kFp8Chunks = true;
inline constexpr float kFp8ChunkScale = 256.0f;
template <> struct Chunk16<fp8_e4m3_t> {
  static constexpr bool kPairOrder = false;
  static inline __m256 load8(const fp8_e4m3_t* p) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(int16_t(0xbf80)));
    const __m128i em = _mm_set1_epi16(0x3f80);
    const __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(_mm_and_si128(h, em), em));
    return _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
  }
  static inline void load(const fp8_e4m3_t* p, __m256& lo, __m256& hi) {
    lo = load8(p);
    hi = load8(p + 8);
  }
};
template <> struct Chunk16<float> {
  static constexpr bool kPairOrder = false;
  static inline void load(const float* p, __m256& lo, __m256& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
};

// A natural-order row of D (a multiple of 16) floats into chunk order, and back.
template <class E>
inline void to_chunk_order(const float* in, float* out, int D) {
  if constexpr (!Chunk16<E>::kPairOrder) {
    for (int d = 0; d < D; ++d) out[d] = in[d];
  } else {
    for (int c = 0; c < D; c += 16)
      for (int i = 0; i < 8; ++i) {
        out[c + i] = in[c + 2 * i];
        out[c + 8 + i] = in[c + 2 * i + 1];
      }
  }
}
template <class E>
inline float from_chunk_order(const float* row, int d) {  // natural element d of a chunk-order row
  if constexpr (!Chunk16<E>::kPairOrder) return row[d];
  const int c = d & ~15, i = d & 15;
  return row[c + (i & 1) * 8 + (i >> 1)];
}

// out[j] = sum of v[j]'s 8 lanes, for 8 vectors at once.
inline __m256 hsum8x8(const __m256 (&v)[8]) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);  // per 128-bit half: v0..v3 / v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// Starts the loads of one row of the next block (a random page) while this block computes.
inline void prefetch_row(const char* p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// R query rows against keys 0 .. valid-1 of one block (all R rows see the same keys):
//   s_r[j] = q_r . k_j (q pre-scaled), the online-softmax update of sm[r], and
//   acc_r = acc_r * corr_r + sum_j p_rj v_j.
// q: [R, D] fp32 in chunk order (row stride D); k, v: [valid, D] cache rows of type E;
// acc: [R, D] fp32 in chunk order; s: [R, s_stride] scratch (s_stride >= valid); next_k / next_v:
// the next block's K / V rows (prefetched), or null.
template <int D, int R, class E>
inline void attend_rows_avx2(const float* q, const E* k, const E* v, int valid, OnlineSoftmax* sm, float* acc,
                             float* s, int s_stride, const char* next_k, const char* next_v) {
  static_assert(D % 16 == 0 && R >= 1 && R <= 4, "D a multiple of 16, 1..4 rows");
  constexpr int NP = D / 16;                                       // 16-element chunks per row
  constexpr int kRowBytes = D * int(sizeof(E));
  // scores, 8 keys at a time: per key and row a vector of partial products, reduced together
  for (int j0 = 0; j0 < valid; j0 += 8) {
    const int n = std::min(8, valid - j0);
    __m256 t[R][8];
    for (int jj = 0; jj < n; ++jj) {
      const E* kr = k + size_t(j0 + jj) * D;
      if (next_k) prefetch_row(next_k + size_t(j0 + jj) * kRowBytes, kRowBytes);
      __m256 a0[R], a1[R], lo, hi;
      Chunk16<E>::load(kr, lo, hi);
      for (int r = 0; r < R; ++r) {
        a0[r] = _mm256_mul_ps(_mm256_loadu_ps(q + r * D), lo);
        a1[r] = _mm256_mul_ps(_mm256_loadu_ps(q + r * D + 8), hi);
      }
      for (int c = 1; c < NP; ++c) {
        Chunk16<E>::load(kr + 16 * c, lo, hi);
        for (int r = 0; r < R; ++r) {
          const float* qr = q + r * D + 16 * c;
          a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), lo, a0[r]);
          a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8), hi, a1[r]);
        }
      }
      for (int r = 0; r < R; ++r) t[r][jj] = _mm256_add_ps(a0[r], a1[r]);
    }
    for (int r = 0; r < R; ++r) {
      for (int jj = n; jj < 8; ++jj) t[r][jj] = _mm256_setzero_ps();
      store8(s + r * s_stride + j0, hsum8x8(t[r]), n);
    }
  }
  // online softmax per row: p = exp(s - m_new), corr = exp(m_old - m_new)
  float corr[R];
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * s_stride;
    float mx = -INFINITY;
    for (int j = 0; j < valid; ++j) mx = std::max(mx, sr[j]);
    corr[r] = sm[r].rescale(mx);
    const __m256 m = _mm256_set1_ps(sm[r].m);
    __m256 lsum = _mm256_setzero_ps();
    for (int j0 = 0; j0 < valid; j0 += 8) {
      const int n = std::min(8, valid - j0);
      const __m256 keep = _mm256_castsi256_ps(lanes_mask8(n));
      const __m256 p = _mm256_and_ps(keep, exp_nonpos8(_mm256_sub_ps(load8(sr + j0, n), m)));
      store8(sr + j0, p, n);
      lsum = _mm256_add_ps(lsum, p);
    }
    sm[r].add(hsum8(lsum));
  }
  // acc = acc * corr + P V, PP chunks of every row in registers per pass over the keys (16 registers:
  // R x 2PP accumulators, the PP loaded chunks and the R probabilities)
  constexpr int PP = R == 1 ? std::min(NP, 4) : (R == 2 ? std::min(NP, 2) : 1);
  static_assert(NP % PP == 0, "chunks per pass must divide the row");
  for (int c0 = 0; c0 < NP; c0 += PP) {
    __m256 a[R][2 * PP];
    for (int r = 0; r < R; ++r) {
      const __m256 cv = _mm256_set1_ps(corr[r]);
      for (int i = 0; i < 2 * PP; ++i) a[r][i] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 16 * c0 + 8 * i), cv);
    }
    for (int j = 0; j < valid; ++j) {
      const E* vr = v + size_t(j) * D;
      if (next_v && c0 == 0) prefetch_row(next_v + size_t(j) * kRowBytes, kRowBytes);
      __m256 lo[PP], hi[PP];
      for (int i = 0; i < PP; ++i) Chunk16<E>::load(vr + 16 * (c0 + i), lo[i], hi[i]);
      for (int r = 0; r < R; ++r) {
        const __m256 p = _mm256_broadcast_ss(s + r * s_stride + j);
        for (int i = 0; i < PP; ++i) {
          a[r][2 * i] = _mm256_fmadd_ps(p, lo[i], a[r][2 * i]);
          a[r][2 * i + 1] = _mm256_fmadd_ps(p, hi[i], a[r][2 * i + 1]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 2 * PP; ++i) _mm256_storeu_ps(acc + r * D + 16 * c0 + 8 * i, a[r][i]);
  }
}

// attend_rows_avx2 for a run-time row count (1..4) and head_dim (64, 128 or 256); false for any
// other head_dim (the caller then takes the scalar path).
template <class E>
inline bool attend_rows(int D, int R, const float* q, const E* k, const E* v, int valid, OnlineSoftmax* sm, float* acc,
                        float* s, int s_stride, const char* next_k, const char* next_v) {
#define DK_ATTEND_ROWS_CASE(DD)                                                                    \
  case DD:                                                                                         \
    switch (R) {                                                                                   \
      case 1: attend_rows_avx2<DD, 1, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      case 2: attend_rows_avx2<DD, 2, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      case 3: attend_rows_avx2<DD, 3, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
      default: attend_rows_avx2<DD, 4, E>(q, k, v, valid, sm, acc, s, s_stride, next_k, next_v); return true; \
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
#endif  // DK_AVX2 && !__AVX512F__
