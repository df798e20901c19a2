// CUDA kernels for the paged KV cache (torch-free): reshape_and_cache and paged_attention.
// Same semantics as the CPU kernels in cpu.h; the paged addressing (PagedLayout), the causal
// window (causal_last_key) and the softmax algebra (OnlineSoftmax) come from common.h, so
// CPU and GPU share the per-element logic. All arithmetic is fp32, one rounding per store.
//
// Neither launcher reads device memory on the host or synchronises (the engine captures
// them in CUDA graphs): the grids depend only on shapes. Metadata the CPU launchers
// validate is therefore handled in the kernels, without reading outside any tensor:
//  - reshape_and_cache: slots < 0 (padding) and slots >= num_blocks * block_size are skipped.
//  - paged_attention: a token that lies in no sequence's [query_start_loc[s],
//    query_start_loc[s + 1]) (e.g. padding past query_start_loc[S]) gets out = 0 and
//    lse = -inf. A token whose sequence has seq_lens[s] < its number of new tokens, needs
//    more than max_blocks blocks, or whose causal window uses a block id outside
//    [0, num_blocks) gets out = NaN and lse = NaN (the CPU launcher raises instead).
//
// Batches in which some sequence has more than one new token go to the tensor-core kernel of
// prefill.cuh (paged_attention_uses_prefill_kernel); the rest (decode) to the kernel below.
//
// paged_attention (decode) design:
//  - grid (num_tokens, num_kv_heads, head chunks); one CTA = one query token and up to
//    kMaxHeadsPerCta query heads of one KV head's GQA group (groups larger than that are
//    split across blockIdx.z), so each K/V row is read once per token for the whole chunk.
//  - the token's sequence is found by binary search over query_start_loc (device memory);
//    it sees keys window_first_key(last, window) .. last = causal_last_key(seq_len, n_new, i)
//    (window 0: from key 0; blocks before the window are not read).
//  - the CTA's 4 warps split the keys: a K/V row of D elements is read with 16-byte loads by
//    a group of LPR = min(32, D * sizeof(T) / 16) lanes (NVL accesses each), so a warp holds
//    KPW = 32 / LPR rows at once; each lane group is one "partition" that keeps its own fp32
//    online softmax (OnlineSoftmax m, l) and accumulator per head, over the keys
//    part, part + P, part + 2P, ... (P = 4 * KPW partitions; 2 keys per iteration, so
//    consecutive partitions read consecutive rows of a block).
//  - q (pre-scaled by `scale`, fp32) sits in shared memory; scores are reduced over the
//    LPR lanes with xor shuffles.
//  - the partitions' (m, l, acc) are merged in shared memory with the OnlineSoftmax
//    algebra (rescale by exp(m_p - m), as merge_lse does), giving out = acc / l and
//    lse = m + log(l) (natural log, as the CPU kernel).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "decodekit/attention/common.h"
#include "decodekit/attention/decode_tc.cuh"
#include "decodekit/attention/prefill.cuh"
#include "decodekit/common/fp8.h"
#include "decodekit/common/vec.cuh"

namespace dk::cuda {
namespace attn_detail {

// ------------------------------------------------------------------ reshape_and_cache

constexpr int kCacheMaxThreads = 256;

// One CTA per token (grid-stride over tokens); the CTA's threads copy the token's
// num_kv_heads * head_dim / V accesses of key and of value. VEC: V = 16 / sizeof(T).
// C: the cache's storage type (T, or fp8_e4m3_t: each element quantized as x / scale).
template <class T, class C, bool VEC>
__global__ void __launch_bounds__(kCacheMaxThreads)
reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value, int64_t k_stride, int64_t v_stride,
                         C* __restrict__ key_cache, C* __restrict__ value_cache,
                         const int64_t* __restrict__ slot_mapping, int64_t num_tokens, int64_t num_slots,
                         PagedLayout L, KVScales sc) {
  constexpr int V = VEC ? kVec16<T> : 1;
  const int per_head = L.head_dim / V;
  const int n = L.num_kv_heads * per_head;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int64_t slot = __ldg(slot_mapping + t);
    if (slot < 0 || slot >= num_slots) continue;  // padding (or outside the cache): skipped
    const T* k = key + t * k_stride;
    const T* v = value + t * v_stride;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int h = i / per_head;
      const int e = (i - h * per_head) * V;
      const int64_t src = int64_t(h) * L.head_dim + e;
      const int64_t dst = L.slot_row(slot, h) + e;
      const Vec<T, V> kv = ldg_vec<T, V>(k + src);
      const Vec<T, V> vv = ldg_vec<T, V>(v + src);
      if constexpr (kIsFp8<C>) {
        const float ks = sc.key(h), vs = sc.value(h);
        Vec<C, V> kq, vq;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          kq.v[e].bits = quantize_fp8_e4m3(to_float(kv.v[e]), ks);
          vq.v[e].bits = quantize_fp8_e4m3(to_float(vv.v[e]), vs);
        }
        store_vec(key_cache + dst, kq);
        store_vec(value_cache + dst, vq);
      } else {
        store_vec(key_cache + dst, kv);
        store_vec(value_cache + dst, vv);
      }
    }
  }
}

// ------------------------------------------------------------------ copy_blocks

// One CTA per (pair, cache): copies block src -> dst (pairs with an id outside
// [0, num_blocks) are skipped); 16-byte accesses when block_bytes % 16 == 0 (VEC).
template <bool VEC>
__global__ void __launch_bounds__(256)
copy_blocks_kernel(char* __restrict__ key_cache, char* __restrict__ value_cache, int64_t block_bytes,
                   const int64_t* __restrict__ mapping, int64_t num_blocks) {
  const int64_t src = __ldg(mapping + 2 * blockIdx.x), dst = __ldg(mapping + 2 * blockIdx.x + 1);
  if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) return;
  char* cache = blockIdx.y == 0 ? key_cache : value_cache;
  const char* from = cache + src * block_bytes;
  char* to = cache + dst * block_bytes;
  if constexpr (VEC) {
    for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(to)[i] = reinterpret_cast<const uint4*>(from)[i];
  } else {
    for (int64_t i = threadIdx.x; i < block_bytes; i += blockDim.x) to[i] = from[i];
  }
}

// ------------------------------------------------------------------ paged_attention

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kMaxHeadsPerCta = 8;

// Work split of one K/V row of D elements of T (see the header comment).
template <class T, int D>
struct AttnShape {
  static constexpr int VE = kVec16<T>;                        // elements per 16-byte access
  static constexpr int ROW_VECS = D / VE;                     // 16-byte accesses per row
  static constexpr int LPR = ROW_VECS < 32 ? ROW_VECS : 32;   // lanes per row (a power of two)
  static constexpr int NVL = ROW_VECS / LPR;                  // accesses per lane per row
  static constexpr int EPL = NVL * VE;                        // row elements per lane
  static constexpr int KPW = 32 / LPR;                        // rows (keys) per warp at once
  static constexpr int P = kAttnWarps * KPW;                  // partitions of the keys
  static_assert(D % VE == 0 && ROW_VECS % LPR == 0 && (LPR & (LPR - 1)) == 0, "unsupported head_dim");
  // Element (in the row) of this lane's access j: accesses of a row are spread over the
  // lanes first, so each load instruction of a lane group reads LPR * 16 contiguous bytes.
  DK_HD static int elem(int li, int j) { return (j * LPR + li) * VE; }
  // Position of row element d in the fp32 shared-memory copies (q_s, acc_s): the float4
  // quarters of each 16-byte access are stored quarter-major, so the LDS.128 / STS.128
  // of a lane group touch consecutive 16-byte words (no bank conflicts for VE = 8).
  DK_HD static int spos(int d) {
    const int a = d / VE, e = d - a * VE;
    return (e >> 2) * (ROW_VECS * 4) + a * 4 + (e & 3);
  }
};

template <class T, int N>
DK_DEVICE void zero_vec(Vec<T, N>& x) {
  using R = typename Vec<T, N>::Raw;
  *reinterpret_cast<R*>(&x) = R{};
}

// HPC: heads per CTA the kernel is compiled for (1, 2, 4, 8); the CTA handles
// nh = min(heads_per_cta, group - blockIdx.z * heads_per_cta) <= HPC of them.
// C: the cache's storage type: T (16-byte accesses), or fp8_e4m3_t (the same VE elements
// per access, so 16 / sizeof(T) bytes; K/V read as float(q) * scale, k_scale folded into
// the pre-scaled query and v_scale into the final normalisation).
// PF (prefetch): the next iteration's K/V rows are loaded before this iteration's math, so each warp
// keeps its loads in flight while it computes (the H200 run of 2026-12-04 saturated at 40% of the copy
// bandwidth without: ~5 CTAs per SM, each warp idle on its loads half the time). !PF: the previous
// kernel, kept for bench_attention's A/B until the next GPU run has measured both.
template <class T, class C, int D, int HPC, bool PF = true>
__global__ void __launch_bounds__(kAttnThreads)
paged_attention_kernel(T* out,                // [T, Hq, D] contiguous
                       float* lse,            // [T, Hq] or null
                       const T* query,        // [T, Hq, D], token stride q_stride, head stride D
                       int64_t q_stride,
                       const C* __restrict__ key_cache,    // [num_blocks, Hk, block_size, D]
                       const C* __restrict__ value_cache,  // [num_blocks, Hk, block_size, D]
                       const int32_t* __restrict__ block_tables,     // [S, max_blocks]
                       int max_blocks,
                       const int32_t* __restrict__ seq_lens,         // [S]
                       const int32_t* __restrict__ query_start_loc,  // [S + 1]
                       int num_seqs, int num_q_heads, int heads_per_cta, int64_t num_blocks, PagedLayout L,
                       float scale, KVScales sc,
                       int window,            // sliding window (window_first_key; 0: none)
                       int num_splits,        // > 1: split-KV, this CTA's results go to part_out / part_lse
                       float* part_out,       // [num_splits, T, Hq, D] (split-KV only)
                       float* part_lse) {     // [num_splits, T, Hq] (split-KV only)
  using S = AttnShape<T, D>;
  constexpr int VE = S::VE, LPR = S::LPR, NVL = S::NVL, EPL = S::EPL, KPW = S::KPW, P = S::P;
  alignas(16) __shared__ float q_s[HPC][D];         // this CTA's queries, pre-scaled (at spos(d))
  alignas(16) __shared__ float acc_s[P][HPC][D];    // partitions' unnormalised outputs (at spos(d))
  __shared__ float m_s[P][HPC], l_s[P][HPC];        // partitions' softmax states
  __shared__ int bad_s;                             // token's metadata is inconsistent

  const int64_t t = blockIdx.x;
  const int kvh = blockIdx.y;
  const int group = num_q_heads / L.num_kv_heads;
  const int split = int(blockIdx.z) % num_splits;
  const int g0 = int(blockIdx.z) / num_splits * heads_per_cta;
  const int nh = group - g0 < heads_per_cta ? group - g0 : heads_per_cta;  // >= 1 (grid)
  const int head0 = kvh * group + g0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int li = lane % LPR;                   // lane within its row group
  const int part = warp * KPW + lane / LPR;    // this lane group's partition

  // The token's sequence (binary search over query_start_loc) and last key; split-KV: this CTA takes keys
  // [k_begin, k_end] of the window first .. last, in pieces of a multiple of 2P keys (so the
  // partition/key mapping below is unchanged); a CTA whose piece is empty writes an empty partial
  // result (0, lse = -inf).
  const DecodeToken tok = decode_token(t, query_start_loc, seq_lens, num_seqs, max_blocks, L.block_size);
  const int s = tok.s;
  bool bad = tok.bad;
  int64_t k_begin, k_end;
  split_key_range(window_first_key(tok.last, window), tok.last, split, num_splits, 2 * P, k_begin, k_end);

  if (tid == 0) bad_s = 0;
  const float qscale = scale * sc.key(kvh);
  for (int i = tid; i < nh * D; i += kAttnThreads) {
    const int g = i / D, d = i - g * D;
    q_s[g][S::spos(d)] = to_float(query[t * q_stride + int64_t(head0 + g) * D + d]) * qscale;
  }
  __syncthreads();

  float acc[HPC][EPL];
  OnlineSoftmax sm[HPC];
#pragma unroll
  for (int g = 0; g < HPC; ++g) {
    sm[g].init();
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = 0.f;
  }

  const int32_t* table = block_tables + int64_t(s) * max_blocks;
  const int bs = L.block_size;
  // Loads key k's K and V accesses of this lane (zeros for a key past `last` or one in
  // a block outside the cache, which is also flagged).
  auto load_row = [&](int64_t k, bool valid, Vec<C, VE> (&kr)[NVL], Vec<C, VE> (&vr)[NVL]) {
    int64_t row = -1;
    if (valid) {
      const int kk = int(k);
      const int b = kk / bs;
      const int32_t id = __ldg(table + b);
      if (id >= 0 && id < num_blocks) row = L.row(id, kvh, kk - b * bs);
      else bad = true;
    }
#pragma unroll
    for (int j = 0; j < NVL; ++j) {
      if (row >= 0) {
        kr[j] = ldg_vec<C, VE>(key_cache + row + S::elem(li, j));
        vr[j] = ldg_vec<C, VE>(value_cache + row + S::elem(li, j));
      } else {
        zero_vec(kr[j]);
        zero_vec(vr[j]);
      }
    }
  };

  // Two keys per partition per iteration: ka = k0 + part and kb = ka + P (the loop bound
  // is CTA-uniform, so every lane runs every iteration and the shuffles are full-warp).
  // PF: the rows of iteration k0 were loaded by the previous iteration (the first ones here).
  Vec<C, VE> kra[NVL], vra[NVL], krb[NVL], vrb[NVL];
  if constexpr (PF) {
    load_row(k_begin + part, k_begin + part <= k_end, kra, vra);
    load_row(k_begin + part + P, k_begin + part + P <= k_end, krb, vrb);
  }
#pragma unroll 1
  for (int64_t k0 = k_begin; k0 <= k_end; k0 += 2 * P) {
    const int64_t ka = k0 + part, kb = ka + P;
    const bool va = ka <= k_end, vb = kb <= k_end;
    Vec<C, VE> nkra[NVL], nvra[NVL], nkrb[NVL], nvrb[NVL];  // PF: the next iteration's rows
    if constexpr (PF) {
      load_row(ka + 2 * P, ka + 2 * P <= k_end, nkra, nvra);
      load_row(kb + 2 * P, kb + 2 * P <= k_end, nkrb, nvrb);
    } else {
      load_row(ka, va, kra, vra);
      load_row(kb, vb, krb, vrb);
    }
    float kfa[EPL], kfb[EPL];
#pragma unroll
    for (int j = 0; j < NVL; ++j)
#pragma unroll
      for (int e = 0; e < VE; ++e) {
        kfa[j * VE + e] = to_float(kra[j].v[e]);
        kfb[j * VE + e] = to_float(krb[j].v[e]);
      }
#pragma unroll
    for (int g = 0; g < HPC; ++g) {
      if (g < nh) {
        float q[EPL];
#pragma unroll
        for (int j = 0; j < NVL; ++j)
#pragma unroll
          for (int e = 0; e < VE; e += 4) {
            float qj[4];
            load_floats<4>(&q_s[g][S::spos(S::elem(li, j) + e)], qj);
#pragma unroll
            for (int r = 0; r < 4; ++r) q[j * VE + e + r] = qj[r];
          }
        float da = 0.f, db = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          da += q[e] * kfa[e];
          db += q[e] * kfb[e];
        }
        da = warp_sum_fixed<LPR>(da);
        db = warp_sum_fixed<LPR>(db);
        const float sa = va ? da : -INFINITY, sb = vb ? db : -INFINITY;
        const float corr = sm[g].rescale(sa > sb ? sa : sb);
        const float pa = va ? expf(sa - sm[g].m) : 0.f;
        const float pb = vb ? expf(sb - sm[g].m) : 0.f;
        sm[g].add(pa);
        sm[g].add(pb);
#pragma unroll
        for (int j = 0; j < NVL; ++j)
#pragma unroll
          for (int e = 0; e < VE; ++e)
            acc[g][j * VE + e] = acc[g][j * VE + e] * corr + pa * to_float(vra[j].v[e]) + pb * to_float(vrb[j].v[e]);
      }
    }
    if constexpr (PF) {
#pragma unroll
      for (int j = 0; j < NVL; ++j) {
        kra[j] = nkra[j];
        vra[j] = nvra[j];
        krb[j] = nkrb[j];
        vrb[j] = nvrb[j];
      }
    }
  }

  // Partitions' states to shared memory, then merge them per (head, d).
  if (bad) bad_s = 1;
#pragma unroll
  for (int g = 0; g < HPC; ++g) {
    if (g < nh) {
      if (li == 0) {
        m_s[part][g] = sm[g].m;
        l_s[part][g] = sm[g].l;
      }
#pragma unroll
      for (int j = 0; j < NVL; ++j)
#pragma unroll
        for (int e = 0; e < VE; e += 4)
          *reinterpret_cast<float4*>(&acc_s[part][g][S::spos(S::elem(li, j) + e)]) =
              make_float4(acc[g][j * VE + e], acc[g][j * VE + e + 1], acc[g][j * VE + e + 2], acc[g][j * VE + e + 3]);
    }
  }
  __syncthreads();
  const bool poisoned = bad_s != 0;
  const float vscale = sc.value(kvh);
  for (int i = tid; i < nh * D; i += kAttnThreads) {
    const int g = i / D, d = i - g * D, sd = S::spos(d);
    OnlineSoftmax m;
    m.init();
    float o = 0.f;
#pragma unroll 4
    for (int p = 0; p < P; ++p) {
      const float mp = m_s[p][g];
      if (mp == -INFINITY) continue;  // partition saw no key
      const float corr = m.rescale(mp);
      const float w = expf(mp - m.m);
      o = o * corr + acc_s[p][g][sd] * w;
      m.add(l_s[p][g] * w);
    }
    float res, lv;
    if (poisoned) {
      res = lv = NAN;
    } else if (m.l > 0.f) {
      res = o * (vscale / m.l);
      lv = m.lse();
    } else {  // token in no sequence
      res = 0.f;
      lv = -INFINITY;
    }
    store_decode_result(out, lse, part_out, part_lse, num_splits, split, t * num_q_heads + head0 + g,
                        int64_t(gridDim.x) * num_q_heads, D, d, res, lv);
  }
}

// Split-KV merge: one CTA per (token, query head), D threads: the splits' (out_i, lse_i)
// combined with merge_lse (common.h, the CPU's algebra); NaN (bad metadata) propagates,
// all-empty gives (0, -inf).
template <class T>
__global__ void __launch_bounds__(256)
paged_attention_merge_kernel(T* out,                  // [T, Hq, D]
                             float* lse,              // [T, Hq] or null
                             const float* __restrict__ part_out,  // [num_splits, T, Hq, D]
                             const float* __restrict__ part_lse,  // [num_splits, T, Hq]
                             int num_splits, int64_t rows, int D) {
  const int64_t row = blockIdx.x;  // t * Hq + head
  const int d = threadIdx.x;
  if (d >= D) return;
  float l = -INFINITY, o = 0.f;
  for (int i = 0; i < num_splits; ++i) {
    const float li = __ldg(part_lse + i * rows + row);
    const float oi = __ldg(part_out + (i * rows + row) * D + d);
    float wa, wb;
    const float nl = merge_lse(l, li, wa, wb);
    if (li != li || l != l) {  // NaN: a split saw inconsistent metadata
      l = o = NAN;
      continue;
    }
    o = wa * o + wb * oi;
    l = nl;
  }
  out[row * D + d] = from_float<T>(o);
  if (lse != nullptr && d == 0) lse[row] = l;
}

// Launches the merge when num_splits > 1 (after the split kernel's launch; returns its error otherwise).
template <class T>
cudaError_t paged_attention_merge_launch(T* out, float* lse, const float* part_out, const float* part_lse,
                                         int num_splits, int64_t rows, int head_dim, cudaStream_t stream) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || num_splits <= 1) return err;
  paged_attention_merge_kernel<T><<<unsigned(rows), head_dim, 0, stream>>>(out, lse, part_out, part_lse, num_splits,
                                                                           rows, head_dim);
  return cudaGetLastError();
}

}  // namespace attn_detail

// key/value rows (token stride k_stride / v_stride, heads contiguous) into the caches at
// slot_mapping (slots < 0 or >= num_slots = num_blocks * block_size are skipped).
// C: T, or fp8_e4m3_t (quantized with sc's scales).
template <class T, class C>
cudaError_t reshape_and_cache(const T* key,     // [num_tokens, Hk, D], token stride k_stride
                              const T* value,   // [num_tokens, Hk, D], token stride v_stride
                              int64_t k_stride, int64_t v_stride,
                              C* key_cache,     // [num_blocks, Hk, block_size, D]
                              C* value_cache,   // [num_blocks, Hk, block_size, D]
                              const int64_t* slot_mapping,  // [num_tokens]
                              int64_t num_tokens, int64_t num_slots, PagedLayout L, KVScales sc,
                              cudaStream_t stream) {
  using namespace attn_detail;
  if (num_tokens <= 0 || L.num_kv_heads <= 0 || L.head_dim <= 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec = L.head_dim % V == 0 && k_stride % V == 0 && v_stride % V == 0 && aligned16(key) &&
                   aligned16(value) && aligned16(key_cache) && aligned16(value_cache);
  const int64_t n = int64_t(L.num_kv_heads) * L.head_dim / (vec ? V : 1);
  const int threads = n >= kCacheMaxThreads ? kCacheMaxThreads : round_up32(n);
  const dim3 grid(grid_cap(num_tokens));
  if (vec)
    reshape_and_cache_kernel<T, C, true><<<grid, threads, 0, stream>>>(
        key, value, k_stride, v_stride, key_cache, value_cache, slot_mapping, num_tokens, num_slots, L, sc);
  else
    reshape_and_cache_kernel<T, C, false><<<grid, threads, 0, stream>>>(
        key, value, k_stride, v_stride, key_cache, value_cache, slot_mapping, num_tokens, num_slots, L, sc);
  return cudaGetLastError();
}

// Copies whole blocks (src -> dst pairs in `mapping`, a device array) in one layer's K and V
// caches; ids outside [0, num_blocks) are skipped (no host-side validation, no sync).
inline cudaError_t copy_blocks_launch(void* key_cache, void* value_cache,  // [num_blocks, block_bytes] bytes each
                                      int64_t block_bytes, const int64_t* mapping,  // [num_pairs, 2]
                                      int64_t num_pairs, int64_t num_blocks, cudaStream_t stream) {
  using namespace attn_detail;
  if (num_pairs <= 0 || block_bytes <= 0) return cudaSuccess;
  if (num_pairs > 0x7fffffff) return cudaErrorInvalidValue;
  const bool vec = block_bytes % 16 == 0 && aligned16(key_cache) && aligned16(value_cache);
  const dim3 grid(unsigned(num_pairs), 2);
  char* k = static_cast<char*>(key_cache);
  char* v = static_cast<char*>(value_cache);
  if (vec) copy_blocks_kernel<true><<<grid, 256, 0, stream>>>(k, v, block_bytes, mapping, num_blocks);
  else copy_blocks_kernel<false><<<grid, 256, 0, stream>>>(k, v, block_bytes, mapping, num_blocks);
  return cudaGetLastError();
}

// Head dims paged_attention has kernels for (others: cudaErrorInvalidValue).
DK_HD constexpr bool paged_attention_head_dim_ok(int d) { return d == 64 || d == 128 || d == 256; }

// The decode kernels (batches of one new token per sequence): the SIMT kernel above without / with its
// prefetch, and the tensor-core one of decode_tc.cuh (half / bf16 queries, head_dim 64 or 128; the SIMT
// prefetch kernel otherwise). bench_attention times each; paged_attention takes the SIMT prefetch or the
// tensor-core one at run time.
enum class DecodeKernel : int { kSimt = 0, kSimtPrefetch = 1, kTensorCore = 2 };

// Causal paged attention of every token over its sequence's cache (see the header comment).
// key_cache/value_cache must be 16-byte aligned (cudaErrorInvalidValue otherwise).
// C: T, or fp8_e4m3_t (dequantized with sc's scales). DK: the decode kernel (see DecodeKernel).
template <class T, class C, DecodeKernel DK>
cudaError_t paged_attention_variant(T* out,             // [num_tokens, Hq, D] contiguous
                            float* lse,         // [num_tokens, Hq] or null
                            const T* query,     // [num_tokens, Hq, D], token stride q_stride
                            int64_t q_stride,
                            const C* key_cache,    // [num_blocks, Hk, block_size, D]
                            const C* value_cache,  // [num_blocks, Hk, block_size, D]
                            const int32_t* block_tables,  // [num_seqs, max_blocks]
                            int max_blocks,
                            const int32_t* seq_lens,         // [num_seqs]
                            const int32_t* query_start_loc,  // [num_seqs + 1]
                            int num_seqs, int64_t num_tokens, int num_q_heads, int64_t num_blocks, PagedLayout L,
                            float scale, KVScales sc,
                            int window,          // sliding window: keys per token (0: all, causal)
                            int num_splits,      // paged_attention_num_splits(...) (1: no split)
                            float* workspace,    // paged_attention_workspace_floats(...) floats, or null if 1
                            cudaStream_t stream,
                            bool wgmma_prefill = false) {  // prefill batches: paged_prefill's wgmma kernel
  using namespace attn_detail;
  if (num_tokens <= 0) return cudaSuccess;
  if (num_splits < 1 || num_splits > kMaxSplits || (num_splits > 1 && workspace == nullptr))
    return cudaErrorInvalidValue;
  if (!paged_attention_head_dim_ok(L.head_dim) || L.num_kv_heads <= 0 || L.block_size <= 0 ||
      num_q_heads % L.num_kv_heads != 0 || num_q_heads == 0 || num_tokens > 0x7fffffff ||
      L.num_kv_heads > 65535 || !aligned16(key_cache) || !aligned16(value_cache) || window < 0)
    return cudaErrorInvalidValue;
  if (paged_attention_uses_prefill_kernel(kIsMmaType<T>, L.head_dim, num_tokens, num_seqs))
    return paged_prefill<T, C>(out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens,
                               query_start_loc, num_seqs, num_tokens, num_q_heads, num_blocks, L, scale, sc, window,
                               stream, 0, wgmma_prefill);
  const int group = num_q_heads / L.num_kv_heads;
  const int64_t rows = num_tokens * num_q_heads;
  float* part_out = workspace;
  float* part_lse = num_splits > 1 ? workspace + int64_t(num_splits) * rows * L.head_dim : nullptr;
  if constexpr (DK == DecodeKernel::kTensorCore && kIsMmaType<T>) {
    // (32-bit key and row numbers in the kernel: larger tables / caches take the SIMT kernel)
    if ((L.head_dim == 64 || L.head_dim == 128) && int64_t(max_blocks) * L.block_size <= 0x7fffffff &&
        num_blocks * L.num_kv_heads * L.block_size <= 0x7fffffff) {
      const int chunks = int(ceil_div(group, kDtRows));
      const dim3 grid(unsigned(num_tokens), unsigned(L.num_kv_heads), unsigned(chunks * num_splits));
#define DK_DECODE_TC_LAUNCH(D)                                                                                   \
  {                                                                                                            \
    const cudaError_t e = paged_decode_tc_prepare<T, C, D>();                                                  \
    if (e != cudaSuccess) return e;                                                                            \
    paged_decode_tc_kernel<T, C, D><<<grid, kDtThreads, decode_tc_smem_bytes<C, D>(), stream>>>(              \
        out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens, query_start_loc, \
        num_seqs, num_q_heads, num_blocks, L, scale, sc, window, num_splits, part_out, part_lse);               \
  }
      if (L.head_dim == 64) DK_DECODE_TC_LAUNCH(64)
      else DK_DECODE_TC_LAUNCH(128)
#undef DK_DECODE_TC_LAUNCH
      return paged_attention_merge_launch<T>(out, lse, part_out, part_lse, num_splits, rows, L.head_dim, stream);
    }
  }
  constexpr bool PF = DK != DecodeKernel::kSimt;
  // fp32 queries need more registers per head (fp8 conversions; fp32 K/V rows of head_dim 256 with the
  // prefetched ones): <= 4 heads per CTA there, so that no variant spills (checked in CI by
  // tools/cuda_check.py). fp32 is the tests' dtype, not a serving one.
  constexpr int kMaxHpc = std::is_same_v<T, float> ? 4 : kMaxHeadsPerCta;
  const int chunks = int(ceil_div(group, kMaxHpc));
  const int hpc = int(ceil_div(group, chunks));  // balanced chunks of <= kMaxHpc heads
  const dim3 grid(unsigned(num_tokens), unsigned(L.num_kv_heads), unsigned(chunks * num_splits));
#define DK_PAGED_LAUNCH(D, H)                                                                                    \
  paged_attention_kernel<T, C, D, H, PF><<<grid, kAttnThreads, 0, stream>>>(                                 \
      out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens, query_start_loc,   \
      num_seqs, num_q_heads, hpc, num_blocks, L, scale, sc, window, num_splits, part_out, part_lse)
#define DK_PAGED_HEADS(D)                   \
  if (hpc <= 1) DK_PAGED_LAUNCH(D, 1);      \
  else if (hpc <= 2) DK_PAGED_LAUNCH(D, 2); \
  else if (hpc <= 4) DK_PAGED_LAUNCH(D, 4); \
  else if constexpr (kMaxHpc >= 8) DK_PAGED_LAUNCH(D, 8);
  switch (L.head_dim) {
    case 64: DK_PAGED_HEADS(64) break;
    case 128: DK_PAGED_HEADS(128) break;
    default: DK_PAGED_HEADS(256) break;
  }
#undef DK_PAGED_HEADS
#undef DK_PAGED_LAUNCH
  return paged_attention_merge_launch<T>(out, lse, part_out, part_lse, num_splits, rows, L.head_dim, stream);
}

// paged_attention_variant with the decode kernel chosen at run time: tensor_core_decode -> the tensor-core
// kernel where it applies (DecodeKernel::kTensorCore), else the SIMT prefetch one; wgmma_prefill -> prefill
// batches on the wgmma variant of the prefill kernel (else mma.sync).
template <class T, class C>
cudaError_t paged_attention(T* out, float* lse, const T* query, int64_t q_stride, const C* key_cache,
                            const C* value_cache, const int32_t* block_tables, int max_blocks, const int32_t* seq_lens,
                            const int32_t* query_start_loc, int num_seqs, int64_t num_tokens, int num_q_heads,
                            int64_t num_blocks, PagedLayout L, float scale, KVScales sc, int window, int num_splits,
                            float* workspace, cudaStream_t stream, bool tensor_core_decode,
                            bool wgmma_prefill = false) {
  if (tensor_core_decode)
    return paged_attention_variant<T, C, DecodeKernel::kTensorCore>(
        out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens, query_start_loc,
        num_seqs, num_tokens, num_q_heads, num_blocks, L, scale, sc, window, num_splits, workspace, stream,
        wgmma_prefill);
  return paged_attention_variant<T, C, DecodeKernel::kSimtPrefetch>(
      out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens, query_start_loc,
      num_seqs, num_tokens, num_q_heads, num_blocks, L, scale, sc, window, num_splits, workspace, stream,
      wgmma_prefill);
}

}  // namespace dk::cuda
