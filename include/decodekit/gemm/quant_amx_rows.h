// INT4 (1 .. 16 rows) and INT8 (1 .. 8 rows: the Q8_0 LM head, further down) weight-only GEMMs for fp32 / fp16
// activations (decoding, speculative verification, small batches) on the AMX int8 tile unit, with quant_amx_exact.h's exact integer products and its
// semantics to the bit (a 23-bit fixed point I per row and 32-element block of a, R = sum_k I_k q_k exact,
// fma(fl(R), d s, acc), fma(min, S, acc); see that header): a row's outputs are the same whether it comes
// alone, with 6 draft rows or in a batch of 40 (which quant_amx_exact.h serves).
//
// Why another kernel: quant_amx_exact.h computes the transpose (C[n][m], rows of a in the lanes) and pays
// its per-block scaling for 16 rows of a whatever M is: at M = 1 it is 4x slower than the fp32 GEMV. Here
// C[m][n] = sum_k A[m][k] B[k][n] with the digits of a's rows as the A operand and 16 weight rows as the B
// operand ("VNNI": 4 consecutive k of a weight row in a dword), so the scaling costs ~6-8 vector
// instructions per row of a and 16 outputs, and each weight byte is expanded once whatever M is. The B
// operand's order is not the row-major INT4 layout's, so the weight is repacked once, at load
// (amx_rows_layout.h: 256 bytes of nibbles per 16 rows x 32 k, then the scales and mins per 16 rows).
//
// Kernels by M (the number of tile products per block of 32 k bounds the tile kernels at small M):
//   M = 1 (amx_rows_int4_vnni1, AVX512-VNNI, no tile unit): per k-quad of 16 weight rows one VPDPBUSD per digit
//                     with the digit bytes broadcast; the same integers, so the same bits.
//   M <= 2 ("pair"):  A = the 4 digit rows E0..E3 of each row of a, blocks 2 i and 2 i + 1 side by side
//                     (8 M rows x 64 bytes, the other block's half zero); B = both blocks' codes (16 rows);
//                     one product per two blocks, C rows t M + m (block 2 i), 4 M + t M + m (2 i + 1);
//                     R = C_0 + 16 C_1 + 2^12 (C_2 + 16 C_3) in int32 (exact).
//   M <= 4 ("quad"):  the same with one block per product (A 4 M rows x 32 bytes, B 8 rows).
//   M <= 8:           A row m = [E0 | E1] digits, row M + m = [E2 | E3] (2 M rows); B rows 8..15 = 16 x the
//                     codes, so one product gives C_lo = sum q (E0 + 16 E1) and C_hi in one C tile.
//   M <= 16:          A lo / hi as two tiles, two strips of 16 weight rows per task sharing them.
// The tile kernels run each chunk of blocks in three phases (expand the codes, tile products, scale into the
// accumulators): a tile load of bytes the vector units just stored, or a vector load of a C tile just stored,
// stalled ~100 cycles. Tile rows >= 2 (1-row tiles measured 1.5x slower). All prefetch 2 KB ahead.
// Measured (2-core Sapphire Rapids, SmolLM2-135M's 30 layers of Q4_1 projections streamed from memory, against
// the fp32 GEMV / small-M kernels, tools/ab_amx_rows.sh; bench/results/20261206-*_cpu_xeon_amx_rows.md):
// M = 1 1.31x, 2 1.23x, 3 1.10x, 4 1.19x, 5 1.48x, 6 1.65x, 7 1.83x, 8 1.83x; 9..12 1.04-1.7x quant_amx_exact.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "decodekit/gemm/amx_rows_layout.h"
#include "decodekit/gemm/quant_amx_exact.h"

namespace dk {
namespace cpu {

constexpr int64_t kAmxRowsMaxM = 16;  // rows of a per call (one A tile)
// int4_gemm's limit for it: at 13..16 rows it measured 0.84-1.4x quant_amx_exact.h's kernel (bimodal on a shared
// 2-core VM), at 9..12 1.04-1.7x (tools/ab_amx_rows.sh 12 16).
constexpr int64_t kAmxRowsDispatchM = 12;

#if defined(DK_AMX_EXACT_GEMM)

// M <= 16 rows of a as A-tile rows, per 32-element block b: row m = [E0 | E1] digits of its 32 elements
// (the "lo" row), row hi_row(M) + m = [E2 | E3] (the "hi" row); s[m] = 2^(e - 21), sum[m] = s fl(sum I).
// Up to 8 rows the hi rows follow the lo rows (one A tile of 2 M rows, so one tile product gives C_lo
// and C_hi as the rows of one C tile); from 9 rows they start at row 16 (two tiles). Element for element
// the arithmetic of amx_exact_pack (lanes = elements here instead of rows).
struct AmxRowsBlock {
  alignas(64) uint8_t row[32][64];
  alignas(64) float s[16];
  alignas(64) float sum[16];
};
// The calling thread's packed rows of a, >= K / 32 blocks (zero-filled when grown: padding rows stay finite).
inline std::vector<AmxRowsBlock>& amx_rows_a_blocks(int64_t K) {
  thread_local std::vector<AmxRowsBlock> ap;
  if (ap.size() < size_t(K / 32)) ap.resize(size_t(K / 32));
  return ap;
}
constexpr int64_t kAmxRowsQuadM = 4;  // up to 4 rows: each digit its own A row (see amx_rows_int4_mm)
constexpr int64_t kAmxRowsPairM = 2;  // up to 2 rows: two blocks per tile product
constexpr int amx_rows_hi(int64_t M) { return M <= 8 ? std::max(int(M), 2) : 16; }

// One row's 32-element block at p as fp32 bit patterns x (elements 0..15, 16..31) and its exponent (amx_exact_exp
// of its largest |x|, the same for every lane).
template <class T>
DK_FORCE_INLINE AmxExactExp amx_rows_load_block(const T* p, __m512i (&x)[2]) {
  const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
  x[0] = _mm512_castps_si512(load16(p, __mmask16(0xffff)));
  x[1] = _mm512_castps_si512(load16(p + 16, __mmask16(0xffff)));
  const uint32_t amax = _mm512_reduce_max_epu32(
      _mm512_max_epu32(_mm512_and_si512(x[0], abs_bits), _mm512_and_si512(x[1], abs_bits)));
  return amx_exact_exp(_mm512_set1_epi32(int32_t(amax)));
}

template <class T>
inline void amx_rows_pack_a(AmxRowsBlock* ap,  // [K / 32]
                            const T* a, int64_t a_stride, int64_t M, int64_t K) {
  const int64_t nb = K / 32;
  const int hi_row = amx_rows_hi(M);
  const bool pair = M <= kAmxRowsPairM;
  for (int64_t b = 0; b < nb; ++b) {
    AmxRowsBlock& B = ap[b];
    // pair layout: blocks 2 i and 2 i + 1 share ap[2 i]'s rows, digits of block 2 i + u in rows 4 u M .. and
    // bytes 32 u .. 32 u + 31, the other half zero
    AmxRowsBlock& P = ap[pair ? b & ~int64_t(1) : b];
    const int prow = pair && (b & 1) ? int(4 * M) : 0, pbyte = pair && (b & 1) ? 32 : 0;
    if (pair && !(b & 1)) std::memset(P.row, 0, size_t(8 * M * 64));
    for (int64_t m = 0; m < M; ++m) {
      __m512i x[2];
      const AmxExactExp ex = amx_rows_load_block(a + m * a_stride + b * 32, x);
      __m512i isum = _mm512_setzero_si512();
      uint8_t* lo = B.row[m];
      uint8_t* hi = B.row[hi_row + m];
      const bool quad = M <= kAmxRowsQuadM;  // digit t of row m in row t M + m, bytes 0..31
      for (int h = 0; h < 2; ++h) {
        const __m512i I = amx_exact_fixed(x[h], ex.up);
        isum = _mm512_add_epi32(isum, I);
        __m512i e[4];
        amx_exact_int4_digits(I, e);
        uint8_t* const dst[4] = {quad ? P.row[prow + m] + pbyte : lo, quad ? P.row[prow + M + m] + pbyte : lo + 32,
                                 quad ? P.row[prow + 2 * M + m] + pbyte : hi,
                                 quad ? P.row[prow + 3 * M + m] + pbyte : hi + 32};
        for (int t = 0; t < 4; ++t) _mm_store_si128(reinterpret_cast<__m128i*>(dst[t] + 16 * h), _mm512_cvtepi32_epi8(e[t]));
      }
      // isum's lanes summed in int32 (exact for finite rows), then the same conversions as amx_exact_pack
      const __m512i tot = _mm512_set1_epi32(_mm512_reduce_add_epi32(isum));
      const __m512 s = amx_exact_s(ex);
      B.s[m] = _mm512_cvtss_f32(s);
      B.sum[m] = _mm512_cvtss_f32(_mm512_mul_ps(_mm512_cvtepi32_ps(tot), s));
    }
  }
}

// The 256 packed bytes of a (strip, block) as the 1 KB B tile at dst (rows 0..3: low nibbles, 4..7: high
// nibbles, 8..15: rows 0..7 times 16).
DK_FORCE_INLINE void amx_rows_expand(uint8_t* dst, const uint8_t* src) {
  const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8(char(0xf0));
  DK_UNROLL_ALL
  for (int r = 0; r < 4; ++r) {
    const __m512i p = _mm512_loadu_si512(src + 64 * r);
    _mm512_store_si512(dst + 64 * r, _mm512_and_si512(p, lo4));
    _mm512_store_si512(dst + 64 * (4 + r), _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4));
    _mm512_store_si512(dst + 64 * (8 + r), _mm512_and_si512(_mm512_slli_epi16(p, 4), hi4));
    _mm512_store_si512(dst + 64 * (12 + r), _mm512_and_si512(p, hi4));
  }
}

// The same for the quad layout: only rows 0..7 (512 bytes).
DK_FORCE_INLINE void amx_rows_expand8(uint8_t* dst, const uint8_t* src) {
  const __m512i lo4 = _mm512_set1_epi8(0x0f);
  DK_UNROLL_ALL
  for (int r = 0; r < 4; ++r) {
    const __m512i p = _mm512_loadu_si512(src + 64 * r);
    _mm512_store_si512(dst + 64 * r, _mm512_and_si512(p, lo4));
    _mm512_store_si512(dst + 64 * (4 + r), _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4));
  }
}

// One block's C rows (lo: c_lo + 16 m, hi: c_hi + 16 m, int32) into the accumulators, for strip rows with
// scales d and mins mn: acc[m] = fma(fl(2^12 C_hi + C_lo), d s[m], acc[m]), then fma(mn, sum[m], acc[m]).
// Quad layout (kQuad): C rows t MM + m = sum q E_t, and C_lo = C_0 + 16 C_1, C_hi = C_2 + 16 C_3 (exact).
template <int MM, bool kQuad = false>
DK_FORCE_INLINE void amx_rows_scale(__m512 (&acc)[MM], const int32_t* c_lo, const int32_t* c_hi, __m512 d, __m512 mn,
                                    const AmxRowsBlock& A) {
  DK_UNROLL_ALL
  for (int m = 0; m < MM; ++m) {
    __m512i lo, hi;
    if constexpr (kQuad) {
      lo = _mm512_add_epi32(_mm512_load_si512(c_lo + 16 * m), _mm512_slli_epi32(_mm512_load_si512(c_lo + 16 * (MM + m)), 4));
      hi = _mm512_add_epi32(_mm512_load_si512(c_lo + 16 * (2 * MM + m)),
                            _mm512_slli_epi32(_mm512_load_si512(c_lo + 16 * (3 * MM + m)), 4));
    } else {
      lo = _mm512_load_si512(c_lo + 16 * m);
      hi = _mm512_load_si512(c_hi + 16 * m);
    }
    const __m512 r = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 12), lo));
    acc[m] = _mm512_fmadd_ps(r, _mm512_mul_ps(d, _mm512_set1_ps(A.s[m])), acc[m]);
    acc[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(A.sum[m]), acc[m]);
  }
}

DK_FORCE_INLINE __m512 amx_rows_half16(const half_t* p) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MM, class T>
DK_FORCE_INLINE void amx_rows_store(T* out, int64_t N, int64_t n0, const __m512 (&acc)[MM], const T* bias) {
  if (n0 >= N) return;
  const __mmask16 cols = lanes_mask(std::min<int64_t>(16, N - n0));
  const __m512 bias_f = bias ? load16(bias + n0, cols) : _mm512_setzero_ps();
  DK_UNROLL_ALL
  for (int m = 0; m < MM; ++m) store16(out + m * N + n0, bias ? _mm512_add_ps(acc[m], bias_f) : acc[m], cols);
}

// Tile shapes. Up to 8 rows: tiles 0, 1 = A, 2, 3 = B, 4, 5 = C, two sets used alternately so that one
// product's loads overlap the previous one's (tile registers are not renamed); A / B / C rows per the layouts
// at the top (pair: 8 M / 16 / 8 M, quad: 4 M (32 bytes) / 8 / 4 M, up to 8 rows: 2 M / 16 / 2 M). 9..16 rows:
// 2 / 3 = A lo / hi (M rows), 4 / 5 = the two strips' B, 0, 1 = strip 0's C lo / hi, 6, 7 = strip 1's. Rows
// >= 2 (1-row tiles measured 1.5x slower).
struct alignas(64) AmxRowsTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  explicit AmxRowsTileConfig(int m) {
    const int r = std::max(m, 2);
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      if (m <= kAmxRowsPairM) {  // A: 8 m rows x 64 bytes, B: 16 x 64 bytes (two blocks), C: 8 m rows
        rows[t] = uint8_t(t == 2 || t == 3 ? 16 : 8 * m);
      } else if (m <= kAmxRowsQuadM) {  // A: 4 m rows x 32 bytes, B: 8 x 64 bytes, C: 4 m rows
        rows[t] = uint8_t(t == 2 || t == 3 ? 8 : 4 * m);
        colsb[t] = uint16_t(t == 0 || t == 1 ? 32 : 64);
      } else if (m <= 8) {
        rows[t] = uint8_t(t == 2 || t == 3 ? 16 : 2 * r);
      }
      else rows[t] = uint8_t(t == 4 || t == 5 ? 16 : r);
    }
  }
};

// Software prefetch distance in the packed copy's bytes (its codes; the scales and mins 1 / 8 of it): the
// hardware prefetchers alone left the kernels 0.77-0.85x the fp32 GEMV (which prefetches a row ahead) on
// weights streamed from memory, 2 KB ahead made them 1.25-1.35x (one row) and 1.3-1.9x (2..7 rows) faster.
constexpr int kAmxRowsPrefetch = 2048;

// Prefetch `bytes` bytes at p + kAmxRowsPrefetch (and with `scales`, the group scales / mins at sc / mn that far
// ahead over 8: the copy's scales are 1 / 8 of its codes).
DK_FORCE_INLINE void amx_rows_prefetch(const void* p, int bytes, const half_t* sc = nullptr, const half_t* mn = nullptr,
                                       bool scales = false) {
  const char* f = static_cast<const char*>(p) + kAmxRowsPrefetch;
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(f + o, _MM_HINT_T0);
  if (scales) {
    _mm_prefetch(reinterpret_cast<const char*>(sc) + kAmxRowsPrefetch / 8, _MM_HINT_T0);
    if (mn) _mm_prefetch(reinterpret_cast<const char*>(mn) + kAmxRowsPrefetch / 8, _MM_HINT_T0);
  }
}

// A thread's buffers for a chunk of blocks: expanded B tiles, stored C tiles (1 KB each). Each chunk runs
// in three phases (expand the weights, tile products, scale into the accumulators) so that no tile load
// reads bytes the vector units have just stored and no vector load reads a C tile just stored: each such
// hand-over stalled ~100 cycles (one 3072 x 576 projection at M = 1 on one core: 156 -> 77 us).
constexpr int kAmxRowsKC = 16;  // blocks per chunk up to 8 rows (B 16 KB + C 16 KB: L1); 9..16 rows: 4
struct AmxRowsScratch {
  alignas(64) uint8_t bt[kAmxRowsKC][1024];
  alignas(64) int32_t cb[kAmxRowsKC][256];
};
inline AmxRowsScratch& amx_rows_scratch() {
  thread_local AmxRowsScratch s;
  return s;
}

// C = A B on one tile set: A tile ta from a, B tile tb from b, C tile tc stored to c; dp: _tile_dpbsud (INT4 codes,
// unsigned) or _tile_dpbssd (INT8 codes, signed).
#define DK_AMX_ROWS_PRODUCT(dp, ta, tb, tc, a, b, c) \
  do {                                               \
    _tile_loadd(ta, a, 64);                          \
    _tile_loadd(tb, b, 64);                          \
    _tile_zero(tc);                                  \
    dp(tc, ta, tb);                                  \
    _tile_stored(tc, c, 64);                         \
  } while (0)

// One row of a without the tile unit, the same integers: per block and 16 weight rows, VPDPBUSD of the
// codes (the B tile's rows, one k-quad of 16 rows a register) with each digit's 4 bytes broadcast gives
// C_t = sum q E_t exactly (C_lo = C_0 + 16 C_1, C_hi = C_2 + 16 C_3), then amx_rows_scale's arithmetic: the
// bits of the tile kernel. 32 VPDPBUSD + ~20 other vector instructions per 512 weights, no tile-unit start-up
// (which cost a one-row call up to ~10% whenever other code ran between calls, as in a decode step).
template <class T>
void amx_rows_int4_vnni1(T* out,                 // [1, N]
                         const AmxRowsBlock* ap,  // [K / 32], one row (pair layout: kAmxRowsPairM)
                         const AmxRowsWeight& W,
                         const T* bias,  // [N] or null
                         int64_t N, int64_t K, int G) {
  const int64_t S = amx_rows_strips(N), nb = K / 32, ng = K / G;
  DK_OMP_PARALLEL_FOR_IF(S > 2 && N * K >= kParallelGrain)
  for (int64_t s = 0; s < S; ++s) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512 acc[1] = {_mm512_setzero_ps()};
    const uint8_t* cs = W.codes + s * nb * 256;
    for (int64_t b = 0; b < nb; ++b) {
      const AmxRowsBlock& A = ap[b & ~int64_t(1)];
      const int prow = (b & 1) ? 4 : 0, pbyte = (b & 1) ? 32 : 0;  // the pair layout at M = 1
      __m512i c[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      const int64_t sg = (s * ng + b * 32 / G) * 16;
      amx_rows_prefetch(cs + b * 256, 256, W.scales + sg, W.mins + sg, b % 2 == 0);
      DK_UNROLL_ALL
      for (int r = 0; r < 4; ++r) {
        const __m512i p = _mm512_loadu_si512(cs + b * 256 + 64 * r);
        const __m512i q[2] = {_mm512_and_si512(p, lo4), _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4)};  // k-quads r, 4 + r
        DK_UNROLL_ALL
        for (int h = 0; h < 2; ++h)
          DK_UNROLL_ALL
          for (int t = 0; t < 4; ++t) {
            int32_t e;  // digit t of k 4 (r + 4 h) .. + 3
            std::memcpy(&e, A.row[prow + t] + pbyte + 4 * (r + 4 * h), 4);
            c[t] = _mm512_dpbusd_epi32(c[t], q[h], _mm512_set1_epi32(e));
          }
      }
      alignas(64) int32_t cb[4][16];
      for (int t = 0; t < 4; ++t) _mm512_store_si512(cb[t], c[t]);
      amx_rows_scale<1, true>(acc, cb[0], cb[0], amx_rows_half16(W.scales + sg), amx_rows_half16(W.mins + sg), ap[b]);
    }
    amx_rows_store(out, N, 16 * s, acc, bias);
  }
}

template <int MM, class T>
void amx_rows_int4_mm(T* out,                 // [M, N]
                      const AmxRowsBlock* ap,  // [K / 32], MM rows
                      const AmxRowsWeight& W,
                      const T* bias,  // [N] or null
                      int64_t N, int64_t K, int G) {
  const int64_t S = amx_rows_strips(N), nb = K / 32, ng = K / G;
  const uint8_t* codes = W.codes;
  const half_t* pscales = W.scales;
  const half_t* pmins = W.mins;
  const AmxRowsTileConfig cfg(MM);
  constexpr int R = MM < 2 ? 2 : MM;  // rows of a per tile (C_lo rows 0..R-1, C_hi R..2R-1 up to 8 rows)
#pragma omp parallel if (S > 2 && N * K >= kParallelGrain)
  {
    _tile_loadconfig(&cfg);
    AmxRowsScratch& scr = amx_rows_scratch();
    if constexpr (MM <= 8) {  // one strip per task; C_lo and C_hi rows of one C tile
#pragma omp for schedule(static)
      for (int64_t s = 0; s < S; ++s) {
        __m512 acc[MM];
        DK_UNROLL_ALL
        for (int m = 0; m < MM; ++m) acc[m] = _mm512_setzero_ps();
        const uint8_t* cs = codes + s * nb * 256;
        // chunks of equal size (18 blocks: 9 + 9, not 16 + 2; measured 1.0-1.05x 16 + 2 and 1.02-1.1x chunks of 32)
        const int64_t kc_max = kAmxRowsKC;
        const int64_t chunks = (nb + kc_max - 1) / kc_max, even = (nb + chunks - 1) / chunks;
        const int64_t step = MM <= kAmxRowsPairM ? even + (even & 1) : even;  // pairs: chunks start at even blocks
        for (int64_t b0 = 0; b0 < nb; b0 += step) {
          const int kc = int(std::min<int64_t>(step, nb - b0));
          for (int i = 0; i < kc; ++i) {
            const int64_t sg = (s * ng + (b0 + i) * 32 / G) * 16;
            amx_rows_prefetch(cs + (b0 + i) * 256, 256, pscales + sg, pmins + sg, i % 2 == 0);
            if constexpr (MM <= kAmxRowsPairM) amx_rows_expand8(scr.bt[0] + 512 * i, cs + (b0 + i) * 256);
            else if constexpr (MM <= kAmxRowsQuadM) amx_rows_expand8(scr.bt[i], cs + (b0 + i) * 256);
            else amx_rows_expand(scr.bt[i], cs + (b0 + i) * 256);
          }
          int i = 0;
          if constexpr (MM <= kAmxRowsPairM) {  // blocks 2 j, 2 j + 1: one product, C rows 0.. and 4 MM..
            uint8_t* flat = scr.bt[0];  // block i's 8 rows at 512 i: a pair is one 16-row B tile
            if (kc & 1) std::memset(scr.bt[(kc / 2) & (kAmxRowsKC - 1)] + 512, 0, 512);  // a lone last block: its partner's codes zero (at flat + 512 kc)
            for (int j = 0; 2 * j < kc; j += 2) {
              DK_AMX_ROWS_PRODUCT(_tile_dpbsud, 0, 2, 4, ap[b0 + 2 * j].row[0], flat + 1024 * j, scr.cb[j]);
              if (2 * j + 2 < kc) DK_AMX_ROWS_PRODUCT(_tile_dpbsud, 1, 3, 5, ap[b0 + 2 * j + 2].row[0], flat + 1024 * (j + 1), scr.cb[j + 1]);
            }
            for (i = 0; i < kc; ++i) {
              const int64_t sg = (s * ng + (b0 + i) * 32 / G) * 16;
              const int32_t* c = scr.cb[i / 2] + (i & 1) * 16 * 4 * MM;
              amx_rows_scale<MM, true>(acc, c, c, amx_rows_half16(pscales + sg), amx_rows_half16(pmins + sg), ap[b0 + i]);
            }
            continue;
          }
          for (; i + 2 <= kc; i += 2) {  // tile sets (0, 2, 4) and (1, 3, 5) alternate: the hardware overlaps them
            DK_AMX_ROWS_PRODUCT(_tile_dpbsud, 0, 2, 4, ap[b0 + i].row[0], scr.bt[i], scr.cb[i]);
            DK_AMX_ROWS_PRODUCT(_tile_dpbsud, 1, 3, 5, ap[b0 + i + 1].row[0], scr.bt[i + 1], scr.cb[i + 1]);
          }
          if (i < kc) DK_AMX_ROWS_PRODUCT(_tile_dpbsud, 0, 2, 4, ap[b0 + i].row[0], scr.bt[i], scr.cb[i]);
          for (i = 0; i < kc; ++i) {
            const int64_t sg = (s * ng + (b0 + i) * 32 / G) * 16;
            amx_rows_scale<MM, MM <= kAmxRowsQuadM>(acc, scr.cb[i], scr.cb[i] + 16 * R, amx_rows_half16(pscales + sg),
                                                     amx_rows_half16(pmins + sg), ap[b0 + i]);
          }
        }
        amx_rows_store(out, N, 16 * s, acc, bias);
      }
    } else {  // two strips per task sharing the A tiles lo (2) and hi (3)
      constexpr int kc_max = 4;
#pragma omp for schedule(static)
      for (int64_t sp = 0; sp < S / 2; ++sp) {
        __m512 acc[2][MM];
        DK_UNROLL_ALL
        for (int m = 0; m < MM; ++m) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
        const uint8_t* cs = codes + 2 * sp * nb * 256;
        for (int64_t b0 = 0; b0 < nb; b0 += kc_max) {
          const int kc = int(std::min<int64_t>(kc_max, nb - b0));
          for (int i = 0; i < kc; ++i) {
            for (int h = 0; h < 2; ++h) {
              const int64_t sg = ((2 * sp + h) * ng + (b0 + i) * 32 / G) * 16;
              amx_rows_prefetch(cs + (h * nb + b0 + i) * 256, 256, pscales + sg, pmins + sg, i % 2 == 0);
              amx_rows_expand(scr.bt[2 * i + h], cs + (h * nb + b0 + i) * 256);
            }
          }
          for (int i = 0; i < kc; ++i) {
            int32_t* c = scr.cb[4 * i];
            _tile_loadd(2, ap[b0 + i].row[0], 64);
            _tile_loadd(3, ap[b0 + i].row[16], 64);
            _tile_loadd(4, scr.bt[2 * i], 64);
            _tile_loadd(5, scr.bt[2 * i + 1], 64);
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(6);
            _tile_zero(7);
            _tile_dpbsud(0, 2, 4);
            _tile_dpbsud(1, 3, 4);
            _tile_dpbsud(6, 2, 5);
            _tile_dpbsud(7, 3, 5);
            _tile_stored(0, c, 64);
            _tile_stored(1, c + 256, 64);
            _tile_stored(6, c + 512, 64);
            _tile_stored(7, c + 768, 64);
          }
          for (int i = 0; i < kc; ++i) {
            const int32_t* c = scr.cb[4 * i];
            const int64_t g = (b0 + i) * 32 / G;
            DK_UNROLL_ALL
            for (int h = 0; h < 2; ++h) {
              const int64_t sg = ((2 * sp + h) * ng + g) * 16;
              amx_rows_scale(acc[h], c + 512 * h, c + 512 * h + 256, amx_rows_half16(pscales + sg),
                             amx_rows_half16(pmins + sg), ap[b0 + i]);
            }
          }
        }
        amx_rows_store(out, N, 32 * sp, acc[0], bias);
        amx_rows_store(out, N, 32 * sp + 16, acc[1], bias);
      }
    }
    _tile_release();
  }
}

// out[m, n] = sum_k a[m, k] w[n, k] (+ bias[n]) for M <= 16 rows, bit for bit quant_amx_exact.h's
// int4_gemm_amx_exact. False (nothing written) when the tile unit is unavailable or M / K do not fit.
template <class T>
bool amx_rows_int4(T* out,        // [M, N]
                   const T* a,    // [M, K], row stride a_stride
                   int64_t a_stride,
                   const uint8_t* packed,  // [amx_rows_packed_bytes(N, K, G)] (amx_rows_pack_int4)
                   const T* bias,          // [N] or null
                   int64_t M, int64_t N, int64_t K, int G) {
  if (M < 1 || M > kAmxRowsMaxM || K % 32 != 0 || K == 0 || !amx_enabled()) return false;
  std::vector<AmxRowsBlock>& ap = amx_rows_a_blocks(K);
  amx_rows_pack_a(ap.data(), a, a_stride, M, K);
  const AmxRowsWeight W(packed, N, K, G);
#if defined(__AVX512VNNI__)
  if (M == 1) {
    amx_rows_int4_vnni1(out, ap.data(), W, bias, N, K, G);
    return true;
  }
#endif
  switch (M) {
#define DK_AMX_ROWS_CASE(mm) \
  case mm: amx_rows_int4_mm<mm>(out, ap.data(), W, bias, N, K, G); return true;
    DK_AMX_ROWS_CASE(1) DK_AMX_ROWS_CASE(2) DK_AMX_ROWS_CASE(3) DK_AMX_ROWS_CASE(4)
    DK_AMX_ROWS_CASE(5) DK_AMX_ROWS_CASE(6) DK_AMX_ROWS_CASE(7) DK_AMX_ROWS_CASE(8)
    DK_AMX_ROWS_CASE(9) DK_AMX_ROWS_CASE(10) DK_AMX_ROWS_CASE(11) DK_AMX_ROWS_CASE(12)
    DK_AMX_ROWS_CASE(13) DK_AMX_ROWS_CASE(14) DK_AMX_ROWS_CASE(15) DK_AMX_ROWS_CASE(16)
#undef DK_AMX_ROWS_CASE
    default: return false;
  }
}

// ---- INT8 (GGUF Q8_0, the LM head): quant_amx_exact.h's INT8 semantics, R = fma(fl(C_2), 2^16, fl(2^8 C_1 +
// C_0)) with C_t = sum_k q_k D_t,k (base-256 digits of I), then fma(R, d s, acc); the B tile straight from
// the copy (amx_rows_layout.h). A rows: digit t of row m at t M + m (t = 0, 1; also t = 2 up to 5 rows, else
// at 16 + m: a second A tile); up to 2 rows two blocks per product (block 2 i + 1's rows from 3 M, bytes 32..).
constexpr int64_t kAmxRowsInt8MaxM = 8;

template <class T>
inline void amx_rows_pack_a_int8(AmxRowsBlock* ap, const T* a, int64_t a_stride, int64_t M, int64_t K) {
  const int64_t nb = K / 32;
  const bool pair = M <= kAmxRowsPairM;
  for (int64_t b = 0; b < nb; ++b) {
    AmxRowsBlock& P = ap[pair ? b & ~int64_t(1) : b];
    const int prow = pair && (b & 1) ? int(3 * M) : 0, pbyte = pair && (b & 1) ? 32 : 0;
    if (pair && !(b & 1)) std::memset(P.row, 0, size_t(6 * M * 64));
    for (int64_t m = 0; m < M; ++m) {
      __m512i x[2];
      const AmxExactExp ex = amx_rows_load_block(a + m * a_stride + b * 32, x);
      for (int h = 0; h < 2; ++h) {
        __m512i d[3];
        amx_exact_int8_digits(amx_exact_fixed(x[h], ex.up), d);
        for (int t = 0; t < 3; ++t) {
          uint8_t* row = P.row[t < 2 || M <= 5 ? prow + t * M + m : 16 + m] + pbyte;
          _mm_store_si128(reinterpret_cast<__m128i*>(row + 16 * h), _mm512_cvtepi32_epi8(d[t]));
        }
      }
      ap[b].s[m] = _mm512_cvtss_f32(amx_exact_s(ex));
    }
  }
}

// Tiles: up to 2 rows A 0 / 1 (6 M rows), B 2 / 3 (16 rows: two blocks), C 4 / 5, alternating; up to 5 rows
// A 0 / 1 (3 M rows x 32 bytes), B 2 / 3 (8 rows), C 4 / 5; 6..8 rows A 0 (2 M rows) + 1 (M rows), B 2, C 4 + 5.
struct alignas(64) AmxRowsInt8TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  explicit AmxRowsInt8TileConfig(int m) {
    const bool pair = m <= kAmxRowsPairM, one = m <= 5;
    for (int t = 0; t < 6; ++t) colsb[t] = 64;
    colsb[0] = colsb[1] = uint16_t(pair ? 64 : 32);
    rows[0] = rows[1] = uint8_t(pair ? 6 * m : one ? 3 * m : 2 * m);
    if (!one) rows[1] = uint8_t(m);
    rows[2] = rows[3] = uint8_t(pair ? 16 : 8);
    rows[4] = rows[5] = rows[0];
    if (!one) rows[5] = uint8_t(m);
  }
};

// C rows -> accumulators: c01 + 16 (t M + m) = C_t (t = 0, 1), c2 + 16 m = C_2.
template <int MM>
DK_FORCE_INLINE void amx_rows_scale_int8(__m512 (&acc)[MM], const int32_t* c01, const int32_t* c2, __m512 d,
                                         const AmxRowsBlock& A) {
  DK_UNROLL_ALL
  for (int m = 0; m < MM; ++m) {
    const __m512i v0 = _mm512_load_si512(c01 + 16 * m), v1 = _mm512_load_si512(c01 + 16 * (MM + m)),
                  v2 = _mm512_load_si512(c2 + 16 * m);
    const __m512 r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v2), _mm512_set1_ps(65536.f),
                                     _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(v1, 8), v0)));
    acc[m] = _mm512_fmadd_ps(r, _mm512_mul_ps(d, _mm512_set1_ps(A.s[m])), acc[m]);
  }
}

template <int MM, class T>
void amx_rows_int8_mm(T* out, const AmxRowsBlock* ap, const uint8_t* codes, const half_t* scales, const T* bias,
                      int64_t N, int64_t K, int G) {
  const int64_t S = amx_rows_strips(N), nb = K / 32, ng = K / G;
  const AmxRowsInt8TileConfig cfg(MM);
  constexpr bool kPair = MM <= kAmxRowsPairM, kOne = MM <= 5;
#pragma omp parallel if (S > 2 && N * K >= kParallelGrain)
  {
    _tile_loadconfig(&cfg);
    AmxRowsScratch& scr = amx_rows_scratch();
#pragma omp for schedule(static)
    for (int64_t s = 0; s < S; ++s) {
      __m512 acc[MM];
      DK_UNROLL_ALL
      for (int m = 0; m < MM; ++m) acc[m] = _mm512_setzero_ps();
      const uint8_t* cs = codes + s * nb * 512;
      const int64_t chunks = (nb + kAmxRowsKC - 1) / kAmxRowsKC, even = (nb + chunks - 1) / chunks;
      const int64_t step = kPair ? even + (even & 1) : even;
      for (int64_t b0 = 0; b0 < nb; b0 += step) {
        const int kc = int(std::min<int64_t>(step, nb - b0));
        if constexpr (kPair) {  // C of pair j in cb[j]: rows 0.. block 2 j, 3 MM.. block 2 j + 1
          for (int j = 0; 2 * j < kc; ++j) {
            const int64_t b = b0 + 2 * j;
            amx_rows_prefetch(cs + b * 512 + kAmxRowsPrefetch, 1024);  // (4 KB ahead: 512 bytes a block)
            if (2 * j + 1 < kc) {
              if (j % 2 == 0) DK_AMX_ROWS_PRODUCT(_tile_dpbssd, 0, 2, 4, ap[b].row[0], cs + b * 512, scr.cb[j]);
              else DK_AMX_ROWS_PRODUCT(_tile_dpbssd, 1, 3, 5, ap[b].row[0], cs + b * 512, scr.cb[j]);
            } else {  // a lone last block: its partner's codes zero (A's half is zero too)
              std::memcpy(scr.bt[0], cs + b * 512, 512);
              std::memset(scr.bt[0] + 512, 0, 512);
              DK_AMX_ROWS_PRODUCT(_tile_dpbssd, 0, 2, 4, ap[b].row[0], scr.bt[0], scr.cb[j]);
            }
          }
          for (int i = 0; i < kc; ++i) {
            const int32_t* c = scr.cb[i / 2] + (i & 1) * 16 * 3 * MM;
            amx_rows_scale_int8(acc, c, c + 16 * 2 * MM, amx_rows_half16(scales + (s * ng + (b0 + i) * 32 / G) * 16),
                                ap[b0 + i]);
          }
        } else if constexpr (kOne) {
          for (int i = 0; i < kc; ++i) {
            const int64_t b = b0 + i;
            amx_rows_prefetch(cs + b * 512 + kAmxRowsPrefetch, 512);
            if (i % 2 == 0) DK_AMX_ROWS_PRODUCT(_tile_dpbssd, 0, 2, 4, ap[b].row[0], cs + b * 512, scr.cb[i]);
            else DK_AMX_ROWS_PRODUCT(_tile_dpbssd, 1, 3, 5, ap[b].row[0], cs + b * 512, scr.cb[i]);
          }
          for (int i = 0; i < kc; ++i)
            amx_rows_scale_int8(acc, scr.cb[i], scr.cb[i] + 16 * 2 * MM,
                                amx_rows_half16(scales + (s * ng + (b0 + i) * 32 / G) * 16), ap[b0 + i]);
        } else {  // C_0, C_1 in cb[2 i] (2 MM rows), C_2 in cb[2 i + 1]
          const int kc2 = std::min(kc, int(kAmxRowsKC / 2));
          for (int64_t c0 = b0; c0 < b0 + kc; c0 += kc2) {
            const int n2 = int(std::min<int64_t>(kc2, b0 + kc - c0));
            for (int i = 0; i < n2; ++i) {
              const int64_t b = c0 + i;
              amx_rows_prefetch(cs + b * 512 + kAmxRowsPrefetch, 512);
              _tile_loadd(0, ap[b].row[0], 64);
              _tile_loadd(1, ap[b].row[16], 64);
              _tile_loadd(2, cs + b * 512, 64);
              _tile_zero(4);
              _tile_zero(5);
              _tile_dpbssd(4, 0, 2);
              _tile_dpbssd(5, 1, 2);
              _tile_stored(4, scr.cb[2 * i], 64);
              _tile_stored(5, scr.cb[2 * i + 1], 64);
            }
            for (int i = 0; i < n2; ++i)
              amx_rows_scale_int8(acc, scr.cb[2 * i], scr.cb[2 * i + 1],
                                  amx_rows_half16(scales + (s * ng + (c0 + i) * 32 / G) * 16), ap[c0 + i]);
          }
        }
      }
      amx_rows_store(out, N, 16 * s, acc, bias);
    }
    _tile_release();
  }
}

// out[m, n] = sum_k a[m, k] w[n, k] (+ bias[n]) for an INT8 weight and M <= 8 rows, bit for bit quant_amx_exact.h's
// int8_gemm_amx_exact. False (nothing written) when the tile unit is unavailable or M / K do not fit.
template <class T>
bool amx_rows_int8(T* out, const T* a, int64_t a_stride,
                   const uint8_t* packed,  // [amx_rows_int8_packed_bytes(N, K, G)] (amx_rows_pack_int8)
                   const T* bias, int64_t M, int64_t N, int64_t K, int G) {
  if (M < 1 || M > kAmxRowsInt8MaxM || K % 32 != 0 || K == 0 || !amx_enabled()) return false;
  std::vector<AmxRowsBlock>& ap = amx_rows_a_blocks(K);
  amx_rows_pack_a_int8(ap.data(), a, a_stride, M, K);
  const half_t* scales = reinterpret_cast<const half_t*>(packed + amx_rows_int8_codes_bytes(N, K));
  switch (M) {
#define DK_AMX_ROWS_CASE(mm) \
  case mm: amx_rows_int8_mm<mm>(out, ap.data(), packed, scales, bias, N, K, G); return true;
    DK_AMX_ROWS_CASE(1) DK_AMX_ROWS_CASE(2) DK_AMX_ROWS_CASE(3) DK_AMX_ROWS_CASE(4)
    DK_AMX_ROWS_CASE(5) DK_AMX_ROWS_CASE(6) DK_AMX_ROWS_CASE(7) DK_AMX_ROWS_CASE(8)
#undef DK_AMX_ROWS_CASE
    default: return false;
  }
}

// ---- 9+ rows from the copy (quant_amx_exact.h's kernels, its strip decoders reading the copy instead of int4.h's
// layout): a weight held only as its copy runs every row count, and rows of any M keep their bits.
// Per 32-element block the copy holds a B tile of 16 weight rows, 8 dword rows (k quads) of 16 dwords: transposed
// to 16 rows of 8 dwords = each weight row's 32 codes (INT4: then 16 q, as amx_exact_decode_int4 writes them).
// (A full 16 x 16 transpose with 8 zero rows measured 0.72-0.79x the int4.h decoder at 13-16 rows.)
// z[j] (j < 8): the B tile's dword row j (k quad j of weight rows 0..15) -> x[i] (i < 4): the 8 dwords (32 bytes)
// of weight row i then those of row 4 + i; x[4 + i]: rows 8 + i, 12 + i. Two 4 x 4 dword transposes per 128-bit
// lane (row 4 L + i's k quads 0..3 / 4..7 in lane L of r[i] / r[4 + i]), then lanes paired: 24 shuffles.
DK_FORCE_INLINE void amx_rows_tile_to_rows(const __m512i (&z)[8], __m512i (&x)[8]) {
  __m512i r[8];
  for (int h = 0; h < 2; ++h) {
    const __m512i* y = z + 4 * h;
    const __m512i t0 = _mm512_unpacklo_epi32(y[0], y[1]), t1 = _mm512_unpackhi_epi32(y[0], y[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(y[2], y[3]), t3 = _mm512_unpackhi_epi32(y[2], y[3]);
    r[4 * h + 0] = _mm512_unpacklo_epi64(t0, t2);
    r[4 * h + 1] = _mm512_unpackhi_epi64(t0, t2);
    r[4 * h + 2] = _mm512_unpacklo_epi64(t1, t3);
    r[4 * h + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
  const __m512i lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm512_permutex2var_epi64(r[i], lo, r[4 + i]);
    x[4 + i] = _mm512_permutex2var_epi64(r[i], hi, r[4 + i]);
  }
}

// One 256-byte INT4 block of the copy (16 weight rows x 32 k) as rows: x[i] = rows n, n + 4 (n = i < 4 ? i : i + 4),
// each row's 32 codes in k order (amx_rows_tile_to_rows of the B tile's bytes; byte p: low nibble B-tile byte p, high
// nibble byte 256 + p).
DK_FORCE_INLINE void amx_rows_int4_block_rows(const uint8_t* src, __m512i (&x)[8]) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512i z[8];
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_loadu_si512(src + 64 * j);
    z[j] = _mm512_and_si512(v, low4);
    z[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  }
  amx_rows_tile_to_rows(z, x);
}

// The strip's block scales (and mins): [K / G][16] fp16 of the copy -> fp32 [16][K / 32] (a group's value
// repeated G / 32 times), 16 groups at a time through a 16 x 16 transpose (scalar stores measured 0.6x).
DK_FORCE_INLINE void amx_rows_strip_scales(float* dst, const half_t* src, int64_t K, int G) {
  const int64_t ng = K / G, nb = K / 32;
  const int rep = G / 32;
  __m512i idx[4];  // lane l of segment r: group (16 r + l) / rep of the 16
  for (int r = 0; r < rep; ++r) {
    alignas(64) int32_t v[16];
    for (int l = 0; l < 16; ++l) v[l] = (16 * r + l) / rep;
    idx[r] = _mm512_load_si512(v);
  }
  for (int64_t g0 = 0; g0 < ng; g0 += 16) {
    const int cnt = int(std::min<int64_t>(16, ng - g0));
    __m512i v[16];
    for (int i = 0; i < 16; ++i)
      v[i] = i < cnt ? _mm512_castps_si512(_mm512_cvtph_ps(
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (g0 + i) * 16))))
                     : _mm512_setzero_si512();
    transpose16_epi32(v);  // v[j], lane i: weight row j, group g0 + i
    for (int j = 0; j < 16; ++j)
      for (int r = 0; r < rep && 16 * r < cnt * rep; ++r)
        _mm512_mask_storeu_epi32(dst + j * nb + g0 * rep + 16 * r, lanes_mask(std::min(16, cnt * rep - 16 * r)),
                                 rep == 1 ? v[j] : _mm512_permutexvar_epi32(idx[r], v[j]));
  }
}

// Strip n0 / 16 of an INT4 copy into the thread buffer: the bytes amx_exact_decode_int4 gives (rows past N: zeros,
// as the copy holds them).
inline void amx_rows_decode_strip_int4(AmxExactStrip& st, const uint8_t* packed, int64_t N, int64_t K, int G,
                                       int64_t n0) {
  const int64_t nb = K / 32, ng = K / G, s = n0 / 16;
  const AmxRowsWeight w(packed, N, K, G);
  st.codes = st.buf;
  st.stride = 2 * K;
  const uint8_t* src = w.codes + s * nb * 256;
  for (int64_t b = 0; b < nb; ++b, src += 256) {
    __m512i x[8];
    amx_rows_int4_block_rows(src, x);
    uint8_t* o = st.buf + b * 64;
    for (int i = 0; i < 8; ++i) {  // a row's 64 bytes: its 32 codes, then 16 q (q <= 15: still a byte)
      const __m512i x16 = _mm512_slli_epi16(x[i], 4);
      const int64_t n = i < 4 ? i : i + 4;  // x[i]: rows n, n + 4
      _mm512_storeu_si512(o + n * 2 * K, _mm512_shuffle_i64x2(x[i], x16, _MM_SHUFFLE(1, 0, 1, 0)));
      _mm512_storeu_si512(o + (n + 4) * 2 * K, _mm512_shuffle_i64x2(x[i], x16, _MM_SHUFFLE(3, 2, 3, 2)));
    }
  }
  amx_rows_strip_scales(st.sc, w.scales + s * ng * 16, K, G);
  amx_rows_strip_scales(st.mn, w.mins + s * ng * 16, K, G);
}

// The same for an INT8 copy: 16 rows of K codes.
inline void amx_rows_decode_strip_int8(AmxExactStrip& st, const uint8_t* packed, int64_t N, int64_t K, int G,
                                       int64_t n0) {
  const int64_t nb = K / 32, ng = K / G, s = n0 / 16;
  st.codes = st.buf;
  st.stride = K;
  const uint8_t* src = packed + s * nb * 512;
  for (int64_t b = 0; b < nb; ++b, src += 512) {
    __m512i z[8], x[8];
    for (int j = 0; j < 8; ++j) z[j] = _mm512_loadu_si512(src + 64 * j);
    amx_rows_tile_to_rows(z, x);
    uint8_t* o = st.buf + b * 32;
    for (int i = 0; i < 8; ++i) {
      const int64_t n = i < 4 ? i : i + 4;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + n * K), _mm512_castsi512_si256(x[i]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + (n + 4) * K), _mm512_extracti64x4_epi64(x[i], 1));
    }
  }
  const half_t* sc = reinterpret_cast<const half_t*>(packed + amx_rows_int8_codes_bytes(N, K));
  amx_rows_strip_scales(st.sc, sc + s * ng * 16, K, G);
}

// int4_gemm_amx_exact / int8_gemm_amx_exact on the copy: the same bits (any M; used from 9 / 13 rows).
template <class T>
bool amx_rows_exact_int4(T* out, const T* a, int64_t a_stride, const uint8_t* packed, const T* bias, int64_t M,
                         int64_t N, int64_t K, int G) {
  return amx_exact_gemm_int4(out, a, a_stride, bias, M, N, K, [&](AmxExactStrip& st, int64_t n0) {
    amx_rows_decode_strip_int4(st, packed, N, K, G, n0);
  });
}

template <class T>
bool amx_rows_exact_int8(T* out, const T* a, int64_t a_stride, const uint8_t* packed, const T* bias, int64_t M,
                         int64_t N, int64_t K, int G) {
  return amx_exact_gemm_int8(out, a, a_stride, bias, M, N, K, [&](AmxExactStrip& st, int64_t n0) {
    amx_rows_decode_strip_int8(st, packed, N, K, G, n0);
  });
}

#undef DK_AMX_ROWS_PRODUCT

#endif  // DK_AMX_EXACT_GEMM

}  // namespace cpu
}  // namespace dk
