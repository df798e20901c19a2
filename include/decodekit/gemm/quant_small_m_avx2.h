// INT4 / INT8 weight-only GEMM for 1 .. 8 rows of activations (decode, small decode batches,
// speculative verification) on CPUs with AVX2 + FMA + F16C but no AVX-512 (quant_small_m.h and
// int4.h's GEMV are the AVX-512 kernels).
//
// Register blocking: NB weight rows x MM activation rows of 8-lane fp32 accumulators. Each 16-byte
// chunk of a weight row is decoded once (INT4: 32 codes, 4 vectors) and used by all MM rows.
//
// Per element this is one fixed arithmetic, whatever NB and MM: per group the unscaled dot of the
// codes, chunk by chunk (a chunk's 4 code vectors c0..c3: INT4 the low nibbles of its 16 bytes, 8 at a
// time, then the high ones; INT8 its 32 bytes in order) x = (c0 a0 + c2 a2) + (c1 a1 + c3 a3) (mul,
// fma, add), t = x for the first chunk, t + x after; acc = fma(t, scale, acc); then hsum8(acc) + extra
// (INT4: sum_g min * asum, half_dot8) + bias. So a row's
// result does not depend on how many rows come with it: a speculative verification pass
// reproduces plain decoding bit for bit, as on AVX-512.
//
// Layouts as in int4.h: INT4 qweight [N, K / 2] (group-split nibbles), scales / mins [N, K / G]
// fp16; INT8 qweight [N, K] int8, scales [N, K / G] fp16. G = 32, 64 or 128.
#pragma once
#include <algorithm>
#include <cstdint>

#include "decodekit/common/avx2.h"
#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"

namespace dk {
namespace cpu {

#if defined(DK_AVX2)
#define DK_QUANT_SMALL_M_AVX2 1

// sum_g fp16 w[g] * x[g] over n groups (8 lanes, then the tail in order).
inline float half_dot8(const half_t* w, const float* x, int64_t n) {
  __m256 v = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= n; g += 8)
    v = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g))),
                        _mm256_loadu_ps(x + g), v);
  float t = hsum8(v);
  for (; g < n; ++g) t += _cvtsh_ss(w[g].bits) * x[g];
  return t;
}

// The 4 vectors of one 16-byte chunk of codes: INT4 low nibbles of bytes 0..7, 8..15, then the
// high nibbles of bytes 0..7, 8..15 (elements c.., c+8.., half+c.., half+c+8.. of the group);
// INT8 the 32 signed bytes in order.
struct Int4Chunk {
  static constexpr int kBytes = 16;
  DK_FORCE_INLINE static void decode(const uint8_t* q, __m256 (&v)[4]) {
    const __m256i low4 = _mm256_set1_epi32(15);
    const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
    v[0] = _mm256_cvtepi32_ps(_mm256_and_si256(b0, low4));
    v[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b1, low4));
    v[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));
    v[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
  }
  // activation offsets of the 4 vectors for a chunk at byte c of a group of G
  static int64_t offset(int i, int64_t c, int G) { return (i < 2 ? c : G / 2 + c) + 8 * (i & 1); }
};

struct Int8Chunk {
  static constexpr int kBytes = 32;
  DK_FORCE_INLINE static void decode(const int8_t* q, __m256 (&v)[4]) {
    for (int i = 0; i < 4; ++i)
      v[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i))));
  }
  static int64_t offset(int i, int64_t c, int) { return c + 8 * i; }
};

// out[r, n] for r < MM, n in weight-row blocks of NB (rows past N: row N - 1 again, not written).
// a: fp32 [MM, K] (row stride K); Q: uint8_t (INT4) or int8_t (INT8) codes, row_bytes per row;
// NC = G / 32 chunks per group (compile-time, so the rows' code interleaves without inner loops);
// extra(n, r): the format's per-row term.
template <int NB, int MM, int NC, class Chunk, class Q, class T, class RowExtra>
void quant_small_m_block_avx2(T* out, int64_t out_stride, const float* a, const Q* qweight, int64_t row_bytes,
                              const half_t* scales, const T* bias, int64_t N, int64_t K, RowExtra extra) {
  constexpr int G = 32 * NC, kGroupBytes = NC * Chunk::kBytes;
  const int64_t ng = K / G, nblocks = (N + NB - 1) / NB;
  DK_OMP_PARALLEL_FOR_IF(N * K * MM >= kParallelGrain)
  for (int64_t nb = 0; nb < nblocks; ++nb) {
    const Q* qrow[NB];
    const half_t* srow[NB];
    __m256 acc[NB][MM];
    DK_UNROLL_ALL
    for (int j = 0; j < NB; ++j) {
      const int64_t n = std::min<int64_t>(nb * NB + j, N - 1);
      qrow[j] = qweight + n * row_bytes;
      srow[j] = scales + n * ng;
      DK_UNROLL_ALL
      for (int r = 0; r < MM; ++r) acc[j][r] = _mm256_setzero_ps();
    }
    alignas(32) float sc[NB][8];  // sc[j][i]: row j's scale of group g0 + i
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {
      const int64_t gn = std::min<int64_t>(8, ng - g0);
      DK_UNROLL_ALL
      for (int j = 0; j < NB; ++j)
        _mm256_store_ps(sc[j], load8(srow[j] + g0, gn));
      for (int64_t i = 0; i < gn; ++i) {
        const int64_t g = g0 + i;
        const float* ag = a + g * G;
        DK_UNROLL_ALL
        for (int j = 0; j < NB; ++j) {
          const Q* q = qrow[j] + g * kGroupBytes;
          // the same bytes of row j one block ahead (the rows are contiguous): the hardware prefetcher
          // follows NB interleaved streams poorly. 2 Zen 3 cores, weights from DRAM: SmolLM2's 120 INT4
          // projections per token 14-15 -> 8-10 ms, the 49152 x 576 INT8 LM head 4.2-4.6 -> 1.9-3.3 ms
          // (1 block ahead was as good as or better than 2, 4, 8, 16; T0 as T1). Past the weight's end
          // a prefetch is a no-op.
          _mm_prefetch(reinterpret_cast<const char*>(q + NB * row_bytes), _MM_HINT_T0);
          __m256 t[MM];
          DK_UNROLL_ALL
          for (int c = 0; c < NC; ++c) {
            __m256 v[4];
            Chunk::decode(q + c * Chunk::kBytes, v);
            DK_UNROLL_ALL
            for (int r = 0; r < MM; ++r) {
              const float* ar = ag + r * K;
              const int64_t o = c * Chunk::kBytes;  // the chunk's first byte = its first element
              // two independent chains (even / odd vectors), then their sum: a short dependency path
              const __m256 x0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(ar + Chunk::offset(2, o, G)),
                                                _mm256_mul_ps(v[0], _mm256_loadu_ps(ar + Chunk::offset(0, o, G))));
              const __m256 x1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(ar + Chunk::offset(3, o, G)),
                                                _mm256_mul_ps(v[1], _mm256_loadu_ps(ar + Chunk::offset(1, o, G))));
              const __m256 x = _mm256_add_ps(x0, x1);
              t[r] = c == 0 ? x : _mm256_add_ps(t[r], x);
            }
          }
          const __m256 d = _mm256_broadcast_ss(&sc[j][i]);
          DK_UNROLL_ALL
          for (int r = 0; r < MM; ++r) acc[j][r] = _mm256_fmadd_ps(t[r], d, acc[j][r]);
        }
      }
    }
    for (int j = 0; j < NB && nb * NB + j < N; ++j) {
      const int64_t n = nb * NB + j;
      for (int r = 0; r < MM; ++r) {
        float v = hsum8(acc[j][r]) + extra(n, r);
        if (bias) v += to_float(bias[n]);
        out[r * out_stride + n] = from_float<T>(v);
      }
    }
  }
}

// Row counts 1 .. 8 of a (fp32 [M, K]): blocks of at most 4 rows (5 .. 8 rows: two passes over the
// weight, each row's arithmetic unchanged); NB weight rows per block so that NB x MM accumulators,
// MM partial dots and a chunk's 4 decoded vectors fit the 16 vector registers (one row: 8 weight rows,
// measured 2.7 ns per row-group vs 3.3 with 4 or 6 on one Zen 3 core, 1536 x 576 cache-resident).
template <int NC, class Chunk, class Q, class T, class RowExtra>
void quant_rows_avx2(T* out, int64_t out_stride, const float* a, const Q* qweight, int64_t row_bytes,
                     const half_t* scales, const T* bias, int64_t M, int64_t N, int64_t K, RowExtra extra) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mm = std::min<int64_t>(4, M - m0);
    T* o = out + m0 * out_stride;
    const float* am = a + m0 * K;
    auto ex = [&](int64_t n, int r) { return extra(n, int(m0) + r); };
    switch (mm) {
      case 1: quant_small_m_block_avx2<8, 1, NC, Chunk>(o, out_stride, am, qweight, row_bytes, scales, bias, N, K, ex); break;
      case 2: quant_small_m_block_avx2<3, 2, NC, Chunk>(o, out_stride, am, qweight, row_bytes, scales, bias, N, K, ex); break;
      case 3: quant_small_m_block_avx2<2, 3, NC, Chunk>(o, out_stride, am, qweight, row_bytes, scales, bias, N, K, ex); break;
      default: quant_small_m_block_avx2<1, 4, NC, Chunk>(o, out_stride, am, qweight, row_bytes, scales, bias, N, K, ex); break;
    }
  }
}

// G = 32, 64 or 128 as the compile-time chunk count; false for other group sizes.
template <class Chunk, class Q, class T, class RowExtra>
bool quant_rows_avx2_g(int G, T* out, const float* a, const Q* qweight, int64_t row_bytes, const half_t* scales,
                       const T* bias, int64_t M, int64_t N, int64_t K, RowExtra extra) {
  switch (G) {
    case 32: quant_rows_avx2<1, Chunk>(out, N, a, qweight, row_bytes, scales, bias, M, N, K, extra); return true;
    case 64: quant_rows_avx2<2, Chunk>(out, N, a, qweight, row_bytes, scales, bias, M, N, K, extra); return true;
    case 128: quant_rows_avx2<4, Chunk>(out, N, a, qweight, row_bytes, scales, bias, M, N, K, extra); return true;
    default: return false;
  }
}

// out = a @ w^T (+ bias) for M in 1 .. 8, G = 32, 64 or 128; false (nothing done) otherwise.
// a: fp32 [M, K]; asum: fp32 [M, K / G], each row's per-group activation sums.
template <class T>
bool int4_gemm_small_m_avx2(T* out, const float* a, const float* asum, const uint8_t* qweight, const half_t* scales,
                            const half_t* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G) {
  if (M < 1 || M > 8) return false;
  const int64_t ng = K / G;
  return quant_rows_avx2_g<Int4Chunk>(G, out, a, qweight, K / 2, scales, bias, M, N, K,
                                      [&](int64_t n, int r) { return half_dot8(mins + n * ng, asum + r * ng, ng); });
}

template <class T>
bool int8_gemm_small_m_avx2(T* out, const float* a, const int8_t* qweight, const half_t* scales, const T* bias,
                            int64_t M, int64_t N, int64_t K, int G) {
  if (M < 1 || M > 8) return false;
  return quant_rows_avx2_g<Int8Chunk>(G, out, a, qweight, K, scales, bias, M, N, K, [](int64_t, int) { return 0.f; });
}

#endif  // DK_AVX2

}  // namespace cpu
}  // namespace dk
