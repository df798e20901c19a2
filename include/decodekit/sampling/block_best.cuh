// CTA-wide (key, index) arg-best for the sampling kernels (rejection.cuh, gumbel_max.cuh): a larger
// key wins, equal keys -> the lower index (as the CPU's sequential scans), index < 0 = nothing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "decodekit/common/macros.h"

namespace dk::cuda {
namespace sampling_detail {

constexpr int kThreads = 256;

template <class K>  // float keys, or the argmax_key integers of greedy (rejection.cuh)
DK_DEVICE bool better(K k1, int64_t i1, K k2, int64_t i2) {
  if (i2 < 0) return i1 >= 0;
  if (i1 < 0) return false;
  return k1 > k2 || (k1 == k2 && i1 < i2);
}

// Reduces every thread's (bk, bi) to the CTA's best index (all threads get it; its key in *best_key
// when given). ks / is: kThreads shared slots each (blockDim.x == kThreads, a power of two).
template <class K>
DK_DEVICE int64_t block_reduce_best(K bk, int64_t bi, K* ks, int64_t* is, K* best_key = nullptr) {
  ks[threadIdx.x] = bk;
  is[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s && better(ks[threadIdx.x + s], is[threadIdx.x + s], ks[threadIdx.x], is[threadIdx.x])) {
      ks[threadIdx.x] = ks[threadIdx.x + s];
      is[threadIdx.x] = is[threadIdx.x + s];
    }
    __syncthreads();
  }
  const int64_t r = is[0];
  if (best_key) *best_key = ks[0];
  __syncthreads();  // ks / is are reused by the next reduction
  return r;
}

// CTA-wide best (key, idx) of key(v, ok) over v in [v0, v1) where ok; -1 when no v is (its key in *best_key
// when given: -inf then, 0 for integer keys). K: float (NaN-free) keys, or integers (argmax_key).
template <class Key, class K>
DK_DEVICE int64_t block_best_range(Key key, int64_t v0, int64_t v1, K* ks, int64_t* is, K* best_key = nullptr) {
  K bk = K(std::is_floating_point_v<K> ? -INFINITY : 0.f);
  int64_t bi = -1;
  for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    bool ok;
    const K x = key(v, ok);
    if (ok && better(x, v, bk, bi)) {
      bk = x;
      bi = v;
    }
  }
  return block_reduce_best(bk, bi, ks, is, best_key);
}

// block_best_range over [0, V).
template <class Key>
DK_DEVICE int64_t block_best(Key key, int64_t V, float* ks, int64_t* is) {
  return block_best_range(key, 0, V, ks, is);
}

// ---- splitting a vocabulary over CTAs (rejection.cuh, gumbel_max.cuh): each CTA scans a slice and a second
// kernel merges the slices' results, so that a small batch over a large vocabulary fills the GPU.
constexpr int64_t kMinSlice = 4096;  // tokens per CTA at least (16 KB of a float32 row)
constexpr int64_t kMaxSplits = 64;   // (the merge kernels give each slice a thread)
static_assert(kMaxSplits <= kThreads, "a merge kernel gives each slice a thread");

// A V-token row cut into `splits` slices of `slice` tokens (a multiple of 4, the Philox blocks of
// gumbel_max.h; the last slice may be shorter).
struct VocabPlan {
  int64_t splits, slice;
};

// Host and device: the slices for `want` CTAs per row (clamped to [1, kMaxSplits] and to slices of at least
// kMinSlice tokens, unless force: exactly that many, for tests).
DK_HD VocabPlan vocab_plan(int64_t V, int64_t want, bool force = false) {
  int64_t s = want < 1 ? 1 : (want > kMaxSplits ? kMaxSplits : want);
  if (!force) {
    const int64_t by_len = (V + kMinSlice - 1) / kMinSlice;
    s = s < by_len ? s : by_len;
  }
  s = s < 1 ? 1 : s;
  const int64_t slice = ((V + s - 1) / s + 3) / 4 * 4;
  return VocabPlan{(V + slice - 1) / slice, slice};
}

}  // namespace sampling_detail

// CTAs per row for B rows of V tokens on a GPU with num_sms SMs (about two CTAs per SM in all, slices of at
// least kMinSlice tokens): 32 for one row over a 128k vocabulary, 1 from B = 2 x num_sms on. Shapes only,
// so CUDA graphs replay the same plan.
inline int64_t vocab_splits(int64_t B, int64_t V, int num_sms) {
  const int64_t want = B > 0 ? (2 * int64_t(num_sms > 0 ? num_sms : 1) + B - 1) / B : 1;
  return sampling_detail::vocab_plan(V, want).splits;
}

}  // namespace dk::cuda
