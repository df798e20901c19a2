// CPU launchers for reshape_and_cache and paged_attention (kernels in
// include/decodekit/attention/cpu.h). The host can afford to validate the metadata
// (block ids, lengths) that the CUDA launchers must trust.
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "../op_args.h"
#include "dispatch.h"
#include "decodekit/attention/cpu.h"

namespace {

// f(C{}) with C the cache's element type for activations T (checked by kv_cache_scales): fp8, T itself,
// or for float activations a 16-bit cache (kv_cache_mixed).
template <class T, class F>
void with_cache_type(const at::Tensor& key_cache, bool fp8, F&& f) {
  if (fp8) return f(dk::fp8_e4m3_t{});
  if constexpr (std::is_same_v<T, float>) {
    if (key_cache.scalar_type() == at::kBFloat16) return f(dk::bf16_t{});
    if (key_cache.scalar_type() == at::kHalf) return f(dk::half_t{});
  }
  f(T{});
}

void reshape_and_cache_cpu(const at::Tensor& key,        // [T, Hk, D]
                           const at::Tensor& value,      // [T, Hk, D]
                           at::Tensor& key_cache,        // [num_blocks, Hk, block_size, D]
                           at::Tensor& value_cache,      // [num_blocks, Hk, block_size, D]
                           const at::Tensor& slot_mapping,    // [T] int64
                           const std::optional<at::Tensor>& k_scale,    // fp8 cache: [1] or [Hk] float32
                           const std::optional<at::Tensor>& v_scale) {  // fp8 cache: [1] or [Hk] float32
  const dk::CacheArgs a =
      dk::reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t num_slots = a.num_blocks * a.block_size;
  for (int64_t t = 0; t < a.num_tokens; ++t)
    TORCH_CHECK(slots[t] < num_slots, "decodekit::reshape_and_cache: 'slot_mapping'[", t, "] = ", slots[t],
                " is outside the cache (num_blocks * block_size = ", num_slots, ")");
  const dk::PagedLayout L{a.num_kv_heads, a.block_size, a.head_dim};
  DK_CPU_DISPATCH_FLOATING(key.scalar_type(), "decodekit::reshape_and_cache", [&] {
    with_cache_type<scalar_t>(key_cache, a.fp8, [&](auto cache_tag) {
      using C = decltype(cache_tag);
      dk::cpu::reshape_and_cache<scalar_t, C>(dk_ptr<scalar_t>(key), dk_ptr<scalar_t>(value), a.k_stride,
                                              a.v_stride, dk_ptr<C>(key_cache), dk_ptr<C>(value_cache), slots,
                                              a.num_tokens, L, a.kv);
    });
  });
}

void paged_attention_cpu(at::Tensor& out,                    // [T, Hq, D]
                         const at::Tensor& query,            // [T, Hq, D]
                         const at::Tensor& key_cache,        // [num_blocks, Hk, block_size, D]
                         const at::Tensor& value_cache,      // [num_blocks, Hk, block_size, D]
                         const at::Tensor& block_tables,     // [S, max_blocks] int32
                         const at::Tensor& seq_lens,         // [S] int32
                         const at::Tensor& query_start_loc,  // [S + 1] int32
                         double scale, const std::optional<at::Tensor>& lse,  // [T, Hq] float32
                         const std::optional<at::Tensor>& k_scale,    // fp8 cache: [1] or [Hk] float32
                         const std::optional<at::Tensor>& v_scale,    // fp8 cache: [1] or [Hk] float32
                         int64_t sliding_window) {                    // 0: none
  const char* op = "decodekit::paged_attention";
  const dk::AttnArgs a = dk::paged_attention_args(out, query, key_cache, value_cache, block_tables, seq_lens,
                                                  query_start_loc, scale, lse, k_scale, v_scale, sliding_window);
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  TORCH_CHECK(qsl[0] == 0 && qsl[a.num_seqs] == a.num_tokens, op, ": 'query_start_loc' must start at 0 and end at ",
              "num_tokens = ", a.num_tokens, ", got [", qsl[0], " .. ", qsl[a.num_seqs], "]");
  for (int s = 0; s < a.num_seqs; ++s) {
    const int64_t n = qsl[s + 1] - qsl[s];
    TORCH_CHECK(n >= 0, op, ": 'query_start_loc' must be non-decreasing (sequence ", s, ")");
    TORCH_CHECK(lens[s] >= n, op, ": 'seq_lens'[", s, "] = ", lens[s], " is smaller than its ", n, " new tokens");
    if (n == 0) continue;
    const int64_t nb = (int64_t(lens[s]) + a.block_size - 1) / a.block_size;
    TORCH_CHECK(nb <= a.max_blocks, op, ": 'seq_lens'[", s, "] = ", lens[s], " needs ", nb,
                " blocks but 'block_tables' has ", a.max_blocks, " columns");
    // the blocks the kernel reads: from the window of the first new token on
    const int64_t first_key = dk::window_first_key(dk::causal_last_key(lens[s], n, 0), a.window);
    for (int64_t b = first_key / a.block_size; b < nb; ++b) {
      const int32_t id = bt[int64_t(s) * a.max_blocks + b];
      TORCH_CHECK(id >= 0 && id < a.num_blocks, op, ": 'block_tables'[", s, ", ", b, "] = ", id,
                  " is outside [0, num_blocks = ", a.num_blocks, ")");
    }
  }
  if (a.num_tokens == 0 || a.num_q_heads == 0) return;  // nothing to write (the kernel's tiles need a row)
  dk::cpu::PagedAttentionParams P{a.num_tokens, a.num_seqs, a.num_q_heads, a.max_blocks, a.q_stride, float(scale),
                                  dk::PagedLayout{a.num_kv_heads, a.block_size, a.head_dim}, a.window};
  float* lse_ptr = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  DK_CPU_DISPATCH_FLOATING(query.scalar_type(), op, [&] {
    with_cache_type<scalar_t>(key_cache, a.fp8, [&](auto cache_tag) {
      using C = decltype(cache_tag);
      dk::cpu::paged_attention<scalar_t, C>(dk_ptr<scalar_t>(out), lse_ptr, dk_ptr<scalar_t>(query),
                                            dk_ptr<C>(key_cache), dk_ptr<C>(value_cache), bt, lens, qsl, P, a.kv);
    });
  });
}

void copy_blocks_cpu(at::TensorList key_caches,     // per layer [num_blocks, ...]
                     at::TensorList value_caches,   // per layer [num_blocks, ...]
                     const at::Tensor& block_mapping) {  // [N, 2] int64 (src, dst)
  const dk::BlockCopyArgs a = dk::copy_blocks_args(key_caches, value_caches, block_mapping);
  const int64_t* m = block_mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < 2 * a.num_pairs; ++i)
    TORCH_CHECK(m[i] >= 0 && m[i] < a.num_blocks, "decodekit::copy_blocks: 'block_mapping'[", i / 2, ", ", i % 2,
                "] = ", m[i], " is outside [0, num_blocks = ", a.num_blocks, ")");
  // Every pair reads the blocks' contents from before the call (the reference's semantics). The
  // kernel copies pairs in parallel, which is that only when no destination is also a source; a
  // destination given two different sources has no meaning. O(N log N) in the pairs.
  std::vector<std::pair<int64_t, int64_t>> by_dst(size_t(a.num_pairs));  // (dst, src)
  for (int64_t i = 0; i < a.num_pairs; ++i) by_dst[size_t(i)] = {m[2 * i + 1], m[2 * i]};
  std::sort(by_dst.begin(), by_dst.end());
  for (size_t i = 1; i < by_dst.size(); ++i)
    TORCH_CHECK(by_dst[i].first != by_dst[i - 1].first || by_dst[i].second == by_dst[i - 1].second,
                "decodekit::copy_blocks: 'block_mapping' copies blocks ", by_dst[i - 1].second, " and ",
                by_dst[i].second, " onto the same destination block ", by_dst[i].first,
                " (each destination must have one source)");
  bool chained = false;  // some destination is also a source (read after being written)
  for (int64_t i = 0; i < a.num_pairs && !chained; ++i) {
    const int64_t src = m[2 * i];
    auto it = std::lower_bound(by_dst.begin(), by_dst.end(), std::pair<int64_t, int64_t>{src, INT64_MIN});
    chained = it != by_dst.end() && it->first == src && it->second != src;
  }
  std::vector<char> staged(chained ? size_t(a.num_pairs * a.block_bytes) : 0);
  for (size_t l = 0; l < key_caches.size(); ++l)
    for (const at::Tensor* t : {&key_caches[l], &value_caches[l]}) {
      char* cache = static_cast<char*>(t->data_ptr());
      if (!chained) {
        dk::cpu::copy_blocks(cache, a.block_bytes, m, a.num_pairs);
        continue;
      }
      for (int64_t i = 0; i < a.num_pairs; ++i)  // all sources first, then all destinations
        std::memcpy(staged.data() + i * a.block_bytes, cache + m[2 * i] * a.block_bytes, size_t(a.block_bytes));
      for (int64_t i = 0; i < a.num_pairs; ++i)
        std::memcpy(cache + m[2 * i + 1] * a.block_bytes, staged.data() + i * a.block_bytes, size_t(a.block_bytes));
    }
}

void swap_blocks_cpu(const at::Tensor& src,            // [num_src_blocks, ...]
                     at::Tensor& dst,                  // [num_dst_blocks, ...] same block shape
                     const at::Tensor& block_mapping) {  // [N, 2] int64 on the CPU
  const dk::BlockCopyArgs a = dk::swap_blocks_args(src, dst, block_mapping);
  TORCH_CHECK(src.device().is_cpu() && dst.device().is_cpu(), "decodekit::swap_blocks: CPU kernel got 'src' on ",
              src.device(), " and 'dst' on ", dst.device());
  const int64_t* m = block_mapping.data_ptr<int64_t>();
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  for (int64_t i = 0; i < a.num_pairs; ++i)
    std::memcpy(to + m[2 * i + 1] * a.block_bytes, from + m[2 * i] * a.block_bytes, size_t(a.block_bytes));
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CPU, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cpu);
  m.impl("paged_attention", &paged_attention_cpu);
  m.impl("copy_blocks", &copy_blocks_cpu);
  m.impl("swap_blocks", &swap_blocks_cpu);
}
