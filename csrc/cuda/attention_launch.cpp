// Torch launchers for reshape_and_cache and paged_attention (CUDA dispatch key). Host code,
// compiled by g++ in the CUDA build only; the kernels and their dk::cuda launchers are
// instantiated in attention.cu (include/decodekit/attention/paged.cuh), which nvcc compiles
// without any torch header.
//
// Unlike the CPU launchers, the metadata (slot_mapping, block_tables, seq_lens,
// query_start_loc) is not validated here: that would need device-to-host copies (a sync,
// and no CUDA-graph capture). The kernels never read outside a tensor for bad metadata:
// out-of-range slots are skipped; attention rows of an inconsistent sequence come out NaN
// (see paged.cuh).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

// Whether the environment variable `name` selects `alt` over the default kernel `dflt` (unset, "auto" or dflt:
// the default; anything else is an error naming the choices).
bool env_kernel_choice(const char* name, const std::string& dflt, const std::string& alt) {
  const char* v = std::getenv(name);
  const std::string s = v ? v : "";
  TORCH_CHECK(s.empty() || s == dflt || s == alt || s == "auto", name, " must be ", dflt, ", ", alt, " or auto (",
              dflt, "), not '", s, "'");
  return s == alt;
}

// DECODEKIT_DECODE_ATTN = tc (default) | simt: the decode kernel for half / bf16 queries (paged.cuh's
// DecodeKernel: the tensor-core kernel of decode_tc.cuh, or the SIMT prefetch kernel). Read once.
bool tensor_core_decode() {
  static const bool tc = !env_kernel_choice("DECODEKIT_DECODE_ATTN", "tc", "simt");
  return tc;
}

// DECODEKIT_PREFILL_ATTN = mma (default) | wgmma: the products of the prefill kernel (prefill.cuh) by
// mma.sync or by sm_90a warpgroup MMAs. Read once.
bool wgmma_prefill() {
  static const bool wg = env_kernel_choice("DECODEKIT_PREFILL_ATTN", "mma", "wgmma");
  return wg;
}

void reshape_and_cache_cuda(const at::Tensor& key,        // [T, Hk, D]
                            const at::Tensor& value,      // [T, Hk, D]
                            at::Tensor& key_cache,        // [num_blocks, Hk, block_size, D]
                            at::Tensor& value_cache,      // [num_blocks, Hk, block_size, D]
                            const at::Tensor& slot_mapping,   // [T] int64
                            const std::optional<at::Tensor>& k_scale,    // fp8 cache: [1] or [Hk] float32
                            const std::optional<at::Tensor>& v_scale) {  // fp8 cache: [1] or [Hk] float32
  const char* op = "decodekit::reshape_and_cache";
  const dk::CacheArgs a =
      dk::reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale);
  dk::check_cuda(op, "key", key);
  dk::check_cuda(op, "value", value);
  dk::check_cuda(op, "key_cache", key_cache);
  dk::check_cuda(op, "value_cache", value_cache);
  dk::check_cuda(op, "slot_mapping", slot_mapping);
  if (a.num_tokens == 0) return;
  c10::cuda::OptionalCUDAGuard guard(key_cache.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dk::PagedLayout L{a.num_kv_heads, a.block_size, a.head_dim};
  const dk::KVScales& sc = a.kv;
  DK_CUDA_DISPATCH_FLOATING(key.scalar_type(), op, [&] {
    auto launch = [&](auto* cache_type_tag) {
      using C = std::remove_pointer_t<decltype(cache_type_tag)>;
      dk::check_launch(op, dk::cuda::reshape_and_cache<scalar_t, C>(
                               dk::cuda_ptr<scalar_t>(key), dk::cuda_ptr<scalar_t>(value), a.k_stride, a.v_stride,
                               dk::cuda_ptr<C>(key_cache), dk::cuda_ptr<C>(value_cache),
                               slot_mapping.data_ptr<int64_t>(), a.num_tokens, a.num_blocks * a.block_size, L, sc,
                               stream));
    };
    if (a.fp8) launch(static_cast<dk::fp8_e4m3_t*>(nullptr));
    else launch(static_cast<scalar_t*>(nullptr));
  });
}

std::string head_dim_list() {
  std::ostringstream os;
  const char* sep = "";
  for (int d : dk::cuda::kPagedAttentionHeadDims) {
    os << sep << d;
    sep = ", ";
  }
  return os.str();
}

void paged_attention_cuda(at::Tensor& out,                    // [T, Hq, D]
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
  dk::check_cuda(op, "out", out);
  dk::check_cuda(op, "query", query);
  dk::check_cuda(op, "key_cache", key_cache);
  dk::check_cuda(op, "value_cache", value_cache);
  dk::check_cuda(op, "block_tables", block_tables);
  dk::check_cuda(op, "seq_lens", seq_lens);
  dk::check_cuda(op, "query_start_loc", query_start_loc);
  if (lse.has_value()) dk::check_cuda(op, "lse", *lse);
  if (k_scale.has_value()) dk::check_cuda(op, "k_scale", *k_scale);
  if (v_scale.has_value()) dk::check_cuda(op, "v_scale", *v_scale);
  bool supported = false;
  for (int d : dk::cuda::kPagedAttentionHeadDims) supported |= d == a.head_dim;
  TORCH_CHECK(supported, op, ": head_dim ", a.head_dim, " is not supported by the CUDA kernel (supported: ",
              head_dim_list(), ")");
  for (auto [t, name] : {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}})
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op, ": '", name,
                "' data must be 16-byte aligned on CUDA (it is read with 16-byte loads)");
  TORCH_CHECK(a.num_tokens <= INT32_MAX, op, ": too many tokens (", a.num_tokens, ")");
  TORCH_CHECK(a.num_kv_heads <= 65535, op, ": too many KV heads (", a.num_kv_heads, ")");
  if (a.num_tokens == 0 || a.num_q_heads == 0) return;  // nothing to write
  c10::cuda::OptionalCUDAGuard guard(query.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dk::PagedLayout L{a.num_kv_heads, a.block_size, a.head_dim};
  float* lse_ptr = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  const dk::KVScales& sc = a.kv;
  // Split-KV when the grid would not fill the GPU (decode of few sequences over long contexts);
  // the plan depends on shapes only, so CUDA-graph replays stay valid. The workspace comes
  // from the caching allocator (graph-safe).
  const bool prefill_kernel = dk::paged_attention_uses_prefill_kernel(query.scalar_type() != at::kFloat, a.head_dim,
                                                                      a.num_tokens, a.num_seqs);
  const int64_t table_keys = int64_t(a.max_blocks) * a.block_size;
  const int splits = prefill_kernel ? 1 : dk::paged_attention_num_splits(a.num_tokens, a.num_kv_heads, a.num_q_heads,
                                                    a.window > 0 ? std::min(a.window, table_keys) : table_keys,
                                                    at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  at::Tensor workspace;
  if (splits > 1)
    workspace = at::empty({dk::paged_attention_workspace_floats(splits, a.num_tokens, a.num_q_heads, a.head_dim)},
                          query.options().dtype(at::kFloat));
  float* ws = splits > 1 ? workspace.data_ptr<float>() : nullptr;
  DK_CUDA_DISPATCH_FLOATING(query.scalar_type(), op, [&] {
    auto launch = [&](auto* cache_type_tag) {
      using C = std::remove_pointer_t<decltype(cache_type_tag)>;
      dk::check_launch(op, dk::cuda::paged_attention<scalar_t, C>(
                               dk::cuda_ptr<scalar_t>(out), lse_ptr, dk::cuda_ptr<scalar_t>(query), a.q_stride,
                               dk::cuda_ptr<C>(key_cache), dk::cuda_ptr<C>(value_cache),
                               block_tables.data_ptr<int32_t>(), a.max_blocks, seq_lens.data_ptr<int32_t>(),
                               query_start_loc.data_ptr<int32_t>(), a.num_seqs, a.num_tokens, a.num_q_heads,
                               a.num_blocks, L, float(scale), sc, int(a.window), splits, ws, stream,
                               tensor_core_decode(), wgmma_prefill()));
    };
    if (a.fp8) launch(static_cast<dk::fp8_e4m3_t*>(nullptr));
    else launch(static_cast<scalar_t*>(nullptr));
  });
}

void copy_blocks_cuda(at::TensorList key_caches,     // per layer [num_blocks, ...]
                      at::TensorList value_caches,   // per layer [num_blocks, ...]
                      const at::Tensor& block_mapping) {  // [N, 2] int64 (src, dst), on the device
  const char* op = "decodekit::copy_blocks";
  const dk::BlockCopyArgs a = dk::copy_blocks_args(key_caches, value_caches, block_mapping);
  dk::check_cuda(op, "block_mapping", block_mapping);
  if (a.num_pairs == 0) return;
  c10::cuda::OptionalCUDAGuard guard(block_mapping.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (size_t l = 0; l < key_caches.size(); ++l)  // ids outside the cache are skipped by the kernel
    dk::check_launch(op, dk::cuda::copy_blocks(key_caches[l].data_ptr(), value_caches[l].data_ptr(), a.block_bytes,
                                               block_mapping.data_ptr<int64_t>(), a.num_pairs, a.num_blocks,
                                               stream));
}

void swap_blocks_cuda(const at::Tensor& src,            // [num_src_blocks, ...]
                      at::Tensor& dst,                  // [num_dst_blocks, ...] same block shape
                      const at::Tensor& block_mapping) {  // [N, 2] int64 on the CPU
  const char* op = "decodekit::swap_blocks";
  const dk::BlockCopyArgs a = dk::swap_blocks_args(src, dst, block_mapping);
  const at::Device dev = src.is_cuda() ? src.device() : dst.device();
  TORCH_CHECK(!(src.is_cuda() && dst.is_cuda()) || src.device() == dst.device(), op,
              ": 'src' and 'dst' are on different GPUs (", src.device(), ", ", dst.device(), ")");
  const cudaMemcpyKind kind = src.is_cuda() ? (dst.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                            : cudaMemcpyHostToDevice;
  c10::cuda::OptionalCUDAGuard guard(dev);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t* m = block_mapping.data_ptr<int64_t>();
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  for (int64_t i = 0; i < a.num_pairs; ++i)
    dk::check_launch(op, cudaMemcpyAsync(to + m[2 * i + 1] * a.block_bytes, from + m[2 * i] * a.block_bytes,
                                         size_t(a.block_bytes), kind, stream));
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cuda);
  m.impl("paged_attention", &paged_attention_cuda);
  m.impl("copy_blocks", &copy_blocks_cuda);
  m.impl("swap_blocks", &swap_blocks_cuda);
}
