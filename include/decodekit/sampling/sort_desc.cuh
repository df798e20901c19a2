// CUDA sort_desc_stable (torch-free): the order of sampling/sort_desc.h on the GPU. One device-wide
// stable radix sort (CUB) of 64-bit keys (row << 32 | sort_desc_key(x)) carrying each value's position
// in its row, so all rows sort in one pass whatever B and V; then a gather writes the values and int64
// positions. Workspace (the caller's, from sort_desc_stable_workspace_bytes): keys and positions in
// and out, then CUB's temporary storage. No host synchronisation (graph-capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "decodekit/sampling/sort_desc.h"

namespace dk::cuda {
namespace sort_detail {

inline constexpr int kThreads = 256;

inline size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// Bits of the row number in the key (B rows: ceil(log2 B)).
inline int row_bits(int64_t B) {
  int bits = 0;
  while ((int64_t(1) << bits) < B) ++bits;
  return bits;
}

__global__ void __launch_bounds__(kThreads)
sort_desc_keys_kernel(uint64_t* __restrict__ keys,    // [B * V]
                      uint32_t* __restrict__ ids,     // [B * V]
                      const float* __restrict__ x,    // [B, V], rows row_stride apart
                      int64_t row_stride, int64_t V, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / V, v = i - b * V;
    keys[i] = (uint64_t(b) << 32) | sort_desc_key(x[b * row_stride + v]);
    ids[i] = uint32_t(v);
  }
}

__global__ void __launch_bounds__(kThreads)
sort_desc_gather_kernel(float* __restrict__ values,        // [B, V]
                        int64_t* __restrict__ indices,     // [B, V]
                        const uint32_t* __restrict__ ids,  // [B * V], rank order within each row
                        const float* __restrict__ x,       // [B, V], rows row_stride apart
                        int64_t row_stride, int64_t V, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / V;
    const uint32_t v = ids[i];
    values[i] = x[b * row_stride + v];
    indices[i] = int64_t(v);
  }
}

// CUB's temporary storage for n items.
inline size_t cub_bytes(int64_t n, int end_bit) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                  static_cast<uint64_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), int(n), 0, end_bit);
  return bytes;
}

}  // namespace sort_detail

// Workspace bytes sort_desc_stable needs for B rows of V (B * V < 2^31).
inline size_t sort_desc_stable_workspace_bytes(int64_t B, int64_t V) {
  using namespace sort_detail;
  const int64_t n = B * V;
  return 2 * align256(size_t(n) * 8) + 2 * align256(size_t(n) * 4) + cub_bytes(n, 32 + row_bits(B));
}

// values / indices [B, V] (contiguous) = x's rows [B, V] (row stride row_stride) in descending order.
inline cudaError_t sort_desc_stable(float* values, int64_t* indices, const float* x, int64_t row_stride, int64_t B,
                                    int64_t V, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace sort_detail;
  const int64_t n = B * V;
  if (n == 0) return cudaSuccess;
  if (workspace_bytes < sort_desc_stable_workspace_bytes(B, V)) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  uint64_t* keys_in = reinterpret_cast<uint64_t*>(ws);
  ws += align256(size_t(n) * 8);
  uint64_t* keys_out = reinterpret_cast<uint64_t*>(ws);
  ws += align256(size_t(n) * 8);
  uint32_t* ids_in = reinterpret_cast<uint32_t*>(ws);
  ws += align256(size_t(n) * 4);
  uint32_t* ids_out = reinterpret_cast<uint32_t*>(ws);
  ws += align256(size_t(n) * 4);
  const int end_bit = 32 + row_bits(B);
  size_t temp_bytes = cub_bytes(n, end_bit);
  const int grid = int((n + kThreads - 1) / kThreads < 4096 ? (n + kThreads - 1) / kThreads : 4096);
  sort_desc_keys_kernel<<<grid, kThreads, 0, stream>>>(keys_in, ids_in, x, row_stride, V, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = cub::DeviceRadixSort::SortPairs(ws, temp_bytes, keys_in, keys_out, ids_in, ids_out, int(n), 0, end_bit,
                                        stream);
  if (err != cudaSuccess) return err;
  sort_desc_gather_kernel<<<grid, kThreads, 0, stream>>>(values, indices, ids_out, x, row_stride, V, n);
  return cudaGetLastError();
}

}  // namespace dk::cuda
