// CUDA kernel for rotary_embedding (include/decodekit/rope.cuh), torch-free: nvcc compiles
// only the kernel and the dk::cuda launcher, instantiated here for each storage type; the
// torch launcher that calls it is in rope_launch.cpp (g++).
#include "decodekit/rope.cuh"
#include "launchers.h"

#define DK_INSTANTIATE(T)                                                                                        \
  template cudaError_t dk::cuda::rotary_embedding<T>(const int64_t*, T*, int64_t, int64_t, int, T*, int64_t,    \
                                                     int64_t, int, const float*, int, int, bool, int64_t,       \
                                                     cudaStream_t);
DK_CUDA_LAUNCH_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
