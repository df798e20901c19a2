// Torch launchers for rejection_sample, gumbel_argmax, argmax_rows and sort_desc_stable (CUDA dispatch key); the kernels
// are in sampling.cu (include/decodekit/sampling/rejection.cuh, gumbel_max.cuh, sort_desc.cuh). num_draft is not range-checked here (that would need a
// device-to-host copy): the kernel clamps it to [0, k].
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_args.h"
#include "dispatch.h"
#include "launchers.h"

namespace {

void rejection_sample_cuda(at::Tensor& out,                         // [B, k+1] int64
                           at::Tensor& num_emitted,                 // [B] int32
                           const at::Tensor& draft_tokens,          // [B, k] int64
                           const at::Tensor& num_draft,             // [B] int32
                           const std::optional<at::Tensor>& draft_probs,  // [B, k, V] float32
                           const at::Tensor& target_probs,          // [B, k+1, V] float32
                           const at::Tensor& seeds,                 // [B] int64
                           const at::Tensor& positions,             // [B] int64
                           bool greedy) {
  const char* op = "decodekit::rejection_sample";
  const dk::SpecArgs a = dk::rejection_sample_args(out, num_emitted, draft_tokens, num_draft, draft_probs,
                                                   target_probs, seeds, positions);
  dk::check_cuda(op, "draft_tokens", draft_tokens);
  if (a.B == 0) return;
  c10::cuda::OptionalCUDAGuard guard(draft_tokens.device());
  // The vocabulary split over CTAs (vocab_splits): from B, V and the SM count only, so a CUDA graph replays
  // the same plan.
  const int64_t splits = dk::cuda::sampling_vocab_splits(
      a.B, a.V, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  const size_t bytes = dk::cuda::rejection_sample_workspace(a.B, a.k, splits, greedy);
  at::Tensor ws = at::empty({int64_t(bytes)}, draft_tokens.options().dtype(at::kByte));  // caching allocator: graph-safe
  dk::check_launch(op, dk::cuda::rejection_sample_launch(
                           out.data_ptr<int64_t>(), num_emitted.data_ptr<int32_t>(), draft_tokens.data_ptr<int64_t>(),
                           num_draft.data_ptr<int32_t>(),
                           draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr,
                           target_probs.data_ptr<float>(), seeds.data_ptr<int64_t>(), positions.data_ptr<int64_t>(),
                           a.B, a.k, a.V, greedy, splits, ws.data_ptr(), bytes, c10::cuda::getCurrentCUDAStream()));
}

void gumbel_argmax_cuda(at::Tensor& out,               // [B] int64
                        const at::Tensor& scores,      // [B, V] float32, row stride free
                        const at::Tensor& seeds,       // [B] int64
                        const at::Tensor& positions,   // [B] int64
                        int64_t stream) {
  const char* op = "decodekit::gumbel_argmax";
  const dk::GumbelArgs a = dk::gumbel_argmax_args(out, scores, seeds, positions, stream);
  dk::check_cuda(op, "scores", scores);
  if (a.B == 0) return;
  c10::cuda::OptionalCUDAGuard guard(scores.device());
  const int64_t splits = dk::cuda::sampling_vocab_splits(
      a.B, a.V, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);  // shapes only: graph-stable
  const size_t bytes = dk::cuda::gumbel_argmax_workspace(a.B, splits);
  at::Tensor ws = at::empty({int64_t(bytes)}, scores.options().dtype(at::kByte));  // caching allocator: graph-safe
  dk::check_launch(op, dk::cuda::gumbel_argmax_launch(out.data_ptr<int64_t>(), scores.data_ptr<float>(), a.row_stride,
                                                      seeds.data_ptr<int64_t>(), positions.data_ptr<int64_t>(), a.B,
                                                      a.V, a.stream, splits, ws.data_ptr(), bytes,
                                                      c10::cuda::getCurrentCUDAStream()));
}

void sort_desc_stable_cuda(at::Tensor& values,     // [B, V] float32
                           at::Tensor& indices,    // [B, V] int64
                           const at::Tensor& x) {  // [B, V] float32, row stride free
  const char* op = "decodekit::sort_desc_stable";
  const dk::SortArgs a = dk::sort_desc_stable_args(values, indices, x);
  dk::check_cuda(op, "x", x);
  if (a.B == 0 || a.V == 0) return;
  c10::cuda::OptionalCUDAGuard guard(x.device());
  const size_t bytes = dk::cuda::sort_desc_stable_workspace(a.B, a.V);
  at::Tensor ws = at::empty({int64_t(bytes)}, x.options().dtype(at::kByte));  // caching allocator: graph-safe
  dk::check_launch(op, dk::cuda::sort_desc_stable_launch(values.data_ptr<float>(), indices.data_ptr<int64_t>(),
                                                         x.data_ptr<float>(), a.row_stride, a.B, a.V, ws.data_ptr(),
                                                         bytes, c10::cuda::getCurrentCUDAStream()));
}

void argmax_rows_cuda(at::Tensor& out,            // [B] int64
                      const at::Tensor& scores) {  // [B, V] float32, row stride free
  const char* op = "decodekit::argmax_rows";
  const dk::ArgmaxArgs a = dk::argmax_rows_args(out, scores);
  dk::check_cuda(op, "scores", scores);
  if (a.B == 0) return;
  c10::cuda::OptionalCUDAGuard guard(scores.device());
  dk::check_launch(op, dk::cuda::argmax_rows_launch(out.data_ptr<int64_t>(), scores.data_ptr<float>(), a.row_stride,
                                                    a.B, a.V, c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(decodekit, CUDA, m) {
  m.impl("rejection_sample", &rejection_sample_cuda);
  m.impl("gumbel_argmax", &gumbel_argmax_cuda);
  m.impl("argmax_rows", &argmax_rows_cuda);
  m.impl("sort_desc_stable", &sort_desc_stable_cuda);
}
