// Dense weight GEMM for small M on the CPU (decode): out[m, n] = sum_k a[m, k] w[n, k] + bias[n].
// Memory-bound at small M: each weight row is streamed once and dotted with all M rows of
// `a` (kept in L1). With AVX-512, bf16 and fp16 weights are widened to fp32 in registers (fp32 loaded
// as is) for fp32 FMAs in a register tile; without it a plain loop the compiler vectorizes.
#pragma once
#include <algorithm>
#include <cstdint>

#include "decodekit/common/avx512.h"  // load16, prefetch_row_ahead
#include "decodekit/common/dtype.h"
#include <vector>

namespace dk::cpu {

// Largest M handled here; above it the caller uses a blocked GEMM library (oneDNN/MKL).
constexpr int64_t kDenseGemvMaxM = 64;

// The CPU route of a dense fp32 / bf16 / fp16 projection of M rows (ops.linear and decoder_layer both take
// it from here, through the dense_route op, so the two agree bit for bit): dense_gemm for M in
// [dense_min_m, dense_max_m], an fp32 GEMM on upcast operands from upcast_min_m rows, torch's own
// GEMM (oneDNN / MKL) otherwise. Measured on 2 cores, SmolLM2's 1536x576 / 576x1536 weights from DRAM,
// dense_gemm with its software prefetch (us, dense_gemm vs torch's GEMM vs the fp32 upcast):
//  - bf16, CPUs with AVX512-BF16 (Zen 5 EPYC), where oneDNN's bf16 GEMM runs on vdpbf16ps: M = 1 71 vs
//    119 (68 vs 138), M = 8 101 vs 126 (121 vs 152), M = 16 237 vs 146 (157 vs 112); the upcast never wins
//    (M = 64: 841 vs 233): {1, kBf16DotDenseMaxM, never}.
//  - bf16 elsewhere (earlier sessions' machines): dense_gemm 1.0-2.2x torch's bf16 up to 32 rows, the
//    upcast 1.45x (M = 256) - 1.8x (M = 2048) from 128: {1, kDenseRouteMaxM, kBf16UpcastMinM}.
//  - fp16: torch's fp16 GEMM is slow past one row: dense_gemm (fp16 widened in registers, AVX-512 builds)
//    ties it at M = 1 (39 vs 44, 48 vs 42), is 1.7-5.9x it and 1.6-3.5x the upcast at 2-16 rows, ties the
//    upcast at 32 (492 vs 471, 428 vs 523): {1, kDenseRouteMaxM, kDenseRouteMaxM + 1}; without AVX-512,
//    torch's GEMV for one row and the upcast from two.
//  - fp32 (AVX-512 builds): dense_gemm 1.9-4.2x torch's (MKL) at 1-16 rows (1536x576, M = 1: 129 vs 244;
//    the 49152x576 LM head 3400 vs 8610), 1.1-2x at 32: {1, kDenseRouteMaxM, never}; elsewhere torch's.
constexpr int64_t kDenseRouteMaxM = 32;
constexpr int64_t kBf16UpcastMinM = 128;
constexpr int64_t kBf16DotDenseMaxM = 8;

// Batch invariance (int4_gemm's / int8_gemm's decode_rows, int4.h: split_decode_rows; decoder_layer's and
// ops.linear's for fp8 / dense weights): decode-phase rows get the bits they get alone, where a route has no kernel
// for any row count with the one-row arithmetic (the AMX copy's bf16 kernels, AVX2, fp8_gemm) in blocks of at most
// kDecodeRowBlock rows (below kTiledQuantGemmMinM / kFp8TiledMinM: the few-row kernels; csrc/cpu/gemm.cpp asserts it);
// prompt rows as one block of at least kPrefillRowsMin rows (zero rows appended): from it every CPU route of a
// quantized projection is its many-row kernel (int4_gemm / int8_gemm from kTiledVectorMinM, the AMX copy with bf16
// activations from kAmxRowsDispatchM + 1, fp8_gemm from kFp8TiledMinM), where a row's bits do not depend on the rows
// beside it, so a prompt's rows do not depend on how many prompt rows share its step. (Dense weights: decode rows in
// blocks of dense_gemm's rows; prompt rows as one block of at least dense_prefill_rows_min rows.)
constexpr int64_t kDecodeRowBlock = 8;
constexpr int64_t kPrefillRowsMin = 17;

struct DenseRoute {
  int64_t dense_min_m, dense_max_m;  // dense_gemm for M in [dense_min_m, dense_max_m]
  int64_t upcast_min_m;              // fp32 GEMM on upcast operands from here (INT64_MAX: never)
};

inline bool cpu_has_avx512_bf16() {  // what oneDNN's bf16 GEMM runs on (runtime CPUID)
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

enum class DenseDtype { kFloat32, kBFloat16, kFloat16 };

inline DenseRoute dense_route(DenseDtype dtype) {
  constexpr int64_t kNever = INT64_MAX;
#if defined(DK_AVX512_LOAD_STORE16)
  constexpr bool kWidenBuilt = true;  // dense_tile_widen below
#else
  constexpr bool kWidenBuilt = false;
#endif
  switch (dtype) {
    case DenseDtype::kFloat32:
      return kWidenBuilt ? DenseRoute{1, kDenseRouteMaxM, kNever} : DenseRoute{1, 0, kNever};
    case DenseDtype::kFloat16:
      return kWidenBuilt ? DenseRoute{1, kDenseRouteMaxM, kDenseRouteMaxM + 1} : DenseRoute{2, 1, 2};
    default:
      if (cpu_has_avx512_bf16()) return DenseRoute{1, kBf16DotDenseMaxM, kNever};
      return DenseRoute{1, kDenseRouteMaxM, kBf16UpcastMinM};
  }
}

// Batch invariance for dense weights: the fewest rows a prompt block runs as (zero rows appended), so that every
// prompt block takes one route -- past dense_gemm's rows, and from the upcast GEMM's threshold when there is one
// (dense_gemm, torch's GEMM and the upcast give a row different bits; torch's gives a row the same bits at any row
// count past its small-M kernels, measured: fp32 / bf16 rows 33..700 on 1536x576, 576x1536, 4096x1024).
inline int64_t dense_prefill_rows_min(DenseDtype dtype) {
  const DenseRoute r = dense_route(dtype);
  int64_t p = std::max(kPrefillRowsMin, r.dense_max_m + 1);
  if (r.upcast_min_m != INT64_MAX) p = std::max(p, r.upcast_min_m);
  return p;
}

template <class T>
inline void dense_row_generic(float* acc,            // [mt]
                              const T* a, int64_t a_stride, int mt,
                              const T* w, int64_t K) {
  for (int m = 0; m < mt; ++m) {
    const T* am = a + m * a_stride;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < K; ++k) s += to_float(am[k]) * to_float(w[k]);
    acc[m] = s;
  }
}

#if defined(DK_AVX512_LOAD_STORE16)
#define DK_DENSE_WIDEN_AVX512 1
// load16 without a mask: 16 whole lanes as fp32 (the tiles' main loop).
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const bf16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 widen16(const half_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// fp32 / bf16 / fp16 weights, fp32 activations: each 16-wide chunk of a weight row is widened to fp32
// in registers (load16: bf16 zero-extend + shift, fp16 vcvtph2ps; both exact) and fed to fp32 FMAs. On
// this class of CPU that beats vdpbf16ps (measured 99 vs 82 GMAC/s at M=32; at M=1 10-30% once the tiles
// prefetch) and keeps the activations exact. MT rows of a (<= 4) times NT weight rows (<= 4): per chunk
// NT widenings + MT loads feed MT * NT FMAs. The next tile's weight rows are prefetched (the hardware
// prefetcher follows the tile's interleaved row streams poorly: bf16 1536x576 at two rows 111-118 -> 51 us).
template <int MT, int NT, class W>
inline void dense_tile_widen(float* acc,  // [MT][NT]
                             const float* a, int64_t K, const W* w) {
  __m512 s[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) s[m][j] = _mm512_setzero_ps();
  // 16 columns of the NT weight rows against the MT activation rows: plain loads in the main loop
  // (masked ones there measured up to 1.4x slower at four rows), load16's masked lanes in the tail
  auto chunk = [&](int64_t k, auto load) __attribute__((always_inline)) {
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) {
      prefetch_row_ahead(w + (j + NT) * K + k, k * int64_t(sizeof(W)));  // the next tile's rows (NT on)
      wv[j] = load(w + j * K + k);
    }
    for (int m = 0; m < MT; ++m) {
      const __m512 av = load(a + m * K + k);
      for (int j = 0; j < NT; ++j) s[m][j] = _mm512_fmadd_ps(av, wv[j], s[m][j]);
    }
  };
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) chunk(k, [](const auto* p) { return widen16(p); });
  if (k < K) {  // the tail's zero lanes add nothing
    const __mmask16 mask = lanes_mask(K - k);
    chunk(k, [mask](const auto* p) { return load16(p, mask); });
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) acc[m * NT + j] = _mm512_reduce_add_ps(s[m][j]);
}

template <int NT, class W>
inline void dense_tile_widen_m(float* acc, int mt, const float* a, int64_t K, const W* w) {
  switch (mt) {
    case 4: return dense_tile_widen<4, NT>(acc, a, K, w);
    case 3: return dense_tile_widen<3, NT>(acc, a, K, w);
    case 2: return dense_tile_widen<2, NT>(acc, a, K, w);
    default: return dense_tile_widen<1, NT>(acc, a, K, w);
  }
}

template <class W>
inline void dense_tile_widen_any(float* acc, int mt, const float* a, int64_t K, const W* w, int nt) {
  switch (nt) {
    case 4: return dense_tile_widen_m<4>(acc, mt, a, K, w);
    case 3: return dense_tile_widen_m<3>(acc, mt, a, K, w);
    case 2: return dense_tile_widen_m<2>(acc, mt, a, K, w);
    default: return dense_tile_widen_m<1>(acc, mt, a, K, w);
  }
}
#endif

// acc[m * nt + j] = dot(a row m, weight row j) for mt <= 4 rows of a and nt <= 4 weight rows.
template <class T>
inline void dense_tile(float* acc, const T* a, int64_t a_stride, int mt, const T* w, int nt, int64_t K) {
  float tmp[4];
  for (int j = 0; j < nt; ++j) {
    dense_row_generic(tmp, a, a_stride, mt, w + j * K, K);
    for (int m = 0; m < mt; ++m) acc[m * nt + j] = tmp[m];
  }
}

template <class T>
void dense_gemm(T* out,            // [M, N] contiguous
                const T* a,        // [M, K], row stride a_stride
                int64_t a_stride,
                const T* w,        // [N, K] contiguous
                const T* bias,     // [N] or null
                int64_t M, int64_t N, int64_t K) {
#if defined(DK_DENSE_WIDEN_AVX512)
  // The activations are widened to fp32 once ([M, K], small), the weights per chunk. One path for every
  // M gives each row the same bits whatever M is, as the INT4 kernels do (bf16 at one row: widening
  // measured 10-30% ahead of vdpbf16ps once the tiles prefetch). Reused across calls (no allocation
  // per layer per step); thread_local is the calling thread's buffer: the parallel region below must
  // use the pointer, not the name.
  thread_local std::vector<float> af_buf;
  af_buf.resize(size_t(M * K));
  float* const af = af_buf.data();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = lanes_mask(K - k);
      store16(af + m * K + k, load16(a + m * a_stride + k, mask), mask);
    }
#endif
  // Parallel over blocks of 16 output columns; the block's weight rows (16 x K) stay in L1/L2
  // while all M rows of a pass over them, so each weight byte comes from DRAM once.
  DK_OMP_PARALLEL_FOR_IF(N * K >= kParallelGrain)
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t n1 = std::min(N, n0 + 16);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mt = int(std::min<int64_t>(4, M - m0));
      for (int64_t n = n0; n < n1; n += 4) {
        const int nt = int(std::min<int64_t>(4, n1 - n));
        float acc[16];
#if defined(DK_DENSE_WIDEN_AVX512)
        dense_tile_widen_any(acc, mt, af + m0 * K, K, w + n * K, nt);
#else
        dense_tile(acc, a + m0 * a_stride, a_stride, mt, w + n * K, nt, K);
#endif
        for (int j = 0; j < nt; ++j) {
          const float b = bias ? to_float(bias[n + j]) : 0.f;
          for (int m = 0; m < mt; ++m) out[(m0 + m) * N + n + j] = from_float<T>(acc[m * nt + j] + b);
        }
      }
    }
  }
}

}  // namespace dk::cpu
