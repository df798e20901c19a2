// Tensor-core paged attention for prefill, chunked prefill and mixed batches (torch-free),
// in the style of FlashAttention-2 over the paged KV cache. Same semantics as
// paged_attention_kernel (paged.cuh) and the CPU kernel: causal windows from
// causal_last_key and window_first_key (sliding window), paged addressing from PagedLayout,
// out = softmax(q k^T * scale) v with fp32 softmax and accumulation, lse = natural-log sum of exp, the same treatment of bad
// metadata (NaN rows; no reads outside a tensor) and of tokens in no sequence (0, -inf).
//
// Work split:
//  - the rows of a sequence are its (new token, query head of the GQA group) pairs,
//    row = token * group + head_in_group; a CTA takes 16 W consecutive rows of one sequence and one
//    KV head (grid.y), so each K/V tile it loads serves all its query heads. W = 8 warps (128 rows)
//    when the sequences average more than 64 rows (long prefills: half the L2 -> SM bytes per FLOP of
//    64-row CTAs; at 400 TFLOP/s a 64-row CTA needs ~6 TB/s of L2 reads), else 4 (two CTAs an SM). Tiles are numbered sequence by sequence, the last
//    (longest, causal) tile of a sequence first so the short ones fill the tail; each CTA finds its
//    (sequence, tile) by a block-wide prefix sum over the sequences' tile counts (no host-side
//    metadata, so the launch stays CUDA-graph safe). CTAs past the last tile write the rows of
//    tokens that lie in no sequence.
//  - W warps, 16 rows each (a warp without rows skips the math). Q fragments stay in registers for
//    the whole loop; keys in tiles of BN = 64 staged in dynamic shared memory 3 deep (wgmma: 4) by
//    cp.async (LDGSTS, zero fill past the window): two tiles in flight during a tile's math and one
//    CTA barrier a tile. Warp w issues the loads of the tile's keys KPW w .. KPW w + KPW - 1 (KPW = 64 / W),
//    32 / KPW lanes a key, each of them looking the key's block id up (one table read and division a lane, no
//    shuffles) and loading its share of the key's 16-byte chunks.
//    fp8 caches: the stages carry the raw e4m3 bytes (half the bytes in flight); a due tile is
//    widened by the whole CTA into one of two T tiles (hardware pair conversion e4m3x2 -> f16x2;
//    bf16 through fp32, exact) behind a second barrier; the k scale is folded into the score scale,
//    the v scale into the final normalisation.
//  - S = Q K^T and O += P V with mma.sync m16n8k16 (HMMA, fp32 accumulators), fragments from
//    ldmatrix (x4; transposed for V); rows padded by 16 bytes so ldmatrix is conflict-free.
//    P is rounded to T for the second product (as FlashAttention does); the row sums l use the
//    fp32 P. Online softmax in base 2 per row (each row's 4 lanes reduce with xor shuffles).
//  - wgmma variant (G; DECODEKIT_PREFILL_ATTN=wgmma, sm_90a): the same CTA, loads and softmax, the two products by
//    warpgroup MMAs instead (common/wgmma.cuh): warps 4i .. 4i + 3 form warpgroup i over rows 64 i .. 64 i + 63;
//    S = Q K^T as D / 16 HGMMA.64x64x16 with Q's fragments from registers and K as the K-major B, O += P V as 4
//    HGMMA.64xDx16 with P from registers and V as the MN-major (transposed) B. The K/V tiles are 128-byte
//    swizzled in shared memory (TcShape::off, from a 1024-byte boundary; CuTe's Layout_K_SW128_Atom, checked
//    against CuTe by tools/wgmma_layout_check.cu) instead of padded, fenced to the async proxy before the
//    barrier that publishes them; S waits for its MMAs (wgmma.wait_group 0), O += P V stays in flight over the
//    next tile's barrier and load issue (retired by that tile's wait, before O is rescaled). No branch around the
//    MMAs and no accumulator written on a divergent path (ptxas would serialise them: C7520, refused by
//    tools/cuda_check.py), so a warpgroup without rows does the math too and O is rescaled every tile.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "decodekit/attention/common.h"
#include "decodekit/common/fp8.h"
#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"
#include "decodekit/common/wgmma.cuh"

namespace dk::cuda {
namespace attn_detail {

// cp.async stages of K/V tiles, loaded kTcAhead tiles ahead: the tile refilled at iteration it is it - 1's
// (mma.sync) or it - 2's (wgmma: tile it - 1's O += P V may still be reading its stage)
template <bool G> inline constexpr int kTcStages = G ? 4 : 3;
constexpr int kTcAhead = 2;

// W warps a CTA (8: 128 rows, long prefills; 4: 64 rows, short chunks and verification batches, two CTAs an SM);
// G: the products by wgmma (one or two warpgroups; K/V tiles 128-byte swizzled), else mma.sync (padded rows)
template <int D, int W, bool G = false>
struct TcShape {
  static constexpr int WARPS = W;
  static constexpr int THREADS = 32 * W;
  static constexpr int ROWS = 16 * W;                // (token, head) rows per CTA
  static constexpr int BN = 64;                      // keys per tile
  static constexpr int LD = G ? D : D + 8;           // mma.sync: shared row stride in elements (+16 bytes)
  static constexpr int KSTEPS = D / 16;              // k-steps of Q K^T
  static constexpr int SN = BN / 8;                  // n8 tiles of S
  static constexpr int ON = D / 8;                   // n8 tiles of O
  static constexpr int CPR = D / 8;                  // 16-byte (8-element) chunks per K/V row
  static constexpr int KPW = BN / W;                 // keys whose loads one warp issues per tile
  static constexpr int LPK = 32 / KPW;               // lanes that load one key's rows
  static constexpr int CPL = CPR / LPK;              // 16-byte chunks a lane loads of a K (and a V) row
  static constexpr int TILE = BN * LD;               // elements of one K (or V) T tile
  static constexpr int CPR8 = D / 16;                // fp8: 16-byte chunks per raw row (D bytes)
  static constexpr int CPL8 = CPR8 / LPK;            // fp8: chunks a lane loads of a raw row
  static constexpr int RAW = BN * D;                 // fp8: bytes of one raw K (or V) tile
  static_assert((D == 64 || D == 128) && SN % 2 == 0 && ON % 2 == 0, "head_dim 64 or 128");
  static_assert((W == 4 || W == 8) && KPW <= 32 && CPL >= 1 && CPL8 >= 1 && CPR % LPK == 0 && CPR8 % LPK == 0, "tile split");
  // Element offset of columns col .. col + 7 (col % 8 == 0) of key `key` in a K or V tile. wgmma: 64-column
  // slabs of BN keys x 128 bytes (SLAB elements apart), 8-key groups of 1024 bytes, each key's 16-byte chunks
  // XORed with key % 8 (CuTe's Layout_K_SW128_Atom for K as the K-major B of S = Q K^T, the same bytes read as
  // Layout_MN_SW128_Atom for V as the MN-major B of O = P V); mma.sync: padded rows.
  static constexpr int SLAB = BN * 64;
  DK_HD static int off(int key, int col) {
    if constexpr (G) return (col >> 6) * SLAB + (key >> 3) * 512 + (key & 7) * 64 + ((((col >> 3) & 7) ^ (key & 7)) << 3);
    else return key * LD + col;
  }
  // wgmma descriptors: k-step kk's first element in a tile, LBO and SBO (bytes). K (B of S = Q K^T, K-major): head-dim
  // columns 16 kk .., 8-key groups 1024 bytes apart (LBO unused: 1 unit); V (B of O += P V, MN-major): keys 16 kk ..
  // (two 8-key groups), 64-column slabs SLAB elements apart.
  DK_HD static int k_step_k(int kk) { return (kk >> 2) * SLAB + (kk & 3) * 16; }
  DK_HD static int k_step_v(int kk) { return kk * 1024; }
  static constexpr uint32_t K_LBO = 16, K_SBO = 1024, V_LBO = SLAB * 2, V_SBO = 1024;
};

// T tiles (K and V each) of the prefill kernel: the stages for a cache of T; for fp8, two widened tiles
// (tile i is widened while tile i - 1's may still be read).
template <class C, bool G>
constexpr int tc_tile_buffers() { return kIsFp8<C> ? 2 : kTcStages<G>; }

// Dynamic shared memory of paged_prefill_kernel<T, C, D, W, G> (T: 2-byte): its K/V T tiles, then (fp8) the raw
// stages; wgmma: 1024 bytes more, to start the tiles on a swizzle atom.
template <class C, int D, bool G = false>
constexpr size_t prefill_smem_bytes() {
  constexpr size_t tiles = size_t(2) * tc_tile_buffers<C, G>() * TcShape<D, 8, G>::TILE * 2;  // (tiles do not depend on W)
  constexpr size_t raw = kIsFp8<C> ? size_t(2) * kTcStages<G> * TcShape<D, 8, G>::RAW : 0;
  return tiles + raw + (G ? 1024 : 0);
}

// Stages 8 elements of a K row and of a V row (element offset off in the caches) into shared memory by
// cp.async (zeros when !ok). decode_tc.cuh's staging step for caches of T.
template <class T>
DK_DEVICE void stage_kv_chunk(T* kd, T* vd, const T* key_cache, const T* value_cache, int64_t off, bool ok) {
  cp_async16(kd, ok ? key_cache + off : key_cache, ok ? 16 : 0);
  cp_async16(vd, ok ? value_cache + off : value_cache, ok ? 16 : 0);
}

// 16 e4m3 values (byte i of q: element i) as T, elements 0..7 at lo and 8..15 at hi (16-byte aligned), exact
// (every e4m3 value is an fp16 and a bf16 value): the hardware pair conversion e4m3x2 -> f16x2, for bf16 then
// through fp32.
template <class T>
DK_DEVICE void fp8x16_widen(T* lo, T* hi, uint4 q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t pair = uint16_t(w[i >> 1] >> (16 * (i & 1)));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
    if constexpr (std::is_same_v<T, __half>) {
      o[i] = uint32_t(r.x) | uint32_t(r.y) << 16;
    } else {
      const float2 f = __half22float2(__half2(r));
      o[i] = pack2<T>(f.x, f.y);
    }
#else
    o[i] = pack2<T>(fp8_e4m3_to_float(uint8_t(pair)), fp8_e4m3_to_float(uint8_t(pair >> 8)));
#endif
  }
  *reinterpret_cast<uint4*>(lo) = make_uint4(o[0], o[1], o[2], o[3]);
  *reinterpret_cast<uint4*>(hi) = make_uint4(o[4], o[5], o[6], o[7]);
}
template <class T>
DK_DEVICE void fp8x16_widen(T* dst, uint4 q) { fp8x16_widen(dst, dst + 8, q); }

// 2^x by the MUFU unit alone (ex2.approx.ftz: relative error ~2^-22, results below 2^-126 flushed to 0 --
// softmax weights that small next to the row maximum's 1 add nothing to a float sum); exp2f would add a
// range test and two multiplies per call for the subnormal range.
DK_DEVICE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// The score scale of the tensor-core kernels, applied inside the exponent (p = 2^(s c - m), one FFMA a score,
// the row maxima taken over the raw scores): c = |sscale|, and for a negative sscale the Q fragments' signs
// are flipped instead (exact in fp16 / bf16). c = 0 becomes FLT_MIN (a masked -inf times 0 would be NaN;
// every finite score then weighs 2^0 = 1 as with 0).
template <int KSTEPS>
DK_DEVICE float positive_score_scale(float sscale, uint32_t (&qa)[KSTEPS][4]) {
  if (sscale < 0.f) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) qa[kk][j] ^= 0x80008000u;
    sscale = -sscale;
  }
  return sscale == 0.f ? 1.17549435e-38f : sscale;
}

// Grid size (x) that covers every tile and every token outside the sequences, for any
// query_start_loc with `rows` rows a CTA: sum_s ceil(n_s * group / rows) <= ceil(n * group / rows) + S, and
// the orphan tokens take ceil(T / 16) CTAs at most.
inline int64_t prefill_grid_x(int64_t num_tokens, int group, int num_seqs, int rows) {
  return (num_tokens * group + rows - 1) / rows + (num_tokens + 15) / 16 + num_seqs + 1;
}

template <class T, class C, int D, int W, bool G>
__global__ void __launch_bounds__(32 * W, W == 8 ? 1 : 2)  // 8 (or twice 4) warps an SM: up to 255 registers
paged_prefill_kernel(T* out,                // [T, Hq, D] contiguous
                     float* lse,            // [T, Hq] or null
                     const T* query,        // [T, Hq, D], token stride q_stride, head stride D
                     int64_t q_stride,
                     const C* __restrict__ key_cache,    // [num_blocks, Hk, block_size, D]
                     const C* __restrict__ value_cache,  // [num_blocks, Hk, block_size, D]
                     const int32_t* __restrict__ block_tables,     // [S, max_blocks]
                     int max_blocks,
                     const int32_t* __restrict__ seq_lens,         // [S]
                     const int32_t* __restrict__ query_start_loc,  // [S + 1]
                     int num_seqs, int64_t num_tokens, int num_q_heads, int64_t num_blocks, PagedLayout L,
                     float scale, KVScales sc,
                     int window) {          // sliding window (window_first_key; 0: none)
  using S = TcShape<D, W, G>;
  constexpr int BN = S::BN, LD = S::LD, kTcThreads = S::THREADS, kTcRows = S::ROWS;
  constexpr bool kF8 = kIsFp8<C>;
  DK_DYNAMIC_SMEM(dsm0);
  // (wgmma: the tiles from the next 1024-byte boundary of the shared window, the swizzle atom)
  unsigned char* const dsm = G ? dsm0 + ((1024u - (wgmma_smem_addr(dsm0) & 1023u)) & 1023u) : dsm0;
  T* const k_t = reinterpret_cast<T*>(dsm);                                // [buffers][TILE] (S::off)
  constexpr int ST = kTcStages<G>;
  T* const v_t = k_t + size_t(tc_tile_buffers<C, G>()) * S::TILE;            // [buffers][BN][LD]
  unsigned char* const raw = dsm + size_t(2) * tc_tile_buffers<C, G>() * S::TILE * sizeof(T);  // fp8: [stages][K, V][RAW]
  __shared__ int kbad_s[ST][BN];  // key's block id outside the cache
  __shared__ int64_t scan_s[kTcThreads];
  __shared__ int64_t seq_s, tile_s, total_s;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.y;
  const int group = num_q_heads / L.num_kv_heads;
  const int64_t bx = blockIdx.x;

  // ---- this CTA's (sequence, tile): prefix sum of the tiles per sequence, 128 at a time
  if (tid == 0) seq_s = -1;
  int64_t base = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += kTcThreads) {
    const int s = s0 + tid;
    int64_t tiles = 0;
    if (s < num_seqs) {
      const int64_t n = int64_t(__ldg(query_start_loc + s + 1)) - __ldg(query_start_loc + s);
      tiles = n > 0 ? (n * group + kTcRows - 1) / kTcRows : 0;
    }
    scan_s[tid] = tiles;
    __syncthreads();
    for (int off = 1; off < kTcThreads; off <<= 1) {
      const int64_t v = tid >= off ? scan_s[tid - off] : 0;
      __syncthreads();
      scan_s[tid] += v;
      __syncthreads();
    }
    const int64_t incl = base + scan_s[tid], excl = incl - tiles;
    if (tiles > 0 && excl <= bx && bx < incl) {
      seq_s = s;
      tile_s = tiles - 1 - (bx - excl);  // the sequence's last (longest) tile first
    }
    base += scan_s[kTcThreads - 1];
    __syncthreads();
  }
  if (tid == 0) total_s = base;
  __syncthreads();
  const int64_t seq = seq_s;

  if (seq < 0) {  // tokens in no sequence: out = 0, lse = -inf (for this KV head's query heads)
    const int64_t first = num_seqs > 0 ? __ldg(query_start_loc) : num_tokens;
    const int64_t after = num_seqs > 0 ? __ldg(query_start_loc + num_seqs) : num_tokens;
    const int64_t n_lo = first < 0 ? 0 : (first < num_tokens ? first : num_tokens);
    const int64_t a0 = after < n_lo ? n_lo : after;
    const int64_t n_orphan = n_lo + (num_tokens - (a0 < num_tokens ? a0 : num_tokens));
    const int64_t o0 = (bx - total_s) * 16;
    for (int64_t i = tid; i < 16 * int64_t(group) * D; i += kTcThreads) {
      const int64_t o = o0 + i / (int64_t(group) * D);
      if (o >= n_orphan) break;
      const int64_t t = o < n_lo ? o : a0 + (o - n_lo);
      const int r = int(i % (int64_t(group) * D)), g = r / D, d = r - g * D;
      const int64_t row = t * num_q_heads + kvh * group + g;
      out[row * D + d] = from_float<T>(0.f);
      if (lse != nullptr && d == 0) lse[row] = -INFINITY;
    }
    return;
  }

  // ---- the sequence and this thread's two rows (ra = g_lane, rb = g_lane + 8 of the warp's 16)
  const int64_t start = __ldg(query_start_loc + seq);
  const int64_t n_new = int64_t(__ldg(query_start_loc + seq + 1)) - start;
  const int64_t ctx = __ldg(seq_lens + seq);
  const int64_t max_keys = int64_t(max_blocks) * L.block_size;
  const int64_t row0 = tile_s * kTcRows, rows_total = n_new * group;
  const int64_t last_row = (row0 + kTcRows < rows_total ? row0 + kTcRows : rows_total) - 1;
  // last key of the CTA's last row, clamped to the table (rows past it are bad anyway)
  int64_t kmax64 = ctx >= n_new ? causal_last_key(ctx, n_new, last_row / group) : -1;
  if (kmax64 >= max_keys) kmax64 = max_keys - 1;
  const int kmax = int(kmax64);
  // first key of the CTA's first row (sliding window; 0 without): the tiles start at its tile
  const int kmin = ctx >= n_new ? int(window_first_key(causal_last_key(ctx, n_new, row0 / group), window)) : 0;

  const int gl = lane >> 2, cl = 2 * (lane & 3);
  // (32-bit: the launcher caps tokens and keys at INT32_MAX)
  int r_first[2];  // first key of row ra / rb (sliding window)
  int r_last[2];   // last key of row ra / rb (-1: none)
  bool r_bad[2];   // row of a sequence with inconsistent metadata (NaN)
  bool r_valid[2];
  int r_tok[2];    // token index (may lie outside [0, num_tokens) for bad query_start_loc: not written)
  int r_head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = row0 + warp * 16 + gl + 8 * h;
    r_valid[h] = r < rows_total;
    const int64_t tok = r / group;
    r_tok[h] = int(start + tok);
    r_head[h] = kvh * group + int(r - tok * group);
    const int64_t last = causal_last_key(ctx, n_new, tok);
    r_bad[h] = r_valid[h] && (ctx < n_new || last >= max_keys);
    r_last[h] = r_valid[h] && !r_bad[h] ? int(last) : -1;
    r_first[h] = int(window_first_key(last, window));
  }

  // ---- Q fragments (A operand, row-major 16 x D per warp); rows outside the tile are 0
  uint32_t qa[S::KSTEPS][4];
  {
    const uint16_t* qb = reinterpret_cast<const uint16_t*>(query);
#pragma unroll
    for (int kk = 0; kk < S::KSTEPS; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int h = j & 1, d = kk * 16 + cl + (j >> 1) * 8;
        uint32_t v = 0;
        if (r_valid[h] && r_tok[h] < num_tokens) {
          const uint16_t* p = qb + int64_t(r_tok[h]) * q_stride + int64_t(r_head[h]) * D + d;
          v = uint32_t(p[0]) | (uint32_t(p[1]) << 16);
        }
        qa[kk][j] = v;
      }
  }

  const int32_t* table = block_tables + seq * max_blocks;
  const int bs = L.block_size;
  // Stages the K/V rows of keys kt0 .. kt0 + BN - 1 into stage st (zeros outside [kmin, kmax] or for a bad
  // block id): warp w the keys KPW w .. KPW w + KPW - 1, LPK lanes a key, each looking the key's row up
  // itself (element offset, -1: none; the table reads of a key's lanes coincide) and loading the row's chunks
  // lane % LPK + LPK i (each pass i reads LPK adjacent chunks of every key's rows).
  // (The chunks' shared offsets are the same every tile; the sources lie LPK chunks apart: immediate offsets.
  // Power-of-two block sizes find a key's block by a shift, others by a division.)
  const int my_key = warp * S::KPW + lane / S::LPK, my_chunk = lane % S::LPK;
  int soff[kF8 ? 1 : S::CPL];
#pragma unroll
  for (int i = 0; i < (kF8 ? 1 : S::CPL); ++i) soff[i] = S::off(my_key, (my_chunk + S::LPK * i) * 8);
  int bs_shift = -1;
  if ((bs & (bs - 1)) == 0)
    for (bs_shift = 0; (1 << bs_shift) < bs; ++bs_shift) {}
  auto issue = [&](int st, int kt0) {
    int64_t row = -1;
    const int k = kt0 + my_key;
    bool badk = false;
    if (k >= kmin && k <= kmax) {
      const int b = bs_shift >= 0 ? k >> bs_shift : k / bs;
      const int32_t id = __ldg(table + b);
      if (id >= 0 && id < num_blocks) row = L.row(id, kvh, k - b * bs);
      else badk = true;
    }
    if (my_chunk == 0) kbad_s[st][my_key] = badk;
    const int nbytes = row >= 0 ? 16 : 0;  // (zero fill: the source must still be a valid address, not read)
    const int64_t src = (row >= 0 ? row : 0) + my_chunk * (kF8 ? 16 : 8);
    if constexpr (kF8) {  // raw bytes, 16 elements a chunk
      unsigned char* rk = raw + size_t(st) * 2 * S::RAW + my_key * D + my_chunk * 16;
#pragma unroll
      for (int i = 0; i < S::CPL8; ++i) {
        cp_async16(rk + S::LPK * 16 * i, key_cache + src + S::LPK * 16 * i, nbytes);
        cp_async16(rk + S::RAW + S::LPK * 16 * i, value_cache + src + S::LPK * 16 * i, nbytes);
      }
    } else {
      T* const kd = k_t + size_t(st) * S::TILE;
      T* const vd = v_t + size_t(st) * S::TILE;
#pragma unroll
      for (int i = 0; i < S::CPL; ++i) {
        cp_async16(kd + soff[i], key_cache + src + S::LPK * 8 * i, nbytes);
        cp_async16(vd + soff[i], value_cache + src + S::LPK * 8 * i, nbytes);
      }
    }
  };

  float o[S::ON][4];
#pragma unroll
  for (int j = 0; j < S::ON; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
  float m2[2] = {-INFINITY, -INFINITY};  // running max of the base-2 scores
  float l[2] = {0.f, 0.f};                // this lane's part of the row sums
  bool poison[2] = {false, false};
  const float sscale = positive_score_scale(scale * sc.key(kvh) * 1.4426950408889634f, qa);  // log2(e)

  // the keys every (valid, consistent) row of this warp sees: a tile inside [w_first, w_last] with no bad block
  // needs no mask (the causal diagonal, window edges and range ends are the only tiles that do)
  int w_first = -1, w_last = INT_MAX;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (r_valid[h] && !r_bad[h]) {
      w_first = r_first[h] > w_first ? r_first[h] : w_first;
      w_last = r_last[h] < w_last ? r_last[h] : w_last;
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int f = __shfl_xor_sync(0xffffffffu, w_first, o), l2 = __shfl_xor_sync(0xffffffffu, w_last, o);
    w_first = f > w_first ? f : w_first;
    w_last = l2 < w_last ? l2 : w_last;
  }
  // a warp whose 16 rows are all past the CTA's last row issues its loads and meets the barriers, no math
  // (mma.sync only: a wgmma warpgroup always does the math, see the loop). It and the tile bounds are shuffled
  // from lane 0: visibly warp-uniform, they stay in uniform registers (22 fewer instructions a tile in the wgmma
  // loop, 4 in the mma.sync one)
  const bool warp_rows = __shfl_sync(0xffffffffu, int(row0 + warp * 16 < rows_total), 0) != 0;

  const int kt_start = __shfl_sync(0xffffffffu, kmin / BN * BN, 0);
  const int ntiles = __shfl_sync(0xffffffffu, kmax >= kt_start ? (kmax - kt_start) / BN + 1 : 0, 0);
#pragma unroll
  for (int i = 0; i < kTcAhead; ++i) {
    if (i < ntiles) issue(i, kt_start + i * BN);
    cp_async_commit();
  }
#pragma unroll 1
  for (int it = 0; it < ntiles; ++it) {
    const int st = it % ST;
    const int kt0 = kt_start + it * BN;
    cp_async_wait<kTcAhead - 1>();  // tile it has landed (this thread's copies)
    if constexpr (G && !kF8) fence_proxy_async_smem();  // (wgmma reads them through the async proxy)
    __syncthreads();                 // ... every thread's; and every warp is done with the stage refilled next
    if (it + kTcAhead < ntiles) issue((it + kTcAhead) % ST, kt0 + kTcAhead * BN);
    cp_async_commit();
    const T* ks = k_t + size_t(kF8 ? it & 1 : st) * S::TILE;
    const T* vs = v_t + size_t(kF8 ? it & 1 : st) * S::TILE;
    if constexpr (kF8) {  // widen the raw stage into T tile it & 1 (last read by tile it - 2: ordered by the barrier)
      const unsigned char* rk = raw + size_t(st) * 2 * S::RAW;
      T* kw = k_t + size_t(it & 1) * S::TILE;
      T* vw = v_t + size_t(it & 1) * S::TILE;
      for (int i = tid; i < BN * S::CPR8; i += kTcThreads) {
        const int key = i / S::CPR8, c16 = (i - key * S::CPR8) * 16;
        fp8x16_widen(kw + S::off(key, c16), kw + S::off(key, c16 + 8), *reinterpret_cast<const uint4*>(rk + key * D + c16));
        fp8x16_widen(vw + S::off(key, c16), vw + S::off(key, c16 + 8),
                     *reinterpret_cast<const uint4*>(rk + S::RAW + key * D + c16));
      }
      if constexpr (G) fence_proxy_async_smem();
      __syncthreads();
    }
    if (!G && !warp_rows) continue;  // (a wgmma warpgroup does the math: a branch around it serialises the MMAs)

    // S = Q K^T (B fragments: K rows via ldmatrix; matrices (n-tile j, d lo), (j, d hi), (j+1, lo), (j+1, hi))
    // (wgmma: the warpgroup's 64 rows x 64 keys, K as the K-major B, k-step kk at column 16 kk of its slab)
    float s[S::SN][4];
#pragma unroll
    for (int j = 0; j < S::SN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
    if constexpr (G) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < S::KSTEPS; ++kk)
        wgmma_rs<T, BN, 0>(s, qa[kk], wgmma_desc_sw128(ks + S::k_step_k(kk), S::K_LBO, S::K_SBO), 1);
      wgmma_commit();
      wgmma_wait<0>();  // (also retires the previous tile's O += P V, left in flight over the barrier)
#pragma unroll
      for (int j = 0; j < S::SN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) wgmma_fence_operand(s[j][e]);
#pragma unroll
      for (int j = 0; j < S::ON; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) wgmma_fence_operand(o[j][e]);
    } else {
#pragma unroll
      for (int kk = 0; kk < S::KSTEPS; ++kk)
#pragma unroll
        for (int j = 0; j < S::SN; j += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, ks + ((j + (lane >> 4)) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_m16n8k16<T>(s[j], qa[kk], b0);
          mma_m16n8k16<T>(s[j + 1], qa[kk], b1);
        }
    }

    // scale, causal mask, online softmax (rows ra: s[.][0..1], rb: s[.][2..3]); a tile inside every row's
    // range with no bad block (warp-uniform) skips the per-element mask
    static_assert(BN == 64, "the bad-key vote reads two flags a lane");
    const bool tile_bad = kbad_s[st][lane] != 0 || kbad_s[st][lane + 32] != 0;
    const bool full = kt0 >= w_first && kt0 + BN - 1 <= w_last && !__any_sync(0xffffffffu, tile_bad);
    float mx[2] = {-INFINITY, -INFINITY};  // of the raw scores (sscale > 0)
    if (full) {
#pragma unroll
      for (int j = 0; j < S::SN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    } else {
#pragma unroll
      for (int j = 0; j < S::SN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, kl = j * 8 + cl + (e & 1);
          const int k = kt0 + kl;
          float v = -INFINITY;
          if (k <= r_last[h] && k >= r_first[h]) {
            v = s[j][e];
            if (kbad_s[st][kl]) poison[h] = true;
          }
          s[j][e] = v;
          mx[h] = fmaxf(mx[h], v);
        }
    }
    float corr[2], mref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float nm = fmaxf(m2[h], mx[h] == -INFINITY ? -INFINITY : mx[h] * sscale);
      corr[h] = m2[h] == -INFINITY ? 0.f : fast_exp2(m2[h] - nm);  // 1 while the max stays
      m2[h] = nm;
      mref[h] = nm == -INFINITY ? 0.f : nm;  // a row with no key yet: its scores are all -inf, exp2 gives 0
      l[h] *= corr[h];
    }
#pragma unroll
    for (int j = 0; j < S::SN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float p = fast_exp2(fmaf(s[j][e], sscale, -mref[h]));
        s[j][e] = p;
        l[h] += p;
      }
    // (lanes agree per row; skipped once the maxima settle; wgmma: always -- accumulators written on a divergent
    // path serialise the warpgroup MMAs)
    if (G || corr[0] != 1.f || corr[1] != 1.f) {
#pragma unroll
      for (int j = 0; j < S::ON; ++j) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
      }
    }

    // O += P V (A: P rounded to T, the C layout of two n-tiles is the A layout of one k-step;
    // B: V rows via transposed ldmatrix, matrices (keys lo, d-tile j), (hi, j), (lo, j+1), (hi, j+1);
    // wgmma: V as the MN-major B, k-step kk = keys 16 kk .. (two 8-key groups), slabs SLAB apart)
    if constexpr (G) {
#pragma unroll
      for (int j = 0; j < S::ON; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) wgmma_fence_operand(o[j][e]);
      uint32_t pa[BN / 16][4];  // (all packed before the fence: registers defined between MMAs cost arrives)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_rs<T, D, 1>(o, pa[kk], wgmma_desc_sw128(vs + S::k_step_v(kk), S::V_LBO, S::V_SBO), 1);
      wgmma_commit();  // retired by the next tile's wait (its stage and widened buffer are not refilled before)
    } else {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < S::ON; j += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (j + (lane >> 4)) * 8);
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_m16n8k16<T>(o[j], pa, b0);
          mma_m16n8k16<T>(o[j + 1], pa, b1);
        }
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (G) {
    wgmma_wait<0>();  // the last tile's O += P V
#pragma unroll
    for (int j = 0; j < S::ON; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) wgmma_fence_operand(o[j][e]);
  }

  // ---- row sums and poison flags over each row's 4 lanes, then out = O / l * v_scale
  const float vscale = sc.value(kvh);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    float pz = poison[h] ? 1.f : 0.f;
    pz = fmaxf(pz, __shfl_xor_sync(0xffffffffu, pz, 1));
    pz = fmaxf(pz, __shfl_xor_sync(0xffffffffu, pz, 2));
    if (!r_valid[h] || r_tok[h] < 0 || r_tok[h] >= num_tokens) continue;
    const bool nan = r_bad[h] || pz != 0.f;
    const bool empty = !(l[h] > 0.f);
    const float inv = nan ? NAN : empty ? 0.f : vscale / l[h];
    const int64_t row = int64_t(r_tok[h]) * num_q_heads + r_head[h];
    T* orow = out + row * D;
#pragma unroll
    for (int j = 0; j < S::ON; ++j) {
      Vec<T, 2> v;
      v.v[0] = from_float<T>(nan ? NAN : o[j][2 * h] * inv);
      v.v[1] = from_float<T>(nan ? NAN : o[j][2 * h + 1] * inv);
      store_vec(orow + j * 8 + cl, v);
    }
    if (lse != nullptr && (lane & 3) == 0)
      lse[row] = nan ? NAN : empty ? -INFINITY : (m2[h] + log2f(l[h])) * 0.6931471805599453f;
  }
}

// Opts kernel into `bytes` of dynamic shared memory (above 48 KB), once per device (a bit per device id
// below 64 in `done`, one per kernel instantiation; a launch then costs one cudaGetDevice). Not a stream
// operation (allowed while a CUDA graph is captured).
inline cudaError_t dynamic_smem_once(const void* kernel, size_t bytes, std::atomic<uint64_t>& done) {
#if defined(__CUDACC__) && !defined(DK_CUDA_EMU)
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return e;
#else
  (void)kernel, (void)bytes, (void)done;
  return cudaSuccess;
#endif
}

template <class T, class C, int D, int W, bool G>
cudaError_t paged_prefill_prepare() {
  static std::atomic<uint64_t> done{0};
  return dynamic_smem_once(reinterpret_cast<const void*>(&paged_prefill_kernel<T, C, D, W, G>),
                           prefill_smem_bytes<C, D, G>(), done);
}

}  // namespace attn_detail

// Warps a CTA of the prefill kernel (8: 128 rows; 4: 64): 8 when the sequences average more than 64 rows
// (tokens x GQA group), else 4 -- a verification batch's or a decode-heavy mix's short sequences would leave
// most of a 128-row CTA's warps idle, and two 4-warp CTAs fit an SM. Shape-only (CUDA-graph stable).
inline int prefill_warps(int64_t num_tokens, int group, int num_seqs) {
  return num_seqs > 0 && num_tokens * group > int64_t(64) * num_seqs ? 8 : 4;
}

// The tensor-core kernel directly (paged_attention dispatches here; tests and benchmarks may
// call it for any batch). Same arguments and results as paged_attention without the split-KV
// plan; T must be half or bf16 and head_dim 64 or 128 (cudaErrorInvalidValue otherwise).
// wgmma: the products by warpgroup MMAs (sm_90a; HGMMA) instead of mma.sync (HMMA), the same results up to
// the order of the fp32 sums.
template <class T, class C>
cudaError_t paged_prefill(T* out,             // [num_tokens, Hq, D] contiguous
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
                          int window,  // sliding window (0: none)
                          cudaStream_t stream,
                          int warps = 0,       // 4 or 8 warps a CTA (0: prefill_warps; tests force both)
                          bool wgmma = false) {
  using namespace attn_detail;
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (num_tokens <= 0) return cudaSuccess;
    if (!paged_prefill_head_dim_ok(L.head_dim) || L.num_kv_heads <= 0 || L.block_size <= 0 || num_q_heads <= 0 ||
        num_q_heads % L.num_kv_heads != 0 || L.num_kv_heads > 65535 || num_seqs < 0 || num_tokens > 0x7fffffff ||
        int64_t(max_blocks) * L.block_size > 0x7fffffff || !aligned16(key_cache) ||
        !aligned16(value_cache) || window < 0 || (warps != 0 && warps != 4 && warps != 8))
      return cudaErrorInvalidValue;
    const int group = num_q_heads / L.num_kv_heads;
    const int W = warps != 0 ? warps : prefill_warps(num_tokens, group, num_seqs);
    const int64_t gx = prefill_grid_x(num_tokens, group, num_seqs, 16 * W);
    if (gx > 0x7fffffff) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(gx), unsigned(L.num_kv_heads));
#define DK_PREFILL_LAUNCH(D, W, G)                                                                                \
  {                                                                                                            \
    const cudaError_t e = paged_prefill_prepare<T, C, D, W, G>();                                              \
    if (e != cudaSuccess) return e;                                                                            \
    paged_prefill_kernel<T, C, D, W, G><<<grid, 32 * W, prefill_smem_bytes<C, D, G>(), stream>>>(             \
        out, lse, query, q_stride, key_cache, value_cache, block_tables, max_blocks, seq_lens, query_start_loc, \
        num_seqs, num_tokens, num_q_heads, num_blocks, L, scale, sc, window);                                   \
  }
#define DK_PREFILL_WARPS(D, G)                 \
  if (W == 8) DK_PREFILL_LAUNCH(D, 8, G)       \
  else DK_PREFILL_LAUNCH(D, 4, G)
    if (L.head_dim == 64 && wgmma) DK_PREFILL_WARPS(64, true)
    else if (L.head_dim == 64) DK_PREFILL_WARPS(64, false)
    else if (wgmma) DK_PREFILL_WARPS(128, true)
    else DK_PREFILL_WARPS(128, false)
#undef DK_PREFILL_WARPS
#undef DK_PREFILL_LAUNCH
    return cudaGetLastError();
  }
}

}  // namespace dk::cuda
