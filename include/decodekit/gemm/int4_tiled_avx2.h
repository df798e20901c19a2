// The tiled INT4 / INT8 GEMM's (int4_tiled.h) panel decode and micro-kernel for CPUs with AVX2 + FMA
// + F16C but no AVX-512: NR = 16 output columns (two 8-wide vectors), MR = 6 rows of `a` broadcast,
// 12 fp32 accumulators (the BLIS Haswell shape: 12 accumulators + 2 weight vectors + 1 broadcast
// fill the 16 vector registers). The decoded values are int4_dequantize's exactly (scale * q + min
// in fp32, one rounding; INT8 scale * q, exact), as in the AVX-512 version.
#pragma once
#include <algorithm>
#include <cstdint>

#include "decodekit/common/avx2.h"
#include "decodekit/common/dtype.h"

namespace dk {
namespace cpu {

#if defined(DK_AVX2)

constexpr int kTileMR = 6;           // rows of a per micro-kernel (broadcast)
constexpr int kTileNR = 16;          // output columns per micro-kernel (two 8-wide vectors)
constexpr int64_t kTileKC = 256;     // K per decoded panel: kTileKC * kTileNR * 4 B = 16 KB

// c[r][:] = init[:] + sum_k a[r][k] * bp[k][:] (init: c itself when null) for the R rows of one block.
template <int R>
inline void tile_kernel(float* c,             // [R][NR], row stride ldc
                        int64_t ldc,
                        const float* a,       // [R][kc], row stride lda
                        int64_t lda,
                        const float* bp,      // [kc][NR], 32-byte aligned
                        int64_t kc,
                        const float* init) {  // [NR] or null
  __m256 c0[R], c1[R];
  for (int r = 0; r < R; ++r) {
    c0[r] = _mm256_loadu_ps(init ? init : c + r * ldc);
    c1[r] = _mm256_loadu_ps(init ? init + 8 : c + r * ldc + 8);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(bp + k * kTileNR), b1 = _mm256_load_ps(bp + k * kTileNR + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, c0[r]);
    _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
  }
}

inline void tile_kernel_rows(int rows, float* c, int64_t ldc, const float* a, int64_t lda, const float* bp,
                             int64_t kc, const float* init) {
  switch (rows) {  // compile-time row counts keep the accumulators in registers
    case 1: return tile_kernel<1>(c, ldc, a, lda, bp, kc, init);
    case 2: return tile_kernel<2>(c, ldc, a, lda, bp, kc, init);
    case 3: return tile_kernel<3>(c, ldc, a, lda, bp, kc, init);
    case 4: return tile_kernel<4>(c, ldc, a, lda, bp, kc, init);
    case 5: return tile_kernel<5>(c, ldc, a, lda, bp, kc, init);
    default: return tile_kernel<kTileMR>(c, ldc, a, lda, bp, kc, init);
  }
}

// The 8 rows n0 .. n0 + 8 of half a strip: lanes past N masked off (their gathers read nothing and
// their scales are 0, so they decode to 0). offsets: each lane's row offset in bytes.
struct TileRows8 {
  int valid;
  __m256i mask, offsets;
  TileRows8(int64_t n0, int64_t N, int64_t row_bytes) {
    valid = int(std::clamp<int64_t>(N - n0, 0, 8));
    mask = lanes_mask8(valid);
    offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(int(row_bytes)));
  }
  // fp16 v[(n0 + j) * ld + g] as fp32 in lane j (0 past N)
  __m256 column(const half_t* v, int64_t n0, int64_t ld, int64_t g) const {
    alignas(32) float t[8] = {};
    for (int j = 0; j < valid; ++j) t[j] = _cvtsh_ss(v[(n0 + j) * ld + g].bits);
    return _mm256_load_ps(t);
  }
  __m256i gather(const void* p) const {  // 4 bytes at p + offsets[j] for the valid lanes
    return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), static_cast<const int*>(p), offsets, mask, 1);
  }
};

// bp[k - k0][j] = w[n0 + j, k] for k in [k0, k0 + kc), j < NR (0 for rows past N). Each gather
// fetches 4 code bytes of 8 rows: 8 decoded k of INT4 (4 low nibbles, 4 high), 4 of INT8.
inline void tile_decode_int4(float* bp,               // [kc][NR]
                             const uint8_t* qweight,  // [N, K / 2]
                             const half_t* scales,    // [N, K / G]
                             const half_t* mins,      // [N, K / G]
                             int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  const int64_t ng = K / G;
  const int half = G / 2;
  const __m256i low4 = _mm256_set1_epi32(15);
  for (int h = 0; h < kTileNR / 8; ++h) {
    const int64_t nb = n0 + 8 * h;
    const TileRows8 rows(nb, N, K / 2);
    const uint8_t* base = qweight + std::min(nb, N - 1) * (K / 2);
    for (int64_t g = k0 / G; g < (k0 + kc) / G; ++g) {
      const __m256 d = rows.column(scales, nb, ng, g), m = rows.column(mins, nb, ng, g);
      float* dst = bp + (g * G - k0) * kTileNR + 8 * h;
      for (int c = 0; c < half; c += 4) {  // bytes g*half + c .. +3: elements g*G + c + j (low), + half (high)
        const __m256i v = rows.gather(base + g * half + c);
        for (int j = 0; j < 4; ++j) {
          const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(v, 8 * j + 4), low4);
          // d * q + m: the product is exact, so the fused form rounds once, as int4_weight
          _mm256_store_ps(dst + (c + j) * kTileNR, _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), d, m));
          _mm256_store_ps(dst + (half + c + j) * kTileNR, _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), d, m));
        }
      }
    }
  }
}

inline void tile_decode_int8(float* bp,              // [kc][NR]
                             const int8_t* qweight,  // [N, K]
                             const half_t* scales,   // [N, K / G]
                             int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  const int64_t ng = K / G;
  for (int h = 0; h < kTileNR / 8; ++h) {
    const int64_t nb = n0 + 8 * h;
    const TileRows8 rows(nb, N, K);
    const int8_t* base = qweight + std::min(nb, N - 1) * K;
    for (int64_t g = k0 / G; g < (k0 + kc) / G; ++g) {
      const __m256 d = rows.column(scales, nb, ng, g);
      float* dst = bp + (g * G - k0) * kTileNR + 8 * h;
      for (int c = 0; c < G; c += 4) {
        const __m256i v = rows.gather(base + g * G + c);
        for (int j = 0; j < 4; ++j) {  // byte j, sign-extended; d * q is exact
          const __m256i q = _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * j), 24);
          _mm256_store_ps(dst + (c + j) * kTileNR, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
      }
    }
  }
}

#endif  // DK_AVX2

}  // namespace cpu
}  // namespace dk
