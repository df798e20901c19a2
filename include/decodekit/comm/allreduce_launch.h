// Declarations of the torch-free CUDA launchers of allreduce.cuh, for the host (g++) translation
// unit csrc/cuda/allreduce_launch.cpp; csrc/cuda/allreduce.cu includes both and instantiates them
// for float, __half and __nv_bfloat16. Keep the signatures identical to the definitions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "decodekit/comm/allreduce.h"

namespace dk::cuda {

template <class T>
cudaError_t custom_all_reduce(T* out, const T* inp, int64_t n, const dk::comm::Peers& P, bool two_shot,
                              cudaStream_t stream);

template <class T>
cudaError_t gemm_all_reduce(T* out, const T* a, int64_t a_stride, const T* w, const T* bias, int64_t M, int64_t N,
                            int64_t K, const dk::comm::Peers& P, cudaStream_t stream);

template <class T>
cudaError_t gemm_all_reduce_int4(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                                 const __half* mins, int G, const T* bias, int64_t M, int64_t N, int64_t K,
                                 const dk::comm::Peers& P, cudaStream_t stream);

template <class T>
cudaError_t gemm_all_reduce_fp8(T* out, const uint8_t* a, int64_t a_stride, const float* a_scale, const uint8_t* w,
                                const float* w_scale, const T* bias, int64_t M, int64_t N, int64_t K,
                                const dk::comm::Peers& P, cudaStream_t stream);

}  // namespace dk::cuda
