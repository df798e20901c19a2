// CPU kernels for the paged KV cache: reshape_and_cache and paged_attention (torch-free).
// Parallel over (sequence, KV head, query tile); every query head of a GQA group is
// processed together so each K/V row is converted and read once per tile.
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
#include "decodekit/common/dtype.h"
#include "decodekit/common/fp8.h"

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

// n cache elements as fp32 (fp8: through a 256-entry table built from fp8_e4m3_to_float).
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
    // e4m3 -> fp16 bits (sign to bit 15, exponent and mantissa to bits 7..13: an fp16 with 2^8
    // too small a scale, subnormals included), hardware fp16 -> fp32, times 256 (exact);
    // the NaN code S.1111.111 is patched in. Equal to fp8_e4m3_to_float for every code.
    const __m256i m7f = _mm256_set1_epi16(0x7f), m80 = _mm256_set1_epi16(0x80);
    for (; j + 16 <= n; j += 16) {
      const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j)));
      const __m256i em = _mm256_and_si256(w, m7f);
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, m80), 8), _mm256_slli_epi16(em, 7));
      __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
      f = _mm512_mask_mov_ps(f, _mm256_cmpeq_epi16_mask(em, m7f), _mm512_set1_ps(NAN));
      _mm512_storeu_ps(dst + j, f);
    }
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
#endif
    for (; j < n; ++j) dst[j] = to_float(src[j]);
  }
}

// T: the activations' storage type; C: the cache's (T, or fp8_e4m3_t: x / scale quantized).
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
      } else {
        std::copy_n(k, D, key_cache + dst);
        std::copy_n(v, D, value_cache + dst);
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

// The online-softmax step shared by both attend_block versions: s[0..valid) holds the block's
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

#if defined(__AVX512F__)
// out[j] = sum of v[j]'s 16 lanes, for 16 vectors at once (45 instructions instead of 16
// horizontal reductions): pairwise unpack+add at 32 and 64 bits, then across 128-bit lanes.
inline __m512 hsum16(const __m512 (&v)[16]) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [v2i(0+2), v2i+1(0+2), v2i(1+3), v2i+1(1+3)]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: the lane sums of v4k .. v4k+3
    const __m512d x = _mm512_castps_pd(a[2 * k]), y = _mm512_castps_pd(a[2 * k + 1]);
    b[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 d01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 d23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d01, d23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(d01, d23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp_nonpos on 16 lanes (the same range reduction and polynomial, with FMAs).
inline __m512 exp_nonpos16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.3981999507e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// softmax_block for up to 16 scores in one vector (the scalar loop's exp did not vectorize
// for a run-time count and dominated the decode kernel).
inline float softmax_block16(float* s, int valid, float mx, OnlineSoftmax& sm) {
  const float corr = sm.rescale(mx);
  const __mmask16 k = valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
  const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s), _mm512_set1_ps(sm.m));
  const __m512 p = _mm512_maskz_mov_ps(k, exp_nonpos16(x));
  _mm512_mask_storeu_ps(s, k, p);
  sm.add(_mm512_reduce_add_ps(p));
  return corr;
}

// The rest of a block once its scores s[0..valid) (max mx) are known: the online-softmax update
// and acc = acc * corr + sum_j p_j v_j, the accumulator row in D / 16 zmm registers.
template <int D>
inline void attend_scores_avx512(const float* vf, int valid, float mx, OnlineSoftmax& sm, float* acc, float* s) {
  constexpr int NC = D / 16;
  const float corr = valid <= 16 ? softmax_block16(s, valid, mx, sm) : softmax_block(s, valid, mx, sm);
  __m512 a[NC];
  const __m512 cv = _mm512_set1_ps(corr);
  for (int c = 0; c < NC; ++c) a[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), cv);
  for (int j = 0; j < valid; ++j) {
    const __m512 p = _mm512_set1_ps(s[j]);
    const float* vr = vf + size_t(j) * D;
    for (int c = 0; c < NC; ++c) a[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * c), a[c]);
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

// attend_block for a compile-time head_dim D (a multiple of 16): q and the accumulator row
// stay in D / 16 zmm registers for the whole block (no reload/store per key).
template <int D>
inline void attend_block_avx512(const float* q, const float* kf, const float* vf, int valid, OnlineSoftmax& sm,
                                float* acc, float* s) {
  static_assert(D % 16 == 0, "D must be a multiple of 16");
  constexpr int NC = D / 16;
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  float mx = -INFINITY;
  if (valid == 16) {  // a full block: 16 dot products, reduced together by a transpose tree
    __m512 t[16];
    for (int j = 0; j < 16; ++j) {
      const float* kr = kf + size_t(j) * D;
      t[j] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
      for (int c = 1; c < NC; ++c) t[j] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), t[j]);
    }
    const __m512 sums = hsum16(t);  // sums[j] = sum of t[j]'s lanes
    _mm512_storeu_ps(s, sums);
    mx = _mm512_reduce_max_ps(sums);
  }
  for (int j = valid == 16 ? 16 : 0; j < valid; ++j) {
    const float* kr = kf + size_t(j) * D;
    __m512 t0 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    __m512 t1 = _mm512_mul_ps(qv[1], _mm512_loadu_ps(kr + 16));
    for (int c = 2; c < NC; c += 2) {
      t0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), t0);
      t1 = _mm512_fmadd_ps(qv[c + 1], _mm512_loadu_ps(kr + 16 * c + 16), t1);
    }
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
    s[j] = dot;
    mx = std::max(mx, dot);
  }
  attend_scores_avx512<D>(vf, valid, mx, sm, acc, s);
}

#if defined(__AVX512BF16__)
// attend_block_avx512 for a bf16 query and bf16 cache: the scores straight from the cache's bf16
// rows by vdpbf16ps (products of bf16 are exact in fp32; fp32 sums), times qscale afterwards --
// no fp32 copy of the block's keys. qb: the unscaled query row (D bf16).
template <int D>
inline void attend_block_bf16k(const bf16_t* qb, float qscale, const bf16_t* kb, const float* vf, int valid,
                               OnlineSoftmax& sm, float* acc, float* s) {
  static_assert(D % 32 == 0, "D must be a multiple of 32");
  constexpr int NC = D / 32;
  __m512bh qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(qb + 32 * c);
  const __m512 qs = _mm512_set1_ps(qscale);
  float mx = -INFINITY;
  int j = 0;
  if (valid == 16) {
    __m512 t[16];
    for (; j < 16; ++j) {
      const bf16_t* kr = kb + size_t(j) * D;
      t[j] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(kr));
      for (int c = 1; c < NC; ++c) t[j] = _mm512_dpbf16_ps(t[j], qv[c], (__m512bh)_mm512_loadu_si512(kr + 32 * c));
    }
    const __m512 sums = _mm512_mul_ps(hsum16(t), qs);
    _mm512_storeu_ps(s, sums);
    mx = _mm512_reduce_max_ps(sums);
  }
  for (; j < valid; ++j) {
    const bf16_t* kr = kb + size_t(j) * D;
    __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(kr));
    for (int c = 1; c < NC; ++c) t = _mm512_dpbf16_ps(t, qv[c], (__m512bh)_mm512_loadu_si512(kr + 32 * c));
    s[j] = _mm512_reduce_add_ps(t) * qscale;
    mx = std::max(mx, s[j]);
  }
  attend_scores_avx512<D>(vf, valid, mx, sm, acc, s);
}
#endif
#endif

struct PagedAttentionParams {
  int64_t num_tokens;      // T: all sequences' new tokens
  int num_seqs;            // S
  int num_q_heads;         // Hq (a multiple of Hk)
  int max_blocks;          // block_tables row length
  int64_t q_stride;        // token stride of query (head stride = head_dim)
  float scale;             // softmax scale
  PagedLayout L;
};

// One work item: sequence s, KV head h, new-token rows [t0, t1) of that sequence.
struct AttnWork { int s, h; int64_t t0, t1; };

// T: query/out storage type; C: the cache's (T, or fp8_e4m3_t read as float(q) * scale:
// k_scale is folded into the pre-scaled query, v_scale into the final normalisation).
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
  constexpr int64_t kTile = 16;  // query tokens per work item
  // bf16 query and cache: scores by vdpbf16ps from the cache's own rows (head_dim 64 / 128)
#if defined(__AVX512BF16__)
  constexpr bool kBf16Scores = std::is_same_v<T, bf16_t> && std::is_same_v<C, bf16_t>;
#else
  constexpr bool kBf16Scores = false;
#endif
  std::vector<AttnWork> work;
  for (int s = 0; s < P.num_seqs; ++s)
    for (int64_t t0 = query_start[s]; t0 < query_start[s + 1]; t0 += kTile)
      for (int h = 0; h < Hk; ++h) work.push_back({s, h, t0, std::min<int64_t>(t0 + kTile, query_start[s + 1])});
  int64_t total_keys = 0;
  for (int s = 0; s < P.num_seqs; ++s) total_keys += int64_t(seq_lens[s]) * (query_start[s + 1] - query_start[s]);

#pragma omp parallel if (total_keys * P.num_q_heads * D >= kParallelGrain)
  {
    const int max_rows = int(kTile) * group;
    std::vector<float> q(size_t(max_rows) * D), acc(size_t(max_rows) * D), kf(size_t(bs) * D), vf(size_t(bs) * D),
        sc(size_t(max_rows) * bs);
    std::vector<OnlineSoftmax> sm(max_rows);
    std::vector<int64_t> last(max_rows);
    std::vector<bf16_t> qb(kBf16Scores ? size_t(max_rows) * D : 0);  // unscaled bf16 query rows
#pragma omp for schedule(dynamic, 1)
    for (size_t w = 0; w < work.size(); ++w) {
      const AttnWork W = work[w];
      const int64_t n = query_start[W.s + 1] - query_start[W.s];
      const int64_t ctx = seq_lens[W.s];
      const int rows = int(W.t1 - W.t0) * group;
      // Gather the tile's queries (all heads of the group), pre-scaled, in fp32.
      const float qscale = P.scale * kvs.key(W.h);
      for (int64_t t = W.t0; t < W.t1; ++t)
        for (int g = 0; g < group; ++g) {
          const int r = int(t - W.t0) * group + g;
          const T* src = query + t * P.q_stride + int64_t(W.h * group + g) * D;
          for (int d = 0; d < D; ++d) q[size_t(r) * D + d] = to_float(src[d]) * qscale;
          if constexpr (kBf16Scores) std::copy_n(src, D, &qb[size_t(r) * D]);
          last[r] = causal_last_key(ctx, n, t - query_start[W.s]);
          sm[r].init();
        }
      std::fill(acc.begin(), acc.begin() + size_t(rows) * D, 0.f);
      const int64_t tile_last = last[rows - 1];
      const int32_t* table = block_tables + int64_t(W.s) * P.max_blocks;
      for (int64_t k0 = 0; k0 <= tile_last; k0 += bs) {
        const int nk = int(std::min<int64_t>(bs, tile_last + 1 - k0));
        const int64_t base = P.L.row(table[k0 / bs], W.h, 0);
        if (k0 + bs <= tile_last) {  // the next block is a random page: start its loads now
          const int64_t next = P.L.row(table[k0 / bs + 1], W.h, 0);
          const int64_t bytes = int64_t(bs) * D * int64_t(sizeof(C));
          const char* kn = reinterpret_cast<const char*>(key_cache + next);
          const char* vn = reinterpret_cast<const char*>(value_cache + next);
          for (int64_t off = 0; off < bytes; off += 64) {
            __builtin_prefetch(kn + off);
            __builtin_prefetch(vn + off);
          }
        }
        const bool bf16_scores = kBf16Scores && (D == 128 || D == 64);
        if (!bf16_scores) cache_row_to_float(key_cache + base, kf.data(), nk * D);
        cache_row_to_float(value_cache + base, vf.data(), nk * D);
        for (int r = 0; r < rows; ++r) {
          const int valid = int(std::min<int64_t>(nk, last[r] + 1 - k0));  // causal mask
          if (valid <= 0) continue;
          const float* qr = &q[size_t(r) * D];
          float* ar = &acc[size_t(r) * D];
          float* s = &sc[size_t(r) * bs];
#if defined(__AVX512BF16__)
          if constexpr (kBf16Scores) {
            const bf16_t* qbr = &qb[size_t(r) * D];
            const bf16_t* kb = reinterpret_cast<const bf16_t*>(key_cache + base);
            if (D == 128) { attend_block_bf16k<128>(qbr, qscale, kb, vf.data(), valid, sm[r], ar, s); continue; }
            if (D == 64) { attend_block_bf16k<64>(qbr, qscale, kb, vf.data(), valid, sm[r], ar, s); continue; }
          }
#endif
#if defined(__AVX512F__)
          if (D == 128) { attend_block_avx512<128>(qr, kf.data(), vf.data(), valid, sm[r], ar, s); continue; }
          if (D == 64) { attend_block_avx512<64>(qr, kf.data(), vf.data(), valid, sm[r], ar, s); continue; }
#endif
          attend_block(qr, kf.data(), vf.data(), valid, D, sm[r], ar, s);
        }
      }
      for (int r = 0; r < rows; ++r) {
        const int64_t t = W.t0 + r / group;
        const int head = W.h * group + r % group;
        const float inv = kvs.value(W.h) / sm[r].l;
        T* o = out + (t * P.num_q_heads + head) * int64_t(D);
        for (int d = 0; d < D; ++d) o[d] = from_float<T>(acc[size_t(r) * D + d] * inv);
        if (lse) lse[t * P.num_q_heads + head] = sm[r].lse();
      }
    }
  }
}

}  // namespace dk::cpu
