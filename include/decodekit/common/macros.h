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

namespace dk {
// Elements below which a CPU kernel runs on the calling thread alone.
constexpr long kParallelGrain = 1 << 15;
}

#include <cstdint>
