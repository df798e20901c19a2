// CUDA weight-only GEMV/GEMM for small M (decode): INT4 (group-split nibbles + fp16 scale/min,
// include/decodekit/gemm/int4.h's layout) and INT8 (GGUF Q8_0: int8 + fp16 scale). Torch-free.
//
// GEMV (M <= 8; larger M: the tensor-core GEMM of int4_mma.cuh):
//  - one warp per output row n, 4 warps per CTA; the row's packed bytes are read in 16-byte
//    chunks, consecutive lanes on consecutive chunks (a warp reads 512 contiguous bytes per step);
//  - a chunk is 32 INT4 codes (low nibbles: elements 16j.., high: G/2 + 16j.. of its group) or
//    16 INT8 codes; each is decoded to fp32 (w = scale * q + min, as int4_weight) in registers;
//  - the MM (<= 8) activation rows are read from global memory (small, L1/L2-resident, reused
//    by every warp), fp32 accumulation, warp-shuffle reduction, lane 0 writes out (+ bias).
//  - int4_dequantize: one thread per packed byte (two weights).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/vec.cuh"
#include "decodekit/gemm/int4_common.h"

namespace dk::cuda {
namespace gemm_detail {

constexpr int kWarps = 4;

template <class T, int MM, bool INT4>
__global__ void __launch_bounds__(kWarps * 32)
quant_gemv_kernel(T* __restrict__ out,              // [M, N]
                  const T* __restrict__ a,           // [M, K], row stride a_stride
                  int64_t a_stride,
                  const uint8_t* __restrict__ qweight,  // INT4: [N, K/2] bytes; INT8: [N, K] int8
                  const __half* __restrict__ scales,    // [N, K/G]
                  const __half* __restrict__ mins,      // [N, K/G] (INT4 only)
                  const T* __restrict__ bias,           // [N] or null
                  int M, int64_t N, int64_t K, int G) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps only: the shuffles below stay full-warp
  const int64_t ng = K / G;
  const int64_t row_bytes = INT4 ? K / 2 : K;
  const uint8_t* qrow = qweight + n * row_bytes;
  float acc[MM];
#pragma unroll
  for (int m = 0; m < MM; ++m) acc[m] = 0.f;
  for (int64_t c = lane; c < row_bytes / 16; c += 32) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(qrow + c * 16));
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    if constexpr (INT4) {
      const int64_t g = c * 16 / (G / 2);                // group of this chunk
      const int64_t j = c * 16 - g * (G / 2);            // byte offset in the group
      const float d = __half2float(__ldg(scales + n * ng + g)), mn = __half2float(__ldg(mins + n * ng + g));
      const int64_t k_lo = g * G + j, k_hi = g * G + G / 2 + j;
      float wlo[16], whi[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        wlo[i] = int4_weight(b[i] & 15, d, mn);
        whi[i] = int4_weight(b[i] >> 4, d, mn);
      }
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        if (m < M) {
          const T* ar = a + m * a_stride;
#pragma unroll
          for (int i = 0; i < 16; ++i) acc[m] += wlo[i] * to_float(ar[k_lo + i]) + whi[i] * to_float(ar[k_hi + i]);
        }
      }
    } else {
      const int64_t k0 = c * 16;
      const float d = __half2float(__ldg(scales + n * ng + k0 / G));
      float w[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i] = d * float(int8_t(b[i]));
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        if (m < M) {
          const T* ar = a + m * a_stride + k0;
#pragma unroll
          for (int i = 0; i < 16; ++i) acc[m] += w[i] * to_float(ar[i]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MM; ++m) {
    const float v = warp_sum_fixed<32>(acc[m]);
    if (lane == 0 && m < M) out[m * N + n] = from_float<T>(v + (bias ? to_float(bias[n]) : 0.f));
  }
}

template <class T>
__global__ void int4_dequantize_kernel(T* __restrict__ w, const uint8_t* __restrict__ qweight,
                                       const __half* __restrict__ scales, const __half* __restrict__ mins, int64_t N,
                                       int64_t K, int G) {
  const int64_t half = K / 2, ng = K / G;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * half; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / half, byte = i - n * half;
    const int64_t g = byte / (G / 2), j = byte - g * (G / 2);
    const float d = __half2float(scales[n * ng + g]), mn = __half2float(mins[n * ng + g]);
    const uint8_t b = qweight[i];
    w[n * K + g * G + j] = from_float<T>(int4_weight(b & 15, d, mn));
    w[n * K + g * G + G / 2 + j] = from_float<T>(int4_weight(b >> 4, d, mn));
  }
}

template <class T>
__global__ void int8_dequantize_rows_kernel(T* __restrict__ w, const int8_t* __restrict__ qweight,
                                            const __half* __restrict__ scales, const int64_t* __restrict__ ids,
                                            int64_t R, int64_t N, int64_t K, int G) {
  const int64_t ng = K / G;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < R * K; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / K, k = i - r * K;
    const int64_t n = ids[r];
    // ids outside [0, N) (no host validation, graph-safe): the row comes out NaN
    w[i] = from_float<T>(n >= 0 && n < N ? __half2float(scales[n * ng + k / G]) * float(qweight[n * K + k]) : NAN);
  }
}

}  // namespace gemm_detail

// Most rows of `a` the GEMV kernels take (more: decode once, then a dense GEMM).
inline constexpr int kQuantGemvRows = 8;

// out [M, N] = a [M, K] @ w^T (+ bias), w packed INT4 (int4 = true) or INT8; M <= 8, K a
// multiple of 32 (16-byte chunks never straddle a group), qweight 16-byte aligned.
template <class T>
cudaError_t quant_gemv(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                       const __half* mins, const T* bias, int M, int64_t N, int64_t K, int G, bool int4,
                       cudaStream_t stream) {
  using namespace gemm_detail;
  if (M <= 0 || N <= 0) return cudaSuccess;
  if (M > kQuantGemvRows || K % 32 != 0 || (G != 32 && G != 64 && G != 128) || !aligned16(qweight) ||
      (int4 && mins == nullptr))
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned(ceil_div(N, kWarps))), block(kWarps * 32);
#define DK_QGEMV(MM)                                                                                             \
  {                                                                                                              \
    if (int4)                                                                                                    \
      quant_gemv_kernel<T, MM, true><<<grid, block, 0, stream>>>(out, a, a_stride, qweight, scales, mins, bias, M, \
                                                                 N, K, G);                                       \
    else                                                                                                         \
      quant_gemv_kernel<T, MM, false><<<grid, block, 0, stream>>>(out, a, a_stride, qweight, scales, mins, bias,  \
                                                                  M, N, K, G);                                   \
  }
  if (M <= 1) DK_QGEMV(1)
  else if (M <= 2) DK_QGEMV(2)
  else if (M <= 4) DK_QGEMV(4)
  else DK_QGEMV(8)
#undef DK_QGEMV
  return cudaGetLastError();
}

// The same a 16-byte chunk of codes per thread (16-byte aligned qweight and w; K a multiple of 32, so a chunk
// lies in one group): one division, one scale / min pair and four to eight 16-byte stores per 32 weights, where
// the kernel above spends two 64-bit divisions and two 2-byte stores per byte (it is the fallback). CUDA's
// route for INT4 GEMMs past 64 rows decodes whole weights with it before cuBLAS (decodekit.ops._packed_dense).
template <class T>
__global__ void int4_dequantize_chunks_kernel(T* __restrict__ w, const uint8_t* __restrict__ qweight,
                                              const __half* __restrict__ scales, const __half* __restrict__ mins,
                                              int64_t N, int64_t K, int G) {
  const int64_t cpr = K / 32, ng = K / G;  // chunks and groups per row
  const int hg = G / 2;                    // code bytes per group
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < N * cpr; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = c / cpr;
    const int byte0 = int(c - n * cpr) * 16, g = byte0 / hg, j0 = byte0 - g * hg;
    const float d = __half2float(scales[n * ng + g]), mn = __half2float(mins[n * ng + g]);
    const Vec<uint8_t, 16> q = ldg_vec<uint8_t, 16>(qweight + n * (K / 2) + byte0);
    constexpr int V = kVec16<T>;  // elements per 16-byte store
    Vec<T> lo[16 / V], hi[16 / V];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      lo[i / V].v[i % V] = from_float<T>(int4_weight(q.v[i] & 15, d, mn));
      hi[i / V].v[i % V] = from_float<T>(int4_weight(q.v[i] >> 4, d, mn));
    }
    T* row = w + n * K + int64_t(g) * G + j0;
#pragma unroll
    for (int j = 0; j < 16 / V; ++j) {
      store_vec(row + j * V, lo[j]);
      store_vec(row + hg + j * V, hi[j]);
    }
  }
}

template <class T>
cudaError_t int4_dequantize(T* w, const uint8_t* qweight, const __half* scales, const __half* mins, int64_t N,
                            int64_t K, int G, cudaStream_t stream) {
  using namespace gemm_detail;
  if (N <= 0 || K <= 0) return cudaSuccess;
  if (K % 32 == 0 && G % 32 == 0 && aligned16(qweight) && aligned16(w)) {
    const int64_t n = N * (K / 32);
    int4_dequantize_chunks_kernel<T><<<grid_cap(ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536), 256, 0,
                                       stream>>>(w, qweight, scales, mins, N, K, G);
    return cudaGetLastError();
  }
  const int64_t n = N * K / 2;
  int4_dequantize_kernel<T><<<grid_cap(ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536), 256, 0, stream>>>(
      w, qweight, scales, mins, N, K, G);
  return cudaGetLastError();
}

// Rows ids [R] of an INT8 weight, decoded: w [R, K] (the embedding lookup of a Q8_0 table).
template <class T>
cudaError_t int8_dequantize_rows(T* w, const int8_t* qweight, const __half* scales, const int64_t* ids, int64_t R,
                                 int64_t N, int64_t K, int G, cudaStream_t stream) {
  using namespace gemm_detail;
  if (R <= 0 || K <= 0) return cudaSuccess;
  const int64_t blocks = ceil_div(R * K, 256);
  int8_dequantize_rows_kernel<T><<<grid_cap(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(w, qweight, scales,
                                                                                               ids, R, N, K, G);
  return cudaGetLastError();
}

}  // namespace dk::cuda
