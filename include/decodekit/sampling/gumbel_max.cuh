// CUDA gumbel_argmax (torch-free): the rule of sampling/gumbel_max.h, one CTA per row. Three
// CTA-wide scans of the row: the first NaN, the first maximum (whose key seeds every thread's
// running best), then each thread offers its Philox blocks (4 tokens each, strided over the CTA)
// with the header's exact skips and the CTA reduces the (key, token) pairs (ties -> the lowest
// token). The per-token functions are the CPU kernel's, so CPU and GPU agree token for token up to
// logf's last-ulp differences between libms (keys tied to ~1e-7). No host synchronisation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/sampling/block_best.cuh"
#include "decodekit/sampling/gumbel_max.h"

namespace dk::cuda {
namespace gumbel_detail {
using namespace sampling_detail;

__global__ void __launch_bounds__(kThreads)
gumbel_argmax_kernel(int64_t* __restrict__ out,             // [B]
                     const float* __restrict__ x,           // [B, V], rows row_stride apart
                     int64_t row_stride,
                     const int64_t* __restrict__ seeds,     // [B]
                     const int64_t* __restrict__ positions,  // [B]
                     int64_t V, uint32_t stream) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x;
  const float* row = x + b * row_stride;
  const int64_t nan_at = block_best([&](int64_t v, bool& ok) {
    const float e = row[v];
    ok = e != e;  // NaN
    return 0.f;
  }, V, ks, is);
  if (nan_at >= 0) {  // CTA-uniform
    if (threadIdx.x == 0) out[b] = nan_at;
    return;
  }
  const int64_t first = block_best([&](int64_t v, bool& ok) {
    ok = true;
    return row[v];
  }, V, ks, is);
  const float xmax = row[first];
  if (!(xmax > -INFINITY) || xmax == INFINITY) {
    if (threadIdx.x == 0) out[b] = first;
    return;
  }
  const uint64_t seed = uint64_t(__ldg(seeds + b)), pos = uint64_t(__ldg(positions + b));
  float best = xmax + token_gumbel(seed, pos, uint32_t(first), stream);
  int64_t bi = first;
  auto xv = [row](int64_t v) { return row[v]; };
  for (int64_t j = threadIdx.x; 4 * j < V; j += blockDim.x) {
    const int n = V - 4 * j < 4 ? int(V - 4 * j) : 4;
    gumbel_offer_block(xv, j, n, first, seed, pos, stream, best, bi);
  }
  const int64_t r = block_reduce_best(best, bi, ks, is);
  if (threadIdx.x == 0) out[b] = r;
}

}  // namespace gumbel_detail

// See the header comment: out[b] for B rows of V logits (row_stride elements apart).
inline cudaError_t gumbel_argmax(int64_t* out, const float* x, int64_t row_stride, const int64_t* seeds,
                                 const int64_t* positions, int64_t B, int64_t V, uint32_t stream,
                                 cudaStream_t cuda_stream) {
  using namespace gumbel_detail;
  if (B <= 0) return cudaSuccess;
  if (B > 0x7fffffff || V <= 0) return cudaErrorInvalidValue;
  gumbel_argmax_kernel<<<unsigned(B), kThreads, 0, cuda_stream>>>(out, x, row_stride, seeds, positions, V, stream);
  return cudaGetLastError();
}

}  // namespace dk::cuda
