// CUDA gumbel_argmax (torch-free): the rule of sampling/gumbel_max.h in two kernels: each row's
// vocabulary split over CTAs (one per row once the batch fills the GPU: vocab_splits in
// block_best.cuh), each scanning its slice (gumbel_partial_kernel), then one CTA per row merging the
// slices (gumbel_finish_kernel). The per-token functions are the CPU kernel's, so CPU and GPU agree token for token up to
// logf's last-ulp differences between libms (keys tied to ~1e-7). No host synchronisation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/sampling/block_best.cuh"
#include "decodekit/sampling/gumbel_max.h"

namespace dk::cuda {
namespace gumbel_detail {
using namespace sampling_detail;

// Partial results of one slice of a row (gumbel_partial_kernel), [B, splits] each.
struct GumbelPartials {
  int64_t* nan_idx;  // the slice's first NaN (-1: none)
  int64_t* max_idx;  // its first maximum (the lowest index among equal ones)
  float* max_val;
  int64_t* key_idx;  // its Gumbel-max winner over the finite logits (-1: none)
  float* key;
};

// Grid (B, splits): one slice of a row per CTA. Three CTA-wide scans of the slice: the first NaN, the first
// maximum (whose key seeds every thread's running best), then each thread offers its Philox blocks (4
// tokens each, strided over the CTA) with the header's exact skips; the CTA reduces the (key, token) pairs
// (ties -> the lowest token). A slice's winner is exactly the best key of its tokens, so the merge's best
// over the slices is the row's, as the CPU's single scan finds it.
__global__ void __launch_bounds__(kThreads)
gumbel_partial_kernel(GumbelPartials part,
                      const float* __restrict__ x,           // [B, V], rows row_stride apart
                      int64_t row_stride,
                      const int64_t* __restrict__ seeds,     // [B]
                      const int64_t* __restrict__ positions,  // [B]
                      int64_t V, uint32_t stream, VocabPlan plan) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x, sl = blockIdx.y, w = b * plan.splits + sl;
  const int64_t v0 = sl * plan.slice, v1 = v0 + plan.slice < V ? v0 + plan.slice : V;
  const float* row = x + b * row_stride;
  const int64_t nan_at = block_best_range([&](int64_t v, bool& ok) {
    const float e = row[v];
    ok = e != e;  // NaN
    return 0.f;
  }, v0, v1, ks, is);
  float xmax;
  const int64_t first = block_best_range([&](int64_t v, bool& ok) {
    ok = true;
    return row[v];
  }, v0, v1, ks, is, &xmax);
  float best = -INFINITY;
  int64_t bi = -1;
  if (nan_at < 0 && xmax > -INFINITY && xmax < INFINITY) {  // CTA-uniform
    const uint64_t seed = uint64_t(__ldg(seeds + b)), pos = uint64_t(__ldg(positions + b));
    best = xmax + token_gumbel(seed, pos, uint32_t(first), stream);
    bi = first;
    auto xv = [row](int64_t v) { return row[v]; };
    for (int64_t j = v0 / 4 + threadIdx.x; 4 * j < v1; j += blockDim.x) {
      const int n = v1 - 4 * j < 4 ? int(v1 - 4 * j) : 4;
      gumbel_offer_block(xv, j, n, first, seed, pos, stream, best, bi);
    }
  }
  float key;
  const int64_t win = block_reduce_best(best, bi, ks, is, &key);
  if (threadIdx.x == 0) {
    part.nan_idx[w] = nan_at;
    part.max_idx[w] = first;
    part.max_val[w] = xmax;
    part.key_idx[w] = win;
    part.key[w] = key;
  }
}

// One CTA per row: the header's rule from the slices' partials -- the first NaN of the row if any; else its
// first maximum if that is +-inf; else the best (key, token) of the slices.
__global__ void __launch_bounds__(kThreads)
gumbel_finish_kernel(int64_t* __restrict__ out,  // [B]
                     GumbelPartials part, int64_t splits) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x, w = b * splits + threadIdx.x;
  const bool mine = int64_t(threadIdx.x) < splits;
  // the first NaN: equal keys, so the lowest index wins (-1: none)
  const int64_t nan_at = block_reduce_best(0.f, mine ? part.nan_idx[w] : -1, ks, is);
  float xmax;
  const int64_t first = block_reduce_best(mine ? part.max_val[w] : -INFINITY, mine ? part.max_idx[w] : -1, ks, is,
                                          &xmax);
  const int64_t win = block_reduce_best(mine ? part.key[w] : -INFINITY, mine ? part.key_idx[w] : -1, ks, is);
  if (threadIdx.x == 0) out[b] = nan_at >= 0 ? nan_at : !(xmax > -INFINITY) || xmax == INFINITY ? first : win;
}

}  // namespace gumbel_detail

// Workspace of gumbel_argmax for B rows in `splits` slices each (vocab_splits).
inline size_t gumbel_argmax_workspace_bytes(int64_t B, int64_t splits) {
  return size_t(B) * size_t(splits) * (3 * sizeof(int64_t) + 2 * sizeof(float));
}

// See the header comment: out[b] for B rows of V logits (row_stride elements apart), each split over
// `splits` CTAs (vocab_splits; force_splits: exactly that many, for tests) with a workspace of
// gumbel_argmax_workspace_bytes.
inline cudaError_t gumbel_argmax(int64_t* out, const float* x, int64_t row_stride, const int64_t* seeds,
                                 const int64_t* positions, int64_t B, int64_t V, uint32_t stream, int64_t splits,
                                 void* workspace, size_t workspace_bytes, cudaStream_t cuda_stream,
                                 bool force_splits = false) {
  using namespace gumbel_detail;
  if (B <= 0) return cudaSuccess;
  if (B > 0x7fffffff || V <= 0) return cudaErrorInvalidValue;
  const VocabPlan plan = vocab_plan(V, splits, force_splits);
  const size_t n = size_t(B) * size_t(plan.splits);
  if (!workspace || workspace_bytes < gumbel_argmax_workspace_bytes(B, plan.splits)) return cudaErrorInvalidValue;
  int64_t* w64 = static_cast<int64_t*>(workspace);  // 8-byte aligned first
  float* w32 = reinterpret_cast<float*>(w64 + 3 * n);
  const GumbelPartials part{w64, w64 + n, w32, w64 + 2 * n, w32 + n};
  gumbel_partial_kernel<<<dim3(unsigned(B), unsigned(plan.splits)), kThreads, 0, cuda_stream>>>(
      part, x, row_stride, seeds, positions, V, stream, plan);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  gumbel_finish_kernel<<<unsigned(B), kThreads, 0, cuda_stream>>>(out, part, plan.splits);
  return cudaGetLastError();
}

}  // namespace dk::cuda
