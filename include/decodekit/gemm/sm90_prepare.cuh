// The operand preparation of the CUTLASS sm90 INT4 GEMM (gemm/sm90_gemm.cuh), CUTLASS-free so the
// host emulator (tools/cuda_emu/test_quant.cpp) runs it: activations interleaved per group to match
// reading our qweight bytes as plain packed 4-bit elements, scales / mins widened to fp32 and
// transposed to the MN-major [K / G, N] the mixed-input collective loads. Torch-free.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/gemm/int4_common.h"

namespace dk::cuda {
namespace sm90 {

// x' [M, K] (contiguous) = x [M, K] (row stride a_stride) with each group of G interleaved:
// x'[m, gG + j] = x[m, gG + int4_interleaved_source(j, G)]; one thread per 8 outputs (one 16-byte store).
template <class T>
__global__ void int4_sm90_interleave_kernel(T* __restrict__ dst, const T* __restrict__ a, int64_t a_stride,
                                            int64_t M, int64_t K, int G) {
  const int64_t per_row = K / 8, total = M * per_row;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = t / per_row, k0 = (t - m * per_row) * 8;
    const int64_t g0 = k0 / G * G;
    const int j0 = int(k0 - g0);
    const T* src = a + m * a_stride + g0;
    alignas(16) T v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = src[int4_interleaved_source(j0 + e, G)];
    *reinterpret_cast<uint4*>(dst + m * K + k0) = *reinterpret_cast<const uint4*>(v);
  }
}

// s_t / z_t [K/G, N] fp32 = scales / mins [N, K/G] fp16, transposed through a Tile x Tile shared tile
// (a template only so that every translation unit including this header may define it).
template <int Tile>
__global__ void int4_sm90_scales_kernel(float* __restrict__ s_t, float* __restrict__ z_t,
                                        const __half* __restrict__ scales, const __half* __restrict__ mins,
                                        int64_t N, int64_t KG) {
  __shared__ float tile[2][Tile][Tile + 1];
  const int64_t n0 = int64_t(blockIdx.x) * Tile, g0 = int64_t(blockIdx.y) * Tile;
  for (int r = threadIdx.y; r < Tile; r += blockDim.y) {
    const int64_t n = n0 + r, g = g0 + threadIdx.x;
    if (n < N && g < KG) {
      tile[0][r][threadIdx.x] = __half2float(scales[n * KG + g]);
      tile[1][r][threadIdx.x] = __half2float(mins[n * KG + g]);
    }
  }
  __syncthreads();
  for (int r = threadIdx.y; r < Tile; r += blockDim.y) {
    const int64_t g = g0 + r, n = n0 + threadIdx.x;
    if (n < N && g < KG) {
      s_t[g * N + n] = tile[0][threadIdx.x][r];
      z_t[g * N + n] = tile[1][threadIdx.x][r];
    }
  }
}

}  // namespace sm90

// x [M, K] (contiguous; K a multiple of 8 and of G, 16-byte aligned) = a interleaved per group;
// s_t / z_t [K / G, N] fp32 = scales / mins [N, K / G] transposed.
template <class T>
cudaError_t int4_sm90_prepare(T* x, float* s_t, float* z_t, const T* a, int64_t a_stride, const __half* scales,
                              const __half* mins, int64_t M, int64_t N, int64_t K, int G, cudaStream_t stream) {
  if (K % 8 != 0 || K % G != 0 || (reinterpret_cast<uintptr_t>(x) & 15u)) return cudaErrorInvalidValue;
  const int64_t KG = K / G, total = M * (K / 8);
  if (total > 0) {
    const int64_t blocks = total / 256 + 1 < 65536 ? total / 256 + 1 : 65536;
    sm90::int4_sm90_interleave_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(x, a, a_stride, M, K, G);
  }
  if (N > 0 && KG > 0) {
    constexpr int kTile = 32;
    if ((KG + kTile - 1) / kTile > 65535) return cudaErrorInvalidValue;
    const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((KG + kTile - 1) / kTile)), block(kTile, 8);
    sm90::int4_sm90_scales_kernel<kTile><<<grid, block, 0, stream>>>(s_t, z_t, scales, mins, N, KG);
  }
  return cudaGetLastError();
}

}  // namespace dk::cuda
