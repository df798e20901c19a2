// CUDA INT4 weight-only GEMM on tensor cores (W4A16, fp16/bf16 activations) for M beyond the GEMV
// kernels (batched decode, prefill): out [M, N] = a [M, K] @ w^T (+ bias), w in
// include/decodekit/gemm/int4.h's layout (group-split nibbles, fp16 scale and min per group of G).
// Torch-free.
//
// Design (Marlin-like in spirit: weights decoded in registers straight into mma fragments):
//  - CTA = 4 warps = kMmaN (64) output features x 16 * MT rows of a (MT = 1, 2 or 4 m16 tiles,
//    picked from M); grid (ceil(N / 64), ceil(M / (16 MT))).
//  - per group of G input features: the CTA stages a [16 MT x G] tile of a in shared memory (rows
//    padded by 16 bytes: conflict-free ldmatrix), then each warp, for its 2 n8 tiles, reads each
//    16-byte chunk of packed codes (32 weights: the low nibbles are group elements 16j..16j+15,
//    the high ones G/2 + 16j..) with one 16-byte load per lane (the 4 lanes of a row read the same
//    chunk), decodes its 8 weights w = scale * q + min in fp32 (as int4_weight) and rounds them to T:
//    two k16 steps' B fragments per chunk, multiplied with A fragments from ldmatrix by
//    mma.sync m16n8k16 (fp32 accumulators).
//  - rows of a past M and weights past N are zeros, their outputs are not written.
//  - split-K (int4_mma_splits, gemm/mma_plan.h): blockIdx.z takes groups [ng z / S, ng (z+1) / S) and
//    writes its fp32 sums to partial[z] [M, N]; splitk_reduce (gemm/splitk.cuh) adds the S of them in order
//    (+ bias) and rounds once to T. S = 1 writes out directly.
// Numerics: like decoding the weight to T then a T GEMM with fp32 accumulation (what the dense
// path does): each weight rounded once to T, products and sums in fp32.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"
#include "decodekit/gemm/int4_common.h"
#include "decodekit/gemm/mma_plan.h"
#include "decodekit/gemm/splitk.cuh"

namespace dk::cuda {
namespace gemm_detail {

constexpr int kMmaWarps = 4;
constexpr int kMmaNT = 2;                         // n8 tiles per warp
constexpr int kMmaN = kMmaWarps * kMmaNT * 8;     // output features per CTA
static_assert(kMmaN == kMmaGemmFeatures, "mma_plan.h's CTA width");

// Four bytes of a 16-byte chunk held as words w[0..3]: bytes c, c + 1, c + 8, c + 9 (c even, < 8)
// as one word (byte order: c, c+1, c+8, c+9), selects only (no run-time register indexing).
DK_DEVICE uint32_t chunk_bytes(const uint4& w, int c) {
  const uint32_t lo = (c < 4 ? w.x : w.y) >> ((c & 3) * 8);
  const uint32_t hi = (c < 4 ? w.z : w.w) >> ((c & 3) * 8);
  return (lo & 0xffffu) | ((hi & 0xffffu) << 16);
}

template <class T, int MT>
__global__ void __launch_bounds__(kMmaWarps * 32)
int4_gemm_mma_kernel(T* __restrict__ out,              // [M, N]
                     const T* __restrict__ a,           // [M, K], row stride a_stride
                     int64_t a_stride,
                     const uint8_t* __restrict__ qweight,  // [N, K/2]
                     const __half* __restrict__ scales,    // [N, K/G]
                     const __half* __restrict__ mins,      // [N, K/G]
                     const T* __restrict__ bias,           // [N] or null
                     float* __restrict__ partial,          // [splits, M, N] (splits > 1) or null
                     int64_t M, int64_t N, int64_t K, int G) {
  constexpr int BM = 16 * MT;
  constexpr int LDA = 128 + 8;  // the largest group (128) + 16 bytes of padding
  alignas(16) __shared__ T a_s[BM][LDA];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gl = lane >> 2, cl = 2 * (lane & 3);
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int64_t nw = int64_t(blockIdx.x) * kMmaN + warp * (kMmaNT * 8);  // this warp's first feature
  const int64_t ng = K / G;
  const int64_t g_begin = ng * blockIdx.z / gridDim.z, g_end = ng * (blockIdx.z + 1) / gridDim.z;

  float acc[MT][kMmaNT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < kMmaNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;

  // this lane's weight rows (one per n8 tile): row nw + 8t + gl
  const uint8_t* qrow[kMmaNT];
  bool nvalid[kMmaNT];
#pragma unroll
  for (int t = 0; t < kMmaNT; ++t) {
    const int64_t n = nw + 8 * t + gl;
    nvalid[t] = n < N;
    qrow[t] = qweight + (nvalid[t] ? n : 0) * (K / 2);
  }

#pragma unroll 1
  for (int64_t g = g_begin; g < g_end; ++g) {
    // a[m0 .. m0 + BM, g*G .. g*G + G) -> a_s (zeros past M), 2 elements per access
    __syncthreads();
    for (int i = tid; i < BM * G / 2; i += kMmaWarps * 32) {
      const int r = i / (G / 2), cc = (i - r * (G / 2)) * 2;
      const int64_t m = m0 + r;
      T v0 = from_float<T>(0.f), v1 = v0;
      if (m < M) {
        const T* p = a + m * a_stride + g * G + cc;
        v0 = p[0];
        v1 = p[1];
      }
      a_s[r][cc] = v0;
      a_s[r][cc + 1] = v1;
    }
    __syncthreads();

    float sc[kMmaNT], mn[kMmaNT];
#pragma unroll
    for (int t = 0; t < kMmaNT; ++t) {
      const int64_t n = nw + 8 * t + gl;
      sc[t] = nvalid[t] ? __half2float(__ldg(scales + n * ng + g)) : 0.f;
      mn[t] = nvalid[t] ? __half2float(__ldg(mins + n * ng + g)) : 0.f;
    }
#pragma unroll 1
    for (int j = 0; j < G / 32; ++j) {  // 16-byte chunk j of the group: elements 16j.. and G/2 + 16j..
      uint32_t blo[kMmaNT][2], bhi[kMmaNT][2];
#pragma unroll
      for (int t = 0; t < kMmaNT; ++t) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (nvalid[t]) w = __ldg(reinterpret_cast<const uint4*>(qrow[t] + g * (G / 2) + 16 * j));
        const uint32_t b = chunk_bytes(w, cl);  // bytes c, c+1, c+8, c+9
        auto wv = [&](int shift) { return int4_weight(int((b >> shift) & 15u), sc[t], mn[t]); };
        blo[t][0] = pack2<T>(wv(0), wv(8));     // elements c, c+1 (low nibbles of bytes c, c+1)
        blo[t][1] = pack2<T>(wv(16), wv(24));   // elements c+8, c+9
        bhi[t][0] = pack2<T>(wv(4), wv(12));    // elements G/2 + c, c+1 (high nibbles)
        bhi[t][1] = pack2<T>(wv(20), wv(28));
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        // A fragments of k-steps at columns 16j (low nibbles) and G/2 + 16j (high nibbles)
        uint32_t alo[4], ahi[4];
        const int ar = i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8;
        ldmatrix_x4(alo, &a_s[ar][16 * j + ac]);
        ldmatrix_x4(ahi, &a_s[ar][G / 2 + 16 * j + ac]);
#pragma unroll
        for (int t = 0; t < kMmaNT; ++t) {
          mma_m16n8k16<T>(acc[i][t], alo, blo[t]);
          mma_m16n8k16<T>(acc[i][t], ahi, bhi[t]);
        }
      }
    }
  }

  // out rows m0 + 16i + gl (+8), features nw + 8t + cl (+1)
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < kMmaNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + 16 * i + gl + (e >> 1) * 8;
        const int64_t n = nw + 8 * t + cl + (e & 1);
        if (m < M && n < N) {
          float v = acc[i][t][e];
          if (partial != nullptr) {
            partial[(int64_t(blockIdx.z) * M + m) * N + n] = v;
          } else {
            if (bias != nullptr) v += to_float(bias[n]);
            out[m * N + n] = from_float<T>(v);
          }
        }
      }
}

}  // namespace gemm_detail

// out [M, N] = a [M, K] @ w^T (+ bias) on tensor cores, w packed INT4 (any M >= 1; meant for
// M > kQuantGemvRows). T: half or bf16 (float: cudaErrorInvalidValue); K a multiple of G,
// G in {32, 64, 128}; qweight 16-byte aligned. splits >= 1 ways of K (int4_mma_splits); more than one
// needs `partial`, splits * M * N floats of device workspace.
template <class T>
cudaError_t int4_gemm_mma(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                          const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G, int splits,
                          float* partial, cudaStream_t stream) {
  using namespace gemm_detail;
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if ((G != 32 && G != 64 && G != 128) || K % G != 0 || !aligned16(qweight) || mins == nullptr || splits < 1 ||
        splits > 65535 || (splits > 1 && partial == nullptr))
      return cudaErrorInvalidValue;
    float* part = splits > 1 ? partial : nullptr;
    const int64_t gx = ceil_div(N, int64_t(kMmaN));
    const dim3 block(kMmaWarps * 32);
    if (gx > 0x7fffffff) return cudaErrorInvalidValue;
#define DK_MMA_LAUNCH(MT)                                                                                      \
  {                                                                                                            \
    const int64_t gy = ceil_div(M, int64_t(16 * MT));                                                          \
    if (gy > 65535) return cudaErrorInvalidValue;                                                              \
    const dim3 grid = dim3(unsigned(gx), unsigned(gy), unsigned(splits));                                      \
    int4_gemm_mma_kernel<T, MT><<<grid, block, 0, stream>>>(out, a, a_stride, qweight, scales, mins, bias, part, \
                                                            M, N, K, G);                                       \
  }
    if (mma_gemm_block_rows(M) == 16) DK_MMA_LAUNCH(1)
    else if (mma_gemm_block_rows(M) == 32) DK_MMA_LAUNCH(2)
    else DK_MMA_LAUNCH(4)
#undef DK_MMA_LAUNCH
    if (splits > 1) return splitk_reduce<T>(out, partial, nullptr, nullptr, bias, M, N, splits, stream);
    return cudaGetLastError();
  }
}

}  // namespace dk::cuda
