// Gated activations: shared per-element math and the CPU kernel (torch-free).
//   silu_and_mul: out[..., i] = silu(x[..., i]) * x[..., d + i],  i < d
#pragma once
#include <cmath>
#include "decodekit/common/dtype.h"

namespace dk {

DK_HD float silu(float x) { return x / (1.0f + expf(-x)); }

namespace cpu {

template <class T>
void silu_and_mul(T* DK_RESTRICT out,       // [rows, d], contiguous
                  const T* DK_RESTRICT in,  // [rows, 2 * d], row stride in_stride
                  int64_t in_stride, int64_t rows, int64_t d) {
  DK_OMP_PARALLEL_FOR_IF(rows * d >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = in + r * in_stride;
    const T* u = g + d;
    T* y = out + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) y[i] = from_float<T>(silu(to_float(g[i])) * to_float(u[i]));
  }
}

}  // namespace cpu
}  // namespace dk
