// The second half of split-K in the CUDA mma.sync GEMMs (gemm/int4_mma.cuh, gemm/fp8_gemm.cuh; plan in
// gemm/mma_plan.h): split z wrote its fp32 partial sums to partial[z] [M, N]; this adds them in split order
// (deterministic), applies the per-row x per-column scales when given (fp8: a_scale[m] * w_scale[n], in the
// unsplit epilogue's order) and the bias, and rounds once to T. Torch-free.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "decodekit/common/vec.cuh"

namespace dk::cuda {
namespace splitk_detail {

template <class T>
__global__ void __launch_bounds__(256)
splitk_reduce_kernel(T* __restrict__ out,                  // [M, N]
                     const float* __restrict__ partial,    // [splits, M, N]
                     const float* __restrict__ row_scale,  // [M] or null (then col_scale is too)
                     const float* __restrict__ col_scale,  // [N] or null
                     const T* __restrict__ bias,           // [N] or null
                     int64_t M, int64_t N, int splits) {
  const int64_t total = M * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float v = partial[i];
    for (int s = 1; s < splits; ++s) v += partial[int64_t(s) * total + i];
    const int64_t n = i % N;
    if (row_scale != nullptr) v = v * __ldg(row_scale + i / N) * __ldg(col_scale + n);
    if (bias != nullptr) v += to_float(bias[n]);
    out[i] = from_float<T>(v);
  }
}

}  // namespace splitk_detail

template <class T>
cudaError_t splitk_reduce(T* out, const float* partial, const float* row_scale, const float* col_scale, const T* bias,
                          int64_t M, int64_t N, int splits, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(ceil_div(M * N, int64_t(256)), 65535);
  if (blocks > 0)
    splitk_detail::splitk_reduce_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(out, partial, row_scale, col_scale,
                                                                                 bias, M, N, splits);
  return cudaGetLastError();
}

}  // namespace dk::cuda
