// CUDA rejection_sample (torch-free): the rule of sampling/rejection.h, one CTA per request, the
// vocabulary scans (argmax, Gumbel-max of the residual or of the bonus row) split over the CTA's
// threads and reduced in shared memory (ties -> the lowest token, as the CPU's sequential scan).
// The accept decision uses the same per-element functions (spec_accept_uniform, spec_gumbel), so
// CPU and GPU agree token for token (up to logf's last-ulp differences between libms, which
// matter only for keys tied to ~1e-7). No host synchronisation; num_draft is clamped to [0, k]
// (the CPU launcher rejects it instead).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/vec.cuh"
#include "decodekit/sampling/block_best.cuh"
#include "decodekit/sampling/rejection.h"

namespace dk::cuda {
namespace spec_detail {
using namespace sampling_detail;

__global__ void __launch_bounds__(kThreads)
rejection_sample_kernel(int64_t* __restrict__ out,           // [B, k+1]
                        int32_t* __restrict__ num_emitted,   // [B]
                        const int64_t* __restrict__ draft,   // [B, k]
                        const int32_t* __restrict__ num_draft,  // [B]
                        const float* __restrict__ q,         // [B, k, V] or null (one-hot drafts)
                        const float* __restrict__ p,         // [B, k+1, V]
                        const int64_t* __restrict__ seeds,   // [B]
                        const int64_t* __restrict__ positions,  // [B]
                        int64_t k, int64_t V, bool greedy) {
  __shared__ float ks[kThreads];
  __shared__ int64_t is[kThreads];
  const int64_t b = blockIdx.x;
  int n = __ldg(num_draft + b);
  n = n < 0 ? 0 : (n > k ? int(k) : n);
  const uint64_t seed = uint64_t(__ldg(seeds + b)), pos0 = uint64_t(__ldg(positions + b));
  const float* pb = p + b * (k + 1) * V;
  const float* qb = q ? q + b * k * V : nullptr;
  const int64_t* db = draft + b * k;
  int64_t* ob = out + b * (k + 1);
  for (int64_t i = threadIdx.x; i <= k; i += blockDim.x) ob[i] = -1;
  __syncthreads();
  int emitted = n + 1;
  for (int i = 0; i <= n; ++i) {  // CTA-uniform control flow
    const uint64_t pos = pos0 + uint64_t(i);
    const float* pi = pb + int64_t(i) * V;
    if (i == n) {  // bonus
      int64_t t;
      if (greedy) t = block_best([&](int64_t v, bool& ok) { ok = true; return pi[v]; }, V, ks, is);
      else t = block_best([&](int64_t v, bool& ok) {
          const float w = pi[v];
          ok = w > 0.f;
          return ok ? logf(w) + spec_gumbel(seed, pos, uint32_t(v)) : 0.f;
        }, V, ks, is);
      if (threadIdx.x == 0) ob[i] = t;
      break;
    }
    const int64_t x = __ldg(db + i);
    const bool in_vocab = x >= 0 && x < V;
    if (greedy) {
      const int64_t t = block_best([&](int64_t v, bool& ok) { ok = true; return pi[v]; }, V, ks, is);
      if (threadIdx.x == 0) ob[i] = t;
      if (t != x) {
        emitted = i + 1;
        break;
      }
      continue;
    }
    const float* qi = qb ? qb + int64_t(i) * V : nullptr;
    const float px = in_vocab ? pi[x] : 0.f;
    const float qx = qi ? (in_vocab ? qi[x] : 0.f) : 1.f;
    if (in_vocab && qx > 0.f && spec_accept_uniform(seed, pos) * qx < px) {
      if (threadIdx.x == 0) ob[i] = x;
      continue;
    }
    int64_t t = block_best([&](int64_t v, bool& ok) {
      const float qv = qi ? qi[v] : (v == x ? 1.f : 0.f);
      const float r = pi[v] - qv;
      ok = r > 0.f;
      return ok ? logf(r) + spec_gumbel(seed, pos, uint32_t(v)) : 0.f;
    }, V, ks, is);
    if (t < 0)
      t = block_best([&](int64_t v, bool& ok) {
        const float w = pi[v];
        ok = w > 0.f;
        return ok ? logf(w) + spec_gumbel(seed, pos, uint32_t(v)) : 0.f;
      }, V, ks, is);
    if (threadIdx.x == 0) ob[i] = t;
    emitted = i + 1;
    break;
  }
  if (threadIdx.x == 0) num_emitted[b] = emitted;
}

}  // namespace spec_detail

// See the header comment; B requests, k draft slots each, vocabulary V.
inline cudaError_t rejection_sample(int64_t* out, int32_t* num_emitted, const int64_t* draft, const int32_t* num_draft,
                                    const float* q, const float* p, const int64_t* seeds, const int64_t* positions,
                                    int64_t B, int64_t k, int64_t V, bool greedy, cudaStream_t stream) {
  using namespace spec_detail;
  if (B <= 0) return cudaSuccess;
  if (B > 0x7fffffff || V <= 0) return cudaErrorInvalidValue;
  rejection_sample_kernel<<<unsigned(B), kThreads, 0, stream>>>(out, num_emitted, draft, num_draft, q, p, seeds,
                                                               positions, k, V, greedy);
  return cudaGetLastError();
}

}  // namespace dk::cuda
