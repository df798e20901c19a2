// INT4 / INT8 weight-only GEMM for a few rows of activations (2 .. 16 by int4.h's dispatch: speculative
// verification, small decode batches; any number for batch invariance's decode rows), CPU with AVX-512, with the
// one-row GEMV's per-element arithmetic, so each row gets the bits it gets alone.
//
// Register blocking: NB output rows (weight rows) x MM activation rows of fp32 accumulators.
// Each 16-code chunk of a weight row is decoded once and used by all MM rows; the activation
// chunks come from L1. NB * MM independent accumulators keep the FMA units busy. Rows past N in
// the last block recompute row N - 1 and are not written.
//
// Layouts as in int4.h: INT4 qweight [N, K / 2] (group-split nibbles), scales / mins [N, K / G]
// fp16; INT8 qweight [N, K] int8, scales [N, K / G] fp16. G a multiple of 32.
#pragma once
#include <algorithm>
#include <cstdint>

#include "decodekit/common/avx512.h"  // prefetch_row_ahead
#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"
#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace dk {
namespace cpu {

#if defined(__AVX512F__) && defined(__F16C__)

// The first min(n, 16) fp16 values at p as fp32 lanes, zeros past them (n >= 1).
DK_FORCE_INLINE __m512 half16_lanes(const half_t* p, int64_t n) {
  if (n >= 16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#if defined(DK_AVX512_LOAD_STORE16)
  return load16(p, lanes_mask(n));
#else
  alignas(32) uint16_t t[16] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i].bits;
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(t)));
#endif
}

#endif

// n fp16 values as fp32 (hardware conversion where available; exact either way).
inline void half_row_to_float(const half_t* src, float* dst, int64_t n) {
#if defined(__AVX512F__) && defined(__F16C__)
  for (int64_t i = 0; i < n; i += 16)  // the tail too in one masked convert (not a software fp16 decode)
    _mm512_mask_storeu_ps(dst + i, lanes_mask(n - i), half16_lanes(src + i, n - i));
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i].bits);
#endif
}

#if defined(__AVX512F__) && defined(__F16C__)

// INT4's per-row minimum term sum_g min[g] * asum[g] over n groups, as 16 lanes (lane i: groups i,
// i + 16, ..., fma in that order; lanes past n zero), added to the row's accumulator before its one
// reduction (reduce16_rows).
DK_FORCE_INLINE __m512 half_dot_lanes(const half_t* w, const float* x, int64_t n) {
  __m512 v = _mm512_setzero_ps();
  for (int64_t g = 0; g < n; g += 16) {
    v = _mm512_fmadd_ps(half16_lanes(w + g, n - g), _mm512_maskz_loadu_ps(lanes_mask(n - g), x + g), v);
  }
  return v;
}

// Lane r of the result (r < R <= 16) is the sum of v[r]'s 16 lanes, every row in one fixed tree:
// s_i = v_i + v_{i+8} (i < 8), then s_i + s_{i+4} (i < 4), then s_i + s_{i+2} (i < 2), then s_0 + s_1
// (the order of GCC's _mm512_reduce_add_ps). Four shuffle levels serve all R rows at once (~37 uops
// for 12 rows instead of ~8 per row plus its scalar tail), so the GEMV's and the 2 .. 8-row kernels'
// epilogues, which both reduce through here, give a row the same bits whatever R is. Lanes past R: 0.
template <int R>
DK_FORCE_INLINE __m512 reduce16_rows(const __m512 (&v)[R]) {
  static_assert(R >= 1 && R <= 16, "reduce16_rows: 1 .. 16 rows");
  __m512 x[16];
  DK_UNROLL_ALL
  for (int r = 0; r < 16; ++r) x[r] = r < R ? v[r] : _mm512_setzero_ps();
  __m512 s1[8], s2[4], s3[2];
  DK_UNROLL_ALL
  for (int p = 0; p < (R + 1) / 2; ++p)  // lanes 0..7: row 2p's v_i + v_{i+8}; 8..15: row 2p + 1's
    s1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0x44),
                          _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0xee));
  DK_UNROLL_ALL
  for (int p = (R + 1) / 2; p < 8; ++p) s1[p] = _mm512_setzero_ps();
  DK_UNROLL_ALL
  for (int p = 0; p < 4; ++p)  // quarter k: row 4p + k's 4 partial sums
    s2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0x88),
                          _mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0xdd));
  DK_UNROLL_ALL
  for (int p = 0; p < 2; ++p)  // quarter k: lanes 0, 1 row 8p + k, lanes 2, 3 row 8p + 4 + k
    s3[p] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], 0x44),
                          _mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], 0xee));
  // lane 4k + t: row k + 4t; then rows in lane order
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xdd));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s4);
}

// float(q) for the INT4 codes q = 0..15 (lane q), the table the INT4 kernels scale per group.
DK_FORCE_INLINE __m512 int4_codes_ps() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// 16 int8 codes as fp32 lanes (exact).
DK_FORCE_INLINE __m512 int8x16_to_ps(const int8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

// A register tile's shape as a type (to pass to a generic lambda): NB weight rows x MM activation rows.
template <int NB, int MM>
struct Tile {
  static constexpr int nb = NB, mm = MM;
};

// The block's weight rows (past N: row N - 1 again, not written) and zeroed accumulators.
template <int NB, int MM>
DK_FORCE_INLINE void small_m_begin(int64_t nb, int64_t N, int64_t (&rows)[NB], __m512 (&acc)[NB][MM]) {
  DK_UNROLL_ALL
  for (int j = 0; j < NB; ++j) {
    rows[j] = std::min<int64_t>(nb * NB + j, N - 1);
    for (int r = 0; r < MM; ++r) acc[j][r] = _mm512_setzero_ps();
  }
}

// sc[j][i] = the scale of group g0 + i of weight row rows[j] as fp32 (i < gn <= 16): converted 16 groups at a
// time, so that the group loop reads each scale as a broadcast load instead of a convert + broadcast per
// group and weight row (the GEMV's way, gemv_rows_g32_avx512). Exact, so the same bits either way. The INT4
// and INT8 blocks keep their own group loops around it: one helper taking the group body as a lambda
// measured 0.71-0.9x on the INT8 LM head (tools/ab_quant_gemm.sh).
template <int NB>
DK_FORCE_INLINE void small_m_scales(const half_t* scales, int64_t ng, int64_t g0, int64_t gn,
                                    const int64_t (&rows)[NB], float (&sc)[NB][16]) {
  DK_UNROLL_ALL
  for (int j = 0; j < NB; ++j) half_row_to_float(scales + rows[j] * ng + g0, sc[j], gn);
}

// out[r, n] = reduce16(acc[j][r] + extra(n, r)) (+ bias[n]) for the block's real rows, the GEMV's
// order (extra: INT4's half_dot_lanes; INT8 has none, kExtra false).
template <bool kExtra, int NB, int MM, class T, class RowExtra>
DK_FORCE_INLINE void small_m_end(T* out, int64_t out_stride, const T* bias, int64_t nb, int64_t N,
                                 const int64_t (&rows)[NB], const __m512 (&acc)[NB][MM], RowExtra extra) {
  for (int j = 0; j < NB && nb * NB + j < N; ++j) {
    __m512 v[MM];
    DK_UNROLL_ALL
    for (int r = 0; r < MM; ++r) v[r] = kExtra ? _mm512_add_ps(acc[j][r], extra(rows[j], r)) : acc[j][r];
    alignas(64) float sum[16];
    _mm512_store_ps(sum, reduce16_rows(v));
    const float b = bias ? to_float(bias[rows[j]]) : 0.f;
    for (int r = 0; r < MM; ++r) out[r * out_stride + rows[j]] = from_float<T>(bias ? sum[r] + b : sum[r]);
  }
}

// acc[r] = fma(t[hi], a_r[half..], fma(t[lo], a_r[0..], acc[r])) for one 16-byte chunk of codes q and
// the MM activation rows a_r = ag + r * K (t: the group's scaled code table).
template <int MM>
DK_FORCE_INLINE void int4_chunk_fma(const uint8_t* q, __m512 t, const float* ag, int64_t K, int64_t half,
                                    __m512 (&acc)[MM]) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512 lo = _mm512_permutexvar_ps(b, t);
  const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), t);
  DK_UNROLL_ALL
  for (int r = 0; r < MM; ++r)
    acc[r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(ag + r * K + half), _mm512_fmadd_ps(lo, _mm512_loadu_ps(ag + r * K), acc[r]));
}

// out[r, n] = sum_k a[r, k] * w[n, k] (+ bias[n]) for r < MM; a: fp32 [MM, K] (row stride K);
// asum: fp32 [MM, K / G], each row's per-group activation sums. Per element this is exactly the
// one-row GEMV's arithmetic (int4.h: int4_gemv_g32_avx512): per group the scaled code table
// t = d * (0..15) (exact), then per 16-byte chunk acc = fma(t[hi], a_hi, fma(t[lo], a_lo, acc));
// then reduce16(acc + half_dot_lanes(min, asum)) (+ bias). So a row's result does not depend on how many rows
// come with it (any count; past 8 rows_strips): a verification pass reproduces plain decoding bit for bit.
// Per chunk and weight row: 4 decode uops (widen, shift, 2 lookups) shared by the MM rows, 2 FMAs per row.
// One block of NB weight rows (block nb) against the MM rows.
template <int NB, int MM, class T>
DK_FORCE_INLINE void int4_small_m_nb(T* out, int64_t out_stride, const float* a, const float* asum,
                                     const uint8_t* qweight, const half_t* scales, const half_t* mins, const T* bias,
                                     int64_t N, int64_t K, int G, int64_t nb) {
  const int64_t ng = K / G, half = G / 2;
  const __m512 codes = int4_codes_ps();
  int64_t rows[NB];
  __m512 acc[NB][MM];
  small_m_begin(nb, N, rows, acc);
  alignas(64) float sc[NB][16];  // sc[j][i]: weight row j's scale of group g0 + i
  for (int64_t g0 = 0; g0 < ng; g0 += 16) {
    const int64_t gn = std::min<int64_t>(16, ng - g0);
    small_m_scales(scales, ng, g0, gn, rows, sc);
    for (int64_t g = g0; g < g0 + gn; ++g) {
      DK_UNROLL_ALL
      for (int j = 0; j < NB; ++j) {
        const uint8_t* q = qweight + rows[j] * (K / 2) + g * half;
        prefetch_row_ahead(q + NB * (K / 2), g * half);
        const __m512 t = _mm512_mul_ps(codes, _mm512_set1_ps(sc[j][g - g0]));
        // elements g*G + c.. (low nibbles), g*G + half + c.. (high); the first chunk outside the
        // loop (G = 32: the only one) keeps the accumulators in registers
        int4_chunk_fma<MM>(q, t, a + g * G, K, half, acc[j]);
        for (int64_t c = 16; c < half; c += 16) int4_chunk_fma<MM>(q + c, t, a + g * G + c, K, half, acc[j]);
      }
    }
  }
  small_m_end<true>(out, out_stride, bias, nb, N, rows, acc,
                    [&](int64_t n, int r) { return half_dot_lanes(mins + n * ng, asum + r * ng, ng); });
}

template <int NB, int MM, class T>
void int4_small_m_block(T* out, int64_t out_stride, const float* a, const float* asum, const uint8_t* qweight,
                        const half_t* scales, const half_t* mins, const T* bias, int64_t N, int64_t K, int G) {
  const int64_t nblocks = (N + NB - 1) / NB;
  DK_OMP_PARALLEL_FOR_IF(N * K * MM >= kParallelGrain)
  for (int64_t nb = 0; nb < nblocks; ++nb)
    int4_small_m_nb<NB, MM>(out, out_stride, a, asum, qweight, scales, mins, bias, N, K, G, nb);
}

// INT8 (w = scale * q), the GEMV's arithmetic (int8_gemv_g32_avx512): per 16-code chunk the decoded weights
// w = q * d (exact: 8 x 11 significant bits), then acc = fma(w, a, acc) chunk by chunk; G a multiple of 32.
// Per 32 weights: 4 decode uops (2 widen-convert pairs) and 2 scale multiplies shared by the MM rows, 2 FMAs
// per row (an unscaled dot per group then fma(dot, d, acc) took 3 a row).
template <int NB, int MM, class T>
DK_FORCE_INLINE void int8_small_m_nb(T* out, int64_t out_stride, const float* a, const int8_t* qweight,
                                     const half_t* scales, const T* bias, int64_t N, int64_t K, int G, int64_t nb) {
  const int64_t ng = K / G;
  int64_t rows[NB];
  __m512 acc[NB][MM];
  small_m_begin(nb, N, rows, acc);
  alignas(64) float sc[NB][16];  // sc[j][i]: weight row j's scale of group g0 + i
  for (int64_t g0 = 0; g0 < ng; g0 += 16) {
    const int64_t gn = std::min<int64_t>(16, ng - g0);
    small_m_scales(scales, ng, g0, gn, rows, sc);
    for (int64_t g = g0; g < g0 + gn; ++g) {
      DK_UNROLL_ALL
      for (int j = 0; j < NB; ++j) {
        const int8_t* q = qweight + rows[j] * K + g * G;
        prefetch_row_ahead(q + NB * K, g * G);
        const __m512 d = _mm512_set1_ps(sc[j][g - g0]);
        for (int c = 0; c < G; c += 16) {
          const __m512 w = _mm512_mul_ps(int8x16_to_ps(q + c), d);
          DK_UNROLL_ALL
          for (int r = 0; r < MM; ++r)
            acc[j][r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(a + r * K + g * G + c), acc[j][r]);
        }
      }
    }
  }
  small_m_end<false>(out, out_stride, bias, nb, N, rows, acc, [](int64_t, int) { return _mm512_setzero_ps(); });
}

template <int NB, int MM, class T>
void int8_small_m_block(T* out, int64_t out_stride, const float* a, const int8_t* qweight, const half_t* scales,
                        const T* bias, int64_t N, int64_t K, int G) {
  const int64_t nblocks = (N + NB - 1) / NB;
  DK_OMP_PARALLEL_FOR_IF(N * K * MM >= kParallelGrain)
  for (int64_t nb = 0; nb < nblocks; ++nb)
    int8_small_m_nb<NB, MM>(out, out_stride, a, qweight, scales, bias, N, K, G, nb);
}

// More than 8 rows with the same per-element arithmetic (so still each row's one-row bits): the weight rows in
// strips of kRowsStripBlocks blocks of NB (an L1-sized strip: 32 SmolLM2 rows of K = 1536 are 24 KB as INT4), each
// strip against every group of MM rows in turn, so the weights are read from memory once; body(tile, m0, nb) runs
// weight block nb against the rows [m0, m0 + tile.mm). Parallel over the strips.
constexpr int64_t kRowsStripBlocks = 8;

template <int NB, int MM, class Body>
void rows_strips(int64_t M, int64_t N, int64_t K, Body body) {
  static_assert(MM >= 2 && MM <= 8);
  const int64_t nblocks = (N + NB - 1) / NB, strips = (nblocks + kRowsStripBlocks - 1) / kRowsStripBlocks;
  DK_OMP_PARALLEL_FOR_IF(N * K * M >= kParallelGrain)
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t b0 = s * kRowsStripBlocks, b1 = std::min(nblocks, b0 + kRowsStripBlocks);
    auto group = [&](auto tile, int64_t m0) {
      for (int64_t nb = b0; nb < b1; ++nb) body(tile, m0, nb);
    };
    int64_t m0 = 0;
    for (; m0 + MM <= M; m0 += MM) group(Tile<NB, MM>{}, m0);
    if (m0 < M)  // the last rows (fewer than MM)
      rows_switch<MM - 1>(int(M - m0), [&](auto R) { group(Tile<NB, decltype(R)::value>{}, m0); });
  }
}

// Row counts 1 .. 8 (compile-time so the accumulators stay in registers). INT4: 4 weight rows per
// block up to 5 activation rows (swept 2..12 on one Xeon core, cache-resident SmolLM2 shapes: M = 5 is
// 1.14x faster at 4 than at 2); 6 rows in one pass of 3 weight rows per block (after the scales became
// broadcast loads: 1.08-1.17x the 3 + 3 passes, tools/ab_quant_gemm.sh on a 2-core Sapphire Rapids);
// 7 .. 8 rows as two passes over the weights, 4 + 3, 4 + 4 (SmolLM2's 30 layers from DRAM on 2 EPYC
// cores, mean of 6 alternations: M = 7 9.81 -> 8.29, 8 12.60 -> 9.10 ms against one pass at 2 weight
// rows per block: the 4-row blocks keep the activation chunks in registers, which the one-pass 2 x 7
// tile cannot, and the second weight read is mostly from L3; one pass of 3 x 7, 2 x 7, 2 x 8 or 3 x 8
// measured 0.71-0.96x on Sapphire Rapids). Each row's arithmetic is the GEMV's either way. INT8: 4 up
// to 4, 2 beyond (at most 16 accumulators; two passes gained <= 5% there; 4 x 5, 4 x 6, 3 x 7, 3 x 8
// measured no better). More rows: weight strips against groups of rows (rows_strips: INT4 4 x 4, INT8 2 x 8; the
// strips measured no faster than passes of 8 rows from DRAM, but they are one call). False for G not a multiple of 32.
template <class T>
bool int4_gemm_small_m(T* out, const float* a, const float* asum, const uint8_t* qweight, const half_t* scales,
                       const half_t* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G) {
  if (G % 32 != 0) return false;
  const int64_t ng = K / G;
  // rows [r0, r0 + MM) of a / asum / out
  auto rows = [&](auto tile, int64_t r0) {
    using Shape = decltype(tile);
    int4_small_m_block<Shape::nb, Shape::mm>(out + r0 * N, N, a + r0 * K, asum + r0 * ng, qweight, scales, mins, bias, N, K, G);
  };
  switch (M) {
    case 1: rows(Tile<4, 1>{}, 0); return true;
    case 2: rows(Tile<4, 2>{}, 0); return true;
    case 3: rows(Tile<4, 3>{}, 0); return true;
    case 4: rows(Tile<4, 4>{}, 0); return true;
    case 5: rows(Tile<4, 5>{}, 0); return true;
    case 6: rows(Tile<3, 6>{}, 0); return true;
    case 7: rows(Tile<4, 4>{}, 0); rows(Tile<4, 3>{}, 4); return true;
    case 8: rows(Tile<4, 4>{}, 0); rows(Tile<4, 4>{}, 4); return true;
    default: break;
  }
  rows_strips<4, 4>(M, N, K, [&](auto tile, int64_t m0, int64_t nb) {  // 4 x 5: 0.85-0.9x (30 layers, DRAM)
    using Shape = decltype(tile);
    int4_small_m_nb<Shape::nb, Shape::mm>(out + m0 * N, N, a + m0 * K, asum + m0 * ng, qweight, scales, mins, bias,
                                          N, K, G, nb);
  });
  return true;
}

template <class T>
bool int8_gemm_small_m(T* out, const float* a, const int8_t* qweight, const half_t* scales, const T* bias,
                       int64_t M, int64_t N, int64_t K, int G) {
  if (G % 32 != 0) return false;
  switch (M) {
    case 1: int8_small_m_block<4, 1>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 2: int8_small_m_block<4, 2>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 3: int8_small_m_block<4, 3>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 4: int8_small_m_block<4, 4>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 5: int8_small_m_block<2, 5>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 6: int8_small_m_block<2, 6>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 7: int8_small_m_block<2, 7>(out, N, a, qweight, scales, bias, N, K, G); return true;
    case 8: int8_small_m_block<2, 8>(out, N, a, qweight, scales, bias, N, K, G); return true;
    default: break;
  }
  // 2 weight rows x 8 activation rows, as 8 rows above (the Q8_0 LM head, 49152 x 576 from DRAM, as decode rows:
  // M = 24 / 32 / 64 7.8 / 10.4 / 20.4 ms against 4 x 4's 9.1 / 12.1 / 24.5, tools/bench_decode_rows.py)
  rows_strips<2, 8>(M, N, K, [&](auto tile, int64_t m0, int64_t nb) {
    using Shape = decltype(tile);
    int8_small_m_nb<Shape::nb, Shape::mm>(out + m0 * N, N, a + m0 * K, qweight, scales, bias, N, K, G, nb);
  });
  return true;
}

#endif  // __AVX512F__ && __F16C__

}  // namespace cpu
}  // namespace dk
