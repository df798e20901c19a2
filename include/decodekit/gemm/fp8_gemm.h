// fp8 e4m3 W8A8 (CPU kernels, torch-free): dynamic per-token activation quantization and the
// fp8 x fp8 GEMM with per-token and per-output-channel scales. Per-element logic (the e4m3
// conversions, the dynamic scale) is common/fp8.h's, shared with the CUDA kernels
// (gemm/fp8_gemm.cuh) and mirrored by the torch reference.
//
//   quantize_fp8:  scale[m] = fp8_dynamic_scale(max_k |x[m, k]|),  q[m, k] = fp8(x[m, k] / scale[m])
//   fp8_gemm:      out[m, n] = (sum_k float(a[m, k]) * float(w[n, k])) * a_scale[m] * w_scale[n] + bias[n]
//                  (products exact in fp32, fp32 sums; one rounding to T at the store)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"
#include "decodekit/common/macros.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
#include <immintrin.h>
#define DK_FP8_GEMM_AVX512 1
#include "decodekit/gemm/int4_tiled_bf16.h"  // DK_TILED_QUANT_BF16: 9+ rows as bf16 products (exact here)
#else
#include "decodekit/common/avx2.h"  // DK_AVX2: the 8-lane version of the same kernel
#endif

namespace dk::cpu {

// The 256 e4m3 codes as floats.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = fp8_e4m3_to_float(uint8_t(i));
  }
};
inline const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

template <class T>
void quantize_fp8(uint8_t* q,            // [M, K] e4m3 codes, contiguous
                  float* scale,          // [M]
                  const T* x,            // [M, K], row stride x_stride
                  int64_t M, int64_t K, int64_t x_stride) {
  DK_OMP_PARALLEL_FOR_IF(M * K >= kParallelGrain)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * x_stride;
    float amax = 0.f;
    bool nan = false;
    for (int64_t k = 0; k < K; ++k) {
      const float v = to_float(row[k]);
      nan |= v != v;
      amax = std::max(amax, std::fabs(v));
    }
    const float s = fp8_dynamic_scale(nan ? NAN : amax);
    scale[m] = s;
    for (int64_t k = 0; k < K; ++k) q[m * K + k] = quantize_fp8_e4m3(to_float(row[k]), s);
  }
}

#if defined(DK_FP8_GEMM_AVX512)
constexpr int64_t kFp8DotLanes = 16;
// 16 e4m3 codes -> fp32 times 2^-8, exactly: the code's sign, exponent and mantissa moved into
// fp16 fields ((b & 0x80) << 8 | (b & 0x7f) << 7) make an fp16 of value x * 2^-8 (normals and
// subnormals alike, since e4m3's exponent range fits fp16's), widened by vcvtph2ps. (The NaN
// codes come out as 480 * 2^-8; the quantizers never produce them from finite inputs, and a NaN
// input row has a NaN scale, which the epilogue propagates.)
// fp8_lanes_to_ps_scaled: one code a 32-bit lane (0..255).
DK_FORCE_INLINE __m512 fp8_lanes_to_ps_scaled(__m512i b) {
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 8);
  const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7f)), 7);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_or_si512(sign, mag)));
}
inline __m512 fp8x16_to_ps_scaled(const uint8_t* p) {
  return fp8_lanes_to_ps_scaled(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Rows m0 .. m0 + MM of out for weight row n: sum_k af[m][k] * w[k] * 2^-8 with 16-wide FMAs.
template <int MM>
inline void fp8_dot_rows(const float* af, int64_t K, const uint8_t* wr, float* res) {  // K % kFp8DotLanes == 0
  __m512 acc[MM];
  for (int r = 0; r < MM; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 w = fp8x16_to_ps_scaled(wr + k);
    for (int r = 0; r < MM; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(af + r * K + k), w, acc[r]);
  }
  for (int r = 0; r < MM; ++r) res[r] = _mm512_reduce_add_ps(acc[r]) * 256.f;
}
#if defined(DK_TILED_QUANT_BF16)
// 9+ rows on AVX512-BF16: e4m3 values are exact in bf16 (4 significant bits, exponents in range), so VDPBF16PS's
// products are the exact products of the rows kernel above and only the order of the fp32 sums differs; codes are
// taken as bf16 x 2^-8 (fp8x16_to_ps_scaled's trick), the sums scaled back by 2^16 (exact), then the same
// epilogue (sum * a_scale * w_scale + bias, one rounding to T). int4_tiled_bf16.h's tiling: 1.8-1.9x the fp32
// FMA rate. Rows 1 .. 8 keep the rows kernel (a row's bits there do not depend on the row count).
constexpr int64_t kFp8TiledMinM = 9;

// bp[(k - k0) / 2][j] = the pair (w[n0 + j, k], w[n0 + j, k + 1]) as bf16 x 2^-8, zeros for rows past N.
inline void tile_decode_fp8_bf16(uint32_t* bp,          // [kc / 2][NR]
                                 const uint8_t* w,      // [N, K] e4m3
                                 int64_t N, int64_t K, int64_t n0, int64_t k0, int64_t kc) {
  const __m512i byte = _mm512_set1_epi32(0xff);
  for (int h = 0; h < kTileNR / 16; ++h) {
    const int64_t nb = n0 + 16 * h;
    const TileRows rows(nb, N, K);
    const uint8_t* base = w + std::min(nb, N - 1) * K + k0;
    for (int64_t c = 0; c < kc; c += 4) {  // 4 codes of 16 rows a gather
      const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows.mask, rows.offsets, base + c, 1);
      __m512 f[4];
      for (int j = 0; j < 4; ++j) f[j] = fp8_lanes_to_ps_scaled(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), byte));
      _mm512_store_si512(bp + c / 2 * kTileNR + 16 * h, tile_bf16_pairs(f[0], f[1]));
      _mm512_store_si512(bp + (c / 2 + 1) * kTileNR + 16 * h, tile_bf16_pairs(f[2], f[3]));
    }
  }
}

template <class T>
bool fp8_gemm_tiled_bf16(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                         const T* bias, int64_t M, int64_t N, int64_t K) {
  if (!bf16_dot_enabled() || K % 32 != 0 || K == 0) return false;
  tiled_bf16_gemm(
      M, N, K, 32,
      [&](int64_t m0, int64_t rows, int64_t& lda) {  // the row block's codes as bf16 x 2^-8, in a thread buffer
        thread_local std::vector<bf16_t> buf;
        if (buf.size() < size_t(rows * K)) buf.resize(size_t(rows * K));
        for (int64_t i = 0; i < rows * K; i += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.data() + i),
                              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(fp8x16_to_ps_scaled(a + m0 * K + i))));
        lda = K;
        return buf.data();
      },
      [](int64_t, int, float* init) { std::fill(init, init + kTileNR, 0.f); },
      [&](uint32_t* bp, int64_t n0, int64_t k0, int64_t kc) { tile_decode_fp8_bf16(bp, w, N, K, n0, k0, kc); },
      [&](int64_t m0, int64_t rows, int64_t n0, int cols, const float* cb) {
        for (int64_t r = 0; r < rows; ++r)
          for (int j = 0; j < cols; ++j) {
            const float sum = cb[r * kTileNR + j] * 65536.f;  // the exact products' fp32 sum, unscaled
            const float b = bias ? to_float(bias[n0 + j]) : 0.f;
            out[(m0 + r) * N + n0 + j] = from_float<T>(sum * a_scale[m0 + r] * w_scale[n0 + j] + b);
          }
      });
  return true;
}
#endif
#elif defined(DK_AVX2)
constexpr int64_t kFp8DotLanes = 8;
// fp8x16_to_ps_scaled on 8 codes (AVX2 without AVX-512).
inline __m256 fp8x8_to_ps_scaled(const uint8_t* p) {
  const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8);
  const __m128i mag = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7f)), 7);
  return _mm256_cvtph_ps(_mm_or_si128(sign, mag));
}

template <int MM>
inline void fp8_dot_rows(const float* af, int64_t K, const uint8_t* wr, float* res) {
  __m256 acc[MM];
  for (int r = 0; r < MM; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 w = fp8x8_to_ps_scaled(wr + k);
    for (int r = 0; r < MM; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(af + r * K + k), w, acc[r]);
  }
  for (int r = 0; r < MM; ++r) res[r] = hsum8(acc[r]) * 256.f;
}
#endif

template <class T>
void fp8_gemm(T* out,                 // [M, N]
              const uint8_t* a,       // [M, K] e4m3, contiguous
              const float* a_scale,   // [M]
              const uint8_t* w,       // [N, K] e4m3, contiguous
              const float* w_scale,   // [N]
              const T* bias,          // [N] or null
              int64_t M, int64_t N, int64_t K) {
#if defined(DK_TILED_QUANT_BF16)
  if (M >= kFp8TiledMinM && fp8_gemm_tiled_bf16(out, a, a_scale, w, w_scale, bias, M, N, K)) return;
#endif
  const float* lut = fp8_table().v;
  std::vector<float> af(size_t(M * K));  // activations decoded once
  for (int64_t i = 0; i < M * K; ++i) af[size_t(i)] = lut[a[i]];
  constexpr int64_t kRows = 4;  // activation rows per pass over a decoded weight row
#pragma omp parallel if (N * K * M >= kParallelGrain)
  {
    std::vector<float> wf(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = w + n * K;
      const float ws = w_scale[n];
      const float b = bias ? to_float(bias[n]) : 0.f;
#if defined(DK_FP8_GEMM_AVX512) || defined(DK_AVX2)
      if (K % kFp8DotLanes == 0) {  // codes widened in registers; each weight row read once per 4 rows of a
        for (int64_t m0 = 0; m0 < M; m0 += kRows) {
          const int64_t mm = std::min(kRows, M - m0);
          float acc[kRows];
          const float* a0 = &af[size_t(m0 * K)];
          switch (mm) {
            case 1: fp8_dot_rows<1>(a0, K, wr, acc); break;
            case 2: fp8_dot_rows<2>(a0, K, wr, acc); break;
            case 3: fp8_dot_rows<3>(a0, K, wr, acc); break;
            default: fp8_dot_rows<4>(a0, K, wr, acc); break;
          }
          for (int64_t r = 0; r < mm; ++r)
            out[(m0 + r) * N + n] = from_float<T>(acc[r] * a_scale[m0 + r] * ws + b);
        }
        continue;
      }
#endif
      for (int64_t k = 0; k < K; ++k) wf[size_t(k)] = lut[wr[k]];
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int64_t mm = std::min(kRows, M - m0);
        float acc[kRows] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t r = 0; r < mm; ++r) {
          const float* ar = &af[size_t((m0 + r) * K)];
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t k = 0; k < K; ++k) s += ar[k] * wf[size_t(k)];
          acc[r] = s;
        }
        for (int64_t r = 0; r < mm; ++r)
          out[(m0 + r) * N + n] = from_float<T>(acc[r] * a_scale[m0 + r] * ws + b);
      }
    }
  }
}

}  // namespace dk::cpu
