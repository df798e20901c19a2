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

// Scales of an fp8 KV cache: KV head h's key scale = k[h * k_stride], its value scale v[h * v_stride]
// (stride 0: one scale for the tensor, 1: one per KV head; each independently); a null pointer means
// 1 (and is what non-fp8 caches pass).
struct KVScales {
  const float* k = nullptr;
  const float* v = nullptr;
  int k_stride = 0;
  int v_stride = 0;
  DK_HD float key(int h) const { return k ? k[h * k_stride] : 1.f; }
  DK_HD float value(int h) const { return v ? v[h * v_stride] : 1.f; }
};

// Causal window: a sequence with `ctx` tokens of context (incl. the `n` new ones) puts
// new token i at position ctx - n + i, and it sees keys 0 .. ctx - n + i.
DK_HD int64_t causal_last_key(int64_t ctx, int64_t n, int64_t i) { return ctx - n + i; }
// Sliding-window attention (Mistral, Qwen2's sliding layers): a query whose last key is `last`
// sees only the `window` keys last - window + 1 .. last (transformers' mask: key > query - window);
// window <= 0: every key from 0 (plain causal attention).
DK_HD int64_t window_first_key(int64_t last, int64_t window) {
  return window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
}

// Running state of one query row's softmax over key chunks: max m, sum l of exp(s - m).
struct OnlineSoftmax {
  float m;
  float l;
  DK_HD void init() { m = -INFINITY; l = 0.f; }
  // Folds in a chunk with maximum chunk_max; returns the factor by which the running
  // accumulator must be scaled (exp(old_m - new_m)) and updates m. Add the chunk's
  // exp(s - m) terms to l afterwards with add().
  DK_HD float rescale(float chunk_max) {
    if (chunk_max <= m) return 1.f;  // max unchanged: exp(0), no exp call
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

// ---- CUDA split-KV ("flash-decoding") plan: host code, shared by the torch launcher and the
// C++ benchmark (the kernels are in paged.cuh).
// Split-KV plan, from shapes only (so a captured CUDA graph stays valid): one split while
// tokens x KV heads x head chunks fill the GPU (>= 1 CTA per SM); else enough splits for
// ~kPlanCtasPerSm CTAs per SM, at most max_keys / kMinKeysPerSplit and kPlanMaxSplits. max_keys:
// the most keys a token can see (block_tables columns x block_size, or the sliding window if that is
// smaller). kMaxSplits: what the kernels take (bench_attention sweeps up to it).
inline constexpr int kMaxSplits = 128;
inline constexpr int kPlanMaxSplits = 32;
inline constexpr int kPlanCtasPerSm = 2;
inline constexpr int64_t kMinKeysPerSplit = 256;
inline int paged_attention_num_splits(int64_t num_tokens, int num_kv_heads, int num_q_heads, int64_t max_keys,
                                      int num_sms) {
  const int group = num_kv_heads > 0 ? num_q_heads / num_kv_heads : 1;
  const int64_t chunks = (group + 7) / 8;  // kMaxHeadsPerCta (4 for fp32 queries: a heuristic either way)
  const int64_t ctas = num_tokens * num_kv_heads * chunks;
  if (ctas <= 0 || ctas >= num_sms) return 1;
  int64_t n = (kPlanCtasPerSm * int64_t(num_sms) + ctas - 1) / ctas;
  const int64_t by_len = max_keys / kMinKeysPerSplit;
  if (n > by_len) n = by_len;
  if (n > kPlanMaxSplits) n = kPlanMaxSplits;
  return n < 1 ? 1 : int(n);
}
// Head dims the CUDA tensor-core (prefill) kernel has instantiations for.
DK_HD constexpr bool paged_prefill_head_dim_ok(int d) { return d == 64 || d == 128; }
// Shape-only choice of the CUDA paged_attention kernel (CUDA-graph stable): the tensor-core
// kernel (prefill.cuh) for half / bf16 queries when some sequence brings more than one new
// token (prefill, chunked prefill, mixed batches, verification of drafted tokens); the decode
// kernel (split-KV, paged.cuh) otherwise. The split-KV plan applies to the decode kernel only.
inline bool paged_attention_uses_prefill_kernel(bool half_or_bf16, int head_dim, int64_t num_tokens, int num_seqs) {
  return half_or_bf16 && paged_prefill_head_dim_ok(head_dim) && num_tokens > num_seqs;
}
// float elements of workspace paged_attention needs for num_splits > 1 (0 otherwise).
inline int64_t paged_attention_workspace_floats(int num_splits, int64_t num_tokens, int num_q_heads, int head_dim) {
  return num_splits > 1 ? int64_t(num_splits) * num_tokens * num_q_heads * (head_dim + 1) : 0;
}

}  // namespace dk
