// INT4 / INT8 weight-only GEMM for fp32 / fp16 activations on the AMX int8 tile unit, with integer
// products that are exact: fp32 accuracy at tile-unit speed (a 2-core Sapphire Rapids does ~270
// GFLOP/s in fp32 FMAs; a 32-sequence fp32 decode step was bound by them).
//
// Semantics. K is cut into 32-element blocks (a weight group, G = 32, or a part of one). For each
// row m of a and block b, with 2^e <= max_k |a[m, k]| < 2^(e+1) over the block:
//   s = 2^(e - 21),  I_k = rne(a[m, k] / s)  (|I_k| <= 2^22: a 23-bit fixed point per row and block,
//   error <= 2^-22 max |a| of the block),
//   R[n] = sum_k I_k q[n, k]  (exact: integer products and sums),  S = s * fl(sum_k I_k),
// and out[m, n] = sum over b in order of fma(fl(R[n]) , d[n, b] * s, acc) then (INT4)
// fma(min[n, b], S, acc), + bias[n] in fp32, one rounding to T. fl(R) is one rounding to fp32 (INT4;
// INT8: fma(fl(R_2), 2^16, fl(R_0 + 2^8 R_1)), see below). The integer sums make each row's result
// independent of the other rows (any M >= kTiledQuantGemmMinM gives a row the same bits) and of the
// order of the hardware's sums. An all-zero block contributes 0; a block with a NaN or an infinity
// makes its row's outputs NaN; a block whose largest |a| is below 2^-104 has a subnormal s (fewer
// bits; below 2^-128 it contributes 0).
//
// How: the tile unit computes the transpose, C[n][m] = sum_k W[n][k] A[m][k]: the weight codes of one
// block are the A operand (row-major bytes), the digits of I the B operand ("VNNI": 4 consecutive k of a
// row in a dword), packed once per row chunk (amx_exact_pack); one C tile per digit product, stored per
// block and scaled by the vector units into fp32 accumulators (weight row x 16 rows of a), transposed at
// the end.
//   INT4 (amx_exact_gemm_int4): I = 2^12 (16 E3 + E2) + 16 E1 + E0 (E0, E2 in 0..15, E1, E3 s8). The
//   A operand is the 32 codes q followed by 16 q (still bytes: q <= 15), the B operands (E0 rows; E1
//   rows) and (E2; E3), so one TDPBUSD of K = 64 gives C_lo = sum q (16 E1 + E0), another C_hi;
//   R = 2^12 C_hi + C_lo in int32 is exact (|R| <= 2^22 * 15 * 32 < 2^31), one conversion rounds.
//   Two strips of 16 columns per task: tiles 4, 5 their codes, 6, 7 the digits, 0..3 the C tiles.
//   INT8 (amx_exact_gemm_int8; 16 q does not fit a byte): balanced base-256 digits I = 2^16 D2 + 2^8 D1
//   + D0 (D0, D1 in -128..127, |D2| <= 65), three TDPBSSD of K = 32 into three C tiles, R = fma(fl(C2),
//   2^16, fl(2^8 C1 + C0)) (2^8 C1 + C0 exact in int32).
// Cost per 16 x 16 x 32 block: 2 (INT4) or 3 tile products, their C tiles' round trip through memory
// and ~6-8 vector instructions per 16 outputs (the scales are per block of K). Measured on a 2-core
// Sapphire Rapids at 32 rows: 1.15-1.6x the fp32 tiled kernel (bench/results/20261206-*_cpu_amx_exact.md).
// Work: tasks = (chunk of <= kAmxExactMC rows of a) x (32 or 16 output columns), as quant_amx.h.
#pragma once
#include "decodekit/gemm/quant_amx.h"
#include "decodekit/gemm/quant_small_m.h"  // half_row_to_float

#if defined(DK_AMX_QUANT_GEMM) && defined(__AMX_INT8__)
#define DK_AMX_EXACT_GEMM 1
#endif

namespace dk {
namespace cpu {

#if defined(DK_AMX_EXACT_GEMM)
constexpr int64_t kAmxExactMC = 128;  // rows of a per task (a multiple of 16)
constexpr int kAmxExactShift = 21;    // I = rne(a * 2^(21 - e)): |I| <= 2^22

// 16 rows of a x one 32-element block of K, ready for the tile unit: digit[t][j][i] = the 4 s8 digits t
// of row i's elements 4j .. 4j + 3 (the B operand's "VNNI" rows). INT8 weights: t = 0, 1, 2 the base-256
// digits D0, D1, D2; INT4: t = 0..3 the digits E0..E3 of I = 2^12 (16 E3 + E2) + 16 E1 + E0, tiles
// (digit[0], digit[1]) and (digit[2], digit[3]) of 16 rows each (E0, E2 in 0..15, E1, E3 in -128..127).
struct alignas(64) AmxExactBlock {
  uint32_t digit[4][8][16];
  float s[16];    // row i's 2^(e - 21) (0: an all-zero block; NaN: a non-finite element)
  float sum[16];  // s * fl(sum_k I_k)
};

DK_FORCE_INLINE __m512i sext_low(__m512i x, int bits) {  // the low `bits` bits of x as a signed number
  return _mm512_srai_epi32(_mm512_slli_epi32(x, 32 - bits), 32 - bits);
}

// The per-element arithmetic of the semantics, shared with quant_amx_rows.h (which lays the lanes out
// differently): up = 21 - e from a block's max |x| bit pattern (0 lanes: all-zero or non-finite), and the
// block's s = 2^(e - 21) (0: all zero; NaN: non-finite).
struct AmxExactExp {
  __mmask16 bad, zero;
  __m512 up;
};
DK_FORCE_INLINE AmxExactExp amx_exact_exp(__m512i amax) {
  const __mmask16 bad = _mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(0x7f800000));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(amax, _mm512_setzero_si512());
  // e = floor(log2 max |x|) (exact for subnormals too); 0 for all-zero and non-finite lanes
  const __m512 e = _mm512_maskz_getexp_ps(__mmask16(~(bad | zero)), _mm512_castsi512_ps(amax));
  return {bad, zero, _mm512_sub_ps(_mm512_set1_ps(float(kAmxExactShift)), e)};
}
DK_FORCE_INLINE __m512 amx_exact_s(const AmxExactExp& x) {
  return _mm512_mask_mov_ps(_mm512_maskz_scalef_ps(__mmask16(~x.zero), _mm512_set1_ps(1.f),
                                                   _mm512_sub_ps(_mm512_setzero_ps(), x.up)),
                            x.bad, _mm512_set1_ps(__builtin_nanf("")));
}
// I = rne(x 2^up) (x: fp32 bit patterns).
DK_FORCE_INLINE __m512i amx_exact_fixed(__m512i x, __m512 up) {
  return _mm512_cvtps_epi32(_mm512_scalef_ps(_mm512_castsi512_ps(x), up));
}
// INT4's digits of I: L = sext12(I), H = (I - L) / 2^12; E0 = L mod 16 (0..15: E1 = (L - E0) / 16 stays in
// -128..127), E2 = H mod 16, E3 = (H - E2) / 16 (|H| <= 2^10).
DK_FORCE_INLINE void amx_exact_int4_digits(__m512i I, __m512i (&e)[4]) {
  const __m512i L = sext_low(I, 12), H = _mm512_srai_epi32(_mm512_sub_epi32(I, L), 12);
  const __m512i low4 = _mm512_set1_epi32(15);
  e[0] = _mm512_and_si512(L, low4);
  e[2] = _mm512_and_si512(H, low4);
  e[1] = _mm512_srai_epi32(_mm512_sub_epi32(L, e[0]), 4);
  e[3] = _mm512_srai_epi32(_mm512_sub_epi32(H, e[2]), 4);
}
// INT8's: D0 = sext8(I), t = (I - D0) / 2^8, D1 = sext8(t), D2 = (t - D1) / 2^8, each valid in its low byte
// (D0's low byte is I's, D1's is t's, which is what is returned for them).
DK_FORCE_INLINE void amx_exact_int8_digits(__m512i I, __m512i (&d)[3]) {
  const __m512i t = _mm512_srai_epi32(_mm512_sub_epi32(I, sext_low(I, 8)), 8);
  d[0] = I;
  d[1] = t;
  d[2] = _mm512_srai_epi32(_mm512_sub_epi32(t, sext_low(t, 8)), 8);
}

// x[k] (lanes: 16 rows) -> 4 lanes' digits of k = 4j .. 4j + 3 as the dwords of one B-operand row.
DK_FORCE_INLINE __m512i amx_exact_bytes4(__m512i d0, __m512i d1, __m512i d2, __m512i d3) {
  const __m512i b0 = _mm512_and_si512(d0, _mm512_set1_epi32(0xff));
  const __m512i b1 = _mm512_srli_epi32(_mm512_slli_epi32(d1, 24), 16);
  const __m512i b2 = _mm512_srli_epi32(_mm512_slli_epi32(d2, 24), 8);
  const __m512i b3 = _mm512_slli_epi32(d3, 24);
  return _mm512_or_si512(_mm512_ternarylogic_epi32(b0, b1, b2, 0xfe), b3);
}

// Rows m0 .. m0 + rows of a (zeros up to rows_pad, a multiple of 16) as blocks ap[mb * (K / 32) + b],
// with the digits for INT4 (kInt4) or INT8 weights.
template <bool kInt4, class T>
inline void amx_exact_pack(AmxExactBlock* ap,  // [rows_pad / 16][K / 32]
                           const T* a,         // [M, K], row stride a_stride
                           int64_t a_stride, int64_t m0, int64_t rows, int64_t rows_pad, int64_t K) {
  const int64_t nb = K / 32;
  const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
  for (int64_t mb = 0; mb < rows_pad / 16; ++mb)
    for (int64_t b = 0; b < nb; ++b) {
      __m512i x[32];  // x[k], lane i: element k of the block in row mb * 16 + i (fp32 bits)
      for (int i = 0; i < 16; ++i) {
        const int64_t r = mb * 16 + i;
        if (r < rows) {
          const T* p = a + (m0 + r) * a_stride + b * 32;
          x[i] = _mm512_castps_si512(load16(p, __mmask16(0xffff)));
          x[16 + i] = _mm512_castps_si512(load16(p + 16, __mmask16(0xffff)));
        } else {
          x[i] = x[16 + i] = _mm512_setzero_si512();
        }
      }
      transpose16_epi32(reinterpret_cast<__m512i(&)[16]>(x[0]));
      transpose16_epi32(reinterpret_cast<__m512i(&)[16]>(x[16]));
      // max |x| per lane on the bit patterns: NaN > inf > every finite value
      __m512i amax = _mm512_setzero_si512();
      for (int k = 0; k < 32; ++k) amax = _mm512_max_epu32(amax, _mm512_and_si512(x[k], abs_bits));
      const AmxExactExp ex = amx_exact_exp(amax);
      AmxExactBlock& B = ap[mb * nb + b];
      __m512i isum = _mm512_setzero_si512();
      __m512i dg[4][4];
      for (int k = 0; k < 32; ++k) {
        const __m512i I = amx_exact_fixed(x[k], ex.up);
        isum = _mm512_add_epi32(isum, I);
        __m512i d[4];
        if constexpr (kInt4) amx_exact_int4_digits(I, d);
        else amx_exact_int8_digits(I, reinterpret_cast<__m512i(&)[3]>(d));
        for (int t = 0; t < (kInt4 ? 4 : 3); ++t) dg[t][k % 4] = d[t];
        if (k % 4 == 3)
          for (int t = 0; t < (kInt4 ? 4 : 3); ++t)
            _mm512_store_si512(B.digit[t][k / 4], amx_exact_bytes4(dg[t][0], dg[t][1], dg[t][2], dg[t][3]));
      }
      const __m512 s = amx_exact_s(ex);
      _mm512_store_ps(B.s, s);
      _mm512_store_ps(B.sum, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), s));
    }
}

// A strip of 16 weight rows: codes row j, block b = the bytes at codes + j * stride + b * block_bytes
// (INT8: 32 codes, the weight itself for full strips; INT4: the 32 codes q then 16 q, 64 bytes, decoded
// into a thread buffer), sc[j * nb + b] = d, mn[j * nb + b] = min (INT4) in fp32; rows past N: zeros.
struct AmxExactStrip {
  const uint8_t* codes;
  int64_t stride;  // bytes between rows of codes
  float* sc;       // [16][K / 32]
  float* mn;       // [16][K / 32]
  uint8_t* buf;    // [16][2 K] the thread's code buffer
};

// The per-row scale (and min) of every 32-element block: a group's values repeated G / 32 times.
DK_FORCE_INLINE void amx_exact_block_scales(float* dst, const half_t* src, int64_t K, int G) {
  const int64_t ng = K / G;
  if (G == 32) {
    half_row_to_float(src, dst, ng);
    return;
  }
  for (int64_t g = 0; g < ng; ++g) {
    const float v = half_to_float(src[g].bits);  // one per G >= 64 elements: scalar
    for (int c = 0; c < G / 32; ++c) dst[g * (G / 32) + c] = v;
  }
}

// Scratch of one thread: its strips, packed rows of a and C tiles (64-byte aligned pieces of one
// grow-only buffer: no allocation or zero fill per call).
struct AmxExactScratch {
  AmxExactStrip strip[2];
  AmxExactBlock* ap;
  int32_t* cb;
  AmxExactScratch(int64_t K, int64_t mc) {
    const int64_t nb = K / 32;
    const size_t codes = size_t(32 * K), scale = size_t(nb * 64), apb = size_t(mc / 16 * nb) * sizeof(AmxExactBlock);
    const size_t total = 2 * (codes + 2 * scale) + apb + 8192 + 64;
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < total) buf.resize(total);
    uint8_t* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    for (auto& st : strip) {
      st = AmxExactStrip{p, 0, reinterpret_cast<float*>(p + codes), reinterpret_cast<float*>(p + codes + scale), p};
      p += codes + 2 * scale;
    }
    ap = reinterpret_cast<AmxExactBlock*>(p);
    cb = reinterpret_cast<int32_t*>(p + apb);
  }
};

// acc[j] (lane i: weight row n0 + j x row r0 + i) -> out rows r0 .. r0 + rows, columns n0 .. n0 + cols
// (+ bias in fp32, one rounding to T).
template <class T>
DK_FORCE_INLINE void amx_exact_store(T* out, int64_t N, const __m512 (&acc)[16], int64_t r0, int64_t rows,
                                     int64_t n0, int64_t cols, const T* bias) {
  if (cols <= 0) return;
  const __mmask16 col_mask = lanes_mask(cols);
  const __m512 bias_f = bias ? load16(bias + n0, col_mask) : _mm512_setzero_ps();
  __m512i tr[16];
  for (int j = 0; j < 16; ++j) tr[j] = _mm512_castps_si512(acc[j]);
  transpose16_epi32(tr);  // tr[i], lane j: row r0 + i x column n0 + j
  for (int64_t i = 0; i < std::min<int64_t>(16, rows); ++i)
    store16(out + (r0 + i) * N + n0, bias ? _mm512_add_ps(_mm512_castsi512_ps(tr[i]), bias_f) : _mm512_castsi512_ps(tr[i]),
            col_mask);
}

// The work split of both kernels: tasks = (chunk of <= kAmxExactMC rows of a) x (kCols output columns),
// handed out dynamically; a thread packs a chunk's rows when its task is on another chunk (so each
// thread reads a once per chunk), then body(scratch, A, mb, m0, rows, n0) for each 16-row block mb
// (A: its packed blocks). False when the tile unit is not available.
template <bool kInt4, int kCols, class T, class Body>
bool amx_exact_run(const T* a,  // [M, K], row stride a_stride
                   int64_t a_stride, int64_t M, int64_t N, int64_t K, const AmxTileConfig& cfg, Body body) {
  if (K % 32 != 0 || !amx_enabled()) return false;
  const int64_t nb = K / 32;
  const int64_t tasks_n = (N + kCols - 1) / kCols;
  const int64_t nmb = (M + kAmxExactMC - 1) / kAmxExactMC;
  const int64_t mc = std::min<int64_t>(kAmxExactMC, (M + 15) / 16 * 16);
#pragma omp parallel if (M * N * K >= kParallelGrain)
  {
  _tile_loadconfig(&cfg);
  AmxExactScratch sc(K, mc);
  int64_t packed = -1;  // the row chunk in sc.ap
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < nmb * tasks_n; ++t) {
    const int64_t ib = t / tasks_n, m0 = ib * kAmxExactMC, rows = std::min(kAmxExactMC, M - m0);
    const int64_t rows_pad = (rows + 15) / 16 * 16;
    if (ib != packed) amx_exact_pack<kInt4>(sc.ap, a, a_stride, m0, rows, rows_pad, K);
    packed = ib;
    const int64_t n0 = (t % tasks_n) * kCols;
    for (int64_t mb = 0; mb < rows_pad / 16; ++mb) body(sc, sc.ap + mb * nb, mb == 0, m0 + mb * 16, rows - mb * 16, n0);
  }
  _tile_release();
  }
  return true;
}

// out[m, n] = sum_k a[m, k] w[n, k] (+ bias[n]) for an INT4 weight, on the tile unit (semantics at the
// top). 32 output columns (two strips) per task. Per block of K, tile 4 / 5 = the strips' codes
// [q | 16 q] (16 x 64 bytes), tiles 6 / 7 = the digits (E0, E1) / (E2, E3): TDPBUSD gives
// C_lo = sum q (16 E1 + E0) and C_hi = sum q (16 E3 + E2) (tiles 0, 1: strip 0; 2, 3: strip 1),
// R = 2^12 C_hi + C_lo exactly in int32, then one rounding.
template <class T, class Decode>
bool amx_exact_gemm_int4(T* out,         // [M, N]
                         const T* a,     // [M, K], row stride a_stride
                         int64_t a_stride,
                         const T* bias,  // [N] or null
                         int64_t M, int64_t N, int64_t K, Decode decode) {
  const int64_t nb = K / 32;
  const AmxTileConfig cfg;  // every tile 16 x 64 bytes
  return amx_exact_run<true, 32>(a, a_stride, M, N, K, cfg, [&](AmxExactScratch& sc, const AmxExactBlock* A,
                                                                  bool first, int64_t r0, int64_t rows, int64_t n0) {
    if (first) {  // the task's strips, for all its row blocks
      decode(sc.strip[0], n0);
      decode(sc.strip[1], n0 + 16);
    }
    const AmxExactStrip& s0 = sc.strip[0];
    const AmxExactStrip& s1 = sc.strip[1];
    __m512 acc[2][16];  // acc[h][j], lane i: weight row n0 + 16 h + j x row r0 + i
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 16; ++j) acc[h][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      _tile_loadd(4, s0.codes + b * 64, s0.stride);
      _tile_loadd(5, s1.codes + b * 64, s1.stride);
      _tile_loadd(6, A[b].digit[0], 64);
      _tile_loadd(7, A[b].digit[2], 64);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
      int32_t* c = sc.cb + (b % 2) * 1024;  // two buffers: the next block's stores need not wait
      _tile_stored(0, c, 64);
      _tile_stored(1, c + 256, 64);
      _tile_stored(2, c + 512, 64);
      _tile_stored(3, c + 768, 64);
      const __m512 s = _mm512_load_ps(A[b].s), sum = _mm512_load_ps(A[b].sum);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const AmxExactStrip& st = sc.strip[h];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const __m512i lo = _mm512_load_si512(c + h * 512 + j * 16), hi = _mm512_load_si512(c + h * 512 + 256 + j * 16);
          const __m512 r = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 12), lo));
          acc[h][j] = _mm512_fmadd_ps(r, _mm512_mul_ps(_mm512_set1_ps(st.sc[j * nb + b]), s), acc[h][j]);
          acc[h][j] = _mm512_fmadd_ps(_mm512_set1_ps(st.mn[j * nb + b]), sum, acc[h][j]);
        }
      }
    }
    for (int h = 0; h < 2; ++h)
      amx_exact_store(out, N, acc[h], r0, rows, n0 + 16 * h, std::min<int64_t>(16, N - n0 - 16 * h), bias);
  });
}

// The same for an INT8 weight (codes s8: 16 q does not fit a byte): three base-256 digits, tile 3 the
// strip's codes (16 x 32 bytes), tiles 4..6 the digits (8 k-quads each), TDPBSSD into tiles 0..2,
// R = 2^16 C2 + (2^8 C1 + C0) in fp32 (two roundings); 16 output columns per task. The loop over K is
// software-pipelined: block b + 1's products run on the tile unit while the vector units scale block
// b's (stored to the other half of cb).
template <class T, class Decode>
bool amx_exact_gemm_int8(T* out,         // [M, N]
                         const T* a,     // [M, K], row stride a_stride
                         int64_t a_stride,
                         const T* bias,  // [N] or null
                         int64_t M, int64_t N, int64_t K, Decode decode) {
  const int64_t nb = K / 32;
  AmxTileConfig cfg;
  cfg.colsb[3] = 32;
  for (int t = 4; t < 7; ++t) cfg.rows[t] = 8;
  return amx_exact_run<false, 16>(a, a_stride, M, N, K, cfg, [&](AmxExactScratch& sc, const AmxExactBlock* A,
                                                                   bool first, int64_t r0, int64_t rows, int64_t n0) {
    AmxExactStrip& strip = sc.strip[0];
    if (first) decode(strip, n0);
    auto products = [&](int64_t b) {  // block b's three digit products
      _tile_loadd(3, strip.codes + b * 32, strip.stride);
      _tile_loadd(4, A[b].digit[0], 64);
      _tile_loadd(5, A[b].digit[1], 64);
      _tile_loadd(6, A[b].digit[2], 64);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_dpbssd(0, 3, 4);
      _tile_dpbssd(1, 3, 5);
      _tile_dpbssd(2, 3, 6);
    };
    auto store = [&](int64_t b) {
      int32_t* c = sc.cb + (b % 2) * 768;
      _tile_stored(0, c, 64);
      _tile_stored(1, c + 256, 64);
      _tile_stored(2, c + 512, 64);
    };
    __m512 acc[16];  // acc[j], lane i: weight row n0 + j x row r0 + i
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    products(0);
    store(0);
    for (int64_t b = 0; b < nb; ++b) {
      if (b + 1 < nb) products(b + 1);
      const int32_t* c = sc.cb + (b % 2) * 768;
      const __m512 s = _mm512_load_ps(A[b].s);
      for (int j = 0; j < 16; ++j) {
        const __m512i c0 = _mm512_load_si512(c + j * 16), c1 = _mm512_load_si512(c + 256 + j * 16),
                      c2 = _mm512_load_si512(c + 512 + j * 16);
        const __m512 r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c2), _mm512_set1_ps(65536.f),
                                         _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(c1, 8), c0)));
        acc[j] = _mm512_fmadd_ps(r, _mm512_mul_ps(_mm512_set1_ps(strip.sc[j * nb + b]), s), acc[j]);
      }
      if (b + 1 < nb) store(b + 1);
    }
    amx_exact_store(out, N, acc, r0, rows, n0, std::min<int64_t>(16, N - n0), bias);
  });
}

// Strip n0's 16 rows of an INT4 weight (layout: int4.h): per 32-element block the codes q, then 16 q.
inline void amx_exact_decode_int4(AmxExactStrip& st, const uint8_t* qweight,  // [N, K / 2]
                                  const half_t* scales, const half_t* mins,   // [N, K / G]
                                  int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t nb = K / 32, ng = K / G;
  st.codes = st.buf;
  st.stride = 2 * K;
  const __m128i low4 = _mm_set1_epi8(15);
  for (int j = 0; j < 16; ++j) {
    const int64_t n = n0 + j;
    uint8_t* dst = st.buf + j * 2 * K;
    if (n >= N) {
      std::memset(dst, 0, size_t(2 * K));
      std::memset(st.sc + j * nb, 0, size_t(nb) * 4);
      std::memset(st.mn + j * nb, 0, size_t(nb) * 4);
      continue;
    }
    amx_exact_block_scales(st.sc + j * nb, scales + n * ng, K, G);
    amx_exact_block_scales(st.mn + j * nb, mins + n * ng, K, G);
    const uint8_t* q = qweight + n * (K / 2);
    for (int64_t b = 0; b < nb; ++b) {
      // the block's 32 codes as two 16-byte halves: G = 32, the group's 16 bytes (low nibbles elements
      // 0..15, high 16..31); G >= 64, block c of its group: the low nibbles of bytes 32 c .. (c < G / 64),
      // else the high ones
      __m128i h0, h1;
      if (G == 32) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * 16));
        h0 = _mm_and_si128(v, low4);
        h1 = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
      } else {
        const int64_t g = b * 32 / G, c = b - g * (G / 32), half_blocks = G / 64;
        const uint8_t* p = q + g * (G / 2) + 32 * (c % half_blocks);
        const int shift = c < half_blocks ? 0 : 4;
        h0 = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), shift), low4);
        h1 = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)), shift), low4);
      }
      uint8_t* o = dst + b * 64;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), h0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16), h1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm_slli_epi16(h0, 4));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 48), _mm_slli_epi16(h1, 4));
    }
  }
}

// INT8: full strips read the weight in place; the last one is copied with zero rows.
inline void amx_exact_decode_int8(AmxExactStrip& st, const int8_t* qweight,  // [N, K]
                                  const half_t* scales,                      // [N, K / G]
                                  int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t nb = K / 32;
  const bool full = n0 + 16 <= N;
  st.codes = full ? reinterpret_cast<const uint8_t*>(qweight + n0 * K) : st.buf;
  st.stride = K;
  for (int j = 0; j < 16; ++j) {
    const int64_t n = n0 + j;
    if (n >= N) {
      std::memset(st.buf + j * K, 0, size_t(K));
      std::memset(st.sc + j * nb, 0, size_t(nb) * 4);
      continue;
    }
    if (!full) std::memcpy(st.buf + j * K, qweight + n * K, size_t(K));
    amx_exact_block_scales(st.sc + j * nb, scales + n * (K / G), K, G);
  }
}

template <class T>
bool int4_gemm_amx_exact(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const half_t* scales,
                         const half_t* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G) {
  return amx_exact_gemm_int4(out, a, a_stride, bias, M, N, K, [&](AmxExactStrip& st, int64_t n0) {
    amx_exact_decode_int4(st, qweight, scales, mins, N, K, G, n0);
  });
}

template <class T>
bool int8_gemm_amx_exact(T* out, const T* a, int64_t a_stride, const int8_t* qweight, const half_t* scales,
                         const T* bias, int64_t M, int64_t N, int64_t K, int G) {
  return amx_exact_gemm_int8(out, a, a_stride, bias, M, N, K, [&](AmxExactStrip& st, int64_t n0) {
    amx_exact_decode_int8(st, qweight, scales, N, K, G, n0);
  });
}
#endif  // DK_AMX_EXACT_GEMM

}  // namespace cpu
}  // namespace dk
