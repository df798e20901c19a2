// CUDA kernels for rms_norm and fused_add_rms_norm (include/decodekit/norm.cuh), torch-free:
// nvcc compiles only the kernels and the dk::cuda launchers, instantiated here for each
// storage type; the torch launchers that call them are in norm_launch.cpp (g++).
#include "decodekit/norm.cuh"
#include "launchers.h"

#define DK_INSTANTIATE(T)                                                                                         \
  template cudaError_t dk::cuda::rms_norm<T>(T*, const T*, int64_t, const T*, int64_t, int, float, cudaStream_t); \
  template cudaError_t dk::cuda::fused_add_rms_norm<T>(T*, int64_t, T*, int64_t, const T*, int64_t, int, float,     \
                                                       cudaStream_t);
DK_CUDA_LAUNCH_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
