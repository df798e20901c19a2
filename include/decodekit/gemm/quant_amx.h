// INT4 / INT8 weight-only GEMM for bf16 activations on CPUs with AMX (Sapphire Rapids and later):
// the products run on the tile unit (TDPBF16PS: bf16 x bf16 products, fp32 accumulation), as the
// CUDA kernels run theirs on tensor cores. A 2-core Sapphire Rapids does ~270 GFLOP/s in fp32
// FMAs but over 1 TFLOP/s a core in AMX bf16, so a 32-sequence decode step stops being bound by
// the arithmetic and is bound by decoding the weights instead.
//
// Semantics: out = bf16(sum_k a[m, k] * bf16(w[n, k]) + bias[n]) with w[n, k] the fp32 decoded
// weight of int4_dequantize / int8_dequantize (scale * q + min, one rounding), rounded to bf16
// (RNE) for the tile unit, fp32 accumulation (the hardware's order), bias added in fp32, one
// rounding of the output. Only for bf16 activations (fp32 / fp16 activations run exact integer
// products on the AMX int8 unit instead: quant_amx_exact.h) and M >= kTiledQuantGemmMinM (1 .. 8
// rows keep the GEMV arithmetic, which speculative verification needs bit for bit).
//
// Work: tasks = (chunk of <= kAmxMC rows of a) x (strip of NR = 32 output columns). The tile unit
// computes the transpose, C[n][m] = sum_k W[n][k] A[m][k]: a task decodes its strip's 32 weight rows
// (whole K, row-major bf16, the A operand: tiles 4, 5 = rows 0..15, 16..31) once, and runs them
// against every 32-row block of its rows of a, which each thread packs once per chunk into the B
// layout ("VNNI": k pairs interleaved, tiles 6, 7 = rows 0..15, 16..31 of the block, zero rows past
// M); tiles 0..3 accumulate the 32 x 32 block over K in steps of 32, and the epilogue transposes it.
// Layouts: include/decodekit/gemm/int4.h. K a multiple of 32 (G is).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "decodekit/gemm/int4_tiled.h"

#include "decodekit/common/avx512.h"  // lanes_mask, load16, store16

#if defined(DK_TILED_QUANT_AVX512) && defined(DK_AVX512_LOAD_STORE16) && defined(__AMX_TILE__) && \
    defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define DK_AMX_QUANT_GEMM 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace dk {
namespace cpu {

#if defined(DK_AMX_QUANT_GEMM)
constexpr int64_t kAmxMC = 256;  // rows of a per task (a multiple of 32)

// Whether this process may use the tile registers: Linux hands out the 8 KB of tile state only on
// request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once for the whole process.
// DECODEKIT_CPU_AMX=0 turns the AMX path off (the fp32 tiled GEMM then serves bf16 too).
inline bool amx_enabled() {
  static const bool ok = [] {
    const char* env = std::getenv("DECODEKIT_CPU_AMX");
    if (env && std::strcmp(env, "0") == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// The tile shapes: every tile 16 rows x 64 bytes (C: 16 x 16 fp32; A: 16 x 32 bf16; B: 16 k-pairs
// x 16 columns x 2 bf16). Loaded by every thread that runs the kernel (the configuration is
// per-thread state, and other libraries in the process, oneDNN's AMX kernels, load their own).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};

// row(j, n, dst) for each weight row n = n0 + j (j < 32) of a strip, dst its K decoded values; rows
// past N are zeros.
template <class Row>
DK_FORCE_INLINE void amx_strip_rows(uint16_t* wp, int64_t N, int64_t K, int64_t n0, Row row) {
  for (int j = 0; j < 32; ++j) {
    if (n0 + j >= N) std::memset(wp + j * K, 0, size_t(K) * 2);
    else row(n0 + j, wp + j * K);
  }
}

// wp[j][k] = bf16(w[n0 + j, k]) for all k, j < 32 (rows past N: 0): row by row, 16 code bytes
// at a time (32 codes: the low nibbles are elements c .. c + 15 of a group, the high ones
// c + G / 2 ..), each d * q + m rounded once in fp32, then to bf16 (RNE).
inline void amx_decode_int4(uint16_t* wp,            // [32][K]
                            const uint8_t* qweight,  // [N, K / 2]
                            const half_t* scales,    // [N, K / G]
                            const half_t* mins,      // [N, K / G]
                            int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t ng = K / G;
  const int half = G / 2;
  const __m512i low4 = _mm512_set1_epi32(15);
  amx_strip_rows(wp, N, K, n0, [&](int64_t n, uint16_t* dst) {
    const uint8_t* q = qweight + n * (K / 2);
    alignas(64) float sc[16], mn[16];  // 16 groups' scales / mins: broadcast from memory below
    for (int64_t g = 0; g < ng; ++g) {
      if (g % 16 == 0) {
        const __mmask16 gm = lanes_mask(ng - g);
        _mm512_store_ps(sc, load16(scales + n * ng + g, gm));
        _mm512_store_ps(mn, load16(mins + n * ng + g, gm));
      }
      const __m512 d = _mm512_set1_ps(sc[g % 16]), m = _mm512_set1_ps(mn[g % 16]);
      for (int c = 0; c < half; c += 16) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * half + c)));
        const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low4)), d, m);
        const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m);
        if (half == 16) {  // G = 32: the two halves are adjacent, one conversion of both
          _mm512_storeu_si512(dst + g * G, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
          continue;
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * G + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * G + half + c),
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi)));
      }
    }
  });
}

inline void amx_decode_int8(uint16_t* wp,           // [32][K]
                            const int8_t* qweight,  // [N, K]
                            const half_t* scales,   // [N, K / G]
                            int64_t N, int64_t K, int G, int64_t n0) {
  const int64_t ng = K / G;
  amx_strip_rows(wp, N, K, n0, [&](int64_t n, uint16_t* dst) {
    const int8_t* q = qweight + n * K;
    alignas(64) float sc[16];
    for (int64_t g = 0; g < ng; ++g) {
      if (g % 16 == 0)
        _mm512_store_ps(sc, load16(scales + n * ng + g, lanes_mask(ng - g)));
      const __m512 d = _mm512_set1_ps(sc[g % 16]);
      for (int c = 0; c < G; c += 16) {  // d * q is exact in fp32
        const __m512 x = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * G + c)))), d);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * G + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
      }
    }
  });
}

// r[i] (16 dwords each) -> r[j][i] = old r[i][j]: a 16 x 16 transpose of 32-bit elements.
DK_FORCE_INLINE void transpose16_epi32(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of dwords
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8)  // 128-bit lanes: 8 x 8 blocks
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {  // 256-bit halves: 16 x 16
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// Rows m0 .. m0 + rows of a in the tile unit's B layout ("VNNI": k pairs interleaved), per block
// of 16 rows: ap[b][k / 2][i] = the bf16 pair (k, k + 1) of row m0 + 16 b + i (zeros past the last
// row). Per 16 rows x 32 k, the rows' 16 pairs (one vector a row) are transposed in registers so
// each pair row is one 64-byte store.
inline void amx_pack_rows(uint32_t* ap,        // [rows_pad / 16][K / 2][16] bf16 pairs
                          const bf16_t* a,     // [M, K], row stride a_stride
                          int64_t a_stride, int64_t m0, int64_t rows, int64_t rows_pad, int64_t K) {
  const int64_t pairs = K / 2;
  for (int64_t b = 0; b < rows_pad / 16; ++b)
    for (int64_t k = 0; k < K; k += 32) {
      __m512i v[16];
      for (int i = 0; i < 16; ++i)
        v[i] = b * 16 + i < rows ? _mm512_loadu_si512(a + (m0 + b * 16 + i) * a_stride + k) : _mm512_setzero_si512();
      transpose16_epi32(v);  // v[j]: pair j of the chunk for rows 0..15
      uint32_t* dst = ap + b * pairs * 16 + (k / 2) * 16;
      for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * 16, v[j]);
    }
}

// out[m, n] = bf16(sum_k a[m, k] * wb[n, k] (+ bias[n])) with decode(wp, n0) writing strip n0's
// decoded rows (amx_decode_int4 / _int8 bound to a weight). The tile unit computes the transpose,
// C[n][m] = sum_k W[n][k] A[m][k]: the weight rows are the A operand (row-major, as decoded) and the
// activations the B operand (packed once per row chunk). False when the tile unit is not available
// (the caller then runs the fp32 kernels).
template <class Decode>
bool amx_quant_gemm(bf16_t* out,         // [M, N]
                    const bf16_t* a,     // [M, K], row stride a_stride
                    int64_t a_stride,
                    const bf16_t* bias,  // [N] or null
                    int64_t M, int64_t N, int64_t K, Decode decode) {
  if (K % 32 != 0 || !amx_enabled()) return false;
  constexpr int NR = 32;
  const int64_t strips = (N + NR - 1) / NR;
  const int64_t nmb = (M + kAmxMC - 1) / kAmxMC;
  const int64_t mc = std::min<int64_t>(kAmxMC, (M + 31) / 32 * 32);
  const bool parallel = M * N * K >= kParallelGrain;
  const __m512i col_idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(32));
#pragma omp parallel if (parallel)
  {
  const AmxTileConfig cfg;
  _tile_loadconfig(&cfg);
  // this thread's decoded strip, packed rows of a and output block (64-byte aligned pieces of one
  // grow-only scratch buffer: no allocation or zero fill per call)
  const size_t wp_bytes = size_t(64 * K), ap_bytes = size_t(2 * mc * K), cb_bytes = 32 * 32 * 4;
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < wp_bytes + ap_bytes + cb_bytes + 64) scratch.resize(wp_bytes + ap_bytes + cb_bytes + 64);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  uint16_t* wp = reinterpret_cast<uint16_t*>(base);
  uint32_t* ap = reinterpret_cast<uint32_t*>(base + wp_bytes);
  float* cb = reinterpret_cast<float*>(base + wp_bytes + ap_bytes);
  int64_t packed = -1;  // the row chunk in ap
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < nmb * strips; ++t) {
    const int64_t ib = t / strips, m0 = ib * kAmxMC, rows = std::min(kAmxMC, M - m0);
    const int64_t rows_pad = (rows + 15) / 16 * 16;
    if (ib != packed) amx_pack_rows(ap, a, a_stride, m0, rows, rows_pad, K);
    packed = ib;
    const int64_t n0 = (t % strips) * NR;
    const int cols = int(std::min<int64_t>(NR, N - n0));
    decode(wp, n0);
    __mmask16 col_mask[2];
    __m512 bias_f[2];
    for (int h = 0; h < 2; ++h) {
      col_mask[h] = lanes_mask(std::max(cols - 16 * h, 0));
      bias_f[h] = bias ? load16(bias + n0 + 16 * h, col_mask[h]) : _mm512_setzero_ps();
    }
    for (int64_t r0 = 0; r0 < rows_pad; r0 += 32) {
      const bool two = r0 + 16 < rows_pad;  // a second block of 16 rows of a
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const uint32_t* b0 = ap + (r0 / 16) * (K / 2) * 16;
      for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, wp + k, K * 2);           // weight rows 0 .. 15
        _tile_loadd(5, wp + 16 * K + k, K * 2);  // weight rows 16 .. 31
        _tile_loadd(6, b0 + (k / 2) * 16, 64);   // rows r0 .. r0 + 15 of a
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (two) {
          _tile_loadd(7, b0 + (K / 2) * 16 + (k / 2) * 16, 64);
          _tile_dpbf16ps(2, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      // cb[j][i]: weight row j (0 .. 31) x row i of a (0 .. 31)
      _tile_stored(0, cb, 128);
      _tile_stored(1, cb + 16 * 32, 128);
      if (two) {
        _tile_stored(2, cb + 16, 128);
        _tile_stored(3, cb + 16 * 32 + 16, 128);
      }
      const int64_t rr = std::min<int64_t>(32, rows - r0);
      for (int64_t i = 0; i < rr; ++i) {  // + bias in fp32, one rounding to bf16 (from_float's, store16)
        bf16_t* o = out + (m0 + r0 + i) * N + n0;
        for (int h = 0; h < 2; ++h) {
          __m512 v = _mm512_i32gather_ps(col_idx, cb + 16 * h * 32 + i, 4);
          if (bias) v = _mm512_add_ps(v, bias_f[h]);
          store16(o + 16 * h, v, col_mask[h]);
        }
      }
    }
  }
  _tile_release();
  }
  return true;
}

inline bool int4_gemm_amx(bf16_t* out, const bf16_t* a, int64_t a_stride, const uint8_t* qweight,
                          const half_t* scales, const half_t* mins, const bf16_t* bias, int64_t M, int64_t N,
                          int64_t K, int G) {
  return amx_quant_gemm(out, a, a_stride, bias, M, N, K, [&](uint16_t* bp, int64_t n0) {
    amx_decode_int4(bp, qweight, scales, mins, N, K, G, n0);
  });
}

inline bool int8_gemm_amx(bf16_t* out, const bf16_t* a, int64_t a_stride, const int8_t* qweight,
                          const half_t* scales, const bf16_t* bias, int64_t M, int64_t N, int64_t K, int G) {
  return amx_quant_gemm(out, a, a_stride, bias, M, N, K, [&](uint16_t* bp, int64_t n0) {
    amx_decode_int8(bp, qweight, scales, N, K, G, n0);
  });
}
#endif  // DK_AMX_QUANT_GEMM

}  // namespace cpu
}  // namespace dk
