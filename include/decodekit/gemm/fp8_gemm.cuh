// fp8 e4m3 W8A8 on CUDA (torch-free): dynamic per-token activation quantization and the fp8 GEMM
// on tensor cores (mma.sync m16n8k32 e4m3, sm_89+). Same semantics as gemm/fp8_gemm.h (CPU).
//
//  - quantize_fp8: one CTA per row: block max of |x|, scale = fp8_dynamic_scale(amax), codes by
//    quantize_fp8_e4m3 (common/fp8.h), 4 per 32-bit store when aligned.
//  - fp8_gemm: CTA = 4 warps x 2 n8 tiles = 64 output features x 16 * MT rows (MT = 1, 2, 4 by M).
//    Per 64-element K chunk the CTA stages the a tile [16 MT x 64 bytes] in shared memory (rows
//    padded by 16 bytes) and reads A fragments with ldmatrix (an 8x8 b16 matrix is 8 rows x 16
//    codes, exactly the m16n8k32 e4m3 A layout); B fragments (w[n][4t..4t+3] and [16+4t..]) are
//    32-bit loads of the weight rows. fp32 accumulators, then * a_scale[m] * w_scale[n] + bias.
//    Split-K (fp8_mma_splits, gemm/mma_plan.h): blockIdx.z takes a range of the 64-byte K steps and writes
//    its unscaled sums to partial[z] [M, N]; splitk_reduce (gemm/splitk.cuh) sums them in order, then the
//    scales and bias.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/fp8.h"
#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"
#include "decodekit/gemm/mma_plan.h"
#include "decodekit/gemm/splitk.cuh"

namespace dk::cuda {

namespace fp8_detail {

constexpr int kWarps = 4;
constexpr int kNT = 2;                  // n8 tiles per warp
constexpr int kTileN = kWarps * kNT * 8;  // output features per CTA
static_assert(kTileN == kMmaGemmFeatures, "mma_plan.h's CTA width");
constexpr int kKc = 64;                 // K elements (bytes) staged per step

template <class T>
__global__ void __launch_bounds__(256)
quantize_fp8_kernel(uint8_t* __restrict__ q,      // [M, K]
                    float* __restrict__ scale,    // [M]
                    const T* __restrict__ x,      // [M, K], row stride x_stride
                    int64_t K, int64_t x_stride) {
  __shared__ float red[8];
  const int64_t m = blockIdx.x;
  const T* row = x + m * x_stride;
  float amax = 0.f;
  bool nan = false;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = to_float(row[k]);
    nan |= v != v;
    amax = fmaxf(amax, fabsf(v));
  }
  if (nan) amax = NAN;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, amax, o);
    amax = (other != other || amax != amax) ? NAN : fmaxf(amax, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = amax;
  __syncthreads();
  float all = red[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) all = (all != all || red[w] != red[w]) ? NAN : fmaxf(all, red[w]);
  const float s = fp8_dynamic_scale(all);
  if (threadIdx.x == 0) scale[m] = s;
  uint8_t* qr = q + m * K;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) qr[k] = quantize_fp8_e4m3(to_float(row[k]), s);
}

template <class T, int MT>
__global__ void __launch_bounds__(kWarps * 32)
fp8_gemm_kernel(T* __restrict__ out,                // [M, N]
                const uint8_t* __restrict__ a,      // [M, K] e4m3
                const float* __restrict__ a_scale,  // [M]
                const uint8_t* __restrict__ w,      // [N, K] e4m3
                const float* __restrict__ w_scale,  // [N]
                const T* __restrict__ bias,         // [N] or null
                float* __restrict__ partial,        // [splits, M, N] (splits > 1) or null
                int64_t M, int64_t N, int64_t K) {
  constexpr int BM = 16 * MT;
  constexpr int LDA = kKc + 16;  // bytes per staged row (+16: conflict-free ldmatrix)
  alignas(16) __shared__ uint8_t a_s[BM][LDA];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gl = lane >> 2, tl = lane & 3;
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int64_t nw = int64_t(blockIdx.x) * kTileN + warp * (kNT * 8);

  float acc[MT][kNT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;
  const uint8_t* wrow[kNT];
  bool nvalid[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    const int64_t n = nw + 8 * t + gl;
    nvalid[t] = n < N;
    wrow[t] = w + (nvalid[t] ? n : 0) * K;
  }

  const int64_t steps = (K + kKc - 1) / kKc;  // this split's K steps: [steps z / S, steps (z + 1) / S)
  const int64_t k_begin = steps * blockIdx.z / gridDim.z * kKc, k_end = steps * (blockIdx.z + 1) / gridDim.z * kKc;
#pragma unroll 1
  for (int64_t k0 = k_begin; k0 < k_end && k0 < K; k0 += kKc) {
    const int kc = K - k0 < kKc ? int(K - k0) : kKc;  // a multiple of 32 (K % 32 == 0)
    __syncthreads();
    for (int i = tid; i < BM * (kKc / 4); i += kWarps * 32) {  // 4 codes per access, zeros past M / K
      const int r = i / (kKc / 4), c = (i - r * (kKc / 4)) * 4;
      const int64_t m = m0 + r;
      uint32_t v = 0;
      if (m < M && c < kc) {
        const uint8_t* p = a + m * K + k0 + c;
        v = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
      }
      *reinterpret_cast<uint32_t*>(&a_s[r][c]) = v;
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kKc / 32; ++ks) {
      if (32 * ks >= kc) continue;  // CTA-uniform (the last chunk may hold 32 of the 64)
      uint32_t b[kNT][2];
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        b[t][0] = b[t][1] = 0;
        if (nvalid[t]) {
          const uint8_t* p = wrow[t] + k0 + 32 * ks + 4 * tl;
          b[t][0] = __ldg(reinterpret_cast<const uint32_t*>(p));
          b[t][1] = __ldg(reinterpret_cast<const uint32_t*>(p + 16));
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t af[4];
        ldmatrix_x4(af, &a_s[i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][32 * ks + (lane >> 4) * 16]);
#pragma unroll
        for (int t = 0; t < kNT; ++t) mma_m16n8k32_e4m3(acc[i][t], af, b[t]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + 16 * i + gl + (e >> 1) * 8;
        const int64_t n = nw + 8 * t + 2 * tl + (e & 1);
        if (m < M && n < N) {
          if (partial != nullptr) {
            partial[(int64_t(blockIdx.z) * M + m) * N + n] = acc[i][t][e];
          } else {
            float v = acc[i][t][e] * __ldg(a_scale + m) * __ldg(w_scale + n);
            if (bias != nullptr) v += to_float(bias[n]);
            out[m * N + n] = from_float<T>(v);
          }
        }
      }
}

}  // namespace fp8_detail

// Dynamic per-row fp8 quantization of x [M, K] (any row stride): codes q [M, K], scales [M].
template <class T>
cudaError_t quantize_fp8(uint8_t* q, float* scale, const T* x, int64_t M, int64_t K, int64_t x_stride,
                         cudaStream_t stream) {
  using namespace fp8_detail;
  if (M <= 0) return cudaSuccess;
  if (M > 0x7fffffff) return cudaErrorInvalidValue;
  const int threads = K >= 256 ? 256 : round_up32(K < 1 ? 1 : K);
  quantize_fp8_kernel<T><<<unsigned(M), threads, 0, stream>>>(q, scale, x, K, x_stride);
  return cudaGetLastError();
}

// out [M, N] = (a @ w^T) * a_scale[m] * w_scale[n] (+ bias), a / w e4m3 codes; K a multiple of 32;
// a and w 4-byte aligned (rows are: K % 32 == 0).
// splits >= 1 ways of K (fp8_mma_splits); more than one needs `partial`, splits * M * N floats of workspace.
template <class T>
cudaError_t fp8_gemm(T* out, const uint8_t* a, const float* a_scale, const uint8_t* w, const float* w_scale,
                     const T* bias, int64_t M, int64_t N, int64_t K, int splits, float* partial,
                     cudaStream_t stream) {
  using namespace fp8_detail;
  if (M <= 0 || N <= 0) return cudaSuccess;
  if (K % 32 != 0 || (reinterpret_cast<uintptr_t>(a) & 3u) || (reinterpret_cast<uintptr_t>(w) & 3u) || splits < 1 ||
      splits > 65535 || (splits > 1 && partial == nullptr))
    return cudaErrorInvalidValue;
  float* part = splits > 1 ? partial : nullptr;
  const int64_t gx = ceil_div(N, int64_t(kTileN));
  if (gx > 0x7fffffff) return cudaErrorInvalidValue;
#define DK_FP8_LAUNCH(MT)                                                                                      \
  {                                                                                                            \
    const int64_t gy = ceil_div(M, int64_t(16 * MT));                                                          \
    if (gy > 65535) return cudaErrorInvalidValue;                                                              \
    const dim3 grid = dim3(unsigned(gx), unsigned(gy), unsigned(splits));                                      \
    fp8_gemm_kernel<T, MT><<<grid, kWarps * 32, 0, stream>>>(out, a, a_scale, w, w_scale, bias, part, M, N, K); \
  }
  if (mma_gemm_block_rows(M) == 16) DK_FP8_LAUNCH(1)
  else if (mma_gemm_block_rows(M) == 32) DK_FP8_LAUNCH(2)
  else DK_FP8_LAUNCH(4)
#undef DK_FP8_LAUNCH
  if (splits > 1) return splitk_reduce<T>(out, partial, a_scale, w_scale, bias, M, N, splits, stream);
  return cudaGetLastError();
}

}  // namespace dk::cuda
