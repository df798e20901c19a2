// CUDA rejection_sample kernel (include/decodekit/sampling/rejection.cuh), torch-free; the torch
// launcher is in sampling_launch.cpp (g++).
#include "decodekit/sampling/rejection.cuh"
#include "launchers.h"

cudaError_t dk::cuda::rejection_sample_launch(int64_t* out, int32_t* num_emitted, const int64_t* draft,
                                              const int32_t* num_draft, const float* q, const float* p,
                                              const int64_t* seeds, const int64_t* positions, int64_t B, int64_t k,
                                              int64_t V, bool greedy, cudaStream_t stream) {
  return rejection_sample(out, num_emitted, draft, num_draft, q, p, seeds, positions, B, k, V, greedy, stream);
}
