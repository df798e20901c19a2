// CUDA kernels for reshape_and_cache and paged_attention (include/decodekit/attention/paged.cuh),
// torch-free: nvcc compiles only the kernels and the dk::cuda launchers, instantiated here for
// each storage type; the torch launchers that call them are in attention_launch.cpp (g++).
#include "decodekit/attention/paged.cuh"
#include "launchers.h"

// launchers.h's list of head dims (used in the torch launcher's error) == paged.cuh's.
constexpr bool head_dims_in_sync() {
  int listed = 0;
  for (int d : dk::cuda::kPagedAttentionHeadDims) listed += dk::cuda::paged_attention_head_dim_ok(d) ? 1 : 0;
  int ok = 0;
  for (int d = 1; d <= 1024; ++d) ok += dk::cuda::paged_attention_head_dim_ok(d) ? 1 : 0;
  return listed == ok && ok == int(sizeof(dk::cuda::kPagedAttentionHeadDims) / sizeof(int));
}
static_assert(head_dims_in_sync(), "dk::cuda::kPagedAttentionHeadDims (launchers.h) != paged_attention_head_dim_ok");

#define DK_INSTANTIATE_TC(T, C)                                                                                \
  template cudaError_t dk::cuda::reshape_and_cache<T, C>(const T*, const T*, int64_t, int64_t, C*, C*,          \
                                                         const int64_t*, int64_t, int64_t, dk::PagedLayout,     \
                                                         dk::KVScales, cudaStream_t);                           \
  template cudaError_t dk::cuda::paged_attention<T, C>(T*, float*, const T*, int64_t, const C*, const C*,       \
                                                       const int32_t*, int, const int32_t*, const int32_t*, int, \
                                                       int64_t, int, int64_t, dk::PagedLayout, float,            \
                                                       dk::KVScales, int, int, float*, cudaStream_t, bool,    \
                                                       bool);
// every activation type with a cache of the same type, and with an fp8 e4m3 cache
#define DK_INSTANTIATE(T) DK_INSTANTIATE_TC(T, T) DK_INSTANTIATE_TC(T, dk::fp8_e4m3_t)
DK_CUDA_LAUNCH_TYPES(DK_INSTANTIATE)
#undef DK_INSTANTIATE
#undef DK_INSTANTIATE_TC

// copy_blocks is not a template: defined here (launchers.h declares it) around the inline launcher.
cudaError_t dk::cuda::copy_blocks(void* key_cache, void* value_cache, int64_t block_bytes, const int64_t* mapping,
                                  int64_t num_pairs, int64_t num_blocks, cudaStream_t stream) {
  return copy_blocks_launch(key_cache, value_cache, block_bytes, mapping, num_pairs, num_blocks, stream);
}
