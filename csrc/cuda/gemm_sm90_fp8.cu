// The CUTLASS sm90 fp8 e4m3 GEMM with per-token x per-channel scales (include/decodekit/gemm/sm90_gemm.cuh),
// torch-free: instantiated here for fp16 / bf16 outputs (its own file: CUTLASS builds slowly); the torch
// launcher that chooses it is in gemm_launch.cpp (g++).
#include "decodekit/gemm/sm90_gemm.cuh"
#include "launchers.h"

#define DK_INSTANTIATE(T)                                                                                      \
  template size_t dk::cuda::fp8_gemm_sm90_workspace_bytes<T>(int64_t, int64_t, int64_t, dk::cuda::Sm90Schedule, int); \
  template cudaError_t dk::cuda::fp8_gemm_sm90<T>(T*, const uint8_t*, const float*, const uint8_t*, const float*, \
                                                  const T*, int64_t, int64_t, int64_t, dk::cuda::Sm90Schedule, int, \
                                                  void*, size_t, cudaStream_t);
DK_CUDA_SM90_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
