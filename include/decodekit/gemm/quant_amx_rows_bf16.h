// bf16 activations on a weight held as the CPU's AMX copy (amx_rows_layout.h), so that bf16 models hold one copy
// of each INT4 / INT8 weight, as float32 / float16 models do, and decode on the few-row kernels:
//   1 .. kAmxRowsDispatchM rows (INT8: kAmxRowsInt8MaxM): quant_amx_rows.h's kernels (bf16 -> fp32 is exact, so a
//     bf16 row gets quant_amx_exact.h's semantics, as a float32 row holding the same values);
//   more rows: quant_amx.h's AMX-bf16 GEMM (bf16 products of the decoded weights), its 32-row strips decoded from
//     the copy here, bit for bit amx_decode_int4 / amx_decode_int8 on int4.h's layout: fma(q, d, m) (INT8: d q,
//     exact) in fp32, one rounding to bf16 (RNE); rows past N are the copy's zero codes and scales, i.e. zeros.
// A bf16 row's outputs then do not depend on how many rows come with it up to the few-row limit (decoding and
// speculative verification of up to 12 rows agree bit for bit); past it they are quant_amx.h's as before.
#pragma once
#include <cstdint>
#include <vector>

#include "decodekit/gemm/quant_amx_rows.h"

namespace dk {
namespace cpu {

#if defined(DK_AMX_EXACT_GEMM) && defined(DK_AMX_QUANT_GEMM)

// The thread's fp32 block scales (and mins) of a 16-row strip of the copy: [16][K / 32] each.
inline float* amx_rows_bf16_scale_buffer(int64_t K) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(32 * (K / 32) + 16)) buf.resize(size_t(32 * (K / 32) + 16));
  return buf.data();
}

// Weight rows n0 .. n0 + 31 (n0 % 32 == 0: copy strips n0 / 16, n0 / 16 + 1) as bf16, row-major: wp[j][k].
inline void amx_rows_decode_bf16_int4(uint16_t* wp,            // [32][K]
                                      const uint8_t* packed,   // [amx_rows_packed_bytes(N, K, G)]
                                      int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t nb = K / 32, ng = K / G;
  const AmxRowsWeight w(packed, N, K, G);
  float* sc = amx_rows_bf16_scale_buffer(K);
  float* mn = sc + 16 * nb;
  for (int h = 0; h < 2; ++h) {
    const int64_t s = n0 / 16 + h;
    amx_rows_strip_scales(sc, w.scales + s * ng * 16, K, G);
    amx_rows_strip_scales(mn, w.mins + s * ng * 16, K, G);
    const uint8_t* src = w.codes + s * nb * 256;
    uint16_t* dst = wp + 16 * h * K;
    for (int64_t b = 0; b < nb; ++b, src += 256) {
      __m512i x[8];
      amx_rows_int4_block_rows(src, x);  // x[i]: rows n, n + 4 (n = i < 4 ? i : i + 4), 32 codes each
      for (int i = 0; i < 8; ++i)
        for (int u = 0; u < 2; ++u) {
          const int64_t n = (i < 4 ? i : i + 4) + 4 * u;
          const __m256i q = u ? _mm512_extracti64x4_epi64(x[i], 1) : _mm512_castsi512_si256(x[i]);
          const __m512 d = _mm512_set1_ps(sc[n * nb + b]), m = _mm512_set1_ps(mn[n * nb + b]);
          const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))), d, m);
          const __m512 hi =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1))), d, m);
          _mm512_storeu_si512(dst + n * K + 32 * b, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
        }
    }
  }
}

// The same for an INT8 copy (d q exact in fp32, one rounding to bf16).
inline void amx_rows_decode_bf16_int8(uint16_t* wp,           // [32][K]
                                      const uint8_t* packed,  // [amx_rows_int8_packed_bytes(N, K, G)]
                                      int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t nb = K / 32, ng = K / G;
  const half_t* scales = reinterpret_cast<const half_t*>(packed + amx_rows_int8_codes_bytes(N, K));
  float* sc = amx_rows_bf16_scale_buffer(K);
  for (int h = 0; h < 2; ++h) {
    const int64_t s = n0 / 16 + h;
    amx_rows_strip_scales(sc, scales + s * ng * 16, K, G);
    const uint8_t* src = packed + s * nb * 512;
    uint16_t* dst = wp + 16 * h * K;
    for (int64_t b = 0; b < nb; ++b, src += 512) {
      __m512i z[8], x[8];
      for (int j = 0; j < 8; ++j) z[j] = _mm512_loadu_si512(src + 64 * j);
      amx_rows_tile_to_rows(z, x);
      for (int i = 0; i < 8; ++i)
        for (int u = 0; u < 2; ++u) {
          const int64_t n = (i < 4 ? i : i + 4) + 4 * u;
          const __m256i q = u ? _mm512_extracti64x4_epi64(x[i], 1) : _mm512_castsi512_si256(x[i]);
          const __m512 d = _mm512_set1_ps(sc[n * nb + b]);
          const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
          const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
          _mm512_storeu_si512(dst + n * K + 32 * b, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
        }
    }
  }
}

// int4_gemm_amx / int8_gemm_amx on the copy: the same bits (any M; used past the few-row kernels).
inline bool amx_rows_bf16_int4(bf16_t* out, const bf16_t* a, int64_t a_stride, const uint8_t* packed,
                               const bf16_t* bias, int64_t M, int64_t N, int64_t K, int G) {
  return amx_quant_gemm(out, a, a_stride, bias, M, N, K, [&](uint16_t* wp, int64_t n0) {
    amx_rows_decode_bf16_int4(wp, packed, N, K, G, n0);
  });
}

inline bool amx_rows_bf16_int8(bf16_t* out, const bf16_t* a, int64_t a_stride, const uint8_t* packed,
                               const bf16_t* bias, int64_t M, int64_t N, int64_t K, int G) {
  return amx_quant_gemm(out, a, a_stride, bias, M, N, K, [&](uint16_t* wp, int64_t n0) {
    amx_rows_decode_bf16_int8(wp, packed, N, K, G, n0);
  });
}

#endif  // DK_AMX_EXACT_GEMM && DK_AMX_QUANT_GEMM

}  // namespace cpu
}  // namespace dk
