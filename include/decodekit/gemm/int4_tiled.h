// INT4 / INT8 weight-only GEMM for larger M on the CPU (AVX-512; AVX2 below), BLIS style: a panel of the
// weight (NR = 32 output columns x up to KC of K) is decoded ONCE into an fp32 buffer laid out
// k-major for the micro-kernel (32 KB: L1), then an MR x NR register-blocked micro-kernel
// (MR = 12 rows of `a` broadcast, two 16-wide weight vectors, 24 fp32 accumulators) runs it
// against every MR-row block of `a`. The decoded values are int4_dequantize's exactly
// (scale * q + min in fp32, one rounding; INT8 scale * q, exact), so this is an fp32 GEMM on the
// decoded weight; partial sums over K blocks stay in fp32.
//
// Work split: tasks = (block of <= mc rows of `a`, ~1 MB of them in fp32: L2) x (group of
// NR-column strips), handed out dynamically (the machine is shared). fp32 `a` is read in place;
// bf16 / fp16 rows are converted to fp32 into the thread's own buffer (again only when its next
// task is on another row block). fp32 outputs are written by the micro-kernel itself (partial
// sums of later K blocks accumulate there); other types go through an fp32 strip buffer.
// Needs AVX-512 F/BW/VL and F16C, or (without AVX-512) AVX2 + FMA + F16C, whose panel decode and
// micro-kernel (NR = 16, MR = 6) are in int4_tiled_avx2.h; either sets DK_TILED_QUANT_GEMM.
// Layouts: include/decodekit/gemm/int4.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"
#if defined(__AVX512F__)
#include <immintrin.h>

#include "decodekit/common/avx512.h"  // load16, lanes_mask
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define DK_TILED_QUANT_GEMM 1
#define DK_TILED_QUANT_AVX512 1
#else
#include "decodekit/gemm/int4_tiled_avx2.h"
#if defined(DK_AVX2)
#define DK_TILED_QUANT_GEMM 1
#endif
#endif

namespace dk {
namespace cpu {

#if defined(DK_TILED_QUANT_GEMM)
constexpr int64_t kTileABytes = 1 << 20;  // fp32 rows of a per task

// A 64-byte aligned view into a vector of floats (n usable elements).
inline float* tile_buffer(std::vector<float>& v, int64_t n) {
  v.resize(size_t(n + 16));
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
}

// rows of a as fp32 (row stride K): 16 lanes at a time where load16 is there (exact, as to_float; the scalar
// fp16 conversion cost an fp16 prefill ~30% of its time).
template <class T>
inline void tile_rows_to_float(float* af,      // [rows, K]
                               const T* a,     // [rows, K], row stride a_stride
                               int64_t a_stride, int64_t rows, int64_t K) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t k = 0;
#if defined(DK_AVX512_LOAD_STORE16)
    for (; k < K; k += 16) {
      const __mmask16 m = lanes_mask(K - k);
      _mm512_mask_storeu_ps(af + r * K + k, m, load16(a + r * a_stride + k, m));
    }
#endif
    for (; k < K; ++k) af[r * K + k] = to_float(a[r * a_stride + k]);
  }
}
#endif

#if defined(DK_TILED_QUANT_AVX512)
constexpr int kTileMR = 12;          // rows of a per micro-kernel (broadcast)
constexpr int kTileNR = 32;          // output columns per micro-kernel (two 16-wide vectors)
constexpr int64_t kTileKC = 256;     // K per decoded panel: kTileKC * kTileNR * 4 B = 32 KB

// A micro-kernel's 2R accumulators (rows of NR = 32 columns, row stride ldc): from init (all rows) or c itself.
template <int R>
DK_FORCE_INLINE void tile_acc_load(__m512 (&c0)[R], __m512 (&c1)[R], const float* c, int64_t ldc, const float* init) {
  for (int r = 0; r < R; ++r) {
    c0[r] = _mm512_loadu_ps(init ? init : c + r * ldc);
    c1[r] = _mm512_loadu_ps(init ? init + 16 : c + r * ldc + 16);
  }
}
template <int R>
DK_FORCE_INLINE void tile_acc_store(const __m512 (&c0)[R], const __m512 (&c1)[R], float* c, int64_t ldc) {
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, c0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, c1[r]);
  }
}

// c[r][:] = init[:] + sum_k a[r][k] * bp[k][:] (init: c itself when null) for the R rows of
// one block: 2R accumulators; per k two weight vectors and R broadcasts feed 2R FMAs.
template <int R>
inline void tile_kernel(float* c,             // [R][NR], row stride ldc
                        int64_t ldc,
                        const float* a,       // [R][kc], row stride lda
                        int64_t lda,
                        const float* bp,      // [kc][NR]
                        int64_t kc,
                        const float* init) {  // [NR] or null
  __m512 c0[R], c1[R];
  tile_acc_load(c0, c1, c, ldc, init);
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(bp + k * kTileNR), b1 = _mm512_load_ps(bp + k * kTileNR + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
    }
  }
  tile_acc_store(c0, c1, c, ldc);
}

inline void tile_kernel_rows(int rows, float* c, int64_t ldc, const float* a, int64_t lda, const float* bp,
                             int64_t kc, const float* init) {
  rows_switch<kTileMR>(rows, [&](auto R) { tile_kernel<decltype(R)::value>(c, ldc, a, lda, bp, kc, init); });
}

// The 16 rows n0 .. n0 + 16 of a strip: lanes past N masked off (their gathers read nothing and
// their scales are 0, so they decode to 0). offsets: each lane's row offset in bytes.
struct TileRows {
  __mmask16 mask;
  int valid;
  __m512i offsets;
  TileRows(int64_t n0, int64_t N, int64_t row_bytes) {
    valid = int(std::clamp<int64_t>(N - n0, 0, 16));
    mask = __mmask16((1u << valid) - 1);
    offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                 _mm512_set1_epi32(int(row_bytes)));
  }
  // t[j][i] = fp16 v[(n0 + j) * ld + g0 + i] as fp32 for i < n (<= 8), 0 for rows past N: each
  // row's groups of the panel converted at once; column(t, i) then reads group i of the 16 rows.
  void groups(float* t,  // [16][8]
              const half_t* v, int64_t n0, int64_t ld, int64_t g0, int n) const {
    const __mmask8 gm = __mmask8((1u << n) - 1);
    for (int j = 0; j < 16; ++j)
      _mm256_store_ps(t + j * 8, j < valid ? _mm256_cvtph_ps(_mm_maskz_loadu_epi16(gm, v + (n0 + j) * ld + g0))
                                           : _mm256_setzero_ps());
  }
  static __m512 column(const float* t, int i) {
    return _mm512_i32gather_ps(_mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120),
                               t + i, 4);
  }
};

// A panel's decoded weights, 4 code bytes of 16 rows a gather (lanes past N read nothing and decode to 0):
// emit(h, c, lo, hi) with lo[j] / hi[j] (j < 4) the fp32 weights of rows n0 + 16 h .. + 15 at element g G + c + j
// and g G + G / 2 + c + j (c relative to k0: group-split nibbles), each d q + m rounded once (as int4_weight).
template <class Emit>
DK_FORCE_INLINE void tile_decode_int4_each(const uint8_t* qweight,  // [N, K / 2]
                                           const half_t* scales,    // [N, K / G]
                                           const half_t* mins,      // [N, K / G]
                                           int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc,
                                           Emit emit) {
  const int64_t ng = K / G;
  const int half = G / 2;
  const __m512i low4 = _mm512_set1_epi32(15);
  for (int h = 0; h < kTileNR / 16; ++h) {
    const int64_t nb = n0 + 16 * h;
    const TileRows rows(nb, N, K / 2);
    const uint8_t* base = qweight + std::min(nb, N - 1) * (K / 2);
    alignas(64) float st[16 * 8], mt[16 * 8];  // the panel's scales / mins (kc / G <= 8 groups)
    rows.groups(st, scales, nb, ng, k0 / G, int(kc / G));
    rows.groups(mt, mins, nb, ng, k0 / G, int(kc / G));
    for (int64_t g = k0 / G; g < (k0 + kc) / G; ++g) {
      const __m512 d = TileRows::column(st, int(g - k0 / G)), m = TileRows::column(mt, int(g - k0 / G));
      for (int c = 0; c < half; c += 4) {  // bytes g*half + c .. +3: elements g*G + c + j (low), + half (high)
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows.mask, rows.offsets,
                                                      base + g * half + c, 1);
        __m512 lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {  // d * q + m: the product is exact, so the fused form rounds once
          lo[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), low4)), d, m);
          hi[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j + 4), low4)), d, m);
        }
        emit(h, g * G - k0 + c, g * G - k0 + half + c, lo, hi);
      }
    }
  }
}

// The same for INT8: emit(h, c, w) with w[j] the weights of element k0 + c + j (d q, exact).
template <class Emit>
DK_FORCE_INLINE void tile_decode_int8_each(const int8_t* qweight,  // [N, K]
                                           const half_t* scales,   // [N, K / G]
                                           int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc,
                                           Emit emit) {
  const int64_t ng = K / G;
  for (int h = 0; h < kTileNR / 16; ++h) {
    const int64_t nb = n0 + 16 * h;
    const TileRows rows(nb, N, K);
    const int8_t* base = qweight + std::min(nb, N - 1) * K;
    alignas(64) float st[16 * 8];  // the panel's scales (kc / G <= 8 groups)
    rows.groups(st, scales, nb, ng, k0 / G, int(kc / G));
    for (int64_t g = k0 / G; g < (k0 + kc) / G; ++g) {
      const __m512 d = TileRows::column(st, int(g - k0 / G));
      for (int c = 0; c < G; c += 4) {
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows.mask, rows.offsets,
                                                      base + g * G + c, 1);
        __m512 w[4];
        for (int j = 0; j < 4; ++j)  // byte j, sign-extended; d * q is exact
          w[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24)), d);
        emit(h, g * G - k0 + c, w);
      }
    }
  }
}

// bp[k - k0][j] = w[n0 + j, k] for k in [k0, k0 + kc), j < NR (0 for rows past N).
inline void tile_decode_int4(float* bp,               // [kc][NR]
                             const uint8_t* qweight,  // [N, K / 2]
                             const half_t* scales,    // [N, K / G]
                             const half_t* mins,      // [N, K / G]
                             int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  tile_decode_int4_each(qweight, scales, mins, N, K, G, n0, k0, kc,
                        [&](int h, int64_t lo_k, int64_t hi_k, const __m512 (&lo)[4], const __m512 (&hi)[4]) {
                          for (int j = 0; j < 4; ++j) {
                            _mm512_store_ps(bp + (lo_k + j) * kTileNR + 16 * h, lo[j]);
                            _mm512_store_ps(bp + (hi_k + j) * kTileNR + 16 * h, hi[j]);
                          }
                        });
}

inline void tile_decode_int8(float* bp,              // [kc][NR]
                             const int8_t* qweight,  // [N, K]
                             const half_t* scales,   // [N, K / G]
                             int64_t N, int64_t K, int G, int64_t n0, int64_t k0, int64_t kc) {
  tile_decode_int8_each(qweight, scales, N, K, G, n0, k0, kc, [&](int h, int64_t c, const __m512 (&w)[4]) {
    for (int j = 0; j < 4; ++j) _mm512_store_ps(bp + (c + j) * kTileNR + 16 * h, w[j]);
  });
}

#endif  // DK_TILED_QUANT_AVX512

#if defined(DK_TILED_QUANT_GEMM)
// The tasks of a tiled GEMM: (block of mc rows of a) x (group of per_group NR-column strips), K in blocks of kc.
struct TilePlan {
  int64_t strips, mc, nmb, per_group, groups, kc;
  bool parallel;
  TilePlan(int64_t M, int64_t N, int64_t K, int G, int MR, int NR) {
    strips = (N + NR - 1) / NR;
    parallel = M * N * K >= kParallelGrain;
#if defined(_OPENMP)
    const int64_t threads = parallel ? omp_get_max_threads() : 1;
#else
    const int64_t threads = 1;
#endif
    // row blocks of a: about kTileABytes of fp32 each, MR-aligned, as even as they can be
    const int64_t mc_max = std::max<int64_t>(MR, kTileABytes / (4 * K) / MR * MR);
    nmb = (M + mc_max - 1) / mc_max;
    // strip groups: ~4 per thread (balance on a shared machine); few strips: more row blocks
    per_group = std::max<int64_t>(1, strips / (4 * threads));
    groups = (strips + per_group - 1) / per_group;
    if (groups * nmb < threads) nmb = std::min((M + MR - 1) / MR, (threads + groups - 1) / groups);
    mc = ((M + nmb - 1) / nmb + MR - 1) / MR * MR;
    nmb = (M + mc - 1) / mc;
    // K blocks: as even as they can be, multiples of G
    const int64_t nkb = (K + kTileKC - 1) / kTileKC;
    kc = ((K + nkb - 1) / nkb + G - 1) / G * G;
  }
};

// The task loop of the tiled GEMMs (fp32 here, bf16 products in int4_tiled_bf16.h). Per task a_rows(m0, rows, lda)
// gives the task's rows of a (row stride lda; called once per row block and thread); per NR-column strip
// init(n0, cols, init) sets the accumulators' start and target(m0, n0, cols, cb, ldc) where the sums go (cb, the
// thread's [mc][NR] buffer, or out itself); each K block decode(bp, n0, k0, kc) writes the panel (Panel elements)
// and kernel(rows, c, ldc, a, lda, bp, kc, init) adds its products; store(m0, rows, n0, cols, c) ends the strip.
// kPack: k values a Panel element holds (fp32: 1, bf16 pairs: 2).
template <class Panel, int kPack, class ARows, class Init, class Target, class Decode, class Kernel, class Store>
void tiled_gemm_tasks(const TilePlan& plan, int MR, int NR, int64_t M, int64_t N, int64_t K, ARows a_rows, Init init_fn,
                      Target target, Decode decode, Kernel kernel, Store store) {
  static_assert(sizeof(Panel) == sizeof(float), "tiled_gemm_tasks: 4-byte panel elements");
#pragma omp parallel if (plan.parallel)
  {
  std::vector<float> bp_buf, c_buf, init_buf;  // this thread's panel, partial sums and bias strip
  Panel* bp = reinterpret_cast<Panel*>(tile_buffer(bp_buf, plan.kc / kPack * NR));
  float* cb = tile_buffer(c_buf, plan.mc * NR);
  float* init = tile_buffer(init_buf, NR);
  int64_t block = -1;  // the row block a_rows last gave
  decltype(a_rows(0, 0, std::declval<int64_t&>())) ab = nullptr;
  int64_t lda = 0;
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < plan.nmb * plan.groups; ++t) {
    const int64_t ib = t / plan.groups, m0 = ib * plan.mc, rows = std::min(plan.mc, M - m0);
    if (ib != block) ab = a_rows(m0, rows, lda);
    block = ib;
    const int64_t s1 = std::min(plan.strips, (t % plan.groups + 1) * plan.per_group);
    for (int64_t s = (t % plan.groups) * plan.per_group; s < s1; ++s) {
      const int64_t n0 = s * NR;
      const int cols = int(std::min<int64_t>(NR, N - n0));
      init_fn(n0, cols, init);
      int64_t ldc = NR;
      float* c = target(m0, n0, cols, cb, ldc);
      for (int64_t k0 = 0; k0 < K; k0 += plan.kc) {
        const int64_t kcur = std::min(plan.kc, K - k0);
        decode(bp, n0, k0, kcur);
        for (int64_t r0 = 0; r0 < rows; r0 += MR)
          kernel(int(std::min<int64_t>(MR, rows - r0)), c + r0 * ldc, ldc, ab + r0 * lda + k0, lda, bp, kcur,
                 k0 == 0 ? init : nullptr);
      }
      store(m0, rows, n0, cols, c);
    }
  }
  }
}

// out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n]) with decode(bp, n0, k0, kc) writing the
// decoded panel (tile_decode_int4 / _int8 bound to a weight). K a multiple of G (and of 4).
// fp32 a is read in place and full fp32 strips written by the micro-kernel itself; bf16 / fp16 rows are
// converted to fp32 once per row block and thread, other outputs go through the fp32 strip buffer.
template <class T, class Decode>
void tiled_quant_gemm(T* out,          // [M, N]
                      const T* a,      // [M, K], row stride a_stride
                      int64_t a_stride,
                      const T* bias,   // [N] or null
                      int64_t M, int64_t N, int64_t K, int G, Decode decode) {
  constexpr int MR = kTileMR, NR = kTileNR;
  constexpr bool f32 = std::is_same_v<T, float>;
  tiled_gemm_tasks<float, 1>(
      TilePlan(M, N, K, G, MR, NR), MR, NR, M, N, K,
      [&](int64_t m0, int64_t rows, int64_t& lda) -> const float* {
        if constexpr (f32) {
          lda = a_stride;
          return a + m0 * a_stride;
        } else {
          thread_local std::vector<float> buf;
          float* af = tile_buffer(buf, rows * K);
          tile_rows_to_float(af, a + m0 * a_stride, a_stride, rows, K);
          lda = K;
          return af;
        }
      },
      [&](int64_t n0, int cols, float* init) {
        for (int j = 0; j < NR; ++j) init[j] = bias && j < cols ? to_float(bias[n0 + j]) : 0.f;
      },
      [&](int64_t m0, int64_t n0, int cols, float* cb, int64_t& ldc) {
        if (!f32 || cols < NR) return cb;
        ldc = N;  // fp32 output, whole strip: the kernel writes out itself
        return reinterpret_cast<float*>(out) + m0 * N + n0;
      },
      decode,
      [](int rows, float* c, int64_t ldc, const float* ar, int64_t lda, const float* bp, int64_t kc,
         const float* init) { tile_kernel_rows(rows, c, ldc, ar, lda, bp, kc, init); },
      [&](int64_t m0, int64_t rows, int64_t n0, int cols, const float* c) {
        if (f32 && cols == NR) return;
        for (int64_t r = 0; r < rows; ++r)
          for (int j = 0; j < cols; ++j) out[(m0 + r) * N + n0 + j] = from_float<T>(c[r * NR + j]);
      });
}

template <class T>
void int4_gemm_tiled(T* out,                  // [M, N]
                     const T* a,              // [M, K], row stride a_stride
                     int64_t a_stride,
                     const uint8_t* qweight,  // [N, K / 2]
                     const half_t* scales,    // [N, K / G]
                     const half_t* mins,      // [N, K / G]
                     const T* bias,           // [N] or null
                     int64_t M, int64_t N, int64_t K, int G) {
  tiled_quant_gemm(out, a, a_stride, bias, M, N, K, G, [&](float* bp, int64_t n0, int64_t k0, int64_t kc) {
    tile_decode_int4(bp, qweight, scales, mins, N, K, G, n0, k0, kc);
  });
}

template <class T>
void int8_gemm_tiled(T* out,                 // [M, N]
                     const T* a,             // [M, K], row stride a_stride
                     int64_t a_stride,
                     const int8_t* qweight,  // [N, K]
                     const half_t* scales,   // [N, K / G]
                     const T* bias,          // [N] or null
                     int64_t M, int64_t N, int64_t K, int G) {
  tiled_quant_gemm(out, a, a_stride, bias, M, N, K, G, [&](float* bp, int64_t n0, int64_t k0, int64_t kc) {
    tile_decode_int8(bp, qweight, scales, N, K, G, n0, k0, kc);
  });
}
#endif

}  // namespace cpu
}  // namespace dk
