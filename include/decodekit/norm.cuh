// RMSNorm CUDA kernels (torch-free). Same math as the CPU kernels in norm.h: fp32
// arithmetic, one rounding per store; fused_add_rms_norm normalises the unrounded fp32
// sum z = x + residual and stores round(z) into residual.
//
// Layout of the work: blockDim.x threads ("TPR") share one row, blockDim.y rows per CTA.
//  - TPR <= 32 (a power of two): a warp or a lane group per row, reduced with shuffles;
//    used for small rows (e.g. per-head q/k norms of 64..1024 elements).
//  - TPR > 32: one CTA per row (blockDim.y == 1), reduced through shared memory.
// Each thread owns the row elements i = tx + j * TPR (in units of V-element accesses).
// VEC: V = 16 / sizeof(T) elements per 16-byte access (LDG.E.128); the host takes this
// path only when every pointer is 16-byte aligned and hidden and the row strides are
// multiples of V; otherwise V = 1 (scalar, any strides, e.g. hidden = 769).
// NV > 0: each thread keeps its NV accesses of the row in registers, so the row is read
// from memory once (NV in {1, 2, 4}: up to 512 * 4 * V elements, e.g. 16384 bf16).
// NV == 0 (longer rows, and the scalar path): two passes over the row; the fused
// kernel then re-reads x and residual (from L2) and recomputes the identical fp32 sum,
// so its results match the cached path exactly.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "decodekit/common/vec.cuh"
#include "decodekit/norm.h"

namespace dk::cuda {
namespace norm_detail {

// Block-size limits, matched by plan(): NV = 1, 2 run with <= 256 threads, NV = 4 and
// NV = 0 (two passes) with <= 512 (so ptxas may use up to 128 registers).
constexpr int kMaxThreads = 512;
constexpr int launch_bound(int nv) { return nv == 1 || nv == 2 ? 256 : kMaxThreads; }
constexpr int kU = 4;  // accesses in flight per thread per step in the two-pass kernels

// Calls f(std::integral_constant<int, N>, i) over this thread's accesses i = i0 + j * stride
// < n: kU at a time (loads of a step all in flight), then a tail one at a time.
template <class F>
DK_DEVICE void row_steps(int i0, int n, int stride, F&& f) {
  int64_t i = i0;
#pragma unroll 1
  for (; i + int64_t(kU - 1) * stride < n; i += int64_t(kU) * stride) f(std::integral_constant<int, kU>{}, int(i));
#pragma unroll 1
  for (; i < n; i += stride) f(std::integral_constant<int, 1>{}, int(i));
}

DK_DEVICE float row_sum(float v) {
  if (blockDim.x <= 32) return warp_sum(v, blockDim.x);
  return block_sum(v);
}

template <class T, bool VEC, int NV>
__global__ void __launch_bounds__(launch_bound(NV))
rms_norm_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t in_stride, const T* __restrict__ weight,
                int64_t rows, int hidden, float eps) {
  constexpr int V = VEC ? kVec16<T> : 1;
  using VT = Vec<T, V>;
  const int nvec = hidden / V;
  const int tpr = blockDim.x, tx = threadIdx.x;
  for (int64_t r0 = int64_t(blockIdx.x) * blockDim.y; r0 < rows; r0 += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const T* x = in + row * in_stride;
    T* y = out + row * int64_t(hidden);
    if constexpr (NV > 0) {
      VT xv[NV], wv[NV];
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = tx + j * tpr;
        if (active && i < nvec) {
          xv[j] = ldg_vec<T, V>(x + int64_t(i) * V);
          wv[j] = ldg_vec<T, V>(weight + int64_t(i) * V);
        }
      }
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        if (active && tx + j * tpr < nvec) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float f = to_float(xv[j].v[k]);
            ss += f * f;
          }
        }
      }
      const float inv = rms_inv(row_sum(ss), hidden, eps);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = tx + j * tpr;
        if (active && i < nvec) {
          VT o;
#pragma unroll
          for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(to_float(xv[j].v[k]) * inv * to_float(wv[j].v[k]));
          store_vec(y + int64_t(i) * V, o);
        }
      }
    } else {
      // Two passes over the row (reads from L2 the second time).
      float ss = 0.f;
      auto sum_step = [&](auto n, int i) {
        constexpr int N = decltype(n)::value;
        VT xv[N];
#pragma unroll
        for (int u = 0; u < N; ++u) xv[u] = ldg_vec<T, V>(x + int64_t(i + u * tpr) * V);
#pragma unroll
        for (int u = 0; u < N; ++u) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float f = to_float(xv[u].v[k]);
            ss += f * f;
          }
        }
      };
      if (active) row_steps(tx, nvec, tpr, sum_step);
      const float inv = rms_inv(row_sum(ss), hidden, eps);
      auto out_step = [&](auto n, int i) {
        constexpr int N = decltype(n)::value;
        VT xv[N], wv[N];
#pragma unroll
        for (int u = 0; u < N; ++u) {
          xv[u] = ldg_vec<T, V>(x + int64_t(i + u * tpr) * V);
          wv[u] = ldg_vec<T, V>(weight + int64_t(i + u * tpr) * V);
        }
#pragma unroll
        for (int u = 0; u < N; ++u) {
          VT o;
#pragma unroll
          for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(to_float(xv[u].v[k]) * inv * to_float(wv[u].v[k]));
          store_vec(y + int64_t(i + u * tpr) * V, o);
        }
      };
      if (active) row_steps(tx, nvec, tpr, out_step);
    }
  }
}

// x and residual must not overlap.
template <class T, bool VEC, int NV>
__global__ void __launch_bounds__(launch_bound(NV))
fused_add_rms_norm_kernel(T* __restrict__ x, int64_t x_stride, T* __restrict__ residual, int64_t r_stride,
                          const T* __restrict__ weight, int64_t rows, int hidden, float eps) {
  constexpr int V = VEC ? kVec16<T> : 1;
  using VT = Vec<T, V>;
  const int nvec = hidden / V;
  const int tpr = blockDim.x, tx = threadIdx.x;
  for (int64_t r0 = int64_t(blockIdx.x) * blockDim.y; r0 < rows; r0 += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    T* xr = x + row * x_stride;
    T* rr = residual + row * r_stride;
    if constexpr (NV > 0) {
      VT xv[NV], rv[NV];
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = tx + j * tpr;
        if (active && i < nvec) {
          xv[j] = load_vec<T, V>(xr + int64_t(i) * V);
          rv[j] = load_vec<T, V>(rr + int64_t(i) * V);
        }
      }
      float z[NV][V];
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = tx + j * tpr;
        if (active && i < nvec) {
          VT o;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float s = to_float(xv[j].v[k]) + to_float(rv[j].v[k]);
            z[j][k] = s;
            ss += s * s;
            o.v[k] = from_float<T>(s);
          }
          store_vec(rr + int64_t(i) * V, o);
        }
      }
      const float inv = rms_inv(row_sum(ss), hidden, eps);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int i = tx + j * tpr;
        if (active && i < nvec) {
          const VT wv = ldg_vec<T, V>(weight + int64_t(i) * V);
          VT o;
#pragma unroll
          for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(z[j][k] * inv * to_float(wv.v[k]));
          store_vec(xr + int64_t(i) * V, o);
        }
      }
    } else {
      // Two passes over the row. Pass 1 only reads; pass 2 re-reads the same elements in
      // the same thread before writing them and recomputes the identical fp32 sums.
      float ss = 0.f;
      auto sum_step = [&](auto n, int i) {
        constexpr int N = decltype(n)::value;
        VT xv[N], rv[N];
#pragma unroll
        for (int u = 0; u < N; ++u) {
          xv[u] = load_vec<T, V>(xr + int64_t(i + u * tpr) * V);
          rv[u] = load_vec<T, V>(rr + int64_t(i + u * tpr) * V);
        }
#pragma unroll
        for (int u = 0; u < N; ++u) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float z = to_float(xv[u].v[k]) + to_float(rv[u].v[k]);
            ss += z * z;
          }
        }
      };
      if (active) row_steps(tx, nvec, tpr, sum_step);
      const float inv = rms_inv(row_sum(ss), hidden, eps);
      auto out_step = [&](auto n, int i) {
        constexpr int N = decltype(n)::value;
        VT xv[N], rv[N], wv[N];
#pragma unroll
        for (int u = 0; u < N; ++u) {
          xv[u] = load_vec<T, V>(xr + int64_t(i + u * tpr) * V);
          rv[u] = load_vec<T, V>(rr + int64_t(i + u * tpr) * V);
          wv[u] = ldg_vec<T, V>(weight + int64_t(i + u * tpr) * V);
        }
#pragma unroll
        for (int u = 0; u < N; ++u) {
          VT ro, xo;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float z = to_float(xv[u].v[k]) + to_float(rv[u].v[k]);
            ro.v[k] = from_float<T>(z);
            xo.v[k] = from_float<T>(z * inv * to_float(wv[u].v[k]));
          }
          store_vec(rr + int64_t(i + u * tpr) * V, ro);
          store_vec(xr + int64_t(i + u * tpr) * V, xo);
        }
      };
      if (active) row_steps(tx, nvec, tpr, out_step);
    }
  }
}

struct NormLaunch {
  int nv;  // accesses per thread kept in registers (1, 2, 4), or 0: two passes
  dim3 block, grid;
};

// nvec: accesses per row (hidden / V). cached: whether NV > 0 kernels may be used.
inline NormLaunch plan(int64_t rows, int nvec, bool cached) {
  NormLaunch p{};
  int tpr;
  if (nvec <= 128) {  // a lane group or a warp per row, 128 threads per CTA
    if (nvec <= 32) { tpr = next_pow2(nvec); p.nv = 1; }
    else if (nvec <= 64) { tpr = 32; p.nv = 2; }
    else { tpr = 32; p.nv = 4; }
    if (!cached) { tpr = nvec <= 32 ? tpr : 32; p.nv = 0; }
    const int rows_per_cta = 128 / tpr;
    p.block = dim3(tpr, rows_per_cta);
    p.grid = dim3(grid_cap(ceil_div(rows, rows_per_cta)));
    return p;
  }
  tpr = 0;
  if (cached) {
    for (int nv : {1, 2, 4}) {  // prefer <= 256 threads per row, then up to 512 with 4 per thread
      if (round_up32(ceil_div(nvec, nv)) <= 256) { p.nv = nv; tpr = round_up32(ceil_div(nvec, nv)); break; }
    }
    if (tpr == 0 && round_up32(ceil_div(nvec, 4)) <= 512) { p.nv = 4; tpr = round_up32(ceil_div(nvec, 4)); }
  }
  if (tpr == 0) {  // two passes: kU accesses per thread per step, at most kMaxThreads threads
    p.nv = 0;
    tpr = int(std::min<int64_t>(kMaxThreads, round_up32(ceil_div(nvec, kU))));
  }
  p.block = dim3(tpr, 1);
  p.grid = dim3(grid_cap(rows));
  return p;
}

}  // namespace norm_detail

template <class T>
cudaError_t rms_norm(T* out,        // [rows, hidden] contiguous
                     const T* in,   // [rows, hidden], row stride in_stride
                     int64_t in_stride,
                     const T* weight,  // [hidden]
                     int64_t rows, int hidden, float eps, cudaStream_t stream) {
  using namespace norm_detail;
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec = hidden % V == 0 && in_stride % V == 0 && aligned16(out) && aligned16(in) && aligned16(weight);
  const NormLaunch p = plan(rows, vec ? hidden / V : hidden, vec);
#define DK_RMS_LAUNCH(VEC, NV) \
  rms_norm_kernel<T, VEC, NV><<<p.grid, p.block, 0, stream>>>(out, in, in_stride, weight, rows, hidden, eps)
  if (vec) {
    switch (p.nv) {
      case 1: DK_RMS_LAUNCH(true, 1); break;
      case 2: DK_RMS_LAUNCH(true, 2); break;
      case 4: DK_RMS_LAUNCH(true, 4); break;
      default: DK_RMS_LAUNCH(true, 0);
    }
  } else {
    DK_RMS_LAUNCH(false, 0);
  }
#undef DK_RMS_LAUNCH
  return cudaGetLastError();
}

template <class T>
cudaError_t fused_add_rms_norm(T* x,  // [rows, hidden], row stride x_stride; in: input, out: normed
                               int64_t x_stride,
                               T* residual,  // [rows, hidden], row stride r_stride; in/out: x + residual
                               int64_t r_stride,
                               const T* weight,  // [hidden]
                               int64_t rows, int hidden, float eps, cudaStream_t stream) {
  using namespace norm_detail;
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec = hidden % V == 0 && x_stride % V == 0 && r_stride % V == 0 && aligned16(x) && aligned16(residual) &&
                   aligned16(weight);
  const NormLaunch p = plan(rows, vec ? hidden / V : hidden, vec);
#define DK_FUSED_LAUNCH(VEC, NV)                                                                               \
  fused_add_rms_norm_kernel<T, VEC, NV><<<p.grid, p.block, 0, stream>>>(x, x_stride, residual, r_stride, weight, \
                                                                         rows, hidden, eps)
  if (vec) {
    switch (p.nv) {
      case 1: DK_FUSED_LAUNCH(true, 1); break;
      case 2: DK_FUSED_LAUNCH(true, 2); break;
      case 4: DK_FUSED_LAUNCH(true, 4); break;
      default: DK_FUSED_LAUNCH(true, 0);
    }
  } else {
    DK_FUSED_LAUNCH(false, 0);
  }
#undef DK_FUSED_LAUNCH
  return cudaGetLastError();
}

}  // namespace dk::cuda
