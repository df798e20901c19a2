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

#if defined(_OPENMP)
#include <omp.h>
#define DK_PRAGMA(x) _Pragma(#x)
#define DK_OMP_PARALLEL_FOR DK_PRAGMA(omp parallel for schedule(static))
#else
#define DK_OMP_PARALLEL_FOR
#endif

#include <cstdint>
