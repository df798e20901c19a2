// CUDA rejection_sample, gumbel_argmax, argmax_rows and sort_desc_stable kernels (include/decodekit/sampling/
// rejection.cuh, gumbel_max.cuh, argmax.cuh, sort_desc.cuh), torch-free; the torch launchers are in sampling_launch.cpp (g++).
#include "decodekit/sampling/argmax.cuh"
#include "decodekit/sampling/gumbel_max.cuh"
#include "decodekit/sampling/rejection.cuh"
#include "decodekit/sampling/sort_desc.cuh"
#include "launchers.h"

int64_t dk::cuda::sampling_vocab_splits(int64_t B, int64_t V, int num_sms) {
  return vocab_splits(B, V, num_sms);
}

size_t dk::cuda::rejection_sample_workspace(int64_t B, int64_t k, int64_t splits, bool greedy) {
  return rejection_sample_workspace_bytes(B, k, splits, greedy);
}

cudaError_t dk::cuda::rejection_sample_launch(int64_t* out, int32_t* num_emitted, const int64_t* draft,
                                              const int32_t* num_draft, const float* q, const float* p,
                                              const int64_t* seeds, const int64_t* positions, int64_t B, int64_t k,
                                              int64_t V, bool greedy, int64_t splits, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream) {
  return rejection_sample(out, num_emitted, draft, num_draft, q, p, seeds, positions, B, k, V, greedy, splits,
                          workspace, workspace_bytes, stream);
}

size_t dk::cuda::gumbel_argmax_workspace(int64_t B, int64_t splits) { return gumbel_argmax_workspace_bytes(B, splits); }

cudaError_t dk::cuda::gumbel_argmax_launch(int64_t* out, const float* x, int64_t row_stride, const int64_t* seeds,
                                           const int64_t* positions, int64_t B, int64_t V, uint32_t stream,
                                           int64_t splits, void* workspace, size_t workspace_bytes,
                                           cudaStream_t cuda_stream) {
  return gumbel_argmax(out, x, row_stride, seeds, positions, B, V, stream, splits, workspace, workspace_bytes,
                       cuda_stream);
}

size_t dk::cuda::sort_desc_stable_workspace(int64_t B, int64_t V) { return sort_desc_stable_workspace_bytes(B, V); }

cudaError_t dk::cuda::sort_desc_stable_launch(float* values, int64_t* indices, const float* x, int64_t row_stride,
                                              int64_t B, int64_t V, void* workspace, size_t workspace_bytes,
                                              cudaStream_t stream) {
  return sort_desc_stable(values, indices, x, row_stride, B, V, workspace, workspace_bytes, stream);
}

cudaError_t dk::cuda::argmax_rows_launch(int64_t* out, const float* x, int64_t row_stride, int64_t B, int64_t V,
                                         cudaStream_t stream) {
  return argmax_rows(out, x, row_stride, B, V, stream);
}
