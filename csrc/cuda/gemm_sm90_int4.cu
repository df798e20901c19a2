// The CUTLASS sm90 mixed-input INT4 GEMM (include/decodekit/gemm/sm90_gemm.cuh), torch-free:
// instantiated here for fp16 / bf16 activations (its own file: CUTLASS builds slowly); the torch
// launcher that chooses it is in gemm_launch.cpp (g++).
#include "decodekit/gemm/sm90_gemm.cuh"
#include "launchers.h"

#define DK_INSTANTIATE(T)                                                                                      \
  template size_t dk::cuda::int4_gemm_sm90_workspace_bytes<T>(int64_t, int64_t, int64_t, int, dk::cuda::Sm90Schedule, \
                                                               int);                                               \
  template cudaError_t dk::cuda::int4_gemm_sm90<T>(T*, const T*, int64_t, const uint8_t*, const __half*,        \
                                                   const __half*, const T*, int64_t, int64_t, int64_t, int,      \
                                                   dk::cuda::Sm90Schedule, int, void*, size_t, cudaStream_t);
DK_CUDA_SM90_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
