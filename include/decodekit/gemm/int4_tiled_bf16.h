// INT4 / INT8 weight-only GEMM for bf16 activations on CPUs with AVX512-BF16 but no AMX tile unit (AMD Zen 4 /
// Zen 5; Intel Cooper Lake; Sapphire Rapids with DECODEKIT_CPU_AMX=0): int4_tiled.h's BLIS-style tiling with
// bf16 products, VDPBF16PS (two bf16 x bf16 products a lane into fp32), twice the fp32 FMA's multiply-adds per
// instruction, so bf16 prefill is no longer bound by fp32 FMAs.
//
// Semantics: quant_amx.h's, out = bf16(sum_k a[m, k] * bf16(w[n, k]) + bias[n]) with w[n, k] the fp32 decoded
// weight (scale * q + min, one rounding; INT8 scale * q, exact) rounded to bf16 (RNE), the products exact in
// fp32 and summed in fp32 in the hardware's order (VDPBF16PS: denormal inputs read as zero), bias added in fp32,
// one rounding of the output: a bf16 model computes the same thing on either kind of CPU, up to the order of
// the fp32 sums. Used from kTiledVectorMinM rows (fewer rows keep the GEMV arithmetic).
//
// Panel: 32 output columns x kc of K decoded once as bf16 pairs, bp[k / 2][j] = (w[n0 + j, k], w[n0 + j, k + 1])
// (the low half the even k), 16 KB at kc = 256; the micro-kernel (MR = 12 rows x NR = 32 columns, 24 fp32
// accumulators) broadcasts a row's (a[k], a[k + 1]) pair straight from the bf16 rows of a.
// DECODEKIT_CPU_BF16_DOT=0 turns it off (the fp32 tiled kernel then serves bf16, as before).
#pragma once
#include <cstdlib>
#include <cstring>

#include "decodekit/common/avx512.h"  // lanes_mask, store16
#include "decodekit/gemm/int4_tiled.h"

#if defined(DK_TILED_QUANT_AVX512) && defined(DK_AVX512_LOAD_STORE16) && defined(__AVX512BF16__)
#define DK_TILED_QUANT_BF16 1
#endif

namespace dk {
namespace cpu {

#if defined(DK_TILED_QUANT_BF16)

inline bool bf16_dot_enabled() {
  static const bool ok = [] {
    const char* env = std::getenv("DECODEKIT_CPU_BF16_DOT");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return ok;
}

// 16 columns' fp32 values of k (x0) and k + 1 (x1) as 16 bf16 pairs (RNE), x0 in each dword's low half.
DK_FORCE_INLINE __m512i tile_bf16_pairs(__m512 x0, __m512 x1) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0)));
}

// c[r][:] = init[:] + sum_k a[r][k] * bp[k][:] (init: c itself when null) for R rows, kc even.
template <int R>
inline void tile_kernel_bf16(float* c,             // [R][NR], row stride ldc
                             int64_t ldc,
                             const bf16_t* a,      // [R][kc], row stride lda (k0 even)
                             int64_t lda,
                             const uint32_t* bp,   // [kc / 2][NR] bf16 pairs
                             int64_t kc,
                             const float* init) {  // [NR] or null
  __m512 c0[R], c1[R];
  tile_acc_load(c0, c1, c, ldc, init);
  for (int64_t p = 0; p < kc / 2; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + p * kTileNR));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + p * kTileNR + 16));
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, 4);
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
    }
  }
  tile_acc_store(c0, c1, c, ldc);
}

inline void tile_kernel_bf16_rows(int rows, float* c, int64_t ldc, const bf16_t* a, int64_t lda, const uint32_t* bp,
                                  int64_t kc, const float* init) {
  rows_switch<kTileMR>(rows, [&](auto R) { tile_kernel_bf16<decltype(R)::value>(c, ldc, a, lda, bp, kc, init); });
}

// bp[(k - k0) / 2][j] = the bf16 pair (w[n0 + j, k], w[n0 + j, k + 1]) for even k in [k0, k0 + kc), j < NR
// (zeros for rows past N): tile_decode_int4's values, rounded to bf16 in pairs (c and G / 2 are even).
inline void tile_decode_int4_bf16(uint32_t* bp,            // [kc / 2][NR]
                                  const uint8_t* qweight,  // [N, K / 2]
                                  const half_t* scales,    // [N, K / G]
                                  const half_t* mins,      // [N, K / G]
                                  int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  tile_decode_int4_each(qweight, scales, mins, N, K, G, n0, k0, kc,
                        [&](int h, int64_t lo_k, int64_t hi_k, const __m512 (&lo)[4], const __m512 (&hi)[4]) {
                          uint32_t* p = bp + 16 * h;
                          for (int j = 0; j < 4; j += 2) {
                            _mm512_store_si512(p + (lo_k + j) / 2 * kTileNR, tile_bf16_pairs(lo[j], lo[j + 1]));
                            _mm512_store_si512(p + (hi_k + j) / 2 * kTileNR, tile_bf16_pairs(hi[j], hi[j + 1]));
                          }
                        });
}

inline void tile_decode_int8_bf16(uint32_t* bp,           // [kc / 2][NR]
                                  const int8_t* qweight,  // [N, K]
                                  const half_t* scales,   // [N, K / G]
                                  int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  tile_decode_int8_each(qweight, scales, N, K, G, n0, k0, kc, [&](int h, int64_t c, const __m512 (&w)[4]) {
    _mm512_store_si512(bp + c / 2 * kTileNR + 16 * h, tile_bf16_pairs(w[0], w[1]));
    _mm512_store_si512(bp + (c + 2) / 2 * kTileNR + 16 * h, tile_bf16_pairs(w[2], w[3]));
  });
}

// int4_tiled.h's task loop with bf16 products: a_rows(m0, rows, lda) the task's rows of a as bf16 (row stride
// lda), init(n0, cols, init) the accumulators' start, decode(bp, n0, k0, kc) each K block's bf16-pair panel, and
// store(m0, rows, n0, cols, cb) the strip's fp32 sums cb [rows][NR].
template <class ARows, class Init, class Decode, class Store>
void tiled_bf16_gemm(int64_t M, int64_t N, int64_t K, int G, ARows a_rows, Init init_fn, Decode decode, Store store) {
  tiled_gemm_tasks<uint32_t, 2>(
      TilePlan(M, N, K, G, kTileMR, kTileNR), kTileMR, kTileNR, M, N, K, a_rows, init_fn,
      [](int64_t, int64_t, int, float* cb, int64_t&) { return cb; }, decode,
      [](int rows, float* c, int64_t ldc, const bf16_t* ar, int64_t lda, const uint32_t* bp, int64_t kc,
         const float* init) { tile_kernel_bf16_rows(rows, c, ldc, ar, lda, bp, kc, init); },
      store);
}

// out[m, n] = bf16(sum_k a[m, k] * bf16(w[n, k]) + bias[n]) with decode(bp, n0, k0, kc) writing the panel.
// False (nothing written) when turned off.
template <class Decode>
bool tiled_quant_gemm_bf16(bf16_t* out,         // [M, N]
                           const bf16_t* a,     // [M, K], row stride a_stride
                           int64_t a_stride,
                           const bf16_t* bias,  // [N] or null
                           int64_t M, int64_t N, int64_t K, int G, Decode decode) {
  if (!bf16_dot_enabled() || K % 32 != 0) return false;
  tiled_bf16_gemm(
      M, N, K, G,
      [&](int64_t m0, int64_t, int64_t& lda) {
        lda = a_stride;
        return a + m0 * a_stride;
      },
      [&](int64_t n0, int cols, float* init) {
        for (int j = 0; j < kTileNR; ++j) init[j] = bias && j < cols ? to_float(bias[n0 + j]) : 0.f;
      },
      decode,
      [&](int64_t m0, int64_t rows, int64_t n0, int cols, const float* cb) {
        const __mmask16 m0s = lanes_mask(std::min(cols, 16)), m1s = lanes_mask(std::max(cols - 16, 0));
        for (int64_t r = 0; r < rows; ++r) {  // one rounding to bf16 (store16: float_to_bf16's RNE)
          store16(out + (m0 + r) * N + n0, _mm512_loadu_ps(cb + r * kTileNR), m0s);
          if (cols > 16) store16(out + (m0 + r) * N + n0 + 16, _mm512_loadu_ps(cb + r * kTileNR + 16), m1s);
        }
      });
  return true;
}

inline bool int4_gemm_tiled_bf16(bf16_t* out, const bf16_t* a, int64_t a_stride, const uint8_t* qweight,
                                 const half_t* scales, const half_t* mins, const bf16_t* bias, int64_t M, int64_t N,
                                 int64_t K, int G) {
  return tiled_quant_gemm_bf16(out, a, a_stride, bias, M, N, K, G,
                               [&](uint32_t* bp, int64_t n0, int64_t k0, int64_t kc) {
                                 tile_decode_int4_bf16(bp, qweight, scales, mins, N, K, G, n0, k0, kc);
                               });
}

inline bool int8_gemm_tiled_bf16(bf16_t* out, const bf16_t* a, int64_t a_stride, const int8_t* qweight,
                                 const half_t* scales, const bf16_t* bias, int64_t M, int64_t N, int64_t K, int G) {
  return tiled_quant_gemm_bf16(out, a, a_stride, bias, M, N, K, G,
                               [&](uint32_t* bp, int64_t n0, int64_t k0, int64_t kc) {
                                 tile_decode_int8_bf16(bp, qweight, scales, N, K, G, n0, k0, kc);
                               });
}

#endif  // DK_TILED_QUANT_BF16

}  // namespace cpu
}  // namespace dk
