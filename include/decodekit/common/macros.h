// Portable qualifiers so the same per-element logic compiles for host (CPU kernels,
// C++ tests) and device (CUDA kernels).
#pragma once

#if defined(__CUDACC__)
#define DK_HD __host__ __device__ __forceinline__
#define DK_DEVICE __device__ __forceinline__
#define DK_RESTRICT __restrict__
#else
#define DK_HD inline
#define DK_RESTRICT __restrict__
#endif

#define DK_PRAGMA(x) _Pragma(#x)
// Host kernels: fully unrolled loops keep small register arrays (accumulator tiles) in registers (a
// loop left rolled indexes the array at run time, which puts it on the stack).
#define DK_UNROLL_ALL DK_PRAGMA(GCC unroll 16)
#define DK_FORCE_INLINE inline __attribute__((always_inline))

#if defined(_OPENMP)
#include <omp.h>
#define DK_OMP_PARALLEL_FOR DK_PRAGMA(omp parallel for schedule(static))
// Parallel only when the loop has enough work to pay for waking the thread team.
#define DK_OMP_PARALLEL_FOR_IF(cond) DK_PRAGMA(omp parallel for schedule(static) if (cond))
#else
#define DK_OMP_PARALLEL_FOR
#define DK_OMP_PARALLEL_FOR_IF(cond)
#endif

#include <type_traits>

namespace dk {
// Elements below which a CPU kernel runs on the calling thread alone.
constexpr long kParallelGrain = 1 << 15;

// f(std::integral_constant<int, rows>) for rows in [1, Max), else f with Max: a run-time row count as a compile-time
// one (register tiles keep their accumulators in registers only at compile-time sizes).
template <int Max, int R = 1, class F>
DK_FORCE_INLINE void rows_switch(int rows, F&& f) {
  if constexpr (R < Max) {
    if (rows == R) return f(std::integral_constant<int, R>{});
    return rows_switch<Max, R + 1>(rows, f);
  } else {
    return f(std::integral_constant<int, Max>{});
  }
}
}

#include <cstdint>
