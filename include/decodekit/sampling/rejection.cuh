// CUDA rejection_sample (torch-free): the rule of sampling/rejection.h in two small kernels, no host
// synchronisation.
//
//   1. rejection_partial_kernel, grid (B, splits): the vocabulary of each request is cut into
//      `splits` slices (whole Philox blocks of 4 tokens; one slice, i.e. one CTA per request, once
//      the batch alone fills the GPU: vocab_splits in block_best.cuh). Every CTA repeats the cheap accept
//      decisions (one Philox word and two loads per draft), so all agree on the one row to sample:
//      the first rejected draft's residual max(p_i - q_i, 0), or the bonus row p_n. Its slice's
//      Gumbel-max is that of sampling/gumbel_max.h: the slice's largest weight is drawn first and
//      a token is drawn only while it can still beat the running best (gumbel_offer_block_w's exact
//      skips, one Philox block per 4 tokens), so a peaked row costs ~one read of the slice.
//      Greedy: the slice's argmax of every row 0..n (torch.argmax's rule as argmax_key integers, argmax.h: the
//      first NaN wins, as the CPU's spec_argmax), its key's bits in the float workspace.
//      Partial (key, token) pairs go to a workspace.
//   2. rejection_finish_kernel, one CTA per request: repeats the decisions, merges the partials
//      (a larger key wins, ties -> the lower token: the slice results combine to exactly the
//      sequential scan's), writes the tokens and the count. A residual that is zero everywhere
//      (p == q up to rounding) falls back to sampling p_i over the whole row here (rare).
//
// The per-token functions are the CPU kernel's (spec_accept_uniform, spec_gumbel), so CPU and GPU
// agree token for token (up to logf's last-ulp differences between libms, which matter only for
// keys tied to ~1e-7). num_draft is clamped to [0, k] (the CPU launcher rejects it instead).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/vec.cuh"
#include "decodekit/sampling/argmax.h"
#include "decodekit/sampling/block_best.cuh"
#include "decodekit/sampling/rejection.h"

namespace dk::cuda {
namespace spec_detail {
using namespace sampling_detail;

// The row every CTA of request b samples (sampled mode): rejection.h's spec_first_rejected over the request's
// rows (the first rejected draft, or n: the bonus).
DK_DEVICE int first_rejected(const int64_t* db, int n, const float* pb, const float* qb, int64_t V, uint64_t seed,
                             uint64_t pos0) {
  return spec_first_rejected(
      db, n, [&](int i, int64_t v) { return __ldg(pb + int64_t(i) * V + v); },
      [&](int i, int64_t v) { return __ldg(qb + int64_t(i) * V + v); }, qb != nullptr, V, seed, pos0);
}

// sampling/rejection.h's spec_sample, CTA-wide over tokens [v0, v1): Gumbel-max of weights w(v) >= 0
// (v0 a multiple of 4), each thread offering every blockDim-th Philox block: the best token (-1 when every
// weight is 0) and its key in *key.
template <class W>
DK_DEVICE int64_t slice_sample(W w, int64_t v0, int64_t v1, uint64_t seed, uint64_t pos, float* ks, int64_t* is,
                               float* key) {
  const int64_t first = block_best_range([&](int64_t v, bool& ok) {
    const float x = w(v);
    ok = x > 0.f;
    return x;
  }, v0, v1, ks, is);
  if (first < 0) {  // CTA-uniform
    *key = -INFINITY;
    return -1;
  }
  float best = logf(w(first)) + spec_gumbel(seed, pos, uint32_t(first));
  float below = gumbel_weight_floor(best);
  int64_t bi = first;
  for (int64_t j = v0 / 4 + threadIdx.x; 4 * j < v1; j += blockDim.x) {
    const int nb = v1 - 4 * j < 4 ? int(v1 - 4 * j) : 4;
    gumbel_offer_block_w(w, j, nb, first, seed, pos, kStreamSpecResample, best, bi, below);
  }
  return block_reduce_best(best, bi, ks, is, key);
}

__global__ void __launch_bounds__(kThreads)
rejection_partial_kernel(float* __restrict__ ws_key,             // [B, R, splits] (R = k+1 greedy, else 1)
                         int64_t* __restrict__ ws_idx,           // [B, R, splits]
                         const int64_t* __restrict__ draft,      // [B, k]
                         const int32_t* __restrict__ num_draft,  // [B]
                         const float* __restrict__ q,            // [B, k, V] or null (one-hot drafts)
                         const float* __restrict__ p,            // [B, k+1, V]
                         const int64_t* __restrict__ seeds,      // [B]
                         const int64_t* __restrict__ positions,  // [B]
                         int64_t k, int64_t V, bool greedy, VocabPlan plan) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x, s = blockIdx.y;
  const int64_t v0 = s * plan.slice, v1 = v0 + plan.slice < V ? v0 + plan.slice : V;
  int n = __ldg(num_draft + b);
  n = n < 0 ? 0 : (n > k ? int(k) : n);
  const float* pb = p + b * (k + 1) * V;
  const float* qb = q ? q + b * k * V : nullptr;
  const int64_t* db = draft + b * k;
  float key;
  if (greedy) {
    uint32_t* uks = reinterpret_cast<uint32_t*>(ks);  // (the same 4-byte slots)
    for (int i = 0; i <= n; ++i) {
      const float* pi = pb + int64_t(i) * V;
      uint32_t ukey;
      const int64_t t = block_best_range([&](int64_t v, bool& ok) { ok = true; return argmax_key(__ldg(pi + v)); },
                                         v0, v1, uks, is, &ukey);
      if (threadIdx.x == 0) {
        reinterpret_cast<uint32_t*>(ws_key)[(b * (k + 1) + i) * plan.splits + s] = ukey;
        ws_idx[(b * (k + 1) + i) * plan.splits + s] = t;
      }
    }
    return;
  }
  const uint64_t seed = uint64_t(__ldg(seeds + b)), pos0 = uint64_t(__ldg(positions + b));
  const int r = first_rejected(db, n, pb, qb, V, seed, pos0);
  const float* pr = pb + int64_t(r) * V;
  int64_t t;
  if (r == n) {
    t = slice_sample([&](int64_t v) { return __ldg(pr + v); }, v0, v1, seed, pos0 + uint64_t(r), ks, is, &key);
  } else {
    const float* qr = qb ? qb + int64_t(r) * V : nullptr;
    const int64_t x = __ldg(db + r);
    t = slice_sample([&](int64_t v) { return spec_residual(__ldg(pr + v), qr ? __ldg(qr + v) : (v == x ? 1.f : 0.f)); },
                     v0, v1, seed, pos0 + uint64_t(r), ks, is, &key);
  }
  if (threadIdx.x == 0) {
    ws_key[b * plan.splits + s] = key;
    ws_idx[b * plan.splits + s] = t;
  }
}

// The best of request b's row-i partials (CTA-wide); greedy: their keys are argmax_key integers.
DK_DEVICE int64_t merge_partials(const float* ws_key, const int64_t* ws_idx, int64_t row, int64_t splits, float* ks,
                                 int64_t* is, bool greedy) {
  const bool mine = int64_t(threadIdx.x) < splits;
  const int64_t idx = mine ? ws_idx[row * splits + threadIdx.x] : int64_t(-1);
  if (greedy)
    return block_reduce_best(mine ? reinterpret_cast<const uint32_t*>(ws_key)[row * splits + threadIdx.x] : 0u, idx,
                             reinterpret_cast<uint32_t*>(ks), is);
  return block_reduce_best(mine ? ws_key[row * splits + threadIdx.x] : -INFINITY, idx, ks, is);
}

__global__ void __launch_bounds__(kThreads)
rejection_finish_kernel(int64_t* __restrict__ out,               // [B, k+1]
                        int32_t* __restrict__ num_emitted,       // [B]
                        const float* __restrict__ ws_key,        // [B, R, splits]
                        const int64_t* __restrict__ ws_idx,      // [B, R, splits]
                        const int64_t* __restrict__ draft,       // [B, k]
                        const int32_t* __restrict__ num_draft,   // [B]
                        const float* __restrict__ q,             // [B, k, V] or null
                        const float* __restrict__ p,             // [B, k+1, V]
                        const int64_t* __restrict__ seeds,       // [B]
                        const int64_t* __restrict__ positions,   // [B]
                        int64_t k, int64_t V, bool greedy, int64_t splits) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x;
  int n = __ldg(num_draft + b);
  n = n < 0 ? 0 : (n > k ? int(k) : n);
  const int64_t* db = draft + b * k;
  int64_t* ob = out + b * (k + 1);
  for (int64_t i = threadIdx.x; i <= k; i += blockDim.x) ob[i] = -1;
  __syncthreads();
  int emitted = n + 1;
  if (greedy) {
    for (int i = 0; i <= n; ++i) {  // CTA-uniform control flow
      const int64_t t = merge_partials(ws_key, ws_idx, b * (k + 1) + i, splits, ks, is, true);
      if (threadIdx.x == 0) ob[i] = t;
      if (i < n && t != __ldg(db + i)) {
        emitted = i + 1;
        break;
      }
    }
  } else {
    const float* pb = p + b * (k + 1) * V;
    const uint64_t seed = uint64_t(__ldg(seeds + b)), pos0 = uint64_t(__ldg(positions + b));
    const int r = first_rejected(db, n, pb, q ? q + b * k * V : nullptr, V, seed, pos0);
    int64_t t = merge_partials(ws_key, ws_idx, b, splits, ks, is, false);
    if (t < 0 && r < n) {  // the residual is zero everywhere: sample p_r itself
      const float* pr = pb + int64_t(r) * V;
      float key;
      t = slice_sample([&](int64_t v) { return __ldg(pr + v); }, 0, V, seed, pos0 + uint64_t(r), ks, is, &key);
    }
    for (int i = threadIdx.x; i < r; i += blockDim.x) ob[i] = __ldg(db + i);
    if (threadIdx.x == 0) ob[r] = t;
    emitted = r + 1;
  }
  if (threadIdx.x == 0) num_emitted[b] = emitted;
}

}  // namespace spec_detail

// Workspace for rejection_sample with `splits` CTAs per request (vocab_splits).
inline size_t rejection_sample_workspace_bytes(int64_t B, int64_t k, int64_t splits, bool greedy) {
  const size_t n = size_t(B) * size_t(greedy ? k + 1 : 1) * size_t(splits);
  return n * (sizeof(float) + sizeof(int64_t));
}

// See the header comment; B requests, k draft slots each, vocabulary V; `splits` CTAs per request
// (vocab_splits; force_splits: exactly that many, for tests), workspace of
// rejection_sample_workspace_bytes.
inline cudaError_t rejection_sample(int64_t* out, int32_t* num_emitted, const int64_t* draft, const int32_t* num_draft,
                                    const float* q, const float* p, const int64_t* seeds, const int64_t* positions,
                                    int64_t B, int64_t k, int64_t V, bool greedy, int64_t splits, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream, bool force_splits = false) {
  using namespace spec_detail;
  if (B <= 0) return cudaSuccess;
  if (B > 0x7fffffff || V <= 0 || k < 0) return cudaErrorInvalidValue;
  const VocabPlan plan = vocab_plan(V, splits, force_splits);
  const size_t n = size_t(B) * size_t(greedy ? k + 1 : 1) * size_t(plan.splits);
  if (!workspace || workspace_bytes < n * (sizeof(float) + sizeof(int64_t))) return cudaErrorInvalidValue;
  int64_t* ws_idx = static_cast<int64_t*>(workspace);  // 8-byte aligned first
  float* ws_key = reinterpret_cast<float*>(ws_idx + n);
  const dim3 grid(unsigned(B), unsigned(plan.splits));
  rejection_partial_kernel<<<grid, kThreads, 0, stream>>>(ws_key, ws_idx, draft, num_draft, q, p, seeds, positions,
                                                          k, V, greedy, plan);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  rejection_finish_kernel<<<unsigned(B), kThreads, 0, stream>>>(out, num_emitted, ws_key, ws_idx, draft, num_draft, q,
                                                                p, seeds, positions, k, V, greedy, plan.splits);
  return cudaGetLastError();
}

}  // namespace dk::cuda
