// Gated-activation CUDA kernels (torch-free). Same math as activation.h:
//   out[r, i] = silu(in[r, i]) * in[r, d + i]   (fp32, one rounding per store)
// Grid: x over rows (grid-stride), y over chunks of blockDim.x accesses of the row
// (grid-stride). VEC: 16-byte accesses (V = 16 / sizeof(T) elements) when the pointers are
// 16-byte aligned and d and the input row stride are multiples of V; else scalar.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "decodekit/activation.h"
#include "decodekit/common/vec.cuh"

namespace dk::cuda {
namespace act_detail {

constexpr int kThreads = 256;

template <class T, bool VEC>
__global__ void __launch_bounds__(kThreads)
silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t in_stride, int64_t rows, int64_t d) {
  constexpr int V = VEC ? kVec16<T> : 1;
  using VT = Vec<T, V>;
  const int64_t nvec = d / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* g = in + row * in_stride;
    const T* u = g + d;
    T* y = out + row * d;
    for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < nvec; i += int64_t(gridDim.y) * blockDim.x) {
      const VT gv = ldg_vec<T, V>(g + i * V);
      const VT uv = ldg_vec<T, V>(u + i * V);
      VT o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(silu(to_float(gv.v[k])) * to_float(uv.v[k]));
      store_vec(y + i * V, o);
    }
  }
}

}  // namespace act_detail

template <class T>
cudaError_t silu_and_mul(T* out,       // [rows, d] contiguous
                         const T* in,  // [rows, 2 * d], row stride in_stride
                         int64_t in_stride, int64_t rows, int64_t d, cudaStream_t stream) {
  using namespace act_detail;
  if (rows <= 0 || d <= 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec = d % V == 0 && in_stride % V == 0 && aligned16(out) && aligned16(in);
  const int64_t nvec = vec ? d / V : d;
  // Small batches (decode) get narrower blocks so that more multiprocessors take part.
  int threads = kThreads;
  const int64_t target = 2 * int64_t(num_sms());
  while (threads > 64 && rows * ceil_div(nvec, threads) < target) threads /= 2;
  const dim3 grid(grid_cap(rows), unsigned(std::min<int64_t>(ceil_div(nvec, threads), 65535)));
  if (vec)
    silu_and_mul_kernel<T, true><<<grid, threads, 0, stream>>>(out, in, in_stride, rows, d);
  else
    silu_and_mul_kernel<T, false><<<grid, threads, 0, stream>>>(out, in, in_stride, rows, d);
  return cudaGetLastError();
}

}  // namespace dk::cuda
