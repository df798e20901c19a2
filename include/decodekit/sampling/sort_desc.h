// Stable descending sort of float32 rows, host and device: the rule of the sort_desc_stable op (CPU
// kernel below, CUDA in sort_desc.cuh) and of its reference, torch.sort(x, dim=-1, descending=True,
// stable=True), bit for bit: values and token ids in rank order, ties in token order, every NaN
// (whatever its sign or payload) before +inf and equal to the others, -0.0 equal to +0.0.
//
// The order is that of one unsigned 32-bit key per value, sort_desc_key (ascending key = descending
// value), so a stable LSD radix sort on the keys (3 passes of 11 / 11 / 10 bits, token ids riding along)
// gives the order in O(V): the sampler's top-p / min-p filters sort whole vocabulary rows on the CPU when a
// row keeps more than a few thousand tokens, where a comparison sort of 49152 floats took 3.5 ms (128256:
// 10-11 ms) on 2 EPYC cores.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"

namespace dk {

// The sort key of x: sort_desc_key(a) < sort_desc_key(b) iff a sorts before b in descending order; equal
// for values torch.sort ranks equal (all NaNs; -0.0 and +0.0). NaN -> 0 (first), then +inf, ..., -inf.
DK_HD uint32_t sort_desc_key(float x) {
  if (x != x) return 0u;
  uint32_t u = float_to_bits(x);
  if ((u << 1) == 0u) u = 0u;                                         // -0.0 -> +0.0
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // monotone in x
  return ~ascending;  // 0 only for the NaN bit pattern 0x7fffffff, which took the branch above
}

namespace cpu {

inline constexpr int kSortDigitBits[3] = {11, 11, 10};  // LSD passes over the 32 key bits

// One row: values[r] / indices[r] = the r-th value of x in descending order and its position (ties in
// position order). keys / tmp_keys / ids / tmp_ids: scratch of V each (the caller's, reused across rows).
inline void sort_desc_row(float* values,         // [V]
                          int64_t* indices,      // [V]
                          const float* x,        // [V]
                          int64_t V, std::vector<uint32_t>& keys, std::vector<uint32_t>& tmp_keys,
                          std::vector<uint32_t>& ids, std::vector<uint32_t>& tmp_ids) {
  keys.resize(size_t(V));
  tmp_keys.resize(size_t(V));
  ids.resize(size_t(V));
  tmp_ids.resize(size_t(V));
  uint32_t hist[3][2048] = {};
  for (int64_t v = 0; v < V; ++v) {
    const uint32_t k = sort_desc_key(x[v]);
    keys[size_t(v)] = k;
    ids[size_t(v)] = uint32_t(v);
    ++hist[0][k & 2047u];
    ++hist[1][(k >> 11) & 2047u];
    ++hist[2][k >> 22];
  }
  uint32_t* src_k = keys.data();
  uint32_t* dst_k = tmp_keys.data();
  uint32_t* src_i = ids.data();
  uint32_t* dst_i = tmp_ids.data();
  int shift = 0;
  for (int p = 0; p < 3; ++p) {
    const int bits = kSortDigitBits[p];
    const uint32_t mask = (1u << bits) - 1u;
    uint32_t* h = hist[p];
    bool one_bucket = false;  // every key has the same digit: the pass would copy in order
    for (uint32_t d = 0; d <= mask; ++d)
      if (h[d] != 0) {
        one_bucket = h[d] == uint32_t(V);
        break;
      }
    if (!one_bucket) {
      uint32_t start = 0;  // exclusive prefix sum: each digit's first output slot
      for (uint32_t d = 0; d <= mask; ++d) {
        const uint32_t c = h[d];
        h[d] = start;
        start += c;
      }
      for (int64_t v = 0; v < V; ++v) {  // stable scatter
        const uint32_t k = src_k[v];
        const uint32_t slot = h[(k >> shift) & mask]++;
        dst_k[slot] = k;
        dst_i[slot] = src_i[v];
      }
      std::swap(src_k, dst_k);
      std::swap(src_i, dst_i);
    }
    shift += bits;
  }
  for (int64_t r = 0; r < V; ++r) {
    const uint32_t i = src_i[r];
    values[r] = x[i];
    indices[r] = int64_t(i);
  }
}

// B rows of x (row stride x_stride) into values / indices [B, V] (contiguous); rows in parallel.
inline void sort_desc_stable(float* values,     // [B, V]
                             int64_t* indices,  // [B, V]
                             const float* x,    // [B, V], row stride x_stride
                             int64_t x_stride, int64_t B, int64_t V) {
  DK_OMP_PARALLEL_FOR_IF(B > 1 && B * V >= kParallelGrain)
  for (int64_t b = 0; b < B; ++b) {
    // the thread's scratch, kept across calls: a fresh 2 MB (128k-token row) allocation is mapped and
    // page-faulted anew each time
    thread_local std::vector<uint32_t> keys, tmp_keys, ids, tmp_ids;
    sort_desc_row(values + b * V, indices + b * V, x + b * x_stride, V, keys, tmp_keys, ids, tmp_ids);
  }
}

}  // namespace cpu
}  // namespace dk
