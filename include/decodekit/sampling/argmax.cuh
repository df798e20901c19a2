// CUDA argmax_rows (torch-free): one CTA per row, each thread scanning a strided share of the row
// with argmax_key (sampling/argmax.h: the CPU kernel's keys), then a warp-shuffle and shared-memory
// reduction of (key, index): the larger key, equal keys -> the lower index.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "decodekit/sampling/argmax.h"

namespace dk::cuda {
namespace argmax_detail {

constexpr int kThreads = 256;

DK_DEVICE void take_better(uint32_t& bk, int& bi, uint32_t k, int i) {
  if (k > bk || (k == bk && i < bi)) {
    bk = k;
    bi = i;
  }
}

__global__ void __launch_bounds__(kThreads)
argmax_rows_kernel(int64_t* __restrict__ out,      // [B]
                   const float* __restrict__ x,    // [B, V], row stride row_stride
                   int64_t row_stride, int V) {
  const float* row = x + int64_t(blockIdx.x) * row_stride;
  uint32_t bk = 0;
  int bi = INT_MAX;
  for (int v = threadIdx.x; v < V; v += kThreads) take_better(bk, bi, argmax_key(row[v]), v);
  for (int s = 16; s > 0; s >>= 1)  // butterfly: every lane ends with its warp's best
    take_better(bk, bi, uint32_t(__shfl_xor_sync(0xffffffffu, int(bk), s)), __shfl_xor_sync(0xffffffffu, bi, s));
  __shared__ uint32_t ks[kThreads / 32];
  __shared__ int is[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    ks[warp] = bk;
    is[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) take_better(bk, bi, ks[w], is[w]);
    out[blockIdx.x] = bi;
  }
}

}  // namespace argmax_detail

// out[b] = argmax_rows rule over x[b, 0 .. V); B <= 2^31 - 1 CTAs, 1 <= V < 2^31 (argmax_rows_args).
inline cudaError_t argmax_rows(int64_t* out, const float* x, int64_t row_stride, int64_t B, int64_t V,
                               cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  argmax_detail::argmax_rows_kernel<<<unsigned(B), argmax_detail::kThreads, 0, stream>>>(out, x, row_stride, int(V));
  return cudaGetLastError();
}

}  // namespace dk::cuda
