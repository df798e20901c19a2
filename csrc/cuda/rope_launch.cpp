// Torch launcher for rotary_embedding (CUDA dispatch key). Host code, compiled by g++ in the
// CUDA build only; the kernels and their dk::cuda launchers are instantiated in rope.cu
// (include/decodekit/rope.cuh), which nvcc compiles without any torch header.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

// Unlike the CPU launcher, 'positions' is not range-checked: that would need a
// device-to-host copy (a sync, and no CUDA-graph capture). A position outside
// [0, max_position) makes the kernel read outside cos_sin_cache: the caller's bug.
void rotary_embedding_cuda(const at::Tensor& positions,           // [num_tokens] int64
                           at::Tensor& query,                     // [num_tokens, Hq * D] or [num_tokens, Hq, D]
                           const std::optional<at::Tensor>& key,  // [num_tokens, Hk * D] or [num_tokens, Hk, D]
                           const at::Tensor& cos_sin_cache,       // [max_position, rot_dim] float32
                           int64_t head_size, bool is_neox) {
  const char* op = "decodekit::rotary_embedding";
  const dk::RopeArgs a = dk::rotary_embedding_args(positions, query, key, cos_sin_cache, head_size, is_neox);
  dk::check_cuda(op, "query", query);
  dk::check_cuda(op, "positions", positions);
  dk::check_cuda(op, "cos_sin_cache", cos_sin_cache);
  if (key.has_value()) dk::check_cuda(op, "key", *key);
  if (a.num_tokens == 0) return;
  c10::cuda::OptionalCUDAGuard guard(query.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DK_CUDA_DISPATCH_FLOATING(query.scalar_type(), op, [&] {
    scalar_t* k = key.has_value() ? dk::cuda_ptr<scalar_t>(*key) : nullptr;
    dk::check_launch(op, dk::cuda::rotary_embedding<scalar_t>(
                             positions.data_ptr<int64_t>(), dk::cuda_ptr<scalar_t>(query), a.q_token_stride,
                             a.q_head_stride, a.num_q_heads, k, a.k_token_stride, a.k_head_stride, a.num_kv_heads,
                             cos_sin_cache.data_ptr<float>(), a.rot_dim, a.head_size, is_neox, a.num_tokens, stream));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) { m.impl("rotary_embedding", &rotary_embedding_cuda); }
