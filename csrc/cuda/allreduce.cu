// CUDA kernels of custom_all_reduce and gemm_allreduce (include/decodekit/comm/allreduce.cuh),
// torch-free: instantiated here for each storage type; the torch launchers (and the CUDA IPC
// helpers) are in allreduce_launch.cpp (g++).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decodekit/comm/allreduce.cuh"
#include "decodekit/comm/allreduce_launch.h"

#define DK_INSTANTIATE(T)                                                                                   \
  template cudaError_t dk::cuda::custom_all_reduce<T>(T*, const T*, int64_t, const dk::comm::Peers&, bool,  \
                                                      cudaStream_t);                                        \
  template cudaError_t dk::cuda::gemm_all_reduce<T>(T*, const T*, int64_t, const T*, const T*, int64_t,     \
                                                    int64_t, int64_t, const dk::comm::Peers&, cudaStream_t); \
  template cudaError_t dk::cuda::gemm_all_reduce_int4<T>(T*, const T*, int64_t, const uint8_t*, const __half*,  \
                                                         const __half*, int, const T*, int64_t, int64_t, int64_t, \
                                                         const dk::comm::Peers&, cudaStream_t);                   \
  template cudaError_t dk::cuda::gemm_all_reduce_fp8<T>(T*, const uint8_t*, int64_t, const float*, const uint8_t*, \
                                                        const float*, const T*, int64_t, int64_t, int64_t,        \
                                                        const dk::comm::Peers&, cudaStream_t);
DK_INSTANTIATE(float)
DK_INSTANTIATE(__half)
DK_INSTANTIATE(__nv_bfloat16)
#undef DK_INSTANTIATE
