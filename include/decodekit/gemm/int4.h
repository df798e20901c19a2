// INT4 (and INT8) weight-only GEMM (W4A16, W8A16), CPU side, and the INT4 layout's per-element logic
// (shared with the reference through tests; a CUDA kernel will use the same decode).
//
// Layout ("group-split", GGUF Q4_0/Q4_1's own order for group size 32): weight [N, K], groups
// of G (32, 64 or 128) along K.
//   qweight [N, K / 2] uint8: in group g of a row, byte g*G/2 + i holds element g*G + i in its
//           low nibble and element g*G + G/2 + i in its high nibble (i < G/2);
//   scales  [N, K / G] fp16, mins [N, K / G] fp16:  w[n, k] = scale * q + min  (fp32, one rounding:
//           scale * q is exact). GGUF Q4_1 is exactly this; Q4_0 and symmetric GPTQ are
//           min = -8 * scale (exact in fp16); asymmetric zero points are min = -scale * zero.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"
#include "decodekit/gemm/dense_cpu.h"  // kDecodeRowBlock, kPrefillRowsMin
#include "decodekit/gemm/int4_common.h"
#include "decodekit/gemm/int4_tiled.h"
#include "decodekit/gemm/int4_tiled_bf16.h"
#include "decodekit/gemm/quant_amx.h"
#include "decodekit/gemm/quant_amx_exact.h"
#include "decodekit/gemm/quant_amx_rows.h"
#include "decodekit/gemm/quant_amx_rows_bf16.h"
#include "decodekit/gemm/quant_small_m.h"
#include "decodekit/gemm/quant_small_m_avx2.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace dk {

namespace cpu {

// From this many rows of a, int4_gemm / int8_gemm run their many-row kernels: on AMX CPUs the tile unit (bf16:
// quant_amx.h; fp32 / fp16: exact integer products, quant_amx_exact.h), bf16 products on AVX512-BF16
// (int4_tiled_bf16.h), AVX2's tiled fp32 kernel; fewer rows decode in registers: one row by the GEMV below, 2 .. 8
// by the register-blocked kernels of quant_small_m.h (AVX2: quant_small_m_avx2.h).
constexpr int64_t kTiledQuantGemmMinM = 9;
// Without the tile unit, AVX-512: the tiled fp32 kernel (int4_tiled.h: each weight panel decoded once to fp32; fp32 /
// fp16 activations, bf16 where no bf16-product kernel runs) and the bf16-product one (int4_tiled_bf16.h) from this
// many rows; fewer keep the GEMV's arithmetic (int4_gemm_rows_exact). SmolLM2's 30 layers' INT4 projections from DRAM
// on 2 Zen 5 cores (ms, rows kernels vs tiled; tools/bench_decode_rows.py, whose "as decode rows" runs them at any M):
// fp32 M = 9 10.2 vs 18.8, 16 15.7 vs 23.0, 24 25.6 vs 27.4, 32 36.1 vs 33.3, its Q8_0 LM head 9 3.6 vs 5.6, 16 6.2
// vs 6.6, 24 9.4 vs 7.1; bf16 (bf16 products) M = 9 10.9 vs 16.7, 16 17.0 vs 18.7, 24 24.2 vs 20.1, LM head 9 3.8 vs
// 5.0, 16 6.1 vs 5.5.
#if defined(__AVX512F__) && defined(__F16C__)
constexpr int64_t kTiledVectorMinM = 17;
#else
constexpr int64_t kTiledVectorMinM = kTiledQuantGemmMinM;
#endif

struct Int4GemmParams {
  int64_t M, N, K;
  int group_size;      // 32, 64 or 128
  int64_t a_stride;    // row stride of a (elements)
  // The weight's copy in quant_amx_rows.h's layout, or null: fp32 / fp16 activations of 1 .. 12 rows then run
  // on the AMX int8 unit with quant_amx_exact.h's semantics (the ones rows >= 9 get anyway), so that every
  // row count gives a row the same bits (decoding = speculative verification = batches); bf16 activations: the
  // same up to 12 (INT8: 8) rows, then quant_amx.h's bf16 products on strips decoded from the copy
  // (quant_amx_rows_bf16.h). With it, qweight / scales / mins may be null: the weight held only as the copy
  // (other routes unpack it first).
  const uint8_t* amx_rows = nullptr;
  // Batch invariance (split_decode_rows): rows [0, decode_rows) are decode-phase rows, each given the bits it gets
  // alone, the others prompt rows on the many-row kernels; -1: every row by the row count.
  int64_t decode_rows = -1;
};

// How decode rows get their one-row bits: kWhole (one call by the row count: the AMX copy's kernels with fp32 / fp16
// activations on a tile-unit CPU, the same semantics at every row count), kExact (int4_gemm_rows_exact: AVX-512 with
// the weight's codes), else kBlocks (blocks of kDecodeRowBlock rows: every route's few-row kernels).
enum class DecodeRoute { kWhole, kExact, kBlocks };
template <class T>
DecodeRoute decode_rows_route(const Int4GemmParams& P, bool has_codes) {
#if defined(DK_AMX_EXACT_GEMM)
  if (P.amx_rows && amx_enabled()) return std::is_same_v<T, bf16_t> ? DecodeRoute::kBlocks : DecodeRoute::kWhole;
#endif
#if defined(__AVX512F__) && defined(__F16C__)
  if (has_codes) return DecodeRoute::kExact;
#endif
  (void)P, (void)has_codes;
  return DecodeRoute::kBlocks;
}

// Batch invariance (P.decode_rows = D >= 0; dense_cpu.h: kDecodeRowBlock / kPrefillRowsMin), for int4_gemm /
// int8_gemm as gemm(out, a, R) (their by-count routes, R.decode_rows = -1) and exact(out, a, R) (their
// _rows_exact): rows [0, D) are decode-phase rows, each given the bits it gets alone (decode_rows_route); rows
// [D, M) are prompt rows, run as one block of at least kPrefillRowsMin rows (zero rows appended to fewer), where every
// route is its many-row kernel and a row's bits do not depend on the rows beside it.
template <class T, class Gemm, class Exact>
void split_decode_rows(T* out, const T* a, const Int4GemmParams& P, bool has_codes, Gemm gemm, Exact exact) {
  const int64_t D = P.decode_rows, N = P.N, K = P.K, p = P.M - D;
  Int4GemmParams R = P;
  R.decode_rows = -1;
  if (D > 0) {
    R.M = D;
    switch (decode_rows_route<T>(R, has_codes)) {
      case DecodeRoute::kWhole: gemm(out, a, R); break;
      case DecodeRoute::kExact: exact(out, a, R); break;
      default:
        for (int64_t m0 = 0; m0 < D; m0 += kDecodeRowBlock) {
          Int4GemmParams B = R;
          B.M = std::min(kDecodeRowBlock, D - m0);
          gemm(out + m0 * N, a + m0 * P.a_stride, B);
        }
    }
  }
  R.M = std::max(p, kPrefillRowsMin);
  if (p >= kPrefillRowsMin) {
    gemm(out + D * N, a + D * P.a_stride, R);
  } else if (p > 0) {
    std::vector<T> ap(size_t(R.M * K), from_float<T>(0.f)), op(size_t(R.M * N));
    for (int64_t r = 0; r < p; ++r) {
      const T* row = a + (D + r) * P.a_stride;
      std::copy(row, row + K, ap.begin() + r * K);
    }
    R.a_stride = K;
    gemm(op.data(), ap.data(), R);
    std::copy(op.begin(), op.begin() + p * N, out + D * N);
  }
}

#if defined(__AVX512F__)
// res[r] += sum_g sc[g] * sum_i a_r[g*G + i] * q[g*G + i] for MM rows of a (row stride K), G a
// multiple of 32: each 16 code bytes are widened once, scaled once, and used by all MM rows.
template <int MM>
inline void int4_rows_avx512(const uint8_t* qrow, const float* sc, const float* a, int64_t K, int G, float* res) {
  __m512 acc[MM];
  for (int r = 0; r < MM; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi32(15);
  const int64_t ng = K / G;
  const int half = G / 2;
  for (int64_t g = 0; g < ng; ++g) {
    const __m512 d = _mm512_set1_ps(sc[g]);
    const uint8_t* qg = qrow + g * half;
    for (int c = 0; c < half; c += 16) {  // elements g*G + c.. (low nibbles), g*G + half + c.. (high)
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qg + c)));
      const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, low4)), d);
      const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), d);
      for (int r = 0; r < MM; ++r) {
        const float* ar = a + r * K + g * G + c;
        acc[r] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(ar), acc[r]);
        acc[r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(ar + half), acc[r]);
      }
    }
  }
  for (int r = 0; r < MM; ++r) res[r] += _mm512_reduce_add_ps(acc[r]);
}
#endif

#if defined(__AVX512F__) && defined(__F16C__)
// M = 1, G = 32, kGemvRows (12) output rows at a time (the group's 32 activations loaded once for
// them; rows past N recompute the last one and are not written):
//   acc_n = step(q_n,g, a_lo, a_hi, d[n,g], acc_n) over the groups g, then
//   out[n] = reduce16(acc_n + extra(n)) (+ bias[n]), the 12 rows reduced together (reduce16_rows);
// step: the format's 16-lane update with row n's group g (q_n,g: its codes, kGroupBytes of them; a_lo / a_hi: the
// group's activations 0..15 and 16..31; d: its scale); extra(n): the format's per-row term as 16 lanes (INT4:
// half_dot_lanes of the mins and the group sums of a; INT8: none, kExtra false).
// The vector ports bound this loop (not memory, once prefetched): the rows' scales are converted 16
// groups at a time into a stack array, so each group's scale is a broadcast load, not a convert +
// broadcast. 12 rows, not 4: 1.6-2x faster on 2 Zen cores (fewer activation loads and loop steps per
// row, more independent accumulator chains; 16 no longer fits the 32 vector registers),
// bench/results/20261202-*_cpu_gemv.md. The joint reduction and the masked scale tail: SmolLM2's
// K = 576 projections (18 groups a row, so the per-row tail weighed) 1.3-1.4x faster.
// A whole block's rows are contiguous: their codes are addressed from one block pointer (row r at r * row_bytes;
// the software prefetch one block ahead once per 64-byte line) and the step is a captureless lambda, so the code table
// and the 12 accumulators stay in registers (per-row index arithmetic and a captured table made GCC reload them
// from the stack: bench_quant's "smol.layer" 71.0-71.6 -> 68.7-68.8 us fp32, its K = 1536 down projection
// 21.1-22.7 -> 19.2-19.5 us, 3 alternations on 2 Zen 5 cores); only the last, partial block goes through the
// clamped row indices.
inline constexpr int kGemvRows = 12;
template <bool kExtra, int kGroupBytes, class T, class Q, class GroupStep, class RowExtra>
void gemv_rows_g32_avx512(T* out, const float* a, const Q* codes, const half_t* scales, const T* bias, int64_t N,
                          int64_t K, GroupStep step, RowExtra extra) {
  constexpr int R = kGemvRows;
  const int64_t ng = K / 32, row_bytes = ng * kGroupBytes;
  DK_OMP_PARALLEL_FOR_IF(N * K >= kParallelGrain)
  for (int64_t nb = 0; nb < (N + R - 1) / R; ++nb) {
    int64_t rows[R];
    __m512 acc[R];
    alignas(64) float sc[R][16];  // sc[r][i]: row r's scale of group g0 + i
    for (int r = 0; r < R; ++r) {
      rows[r] = std::min<int64_t>(nb * R + r, N - 1);
      acc[r] = _mm512_setzero_ps();
    }
    const bool full = nb * R + R <= N;
    const Q* block = codes + nb * R * row_bytes;
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
      const int64_t gn = std::min<int64_t>(16, ng - g0);
      for (int r = 0; r < R; ++r) half_row_to_float(scales + rows[r] * ng + g0, sc[r], gn);
      for (int64_t i = 0; i < gn; ++i) {
        const int64_t g = g0 + i;
        const __m512 alo = _mm512_loadu_ps(a + g * 32), ahi = _mm512_loadu_ps(a + g * 32 + 16);
        if (full) {
          const Q* p = block + g * kGroupBytes;
          // prefetch_row_ahead's test hoisted out of the row loop: smol.layer 69.0-69.6 vs 70.9-72.5 us through it
          const bool line = ((g * kGroupBytes) & 63) == 0;
          DK_UNROLL_ALL
          for (int r = 0; r < R; ++r) {
            if (line) _mm_prefetch(reinterpret_cast<const char*>(p + (R + r) * row_bytes), _MM_HINT_T0);
            acc[r] = step(p + r * row_bytes, alo, ahi, sc[r][i], acc[r]);
          }
        } else {
          DK_UNROLL_ALL
          for (int r = 0; r < R; ++r)
            acc[r] = step(codes + rows[r] * row_bytes + g * kGroupBytes, alo, ahi, sc[r][i], acc[r]);
        }
      }
    }
    if (kExtra) {
      DK_UNROLL_ALL
      for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], extra(rows[r]));
    }
    alignas(64) float sum[16];
    _mm512_store_ps(sum, reduce16_rows(acc));
    for (int r = 0; r < R && nb * R + r < N; ++r)
      out[rows[r]] = from_float<T>(bias ? sum[r] + to_float(bias[rows[r]]) : sum[r]);
  }
}

// INT4, per group: the scaled code table t[q] = d * q (exact: 4 x 11 significant bits), looked up by
// vpermps, which reads only an index's low 4 bits (the low nibble straight from the widened byte, no
// mask and no int -> float conversion); acc = fma(t[hi], a_hi, fma(t[lo], a_lo, acc)). Each product
// d * q * a is rounded once and the scale costs one multiply per group and row (7 vector uops per 32
// weights), and 2 .. 8 rows (quant_small_m.h) do exactly this per row. (The table by convert + multiply
// instead of vpermps: same bits, 0.85x on Zen 5.)
template <class T>
void int4_gemv_g32_avx512(T* out, const float* a, const float* asum, const uint8_t* qweight, const half_t* scales,
                          const half_t* mins, const T* bias, int64_t N, int64_t K) {
  const int64_t ng = K / 32;
  gemv_rows_g32_avx512<true, 16>(out, a, qweight, scales, bias, N, K,
                   [](const uint8_t* q, __m512 alo, __m512 ahi, float d, __m512 acc) {  // (a constant: kept in a register)
                     const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
                     const __m512 t = _mm512_mul_ps(int4_codes_ps(), _mm512_set1_ps(d));
                     acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(b, t), alo, acc);
                     return _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), t), ahi, acc);
                   },
                   [&](int64_t n) { return half_dot_lanes(mins + n * ng, asum, ng); });
}

// INT8, per 16-code chunk: w = q * d (exact: 8 x 11 significant bits), acc = fma(w, a, acc), the low chunk of
// the group then the high one (8 vector uops per 32 weights; the 2 .. 8-row kernel, int8_small_m_block, does
// exactly this per row at 2 FMAs a row, where an unscaled dot per group then fma(dot, d, acc) took 3).
template <class T>
void int8_gemv_g32_avx512(T* out, const float* a, const int8_t* qweight, const half_t* scales, const T* bias,
                          int64_t N, int64_t K) {
  gemv_rows_g32_avx512<false, 32>(out, a, qweight, scales, bias, N, K,
                   [](const int8_t* q, __m512 a0, __m512 a1, float d, __m512 acc) {  // w = q d (exact)
                     const __m512 ds = _mm512_set1_ps(d);
                     acc = _mm512_fmadd_ps(_mm512_mul_ps(int8x16_to_ps(q), ds), a0, acc);
                     return _mm512_fmadd_ps(_mm512_mul_ps(int8x16_to_ps(q + 16), ds), a1, acc);
                   },
                   [](int64_t) { return _mm512_setzero_ps(); });
}
#endif

// out = a @ w^T (+ bias) with the one-row GEMV's per-element arithmetic, so each row gets the bits it gets alone:
// any M with AVX-512 (the GEMV, quant_small_m.h's few-row kernels, L1 strips past 8 rows), 1 .. 8 rows with AVX2,
// the scalar loop otherwise (the latter two: any M, not the same bits as 1 .. 8 rows past 8). qweight required.
template <class T>
void int4_gemm_rows_exact(T* out, const T* a, const uint8_t* qweight, const half_t* scales, const half_t* mins,
                          const T* bias, const Int4GemmParams& P) {
  const int64_t M = P.M, N = P.N, K = P.K;
  const int G = P.group_size;
  const int64_t ng = K / G;
  // activations in fp32 and their per-group sums
  std::vector<float> af(size_t(M * K)), asum(size_t(M * ng));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < ng; ++g) {
      float s = 0.f;
      for (int i = 0; i < G; ++i) {
        const float v = to_float(a[m * P.a_stride + g * G + i]);
        af[size_t(m * K + g * G + i)] = v;
        s += v;
      }
      asum[size_t(m * ng + g)] = s;
    }
#if defined(__AVX512F__) && defined(__F16C__)
  if (M == 1 && G == 32) {  // decode: kGemvRows output rows per step share the activation loads
    int4_gemv_g32_avx512(out, af.data(), asum.data(), qweight, scales, mins, bias, N, K);
    return;
  }
  // 2 .. 8 rows (and one row at other group sizes): the GEMV's per-element arithmetic
  if (int4_gemm_small_m(out, af.data(), asum.data(), qweight, scales, mins, bias, M, N, K, G)) return;
#elif defined(DK_QUANT_SMALL_M_AVX2)
  // AVX2 without AVX-512: 1 .. 8 rows, each row's arithmetic independent of the row count
  if (int4_gemm_small_m_avx2(out, af.data(), asum.data(), qweight, scales, mins, bias, M, N, K, G)) return;
#endif
  constexpr int kMaxM = 8;  // rows of a handled together (each decoded weight used up to kMaxM times)
#pragma omp parallel if (N * K * M >= kParallelGrain)
  {
  std::vector<float> sc_buf(static_cast<size_t>(ng)), mn_buf(static_cast<size_t>(ng));  // this thread's row of scales / mins in fp32
  float* sc = sc_buf.data();
  float* mn = mn_buf.data();
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    half_row_to_float(scales + n * ng, sc, ng);
    half_row_to_float(mins + n * ng, mn, ng);
    const uint8_t* qrow = qweight + n * (K / 2);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxM) {
      const int mm = int(std::min<int64_t>(kMaxM, M - m0));
      const float* a0 = &af[size_t(m0 * K)];
      float res[kMaxM] = {};
#if defined(__AVX512F__)
      if (G % 32 == 0) {
        switch (mm) {  // compile-time row counts keep the accumulators in registers
          case 1: int4_rows_avx512<1>(qrow, sc, a0, K, G, res); break;
          case 2: int4_rows_avx512<2>(qrow, sc, a0, K, G, res); break;
          case 3: int4_rows_avx512<3>(qrow, sc, a0, K, G, res); break;
          case 4: int4_rows_avx512<4>(qrow, sc, a0, K, G, res); break;
          default:
            int4_rows_avx512<4>(qrow, sc, a0, K, G, res);
            switch (mm - 4) {
              case 1: int4_rows_avx512<1>(qrow, sc, a0 + 4 * K, K, G, res + 4); break;
              case 2: int4_rows_avx512<2>(qrow, sc, a0 + 4 * K, K, G, res + 4); break;
              case 3: int4_rows_avx512<3>(qrow, sc, a0 + 4 * K, K, G, res + 4); break;
              default: int4_rows_avx512<4>(qrow, sc, a0 + 4 * K, K, G, res + 4); break;
            }
        }
      } else
#endif
      {
        for (int64_t g = 0; g < ng; ++g)
          for (int r = 0; r < mm; ++r) {
            const float* ar = a0 + r * K + g * G;
            float t = 0.f;
            for (int i = 0; i < G; ++i) t += ar[i] * float(int4_code(qrow, G, g * G + i));
            res[r] += sc[g] * t;
          }
      }
      for (int r = 0; r < mm; ++r) {
        const float* as = &asum[size_t((m0 + r) * ng)];
        float mt = 0.f;
#pragma omp simd reduction(+ : mt)
        for (int64_t g = 0; g < ng; ++g) mt += mn[g] * as[g];
        float v = res[r] + mt;
        if (bias) v += to_float(bias[n]);
        out[(m0 + r) * N + n] = from_float<T>(v);
      }
    }
  }
  }
}

// out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n]), fp32 accumulation, weights decoded on the
// fly. Per group: scale * (sum_i a_i q_i) + min * (sum_i a_i), the activation sums computed
// once per activation row. Parallel over N. T: activation / output storage type.
template <class T>
void int4_gemm(T* out,                  // [M, N]
               const T* a,              // [M, K], row stride a_stride
               const uint8_t* qweight,  // [N, K / 2]
               const half_t* scales,    // [N, K / G]
               const half_t* mins,      // [N, K / G]
               const T* bias,           // [N] or null
               const Int4GemmParams& P) {
  [[maybe_unused]] const int64_t M = P.M;  // (read by the instruction-set paths only)
  const int64_t N = P.N, K = P.K;
  const int G = P.group_size;
  const int64_t ng = K / G;
  if (P.decode_rows >= 0)
    return split_decode_rows(
        out, a, P, qweight != nullptr,
        [&](T* o, const T* x, const Int4GemmParams& R) { int4_gemm(o, x, qweight, scales, mins, bias, R); },
        [&](T* o, const T* x, const Int4GemmParams& R) { int4_gemm_rows_exact(o, x, qweight, scales, mins, bias, R); });
#if defined(DK_AMX_QUANT_GEMM)
  if constexpr (std::is_same_v<T, bf16_t>) {  // bf16 products on the tile unit (quant_amx.h)
#if defined(DK_AMX_EXACT_GEMM)
    if (P.amx_rows && K > 0) {  // the copy (quant_amx_rows_bf16.h): few rows exact, then bf16 products
      if (M <= kAmxRowsDispatchM && amx_rows_int4(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
      if (M > kAmxRowsDispatchM && amx_rows_bf16_int4(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    }
#endif
    if (qweight && M >= kTiledQuantGemmMinM && K > 0 &&
        int4_gemm_amx(out, a, P.a_stride, qweight, scales, mins, bias, M, N, K, G))
      return;
  }
#endif
#if defined(DK_AMX_EXACT_GEMM)
  if constexpr (!std::is_same_v<T, bf16_t>) {  // fp32 / fp16: exact integer products on the tile unit
    if (P.amx_rows && M <= kAmxRowsDispatchM && amx_rows_int4(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    if (P.amx_rows && K > 0 && amx_rows_exact_int4(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    if (qweight && M >= kTiledQuantGemmMinM && K > 0 &&
        int4_gemm_amx_exact(out, a, P.a_stride, qweight, scales, mins, bias, M, N, K, G))
      return;
  }
#endif
#if defined(DK_TILED_QUANT_BF16)
  if constexpr (std::is_same_v<T, bf16_t>)  // no tile unit: bf16 products on AVX512-BF16 (int4_tiled_bf16.h)
    if (qweight && M >= kTiledVectorMinM && K > 0 &&
        int4_gemm_tiled_bf16(out, a, P.a_stride, qweight, scales, mins, bias, M, N, K, G))
      return;
#endif
  // held only as the copy (an empty weight, K = 0, has a null qweight too) and no kernel above took it: unpack it
  if (!qweight && P.amx_rows) {
    std::vector<uint8_t> q(size_t(N * K / 2));
    std::vector<half_t> sm(size_t(2 * N * ng));
    amx_rows_unpack_int4(q.data(), sm.data(), sm.data() + N * ng, P.amx_rows, N, K, G);
    Int4GemmParams Q = P;
    Q.amx_rows = nullptr;
    int4_gemm(out, a, q.data(), sm.data(), sm.data() + N * ng, bias, Q);
    return;
  }
#if defined(DK_TILED_QUANT_GEMM)
  if (M >= kTiledVectorMinM && K > 0) {
    int4_gemm_tiled(out, a, P.a_stride, qweight, scales, mins, bias, M, N, K, G);
    return;
  }
#endif
  int4_gemm_rows_exact(out, a, qweight, scales, mins, bias, P);
}

// Decodes the whole weight: w [N, K] of T (for large M: decode once, then a dense GEMM).
template <class T>
void int4_dequantize(T* w, const uint8_t* qweight, const half_t* scales, const half_t* mins, int64_t N, int64_t K,
                     int G) {
  const int64_t ng = K / G;
  DK_OMP_PARALLEL_FOR_IF(N * K >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* qrow = qweight + n * (K / 2);
    for (int64_t g = 0; g < ng; ++g) {
      const float d = half_to_float(scales[n * ng + g].bits), mn = half_to_float(mins[n * ng + g].bits);
      float buf[128];  // one group (G <= 128), in element order
      const int half = G / 2;
      int i = 0;
#if defined(__AVX512F__)
      const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(mn);
      for (; i + 16 <= half; i += 16) {  // d * q + m: the product is exact, one rounding as int4_weight
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qrow + g * half + i)));
        _mm512_storeu_ps(buf + i, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(
                                                    _mm512_and_si512(b, _mm512_set1_epi32(15))), dv), mv));
        _mm512_storeu_ps(buf + half + i,
                         _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), dv), mv));
      }
#endif
      for (; i < half; ++i) {
        const uint8_t b = qrow[g * half + i];
        buf[i] = int4_weight(b & 15, d, mn);
        buf[half + i] = int4_weight(b >> 4, d, mn);
      }
      T* dst = w + n * K + g * G;
      for (int j = 0; j < G; ++j) dst[j] = from_float<T>(buf[j]);
    }
  }
}

// ---- INT8 weight-only (GGUF Q8_0: groups of 32, w = scale * q, q int8) -----------------------
// qweight [N, K] int8, scales [N, K / G] fp16.

#if defined(__AVX512F__)
template <int MM>
inline void int8_rows_avx512(const int8_t* qrow, const float* sc, const float* a, int64_t K, int G, float* res) {
  __m512 acc[MM];
  for (int r = 0; r < MM; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t ng = K / G;
  for (int64_t g = 0; g < ng; ++g) {
    const __m512 d = _mm512_set1_ps(sc[g]);
    for (int c = 0; c < G; c += 16) {
      const __m512 w = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qrow + g * G + c)))),
          d);
      for (int r = 0; r < MM; ++r) acc[r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(a + r * K + g * G + c), acc[r]);
    }
  }
  for (int r = 0; r < MM; ++r) res[r] += _mm512_reduce_add_ps(acc[r]);
}
#endif

// int8_gemm's counterpart of int4_gemm_rows_exact.
template <class T>
void int8_gemm_rows_exact(T* out, const T* a, const int8_t* qweight, const half_t* scales, const T* bias,
                          const Int4GemmParams& P) {
  const int64_t M = P.M, N = P.N, K = P.K;
  const int G = P.group_size;
  const int64_t ng = K / G;
  std::vector<float> af(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) af[size_t(m * K + k)] = to_float(a[m * P.a_stride + k]);
#if defined(__AVX512F__) && defined(__F16C__)
  if (M == 1 && G == 32) {
    int8_gemv_g32_avx512(out, af.data(), qweight, scales, bias, N, K);
    return;
  }
  if (int8_gemm_small_m(out, af.data(), qweight, scales, bias, M, N, K, G)) return;
#elif defined(DK_QUANT_SMALL_M_AVX2)
  if (int8_gemm_small_m_avx2(out, af.data(), qweight, scales, bias, M, N, K, G)) return;
#endif
  constexpr int kMaxM = 4;
#pragma omp parallel if (N * K * M >= kParallelGrain)
  {
  std::vector<float> sc_buf(static_cast<size_t>(ng));  // this thread's row of scales in fp32
  float* sc = sc_buf.data();
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    half_row_to_float(scales + n * ng, sc, ng);
    const int8_t* qrow = qweight + n * K;
    for (int64_t m0 = 0; m0 < M; m0 += kMaxM) {
      const int mm = int(std::min<int64_t>(kMaxM, M - m0));
      const float* a0 = &af[size_t(m0 * K)];
      float res[kMaxM] = {};
#if defined(__AVX512F__)
      if (G % 16 == 0) {
        switch (mm) {
          case 1: int8_rows_avx512<1>(qrow, sc, a0, K, G, res); break;
          case 2: int8_rows_avx512<2>(qrow, sc, a0, K, G, res); break;
          case 3: int8_rows_avx512<3>(qrow, sc, a0, K, G, res); break;
          default: int8_rows_avx512<4>(qrow, sc, a0, K, G, res); break;
        }
      } else
#endif
      {
        for (int64_t g = 0; g < ng; ++g)
          for (int r = 0; r < mm; ++r) {
            float t = 0.f;
            for (int i = 0; i < G; ++i) t += a0[r * K + g * G + i] * float(qrow[g * G + i]);
            res[r] += sc[g] * t;
          }
      }
      for (int r = 0; r < mm; ++r) {
        float v = res[r];
        if (bias) v += to_float(bias[n]);
        out[(m0 + r) * N + n] = from_float<T>(v);
      }
    }
  }
  }
}

// out[m, n] = sum_k a[m, k] * scale[n, k / G] * q[n, k] (+ bias[n]), fp32 accumulation.
template <class T>
void int8_gemm(T* out,                  // [M, N]
               const T* a,              // [M, K], row stride a_stride
               const int8_t* qweight,   // [N, K]
               const half_t* scales,    // [N, K / G]
               const T* bias,           // [N] or null
               const Int4GemmParams& P) {
  [[maybe_unused]] const int64_t M = P.M;  // (read by the instruction-set paths only)
  const int64_t N = P.N, K = P.K;
  const int G = P.group_size;
  const int64_t ng = K / G;
  if (P.decode_rows >= 0)
    return split_decode_rows(
        out, a, P, qweight != nullptr,
        [&](T* o, const T* x, const Int4GemmParams& R) { int8_gemm(o, x, qweight, scales, bias, R); },
        [&](T* o, const T* x, const Int4GemmParams& R) { int8_gemm_rows_exact(o, x, qweight, scales, bias, R); });
#if defined(DK_AMX_QUANT_GEMM)
  if constexpr (std::is_same_v<T, bf16_t>) {
#if defined(DK_AMX_EXACT_GEMM)
    if (P.amx_rows && K > 0) {  // the copy (quant_amx_rows_bf16.h), as int4_gemm
      if (M <= kAmxRowsInt8MaxM && amx_rows_int8(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
      if (M > kAmxRowsInt8MaxM && amx_rows_bf16_int8(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    }
#endif
    if (qweight && M >= kTiledQuantGemmMinM && K > 0 &&
        int8_gemm_amx(out, a, P.a_stride, qweight, scales, bias, M, N, K, G))
      return;
  }
#endif
#if defined(DK_AMX_EXACT_GEMM)
  if constexpr (!std::is_same_v<T, bf16_t>) {  // 1 .. 8 rows from the repacked copy (quant_amx_rows.h), then 9+
    if (P.amx_rows && M <= kAmxRowsInt8MaxM && amx_rows_int8(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    if (P.amx_rows && K > 0 && amx_rows_exact_int8(out, a, P.a_stride, P.amx_rows, bias, M, N, K, G)) return;
    if (qweight && M >= kTiledQuantGemmMinM && K > 0 &&
        int8_gemm_amx_exact(out, a, P.a_stride, qweight, scales, bias, M, N, K, G))
      return;
  }
#endif
#if defined(DK_TILED_QUANT_BF16)
  if constexpr (std::is_same_v<T, bf16_t>)  // no tile unit: bf16 products on AVX512-BF16 (int4_tiled_bf16.h)
    if (qweight && M >= kTiledVectorMinM && K > 0 &&
        int8_gemm_tiled_bf16(out, a, P.a_stride, qweight, scales, bias, M, N, K, G))
      return;
#endif
  // held only as the copy (an empty weight, K = 0, has a null qweight too) and no kernel above took it: unpack it
  if (!qweight && P.amx_rows) {
    std::vector<int8_t> q(size_t(N * K));
    std::vector<half_t> sc(size_t(N * ng));
    amx_rows_unpack_int8(q.data(), sc.data(), P.amx_rows, N, K, G);
    Int4GemmParams Q = P;
    Q.amx_rows = nullptr;
    int8_gemm(out, a, q.data(), sc.data(), bias, Q);
    return;
  }
#if defined(DK_TILED_QUANT_GEMM)
  if (M >= kTiledVectorMinM && K > 0) {
    int8_gemm_tiled(out, a, P.a_stride, qweight, scales, bias, M, N, K, G);
    return;
  }
#endif
  int8_gemm_rows_exact(out, a, qweight, scales, bias, P);
}

// Decodes rows of an INT8 weight: w [R, K] of T for the rows ids[0..R) (all N rows when ids is
// null): the embedding lookup of a Q8_0 table and the large-M path. packed (with N): the weight held only as
// its AMX copy (amx_rows_layout.h; qweight / scales unused), each row gathered from it first.
template <class T>
void int8_dequantize_rows(T* w, const int8_t* qweight, const half_t* scales, const int64_t* ids, int64_t R,
                          int64_t K, int G, const uint8_t* packed = nullptr, int64_t N = 0) {
  const int64_t ng = K / G;
  DK_OMP_PARALLEL_FOR_IF(R * K >= kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    int64_t n = ids ? ids[r] : r;
    const int8_t* q = qweight + n * K;
    const half_t* sc = scales;
    if (packed) {  // (the thread's row buffers: no allocation per lookup)
      thread_local std::vector<int8_t> qrow;
      thread_local std::vector<half_t> srow;
      qrow.resize(size_t(K));
      srow.resize(size_t(ng));
      amx_rows_row_int8(qrow.data(), srow.data(), packed, N, K, G, n);
      q = qrow.data();
      sc = srow.data();
      n = 0;
    }
    for (int64_t g = 0; g < ng; ++g) {
      const float d = half_to_float(sc[n * ng + g].bits);
      float buf[128];  // one group (G <= 128)
      int i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= G; i += 16)  // d * q: exact in fp32
        _mm512_storeu_ps(buf + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * G + i)))),
                                                _mm512_set1_ps(d)));
#endif
      for (; i < G; ++i) buf[i] = d * float(q[g * G + i]);
      T* dst = w + r * K + g * G;
      for (int j = 0; j < G; ++j) dst[j] = from_float<T>(buf[j]);
    }
  }
}

}  // namespace cpu
}  // namespace dk
