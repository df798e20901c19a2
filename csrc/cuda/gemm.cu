// CUDA weight-only GEMV kernels (include/decodekit/gemm/int4.cuh) and the INT4 tensor-core GEMMs
// (int4_mma.cuh, int4_marlin.cuh), torch-free: instantiated here for
// each activation type; the torch launchers are in gemm_launch.cpp (g++).
#include "decodekit/gemm/int4.cuh"
#include "decodekit/gemm/int4_mma.cuh"
#include "decodekit/gemm/int4_marlin.cuh"
#include "decodekit/gemm/fp8_gemm.cuh"
#include "launchers.h"

static_assert(dk::cuda::kQuantGemvMaxM == dk::cuda::kQuantGemvRows, "launchers.h != int4.cuh");

#define DK_INSTANTIATE(T)                                                                                      \
  template cudaError_t dk::cuda::quant_gemv<T>(T*, const T*, int64_t, const uint8_t*, const __half*,          \
                                               const __half*, const T*, int, int64_t, int64_t, int, bool,     \
                                               cudaStream_t);                                                 \
  template cudaError_t dk::cuda::int4_gemm_mma<T>(T*, const T*, int64_t, const uint8_t*, const __half*,        \
                                                  const __half*, const T*, int64_t, int64_t, int64_t, int, int, \
                                                  float*, cudaStream_t);                                      \
  template cudaError_t dk::cuda::int4_marlin_prepare<T, false>(int64_t);                                       \
  template cudaError_t dk::cuda::int4_marlin_prepare<T, true>(int64_t);                                        \
  template int dk::cuda::int4_marlin_ctas_per_sm<T, false>(int64_t);                                           \
  template int dk::cuda::int4_marlin_ctas_per_sm<T, true>(int64_t);                                            \
  template cudaError_t dk::cuda::int4_gemm_marlin_packed<T>(T*, const T*, int64_t, const T*, const T*, int64_t, \
                                                            int64_t, int64_t, int, int, float*, unsigned*,    \
                                                            cudaStream_t);                                    \
  template cudaError_t dk::cuda::int4_gemm_marlin<T>(T*, const T*, int64_t, const uint8_t*, const __half*,     \
                                                     const __half*, const T*, int64_t, int64_t, int64_t, int,  \
                                                     int, float*, unsigned*, cudaStream_t);                   \
  template cudaError_t dk::cuda::quantize_fp8<T>(uint8_t*, float*, const T*, int64_t, int64_t, int64_t,       \
                                                 cudaStream_t);                                               \
  template cudaError_t dk::cuda::fp8_gemm<T>(T*, const uint8_t*, const float*, const uint8_t*, const float*,   \
                                             const T*, int64_t, int64_t, int64_t, int, float*, cudaStream_t);   \
  template cudaError_t dk::cuda::int4_dequantize<T>(T*, const uint8_t*, const __half*, const __half*, int64_t, \
                                                    int64_t, int, cudaStream_t);                              \
  template cudaError_t dk::cuda::int8_dequantize_rows<T>(T*, const int8_t*, const __half*, const int64_t*,     \
                                                         int64_t, int64_t, int64_t, int, cudaStream_t);
DK_CUDA_LAUNCH_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
template cudaError_t dk::cuda::int4_marlin_pack<__half>(__half*, const uint8_t*, const __half*, const __half*, int64_t,
                                                        int64_t, int, cudaStream_t);
template cudaError_t dk::cuda::int4_marlin_pack<__nv_bfloat16>(__nv_bfloat16*, const uint8_t*, const __half*,
                                                               const __half*, int64_t, int64_t, int, cudaStream_t);
template cudaError_t dk::cuda::int4_marlin_dequantize<__half>(__half*, const __half*, int64_t, int64_t, int, int64_t,
                                                              int64_t, cudaStream_t);
template cudaError_t dk::cuda::int4_marlin_dequantize<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                                                     int64_t, int, int64_t, int64_t, cudaStream_t);
