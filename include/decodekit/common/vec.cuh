// Device building blocks shared by the CUDA kernels (torch-free):
//  - dk::Conv for __half / __nv_bfloat16 (fp32 <-> storage, round-to-nearest-even, so the
//    results agree bit-for-bit with dk::float_to_half / dk::float_to_bf16 except for the
//    payload of NaNs),
//  - Vec<T, N>: N elements of T moved as one aligned access (16 bytes by default),
//  - warp / block sum reductions,
//  - small host helpers for launch configuration (alignment, rounding).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decodekit/common/dtype.h"

namespace dk {

template <> struct Conv<__half> {
  DK_HD static float load(const __half& x) { return __half2float(x); }
  DK_HD static __half store(float x) { return __float2half_rn(x); }
};
template <> struct Conv<__nv_bfloat16> {
  DK_HD static float load(const __nv_bfloat16& x) { return __bfloat162float(x); }
  DK_HD static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

// The raw unsigned type of an access of BYTES bytes.
template <int BYTES> struct RawBits;
template <> struct RawBits<16> { using type = uint4; };
template <> struct RawBits<8> { using type = uint2; };
template <> struct RawBits<4> { using type = uint32_t; };
template <> struct RawBits<2> { using type = uint16_t; };
template <> struct RawBits<1> { using type = uint8_t; };

// Elements per 16-byte access.
template <class T> inline constexpr int kVec16 = 16 / int(sizeof(T));

// N elements of T loaded or stored as one access of sizeof(T) * N bytes; the address
// must be aligned to that size. Vec<T> (N = 16 / sizeof(T)) is a 128-bit access.
template <class T, int N = kVec16<T>>
struct alignas(sizeof(T) * N) Vec {
  static constexpr int kSize = N;
  using Raw = typename RawBits<int(sizeof(T)) * N>::type;
  T v[N];
};

#if defined(__CUDACC__)

// Plain (coherent) load: use for data the kernel also writes.
template <class T, int N = kVec16<T>>
DK_DEVICE Vec<T, N> load_vec(const T* p) {
  using R = typename Vec<T, N>::Raw;
#if defined(DK_CUDA_EMU)
  dk_emu::check_aligned(p, sizeof(R), "vector load");
#endif
  Vec<T, N> out;
  *reinterpret_cast<R*>(&out) = *reinterpret_cast<const R*>(p);
  return out;
}

// Read-only load through the non-coherent path (LDG.*.CONSTANT): only for data that no
// thread of the kernel writes.
template <class T, int N = kVec16<T>>
DK_DEVICE Vec<T, N> ldg_vec(const T* p) {
  using R = typename Vec<T, N>::Raw;
#if defined(DK_CUDA_EMU)
  dk_emu::check_aligned(p, sizeof(R), "vector load");
#endif
  Vec<T, N> out;
  *reinterpret_cast<R*>(&out) = __ldg(reinterpret_cast<const R*>(p));
  return out;
}

template <class T, int N>
DK_DEVICE void store_vec(T* p, const Vec<T, N>& x) {
  using R = typename Vec<T, N>::Raw;
#if defined(DK_CUDA_EMU)
  dk_emu::check_aligned(p, sizeof(R), "vector store");
#endif
  *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(&x);
}

// N consecutive floats (e.g. from shared memory) with the widest aligned accesses:
// p must be aligned to 4 * min(N, 4) bytes.
template <int N>
DK_DEVICE void load_floats(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + i);
      out[i] = f.x; out[i + 1] = f.y; out[i + 2] = f.z; out[i + 3] = f.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 f = *reinterpret_cast<const float2*>(p + i);
      out[i] = f.x; out[i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

// Sum over groups of `width` consecutive lanes (width a power of two <= 32, groups
// aligned to width); every lane gets its group's sum. All 32 lanes must call it.
DK_DEVICE float warp_sum(float v, int width = 32) {
  for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int WIDTH>
DK_DEVICE float warp_sum_fixed(float v) {
#pragma unroll
  for (int o = WIDTH >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (its size a multiple of 32, at most 1024); every thread gets
// the total. Deterministic (fixed order). Safe to call repeatedly (ends with a barrier).
DK_DEVICE float block_sum(float v) {
  __shared__ float partial[32];
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int nwarps = (blockDim.x * blockDim.y) >> 5;
  v = warp_sum_fixed<32>(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.f;
  v = warp_sum_fixed<32>(v);
  __syncthreads();
  return v;
}

#endif  // __CUDACC__

namespace cuda {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int round_up32(int64_t n) { return int((n + 31) / 32 * 32); }
inline int next_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}
inline unsigned grid_cap(int64_t n) {  // gridDim.x limit; kernels grid-stride past it
  return unsigned(n < 1 ? 1 : (n > 0x7fffffff ? 0x7fffffff : n));
}

// Multiprocessors of the current device (cached per device).
inline int num_sms() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cache[dev] = n;
  }
  return cache[dev];
}

}  // namespace cuda
}  // namespace dk
