// Rotary-embedding CUDA kernel (torch-free). Same math as rope.h (dk::rope_rotate in fp32,
// one rounding per store; elements past rot_dim untouched).
//
// One CTA per token (grid-stride over tokens): the token's rot_dim cos|sin floats are read
// once into shared memory, then the CTA's threads sweep every (head, pair-group) item of
// query and then key. An item is:
//   NeoX  : V consecutive pairs i..i+V-1 -> one access at i and one at i + rot_dim/2,
//   GPT-J : V/2 interleaved pairs        -> one access of V elements at 2i (scalar: 1 pair).
// VEC: V = 16 / sizeof(T) (16-byte accesses) when query/key are 16-byte aligned, their
// token and head strides are multiples of V, and the rotary half (NeoX) or rot_dim (GPT-J)
// is a multiple of V; otherwise V = 1.
//
// positions are NOT checked here (no device-to-host sync): a position outside
// [0, max_position) reads outside cos_sin_cache and is the caller's bug.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "decodekit/common/vec.cuh"
#include "decodekit/rope.h"

namespace dk::cuda {
namespace rope_detail {

constexpr int kMaxThreads = 512;

template <class T, bool VEC>
__global__ void __launch_bounds__(kMaxThreads)
rotary_embedding_kernel(const int64_t* __restrict__ positions, T* __restrict__ query, int64_t q_token_stride,
                        int64_t q_head_stride, int num_q_heads, T* __restrict__ key, int64_t k_token_stride,
                        int64_t k_head_stride, int num_kv_heads, const float* __restrict__ cos_sin_cache,
                        int rot_dim, bool is_neox, int64_t num_tokens) {
  constexpr int V = VEC ? kVec16<T> : 1;
  constexpr int GJ = V >= 2 ? V / 2 : 1;  // GPT-J pairs per item
  using VT = Vec<T, V>;
  extern __shared__ float4 cs_smem[];
  float* cs = reinterpret_cast<float*>(cs_smem);  // [rot_dim]: cos | sin

  const int half = rot_dim / 2;
  const int pairs_per_item = is_neox ? V : GJ;
  const int items_per_head = half / pairs_per_item;
  const int q_items = num_q_heads * items_per_head;
  const int items = q_items + (key != nullptr ? num_kv_heads * items_per_head : 0);

  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const float* src = cos_sin_cache + positions[t] * int64_t(rot_dim);
    for (int i = threadIdx.x; i < rot_dim; i += blockDim.x) cs[i] = __ldg(src + i);
    __syncthreads();
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      T* p;
      int u;
      if (it < q_items) {
        const int h = it / items_per_head;
        u = it - h * items_per_head;
        p = query + t * q_token_stride + h * q_head_stride;
      } else {
        const int h = (it - q_items) / items_per_head;
        u = it - q_items - h * items_per_head;
        p = key + t * k_token_stride + h * k_head_stride;
      }
      if (is_neox) {
        const int i0 = u * V;
        VT xv = load_vec<T, V>(p + i0), yv = load_vec<T, V>(p + half + i0);
        float c[V], s[V];
        load_floats<V>(cs + i0, c);
        load_floats<V>(cs + half + i0, s);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float x = to_float(xv.v[k]), y = to_float(yv.v[k]);
          rope_rotate(x, y, c[k], s[k]);
          xv.v[k] = from_float<T>(x);
          yv.v[k] = from_float<T>(y);
        }
        store_vec(p + i0, xv);
        store_vec(p + half + i0, yv);
      } else {
        const int i0 = u * GJ;
        float c[GJ], s[GJ];
        load_floats<GJ>(cs + i0, c);
        load_floats<GJ>(cs + half + i0, s);
        if constexpr (V >= 2) {
          VT v = load_vec<T, V>(p + 2 * i0);
#pragma unroll
          for (int k = 0; k < GJ; ++k) {
            float x = to_float(v.v[2 * k]), y = to_float(v.v[2 * k + 1]);
            rope_rotate(x, y, c[k], s[k]);
            v.v[2 * k] = from_float<T>(x);
            v.v[2 * k + 1] = from_float<T>(y);
          }
          store_vec(p + 2 * i0, v);
        } else {
          float x = to_float(p[2 * i0]), y = to_float(p[2 * i0 + 1]);
          rope_rotate(x, y, c[0], s[0]);
          p[2 * i0] = from_float<T>(x);
          p[2 * i0 + 1] = from_float<T>(y);
        }
      }
    }
    __syncthreads();  // cs is overwritten for the next token
  }
}

}  // namespace rope_detail

template <class T>
cudaError_t rotary_embedding(const int64_t* positions,  // [num_tokens]
                             T* query,  // [num_tokens, num_q_heads, head_size] (token/head strides in elements)
                             int64_t q_token_stride, int64_t q_head_stride, int num_q_heads,
                             T* key,  // [num_tokens, num_kv_heads, head_size] or null
                             int64_t k_token_stride, int64_t k_head_stride, int num_kv_heads,
                             const float* cos_sin_cache,  // [max_position, rot_dim]
                             int rot_dim, int head_size, bool is_neox, int64_t num_tokens, cudaStream_t stream) {
  using namespace rope_detail;
  (void)head_size;  // only rot_dim (<= head_size) elements of each head are touched
  if (num_tokens <= 0 || rot_dim < 2) return cudaSuccess;
  if (key == nullptr) num_kv_heads = 0;
  constexpr int V = kVec16<T>;
  const int half = rot_dim / 2;
  bool vec = (is_neox ? half % V == 0 : rot_dim % V == 0) && aligned16(query) && q_token_stride % V == 0 &&
             q_head_stride % V == 0;
  if (key != nullptr) vec = vec && aligned16(key) && k_token_stride % V == 0 && k_head_stride % V == 0;
  const int pairs_per_item = is_neox ? (vec ? V : 1) : (vec ? V / 2 : 1);
  const int64_t items = int64_t(num_q_heads + num_kv_heads) * (half / pairs_per_item);
  const int threads = int(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, round_up32(items))));
  const size_t smem = size_t(rot_dim) * sizeof(float);
  const unsigned grid = grid_cap(num_tokens);
  if (vec)
    rotary_embedding_kernel<T, true><<<grid, threads, smem, stream>>>(
        positions, query, q_token_stride, q_head_stride, num_q_heads, key, k_token_stride, k_head_stride,
        num_kv_heads, cos_sin_cache, rot_dim, is_neox, num_tokens);
  else
    rotary_embedding_kernel<T, false><<<grid, threads, smem, stream>>>(
        positions, query, q_token_stride, q_head_stride, num_q_heads, key, k_token_stride, k_head_stride,
        num_kv_heads, cos_sin_cache, rot_dim, is_neox, num_tokens);
  return cudaGetLastError();
}

}  // namespace dk::cuda
