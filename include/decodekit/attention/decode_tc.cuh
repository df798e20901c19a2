// Tensor-core decode attention over the paged KV cache (torch-free): the decode batches of
// paged_attention (one new token per sequence) with mma.sync instead of per-lane dot products.
// Same semantics as paged_attention_kernel (paged.cuh), whose token lookup, split-KV ranges and
// partial-result format (merged by paged_attention_merge_kernel) it shares.
//
// Why: the SIMT decode kernel is bound by instructions, not bytes (H200, 2026-12-04: fp32 caches
// reached 1.6x the fraction of the copy bandwidth of bf16 ones with the same code, i.e. the same
// instructions per element; per 16-byte K/V access it spends ~40 instructions per query head on
// xor-shuffle dot products, exps and rescales). Here the query heads of a GQA group are the M rows
// of an m16n8k16 tile (heads past the group are zero rows), so a 16-key tile costs per warp
// D/16 x 2 HMMA for S = Q K^T, D/8 for O += P V, 2 ldmatrix per 16 x 16 block and the softmax of
// 8 scores per lane, whatever the group size: ~10x fewer instructions per KV byte.
//
// Work split: grid (token, KV head, head chunk x split) as the SIMT kernel, kDtRows = 16 query
// heads per chunk. The CTA's key range (the token's window, or its split's piece) is cut into
// tiles of kDtKeys = 16 keys; warp w takes tiles w, w + 4, ... with its own kDtStages-deep cp.async
// pipeline in dynamic shared memory (no CTA barrier in the loop), its own online softmax (base 2, per
// row over the row's 4 lanes) and accumulators; the 4 warps' (m, l, O) merge in shared memory at
// the end. Keys outside the range are masked to -inf; block ids outside the cache poison the
// token (NaN), like the other kernels.
// fp8 caches: the pipeline stages carry the raw e4m3 bytes (cp.async: half the bytes in flight, nothing
// waits in registers); when a tile is due, its warp widens it into one T tile in shared memory (16 values a
// lane a step: one 16-byte read, 8 hardware pair conversions e4m3x2 -> f16x2, bf16 through fp32, two 16-byte
// stores), then the same ldmatrix / mma code as for T caches. (Before: 8-byte register loads widened one
// element at a time on issue, ~1200 instructions a tile, and each tile's loads waited on at issue.)
// bf16 queries over an fp8 cache compute in fp16 (the mma type M): e4m3 -> fp16 is one conversion per pair
// where -> bf16 costs three more; the queries are scaled by a power of two per CTA (their largest |q| into
// [2^13, 2^14): no overflow, exact scaling) and rounded to fp16 (11 significant bits, more than bf16's 8),
// the scale undone on the scores; P in fp16 (finer than bf16); fp32 accumulators as before.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "decodekit/attention/common.h"
#include "decodekit/attention/prefill.cuh"
#include "decodekit/common/fp8.h"
#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"

namespace dk::cuda {
namespace attn_detail {

// The decode token t's sequence s (binary search over query_start_loc), its last visible key (-1: none,
// e.g. a token in no sequence) and whether the metadata is inconsistent (bad: NaN result).
struct DecodeToken {
  int s;
  int64_t last;
  bool bad;
};

DK_DEVICE DecodeToken decode_token(int64_t t, const int32_t* __restrict__ query_start_loc,
                                   const int32_t* __restrict__ seq_lens, int num_seqs, int max_blocks,
                                   int block_size) {
  DecodeToken r{0, -1, false};
  if (num_seqs > 0 && __ldg(query_start_loc) <= t) {
    int lo = 0, hi = num_seqs;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(query_start_loc + mid) <= t) lo = mid;
      else hi = mid;
    }
    r.s = lo;
    const int64_t start = __ldg(query_start_loc + lo), end = __ldg(query_start_loc + lo + 1);
    if (t < end) {
      const int64_t ctx = __ldg(seq_lens + lo);
      r.last = causal_last_key(ctx, end - start, t - start);
      // Metadata the CPU launcher rejects: no reads past the table row, NaN result.
      if (ctx < end - start || r.last >= int64_t(max_blocks) * block_size) {
        r.bad = true;
        r.last = -1;
      }
    }
  }
  return r;
}

// Split-KV: piece `split` of num_splits of the keys first .. last, in pieces of a multiple of `align` keys
// (an empty piece: begin > end).
DK_DEVICE void split_key_range(int64_t first, int64_t last, int split, int num_splits, int64_t align,
                               int64_t& begin, int64_t& end) {
  begin = first;
  end = last;
  if (num_splits > 1) {
    const int64_t per = ((last - first + 1 + num_splits - 1) / num_splits + align - 1) / align * align;
    begin = first + int64_t(split) * per;
    end = begin + per - 1 < last ? begin + per - 1 : last;
  }
}

// Element d of a decode kernel's result row `row` (token x query head; rows = tokens x query heads):
// out / lse directly, or split `split`'s partials (num_splits > 1) for paged_attention_merge_kernel.
template <class T>
DK_DEVICE void store_decode_result(T* out, float* lse, float* part_out, float* part_lse, int num_splits, int split,
                                   int64_t row, int64_t rows, int D, int d, float res, float lv) {
  if (num_splits > 1) {
    const int64_t prow = int64_t(split) * rows + row;
    part_out[prow * D + d] = res;
    if (d == 0) part_lse[prow] = lv;
  } else {
    out[row * D + d] = from_float<T>(res);
    if (lse != nullptr && d == 0) lse[row] = lv;
  }
}

constexpr int kDtWarps = 4;
constexpr int kDtThreads = kDtWarps * 32;
constexpr int kDtRows = 16;   // query heads per CTA: one m16 tile
constexpr int kDtKeys = 16;   // keys per warp tile: one k16 step of O += P V
constexpr int kDtStages = 2;  // cp.async stages per warp

template <int D>
struct DtShape {
  static constexpr int LD = D + 8;                // shared row stride in elements (+16 bytes: ldmatrix)
  static constexpr int KSTEPS = D / 16;           // k-steps of Q K^T
  static constexpr int ON = D / 8;                // n8 tiles of O
  static constexpr int CPR = D / 8;               // 16-byte chunks per K/V row
  static constexpr int KPP = 32 / CPR;            // rows one warp-wide pass of chunks covers
  static constexpr int PASSES = kDtKeys / KPP;    // passes per tile (chunks per lane, K and V each)
  static constexpr int TILE = kDtKeys * LD;       // elements of one K (or V) tile
  static constexpr int CPR8 = D / 16;             // fp8 caches: 16-byte chunks per raw row (D bytes)
  static constexpr int KPP8 = 32 / CPR8;          // raw rows one pass covers
  static constexpr int PASSES8 = kDtKeys / KPP8;  // passes per raw tile
  static constexpr int RAW = kDtKeys * D;         // bytes of one raw K (or V) tile
  static_assert(D == 64 || D == 128, "the tensor-core decode kernel takes head_dim 64 or 128");
};

// T tiles (K and V) per warp: one for fp8 caches (widened from the raw stages when due), else the stages.
template <class C>
constexpr int dt_tile_stages() { return kIsFp8<C> ? 1 : kDtStages; }

// Dynamic shared memory of the kernel: the warps' K and V T tiles, fp8: their raw stages after them (the final
// merge reuses it).
template <class C, int D>
constexpr size_t decode_tc_smem_bytes() {
  constexpr size_t tiles = size_t(2) * kDtWarps * dt_tile_stages<C>() * DtShape<D>::TILE * 2;  // fp16 / bf16
  constexpr size_t raw = kIsFp8<C> ? size_t(2) * kDtWarps * kDtStages * DtShape<D>::RAW : 0;
  constexpr size_t merge = size_t(kDtWarps) * kDtRows * D * sizeof(float);
  return tiles + raw > merge ? tiles + raw : merge;
}

template <class T, class C, int D>
__global__ void __launch_bounds__(kDtThreads)
paged_decode_tc_kernel(T* out,                // [T, Hq, D] contiguous
                       float* lse,            // [T, Hq] or null
                       const T* query,        // [T, Hq, D], token stride q_stride, head stride D
                       int64_t q_stride,
                       const C* __restrict__ key_cache,    // [num_blocks, Hk, block_size, D]
                       const C* __restrict__ value_cache,  // [num_blocks, Hk, block_size, D]
                       const int32_t* __restrict__ block_tables,     // [S, max_blocks]
                       int max_blocks,
                       const int32_t* __restrict__ seq_lens,         // [S]
                       const int32_t* __restrict__ query_start_loc,  // [S + 1]
                       int num_seqs, int num_q_heads, int64_t num_blocks, PagedLayout L, float scale, KVScales sc,
                       int window,            // sliding window (window_first_key; 0: none)
                       int num_splits,        // > 1: split-KV, this CTA's results go to part_out / part_lse
                       float* part_out,       // [num_splits, T, Hq, D] (split-KV only)
                       float* part_lse) {     // [num_splits, T, Hq] (split-KV only)
  using S = DtShape<D>;
  constexpr bool kF8 = kIsFp8<C>;
  using M = std::conditional_t<kF8, __half, T>;  // the tiles' and mma's type
  constexpr bool kRescaleQ = kF8 && !std::is_same_v<T, __half>;
  DK_DYNAMIC_SMEM(dsm);
  __shared__ float m_s[kDtWarps][kDtRows], l_s[kDtWarps][kDtRows];
  __shared__ float qmax_s[kDtWarps];
  __shared__ int bad_s;

  const int64_t t = blockIdx.x;
  const int kvh = blockIdx.y;
  const int group = num_q_heads / L.num_kv_heads;
  const int split = int(blockIdx.z) % num_splits;
  const int g0 = int(blockIdx.z) / num_splits * kDtRows;
  const int nh = group - g0 < kDtRows ? group - g0 : kDtRows;  // >= 1 (grid)
  const int head0 = kvh * group + g0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gl = lane >> 2, cl = 2 * (lane & 3);  // mma fragment row / column pair

  const DecodeToken tok = decode_token(t, query_start_loc, seq_lens, num_seqs, max_blocks, L.block_size);
  bool bad = tok.bad;
  int64_t k_begin, k_end;
  split_key_range(window_first_key(tok.last, window), tok.last, split, num_splits, int64_t(kDtKeys) * kDtWarps,
                  k_begin, k_end);
  const T* qrow = query + t * q_stride + int64_t(head0) * D;  // [nh, D]
  if constexpr (kRescaleQ) {  // the largest |q| of the CTA's heads (fmaxf skips NaN: a NaN q still reaches its scores)
    float mx = 0.f;
    for (int i = tid; i < nh * D; i += kDtThreads) mx = fmaxf(mx, fabsf(to_float(qrow[i])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) qmax_s[warp] = mx;
  }
  if (tid == 0) bad_s = 0;
  __syncthreads();  // (before any warp can flag it)

  // Q fragments (A operand: rows = heads g0 + gl and g0 + gl + 8, zero past nh), scaled as the scores
  // are (base 2) after the product. kRescaleQ: q * 2^qe in fp16, qe putting the largest |q| in [2^13, 2^14).
  float qmul = 1.f;
  if constexpr (kRescaleQ) {
    float mx = qmax_s[0];
#pragma unroll
    for (int w = 1; w < kDtWarps; ++w) mx = fmaxf(mx, qmax_s[w]);
    if (mx > 0.f && mx < INFINITY) {  // (0, inf, NaN: no rescale; inf / NaN reach the scores as with T)
      int ex;
      frexpf(mx, &ex);  // mx = f 2^ex, f in [0.5, 1)
      qmul = ldexpf(1.f, 14 - ex);
    }
  }
  uint32_t qa[S::KSTEPS][4];
  {
    const uint16_t* qb = reinterpret_cast<const uint16_t*>(qrow);
#pragma unroll
    for (int kk = 0; kk < S::KSTEPS; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = gl + (j & 1) * 8, d = kk * 16 + cl + (j >> 1) * 8;
        if constexpr (kRescaleQ)
          qa[kk][j] = r < nh ? pack2<M>(to_float(qrow[r * D + d]) * qmul, to_float(qrow[r * D + d + 1]) * qmul) : 0u;
        else
          qa[kk][j] = r < nh ? (uint32_t(qb[r * D + d]) | (uint32_t(qb[r * D + d + 1]) << 16)) : 0u;
      }
  }
  // log2(e); qmul: a power of two; applied inside the exponent (positive_score_scale)
  const float sscale = positive_score_scale(scale * sc.key(kvh) * 1.4426950408889634f / qmul, qa);

  constexpr int TS = dt_tile_stages<C>();
  M* k_st = reinterpret_cast<M*>(dsm) + size_t(warp) * TS * S::TILE;
  M* v_st = reinterpret_cast<M*>(dsm) + size_t(kDtWarps + warp) * TS * S::TILE;
  // fp8: this warp's raw stages [kDtStages][K, V][kDtKeys][D] bytes, after every warp's M tiles
  unsigned char* raw = dsm + size_t(2) * kDtWarps * TS * S::TILE * sizeof(M) + size_t(warp) * kDtStages * 2 * S::RAW;
  const int32_t* table = block_tables + int64_t(tok.s) * max_blocks;
  const int bs = L.block_size;
  const int crow = lane / S::CPR, c8 = (lane % S::CPR) * 8;  // this lane's row in a pass and chunk in it
  // Stages the K/V rows of keys kt0 .. kt0 + 15 into stage st (zeros past k_end; a block id outside the
  // cache flags the token). Lane l (and l + 16) looks up key kt0 + (l & 15)'s row once (32-bit: the
  // launcher caps the table's keys and the cache's rows at INT32_MAX); the chunk loop takes it by shuffle.
  auto issue = [&](int st, int64_t kt0) {
    int row = -1;  // (block * Hk + kvh) * bs + offset: rows of D elements
    if (kt0 + (lane & 15) <= k_end) {  // (>= k_begin: the tiles start there)
      const int k = int(kt0) + (lane & 15);
      const int b = k / bs;
      const int32_t id = __ldg(table + b);
      if (id >= 0 && id < num_blocks) row = (id * L.num_kv_heads + kvh) * bs + (k - b * bs);
      else bad = true;
    }
    if constexpr (kF8) {  // raw bytes, 16 (elements) a chunk
      unsigned char* rk = raw + st * 2 * S::RAW;
#pragma unroll
      for (int ps = 0; ps < S::PASSES8; ++ps) {
        const int key = ps * S::KPP8 + lane / S::CPR8, c16 = (lane % S::CPR8) * 16;
        const int r = __shfl_sync(0xffffffffu, row, key);
        const int64_t off = int64_t(r) * D + c16;
        cp_async16(rk + key * D + c16, r >= 0 ? key_cache + off : key_cache, r >= 0 ? 16 : 0);
        cp_async16(rk + S::RAW + key * D + c16, r >= 0 ? value_cache + off : value_cache, r >= 0 ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int ps = 0; ps < S::PASSES; ++ps) {
        const int key = ps * S::KPP + crow;
        const int r = __shfl_sync(0xffffffffu, row, key);
        const int64_t off = int64_t(r) * D + c8;
        stage_kv_chunk(k_st + st * S::TILE + key * S::LD + c8, v_st + st * S::TILE + key * S::LD + c8, key_cache,
                       value_cache, off, r >= 0);
      }
    }
  };

  float o[S::ON][4];
#pragma unroll
  for (int j = 0; j < S::ON; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
  float m2[2] = {-INFINITY, -INFINITY};  // running max of rows gl / gl + 8 (base-2 scores)
  float l[2] = {0.f, 0.f};                // this lane's part of their sums

  // this warp's tiles: kt = k_begin + 16 (warp + 4 i), i = 0 .. n - 1
  const int64_t span = k_end - k_begin + 1;
  const int64_t ntiles_cta = span > 0 ? (span + kDtKeys - 1) / kDtKeys : 0;
  const int n = ntiles_cta > warp ? int((ntiles_cta - warp + kDtWarps - 1) / kDtWarps) : 0;
  auto tile_start = [&](int i) { return k_begin + int64_t(kDtKeys) * (warp + int64_t(kDtWarps) * i); };
#pragma unroll
  for (int i = 0; i < kDtStages - 1; ++i) {
    if (i < n) issue(i, tile_start(i));
    cp_async_commit();
  }
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    const int st = i % kDtStages;
    if (i + kDtStages - 1 < n) issue((i + kDtStages - 1) % kDtStages, tile_start(i + kDtStages - 1));
    cp_async_commit();
    cp_async_wait<kDtStages - 1>();
    __syncwarp();
    if constexpr (kF8) {  // widen the raw tile into the T tile (read by the previous tile's mma: the loop's
                          // closing __syncwarp orders that)
      const unsigned char* rk = raw + st * 2 * S::RAW;
#pragma unroll
      for (int ps = 0; ps < S::PASSES8; ++ps) {
        const int key = ps * S::KPP8 + lane / S::CPR8, c16 = (lane % S::CPR8) * 16;
        fp8x16_widen<__half>(k_st + key * S::LD + c16, *reinterpret_cast<const uint4*>(rk + key * D + c16));
        fp8x16_widen<__half>(v_st + key * S::LD + c16, *reinterpret_cast<const uint4*>(rk + S::RAW + key * D + c16));
      }
      __syncwarp();
    }
    const int64_t kt0 = tile_start(i);
    const M* ks = k_st + (kF8 ? 0 : st) * S::TILE;
    const M* vs = v_st + (kF8 ? 0 : st) * S::TILE;

    // S = Q K^T: 16 heads x 16 keys (n-tiles 0 / 1: keys 0-7 / 8-15); ldmatrix matrices (keys 0-7, d lo),
    // (0-7, hi), (8-15, lo), (8-15, hi)
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < S::KSTEPS; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + ((lane >> 4) * 8 + (lane & 7)) * S::LD + kk * 16 + ((lane >> 3) & 1) * 8);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma_m16n8k16<M>(s[0], qa[kk], b0);
      mma_m16n8k16<M>(s[1], qa[kk], b1);
    }
    // scale, mask keys outside the range, online softmax (row gl: s[.][0..1], row gl + 8: s[.][2..3])
    float mx[2] = {-INFINITY, -INFINITY};
    const int64_t left = k_end - kt0;
    const int in_tile = left < kDtKeys ? int(left) : kDtKeys - 1;  // last key of the tile in range
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = j * 8 + cl + (e & 1) <= in_tile ? s[j][e] : -INFINITY;  // raw (>= k_begin: tiles start there)
        s[j][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float nm = fmaxf(m2[h], mx[h] == -INFINITY ? -INFINITY : mx[h] * sscale);  // finite: a key in range
      corr[h] = fast_exp2(m2[h] - nm);  // exp2(-inf) = 0 on the first tile
      m2[h] = nm;
      l[h] *= corr[h];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(fmaf(s[j][e], sscale, -m2[e >> 1]));  // masked: exp2(-inf) = 0
        s[j][e] = p;
        l[e >> 1] += p;
      }
    if (corr[0] != 1.f || corr[1] != 1.f) {  // (lanes agree per row; skipped once the maxima settle)
#pragma unroll
      for (int j = 0; j < S::ON; ++j) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
      }
    }
    // O += P V (A: P rounded to T, the C layout of the two n-tiles; B: V rows by transposed ldmatrix,
    // matrices (keys 0-7, d-tile j), (8-15, j), (0-7, j + 1), (8-15, j + 1))
    const uint32_t pa[4] = {pack2<M>(s[0][0], s[0][1]), pack2<M>(s[0][2], s[0][3]), pack2<M>(s[1][0], s[1][1]),
                            pack2<M>(s[1][2], s[1][3])};
#pragma unroll
    for (int j = 0; j < S::ON; j += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * S::LD + (j + (lane >> 4)) * 8);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma_m16n8k16<M>(o[j], pa, b0);
      mma_m16n8k16<M>(o[j + 1], pa, b1);
    }
    __syncwarp();  // this stage is refilled by a later issue
  }
  cp_async_wait<0>();

  // the warps' (m, l, O) to shared memory (over the stages: every warp is past its loop), then merged
  // per (head, d)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  if (bad) bad_s = 1;
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(dsm);  // [kDtWarps][kDtRows][D]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = gl + 8 * h;
    if ((lane & 3) == 0) {
      m_s[warp][r] = m2[h];
      l_s[warp][r] = l[h];
    }
#pragma unroll
    for (int j = 0; j < S::ON; ++j)
      *reinterpret_cast<float2*>(&o_s[(warp * kDtRows + r) * D + j * 8 + cl]) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
  }
  __syncthreads();
  const bool poisoned = bad_s != 0;
  const float vscale = sc.value(kvh);
  for (int i = tid; i < nh * D; i += kDtThreads) {
    const int r = i / D, d = i - r * D;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDtWarps; ++w) m = fmaxf(m, m_s[w][r]);
    float sum = 0.f, acc = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDtWarps; ++w) {
        const float c = exp2f(m_s[w][r] - m);  // a warp without keys: 0
        sum += l_s[w][r] * c;
        acc += o_s[(w * kDtRows + r) * D + d] * c;
      }
    }
    float res, lv;
    if (poisoned) {
      res = lv = NAN;
    } else if (sum > 0.f) {
      res = acc * (vscale / sum);
      lv = (m + log2f(sum)) * 0.6931471805599453f;
    } else {  // no key (token in no sequence, or an empty split piece)
      res = 0.f;
      lv = -INFINITY;
    }
    store_decode_result(out, lse, part_out, part_lse, num_splits, split, t * num_q_heads + head0 + r,
                        int64_t(gridDim.x) * num_q_heads, D, d, res, lv);
  }
}

}  // namespace attn_detail

// Opts the kernel into its dynamic shared memory (above 48 KB for head_dim 128), once per device.
template <class T, class C, int D>
cudaError_t paged_decode_tc_prepare() {
  static std::atomic<uint64_t> done{0};
  return attn_detail::dynamic_smem_once(reinterpret_cast<const void*>(&attn_detail::paged_decode_tc_kernel<T, C, D>),
                                        attn_detail::decode_tc_smem_bytes<C, D>(), done);
}

}  // namespace dk::cuda
