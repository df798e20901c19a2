// CUDA kernel for silu_and_mul (include/decodekit/activation.cuh), torch-free: nvcc compiles
// only the kernel and the dk::cuda launcher, instantiated here for each storage type; the
// torch launcher that calls it is in activation_launch.cpp (g++).
#include "decodekit/activation.cuh"
#include "launchers.h"

#define DK_INSTANTIATE(T) \
  template cudaError_t dk::cuda::silu_and_mul<T>(T*, const T*, int64_t, int64_t, int64_t, cudaStream_t);
DK_CUDA_LAUNCH_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
