// Paged KV addressing and the online-softmax algebra, shared by the CPU and CUDA
// attention kernels.
//
// KV cache layout, one tensor for K and one for V per layer:
//   [num_blocks, num_kv_heads, block_size, head_dim]   (HND: one head's block is contiguous)
// A slot is block * block_size + offset; negative slots mark padding and are skipped.
#pragma once
#include <cmath>
#include "decodekit/common/macros.h"

namespace dk {

struct PagedLayout {
  int num_kv_heads;
  int block_size;
  int head_dim;

  // Element offset of (block, head, offset-in-block) row start.
  DK_HD int64_t row(int64_t block, int head, int offset) const {
    return ((block * num_kv_heads + head) * int64_t(block_size) + offset) * head_dim;
  }
  // Element offset of the row that holds slot `slot` for `head`.
  DK_HD int64_t slot_row(int64_t slot, int head) const {
    return row(slot / block_size, head, int(slot % block_size));
  }
};

// Scales of an fp8 KV cache: KV head h's scale = ptr[h * stride] (stride 0: one scale for
// the tensor); a null pointer means 1 (and is what non-fp8 caches pass).
struct KVScales {
  const float* k = nullptr;
  const float* v = nullptr;
  int stride = 0;
  DK_HD float key(int h) const { return k ? k[h * stride] : 1.f; }
  DK_HD float value(int h) const { return v ? v[h * stride] : 1.f; }
};

// Causal window: a sequence with `ctx` tokens of context (incl. the `n` new ones) puts
// new token i at position ctx - n + i, and it sees keys 0 .. ctx - n + i.
DK_HD int64_t causal_last_key(int64_t ctx, int64_t n, int64_t i) { return ctx - n + i; }

// Running state of one query row's softmax over key chunks: max m, sum l of exp(s - m).
struct OnlineSoftmax {
  float m;
  float l;
  DK_HD void init() { m = -INFINITY; l = 0.f; }
  // Folds in a chunk with maximum chunk_max; returns the factor by which the running
  // accumulator must be scaled (exp(old_m - new_m)) and updates m. Add the chunk's
  // exp(s - m) terms to l afterwards with add().
  DK_HD float rescale(float chunk_max) {
    const float nm = chunk_max > m ? chunk_max : m;
    const float corr = (m == -INFINITY) ? 0.f : expf(m - nm);
    l *= corr;
    m = nm;
    return corr;
  }
  DK_HD void add(float p) { l += p; }
  // Natural-log sum of exp over all keys seen.
  DK_HD float lse() const { return m + logf(l); }
};

// Weights for merging two partial results (o_a, lse_a), (o_b, lse_b) of the same query
// over disjoint key sets: o = w_a o_a + w_b o_b, lse = merged. Either side may be empty
// (lse = -inf).
DK_HD float merge_lse(float lse_a, float lse_b, float& w_a, float& w_b) {
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == -INFINITY) { w_a = 0.f; w_b = 0.f; return -INFINITY; }
  const float ea = expf(lse_a - m), eb = expf(lse_b - m);
  const float s = ea + eb;
  w_a = ea / s;
  w_b = eb / s;
  return m + logf(s);
}

}  // namespace dk
