// CPU kernels for the paged KV cache: reshape_and_cache and paged_attention (torch-free).
// Parallel over (sequence, KV head, query tile); every query head of a GQA group is
// processed together so each K/V row is converted and read once per tile. With AVX-512 (or, without
// it, AVX2 + FMA + F16C) and head_dim 64/128/256 the cache is read in place by attend_rows
// (cpu_avx512.h / cpu_avx2.h: DK_ATTN_VEC); otherwise each block is converted to fp32 and the
// scalar attend_block runs.
#pragma once
#include <algorithm>
#include <array>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cstring>
#include <vector>

#include "decodekit/attention/common.h"
#include "decodekit/attention/cpu_avx2.h"
#include "decodekit/attention/cpu_avx512.h"
#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"

#if defined(__AVX512F__) || defined(DK_ATTN_AVX2)
#define DK_ATTN_VEC 1
#endif

namespace dk::cpu {

// exp(x) for x <= 0 as straight-line float code the compiler vectorizes (libm's expf does
// not vectorize here). Range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6
// polynomial: relative error < 2e-7 (a few ulp), far below the bf16/fp16 output rounding.
// Inputs below -87 return ~0 (those weights are < 1e-37 of the row maximum's).
inline float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2 (ln2 split hi/lo)
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (int32_t(n) + 127) << 23;
  float scale;
  memcpy(&scale, &e, 4);
  return p * scale;
}

// n cache elements as fp32 (fp8: by Chunk32's conversion, the tail through a 256-entry table
// built from fp8_e4m3_to_float).
template <class C>
inline void cache_row_to_float(const C* src, float* dst, int n) {
  if constexpr (kIsFp8<C>) {
    static const auto lut = [] {
      std::array<float, 256> t{};
      for (int i = 0; i < 256; ++i) t[size_t(i)] = fp8_e4m3_to_float(uint8_t(i));
      return t;
    }();
    int j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    // the vector kernel's conversion (Chunk32: 2^-8 times the value), times 256: exact
    for (; j + 16 <= n; j += 16)
      _mm512_storeu_ps(dst + j, _mm512_mul_ps(Chunk32<fp8_e4m3_t>::load16(src + j), _mm512_set1_ps(kFp8ChunkScale)));
#elif defined(DK_ATTN_AVX2)
    for (; j + 8 <= n; j += 8)
      _mm256_storeu_ps(dst + j, _mm256_mul_ps(Chunk16<fp8_e4m3_t>::load8(src + j), _mm256_set1_ps(kFp8ChunkScale)));
#endif
    for (; j < n; ++j) dst[j] = lut[src[j].bits];
  } else {
    int j = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<C, bf16_t>) {  // bf16 -> fp32: the bits shifted up by 16
      for (; j + 16 <= n; j += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j));
        _mm512_storeu_ps(dst + j, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
    } else if constexpr (std::is_same_v<C, half_t>) {  // fp16 -> fp32: exact hardware conversion
      for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(dst + j, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j))));
    }
#elif defined(DK_ATTN_AVX2)
    if constexpr (!std::is_same_v<C, float>)
      for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, load8(src + j));
#endif
    for (; j < n; ++j) dst[j] = to_float(src[j]);
  }
}

// T: the activations' storage type; C: the cache's (T; fp8_e4m3_t: x / scale quantized; or for float
// activations bf16_t / half_t: each element rounded to nearest even).
template <class T, class C = T>
void reshape_and_cache(const T* key,              // [T, Hk, D], token stride k_stride
                       const T* value,            // [T, Hk, D], token stride v_stride
                       int64_t k_stride, int64_t v_stride,
                       C* key_cache, C* value_cache,  // [num_blocks, Hk, block_size, D]
                       const int64_t* slot_mapping,   // [T], < 0 = skip
                       int64_t num_tokens, PagedLayout L, KVScales sc = {}) {
  const int D = L.head_dim;
  DK_OMP_PARALLEL_FOR_IF(num_tokens * L.num_kv_heads * D >= kParallelGrain)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    for (int h = 0; h < L.num_kv_heads; ++h) {
      const int64_t dst = L.slot_row(slot, h);
      const T* k = key + t * k_stride + int64_t(h) * D;
      const T* v = value + t * v_stride + int64_t(h) * D;
      if constexpr (kIsFp8<C>) {
        const float ks = sc.key(h), vs = sc.value(h);
        for (int d = 0; d < D; ++d) {
          key_cache[dst + d].bits = quantize_fp8_e4m3(to_float(k[d]), ks);
          value_cache[dst + d].bits = quantize_fp8_e4m3(to_float(v[d]), vs);
        }
      } else if constexpr (std::is_same_v<T, C>) {
        std::copy_n(k, D, key_cache + dst);
        std::copy_n(v, D, value_cache + dst);
      } else {
        for (int d = 0; d < D; ++d) {
          key_cache[dst + d] = from_float<C>(to_float(k[d]));
          value_cache[dst + d] = from_float<C>(to_float(v[d]));
        }
      }
    }
  }
}

// copy_blocks: for each pair i, block mapping[2i] -> block mapping[2i + 1] of one cache
// (block_bytes bytes per block; the caller loops over layers and K/V). Pairs are applied
// in parallel: destinations must be distinct and not also sources (the engine's copy-on-write
// pairs are: a fresh block each).
inline void copy_blocks(char* cache,              // [num_blocks, block_bytes] bytes
                        int64_t block_bytes,
                        const int64_t* mapping,   // [num_pairs, 2] (src, dst)
                        int64_t num_pairs) {
  DK_OMP_PARALLEL_FOR_IF(num_pairs * block_bytes >= 4 * kParallelGrain)
  for (int64_t i = 0; i < num_pairs; ++i)
    std::memcpy(cache + mapping[2 * i + 1] * block_bytes, cache + mapping[2 * i] * block_bytes, size_t(block_bytes));
}

// The online-softmax step of the scalar attend_block: s[0..valid) holds the block's
// scores (max mx); turns them into exp(s - m) with the updated running max, folds their sum
// into sm and returns the factor the accumulator must be scaled by.
inline float softmax_block(float* s, int valid, float mx, OnlineSoftmax& sm) {
  const float corr = sm.rescale(mx);
  const float m = sm.m;
  float lsum = 0.f;
#pragma omp simd reduction(+ : lsum)
  for (int j = 0; j < valid; ++j) {
    s[j] = exp_nonpos(s[j] - m);
    lsum += s[j];
  }
  sm.add(lsum);
  return corr;
}

// One query row against `valid` (<= 16 typically) keys of a converted block: scores
// s[j] = q . k_j (q pre-scaled), the online-softmax update of sm, and acc = acc * corr +
// sum_j p_j v_j. kf, vf: [valid, D] fp32 rows; s: scratch of >= valid floats.
inline void attend_block(const float* q, const float* kf, const float* vf, int valid, int D, OnlineSoftmax& sm,
                         float* acc, float* s) {
  float mx = -INFINITY;
  for (int j = 0; j < valid; ++j) {
    const float* kr = kf + size_t(j) * D;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < D; ++d) dot += q[d] * kr[d];
    s[j] = dot;
    mx = std::max(mx, dot);
  }
  const float corr = softmax_block(s, valid, mx, sm);
#pragma omp simd
  for (int d = 0; d < D; ++d) acc[d] *= corr;
  for (int j = 0; j < valid; ++j) {
    const float p = s[j];
    const float* vr = vf + size_t(j) * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] += p * vr[d];
  }
}

struct PagedAttentionParams {
  int64_t num_tokens;      // T: all sequences' new tokens
  int num_seqs;            // S
  int num_q_heads;         // Hq (a multiple of Hk)
  int max_blocks;          // block_tables row length
  int64_t q_stride;        // token stride of query (head stride = head_dim)
  float scale;             // softmax scale
  PagedLayout L;
  int64_t window = 0;      // sliding window (window_first_key): > 0 keys per query, 0 = all (causal)
};

// One work item: sequence s, KV head h, new-token rows [t0, t1) of that sequence.
struct AttnWork { int s, h; int64_t t0, t1; };

// T: query/out storage type; C: the cache's (T; fp8_e4m3_t read as float(q) * scale: k_scale is folded
// into the pre-scaled query, v_scale into the final normalisation; or for float queries bf16_t / half_t,
// read by the same vector kernel as a bf16 / fp16 model's cache).
template <class T, class C = T>
void paged_attention(T* out,                      // [T, Hq, D] contiguous
                     float* lse,                  // [T, Hq] or null
                     const T* query,              // [T, Hq, D], token stride q_stride
                     const C* key_cache,          // [num_blocks, Hk, block_size, D]
                     const C* value_cache,        // [num_blocks, Hk, block_size, D]
                     const int32_t* block_tables, // [S, max_blocks]
                     const int32_t* seq_lens,     // [S]
                     const int32_t* query_start,  // [S + 1]
                     const PagedAttentionParams& P, KVScales kvs = {}) {
  const int D = P.L.head_dim, bs = P.L.block_size, Hk = P.L.num_kv_heads;
  const int group = P.num_q_heads / Hk;
  // Query tokens per work item: 16, halved (down to 2) while the items cannot give each thread two
  // (a speculative verification's 7 tokens x 3 KV heads on 2 threads: 3 items of 7 left one thread
  // idle half the time; 6 items of 4 / 3 tokens ran 38 -> 30 us per layer). A smaller tile re-reads
  // the sequence's KV once more per tile, from cache at these sizes.
  constexpr int64_t kTile = 16;
  int64_t tile = kTile;
#if defined(_OPENMP)
  const int64_t want = 2 * int64_t(omp_get_max_threads());
  auto num_items = [&](int64_t t) {
    int64_t c = 0;
    for (int s = 0; s < P.num_seqs; ++s) c += (query_start[s + 1] - query_start[s] + t - 1) / t * Hk;
    return c;
  };
  while (tile > 2 && num_items(tile) < want) tile = (tile + 1) / 2;
#endif
  // E: the element type the vector kernel reads -- the cache itself (fp8 read as 2^-8 times its
  // value, the 256 folded into the query and output scales), or, for fp8 without AVX-512 BW/VL,
  // an fp32 copy of each block (converted once per block, shared by all rows of the work item).
#if defined(DK_ATTN_VEC)
  constexpr bool kFp8Direct = kIsFp8<C> && kFp8Chunks;
  const bool vec = D == 64 || D == 128 || D == 256;  // attend_rows' head dims
#else
  constexpr bool kFp8Direct = false;
  const bool vec = false;
#endif
  using E [[maybe_unused]] = std::conditional_t<kIsFp8<C> && !kFp8Direct, float, C>;
#if defined(DK_ATTN_VEC)
  const float fp8_unit = kFp8Direct && vec ? kFp8ChunkScale : 1.0f;  // exact power of two
#else
  const float fp8_unit = 1.0f;
#endif
  const bool convert = !vec || (kIsFp8<C> && !kFp8Direct);  // blocks go through the fp32 copies kf / vf
  std::vector<AttnWork> work;
  for (int s = 0; s < P.num_seqs; ++s)
    for (int64_t t0 = query_start[s]; t0 < query_start[s + 1]; t0 += tile)
      for (int h = 0; h < Hk; ++h) work.push_back({s, h, t0, std::min<int64_t>(t0 + tile, query_start[s + 1])});
  int64_t total_keys = 0;
  for (int s = 0; s < P.num_seqs; ++s) total_keys += int64_t(seq_lens[s]) * (query_start[s + 1] - query_start[s]);

#pragma omp parallel if (total_keys * P.num_q_heads * D >= kParallelGrain)
  {
    const int max_rows = int(kTile) * group;
    std::vector<float> q(size_t(max_rows) * D), acc(size_t(max_rows) * D), qrow(static_cast<size_t>(D)),
        kf(convert ? size_t(bs) * D : 0), vf(convert ? size_t(bs) * D : 0), sc(size_t(max_rows) * bs);
    std::vector<OnlineSoftmax> sm(max_rows);
    std::vector<int64_t> first(max_rows), last(max_rows);
#pragma omp for schedule(dynamic, 1)
    for (size_t w = 0; w < work.size(); ++w) {
      const AttnWork W = work[w];
      const int64_t n = query_start[W.s + 1] - query_start[W.s];
      const int64_t ctx = seq_lens[W.s];
      const int rows = int(W.t1 - W.t0) * group;
      // Gather the tile's queries (all heads of the group), pre-scaled, in fp32 (chunk order
      // for the vector kernel).
      const float qscale = P.scale * kvs.key(W.h) * fp8_unit;
      for (int64_t t = W.t0; t < W.t1; ++t)
        for (int g = 0; g < group; ++g) {
          const int r = int(t - W.t0) * group + g;
          const T* src = query + t * P.q_stride + int64_t(W.h * group + g) * D;
          float* qr = &q[size_t(r) * D];
          for (int d = 0; d < D; ++d) qrow[size_t(d)] = to_float(src[d]) * qscale;
#if defined(DK_ATTN_VEC)
          if (vec) to_chunk_order<E>(qrow.data(), qr, D); else
#endif
          std::copy_n(qrow.data(), D, qr);
          last[r] = causal_last_key(ctx, n, t - query_start[W.s]);
          first[r] = window_first_key(last[r], P.window);
          sm[r].init();
        }
      std::fill(acc.begin(), acc.begin() + size_t(rows) * D, 0.f);
      const int64_t tile_last = last[rows - 1];
      const int32_t* table = block_tables + int64_t(W.s) * P.max_blocks;
      // keys of the rows' windows [first, last]: row 0's first key is the tile's smallest
      for (int64_t k0 = first[0] / bs * bs; k0 <= tile_last; k0 += bs) {
        const int nk = int(std::min<int64_t>(bs, tile_last + 1 - k0));
        const int64_t base = P.L.row(table[k0 / bs], W.h, 0);
        // The next block is a random page: start its loads now (the vector kernel spreads its
        // prefetches over the block's keys; the converting paths issue them up front).
        const bool has_next = k0 + bs <= tile_last;
        const int64_t next = has_next ? P.L.row(table[k0 / bs + 1], W.h, 0) : 0;
        const char* next_k = has_next ? reinterpret_cast<const char*>(key_cache + next) : nullptr;
        const char* next_v = has_next ? reinterpret_cast<const char*>(value_cache + next) : nullptr;
        if (convert) {
          if (has_next)
            for (int64_t off = 0; off < int64_t(bs) * D * int64_t(sizeof(C)); off += 64) {
              __builtin_prefetch(next_k + off);
              __builtin_prefetch(next_v + off);
            }
          next_k = next_v = nullptr;
          cache_row_to_float(key_cache + base, kf.data(), nk * D);
          cache_row_to_float(value_cache + base, vf.data(), nk * D);
        }
        // row r sees the block's keys [lo(r), lo(r) + valid(r)): causal mask and sliding window
        auto lo = [&](int r) { return int(std::max<int64_t>(first[r] - k0, 0)); };
        auto valid_keys = [&](int r) { return int(std::min<int64_t>(nk, last[r] + 1 - k0)) - lo(r); };
        if (!vec) {
          for (int r = 0; r < rows; ++r) {
            const int valid = valid_keys(r), o = lo(r);
            if (valid > 0)
              attend_block(&q[size_t(r) * D], kf.data() + size_t(o) * D, vf.data() + size_t(o) * D, valid, D, sm[r],
                           &acc[size_t(r) * D], &sc[size_t(r) * bs]);
          }
          continue;
        }
#if defined(DK_ATTN_VEC)
        const E* kb;
        const E* vb;
        if constexpr (kIsFp8<C> && !kFp8Direct) {
          kb = kf.data();
          vb = vf.data();
        } else {
          kb = key_cache + base;
          vb = value_cache + base;
        }
        // up to 4 consecutive rows that see the same keys (a decode token's GQA group) at once
        for (int r0 = 0; r0 < rows;) {
          const int valid = valid_keys(r0), o = lo(r0);
          int nr = 1;
          while (nr < 4 && r0 + nr < rows && valid_keys(r0 + nr) == valid && lo(r0 + nr) == o) ++nr;
          if (valid > 0) {
            attend_rows<E>(D, nr, &q[size_t(r0) * D], kb + size_t(o) * D, vb + size_t(o) * D, valid, &sm[r0],
                           &acc[size_t(r0) * D], &sc[size_t(r0) * bs], bs, next_k, next_v);
            next_k = next_v = nullptr;  // prefetched once per block
          }
          r0 += nr;
        }
#endif
      }
      for (int r = 0; r < rows; ++r) {
        const int64_t t = W.t0 + r / group;
        const int head = W.h * group + r % group;
        const float inv = kvs.value(W.h) * fp8_unit / sm[r].l;
        const float* ar = &acc[size_t(r) * D];
        T* o = out + (t * P.num_q_heads + head) * int64_t(D);
#if defined(DK_ATTN_VEC)
        if (vec) {
          for (int d = 0; d < D; ++d) o[d] = from_float<T>(from_chunk_order<E>(ar, d) * inv);
        } else
#endif
        {
          for (int d = 0; d < D; ++d) o[d] = from_float<T>(ar[d] * inv);
        }
        if (lse) lse[t * P.num_q_heads + head] = sm[r].lse();
      }
    }
  }
}

}  // namespace dk::cpu
