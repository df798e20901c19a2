// CUDA INT4 weight-only GEMM for decode-sized M (1..64), Marlin-style (W4A16, fp16/bf16 activations):
// out [M, N] = a [M, K] @ w^T (+ bias), w in include/decodekit/gemm/int4.h's layout (group-split nibbles,
// fp16 scale and min per group of G in {32, 64, 128}) or in the packed layout of int4_marlin_pack.h (the
// same weights cut into contiguous 128 x 128 units, codes in the order the lanes decode them, scale pairs
// inside the unit: each CTA streams one contiguous range of memory, and the kernel needs no byte shuffles
// and no separate scale loads). Torch-free.
//
// Design:
//  - Work units are (128 output features) x (128 input features) tiles of the weight, ordered k-fastest
//    within each 128-feature column; CTA b of P takes units [b U / P, (b + 1) U / P) ("striped", stream-K-like:
//    every CTA the same weight bytes, so even M = 1 with few columns fills all SMs). A CTA's range is one or
//    more segments (maximal runs inside one column).
//  - 4 warps, 32 features each (4 n8 tiles); rows of a in 16-row mma tiles (MT = 1, 2, 4: M <= 16, 32, 64).
//  - Weights, activations: a 4-stage cp.async pipeline in dynamic shared memory (no L2 cache
//    hint: see mma.cuh), XOR-swizzled so that the weight reads
//    (16 bytes a lane) and ldmatrix of a are bank-conflict free. Scales and mins (fp16, 4 bytes per group of a
//    row, not 16-byte aligned) ride in registers two tiles ahead of their tile and are staged in shared memory
//    one tile ahead.
//  - Packed layout: a stage is one unit's block copied as it is (544-640 16-byte chunks, coalesced), each
//    lane reads its four chunks' words of a tile in one 16-byte shared load (512 contiguous bytes a warp).
//  - Decoding in registers, the magic-number trick: a 32-bit word with four codes in its nibble positions
//    (one PRMT from the 16-byte chunk) becomes two T values 2^e + q with one LOP3 (q OR-ed into the mantissa
//    of 1024.0 for fp16, 128.0 for bf16), then q = x - 2^e (exact) and w = q * s + m (one HFMA2) straight into
//    the mma.sync m16n8k16 B fragment; fp32 accumulators. fp16 takes the high nibbles in place (1024 + 16 q,
//    q = x / 16 - 64 exactly by one HFMA2): two shifts fewer per word.
//  - A 16-byte chunk of a row (32 codes: low nibbles elements 16j.., high ones G/2 + 16j.. of a group) feeds
//    two k16 steps; lane (g, c) takes bytes c, c+1, c+8, c+9 = its B fragment of both (as int4_mma.cuh).
//  - Segment epilogue: a column covered by one segment writes out (+ bias) directly. Otherwise each segment
//    writes its fp32 sums (rows < M only) to its own workspace slot, the CTA arriving last at the column's
//    counter (atomicAdd after a fence, the "last block" pattern) adds the column's slots in segment order
//    (deterministic: independent of arrival order) + bias, rounds once to T, writes out and resets the counter
//    to 0, so the counters are zero again after every launch (graph replays need no memset).
// Numerics: each weight is round_T(s_T * q + m_T) computed by one fused multiply-add in T (fp16: s_T, m_T
// are the fp16 scale and min themselves, so w = round_fp16(s q + m) exactly; bf16: the fp16 scale and min are
// first rounded to bf16, ~2^-9 relative each, as Marlin's bf16 path), products and sums in fp32. The other
// CUDA INT4 kernels decode in fp32 (int4_weight) then round to T: results agree within those roundings.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "decodekit/common/mma.cuh"
#include "decodekit/common/vec.cuh"
#include "decodekit/gemm/int4_marlin_pack.h"
#include "decodekit/gemm/mma_plan.h"

namespace dk::cuda {
namespace marlin_detail {

constexpr int kWarps = 4;
constexpr int kBN = kMarlinFeatures;  // 128 output features per unit (4 warps x 4 n8 tiles)
constexpr int kBK = kMarlinK;         // 128 input features per unit (64 bytes of codes a row)
constexpr int kStages = kMarlinStages;
static_assert(kBN == kWarps * 32 && kBK == 128, "the tile shapes below");

// Shared memory of one stage: weights [128 rows][64 bytes], a [16 MT rows][256 bytes], scale/min pairs
// [4 groups][128 rows] x 4 bytes (int4_marlin_smem_bytes in mma_plan.h is the same sum over the stages).
constexpr int kWBytes = kBN * kBK / 2, kSBytes = 4 * kBN * 4;

// Byte selection (PRMT): result byte i = byte (s >> 4i) & 7 of {b (bytes 4..7), a (bytes 0..3)}.
DK_DEVICE uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t v = uint64_t(a) | (uint64_t(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// (x & B) | C in one LOP3 (written as C++, ptxas emits two: one immediate operand each).
template <uint32_t B, uint32_t C>
DK_DEVICE uint32_t and_or(uint32_t x) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(B), "n"(C));
  return r;
#else
  return (x & B) | C;
#endif
}

// L2-only loads / stores of the fp32 workspace (written by other CTAs: never through L1).
DK_DEVICE float ld_cg(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}
DK_DEVICE void st_cg(float* p, float v) {
#if defined(__CUDA_ARCH__)
  __stcg(p, v);
#else
  *p = v;
#endif
}

// The magic-number decode of T: kMagic is 2^e (1024.0 fp16, 128.0 bf16) in both halves; OR-ing a code
// 0..15 into the low mantissa bits gives 2^e + q exactly.
template <class T> struct Magic;
template <> struct Magic<__half> { static constexpr uint32_t kBits = 0x64006400u; static constexpr float kBase = 1024.f; };
template <> struct Magic<__nv_bfloat16> { static constexpr uint32_t kBits = 0x43004300u; static constexpr float kBase = 128.f; };

// A scale / min pair (fp16 bits s | m << 16) as the T pair the decode multiplies with.
template <class T>
DK_DEVICE uint32_t scale_pair(uint32_t sm16) {
  if constexpr (std::is_same_v<T, __half>) {
    return sm16;
  } else {
    __half s, m;
    const uint16_t sb = uint16_t(sm16), mb = uint16_t(sm16 >> 16);
    memcpy(&s, &sb, 2);
    memcpy(&m, &mb, 2);
    return pack2<T>(__half2float(s), __half2float(m));
  }
}

// Two weights from x = kBits | (q0 in bits 0..3) | (q1 in bits 16..19): w_i = round_T(q_i * s + m), with
// sm = the T pair (s, m); returned as one B-fragment register (w0 in the low half).
template <class T>
DK_DEVICE uint32_t decode2(uint32_t x, uint32_t sm) {
#if defined(__CUDA_ARCH__)
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 v, p;
  memcpy(&v, &x, 4);
  memcpy(&p, &sm, 4);
  T2 r;
  if constexpr (std::is_same_v<T, __half>) {
    const T2 q = __hsub2(v, __float2half2_rn(Magic<T>::kBase));  // exact: small integers
    r = __hfma2(q, __low2half2(p), __high2half2(p));             // one rounding to T
  } else {
    const T2 q = __hsub2(v, __float2bfloat162_rn(Magic<T>::kBase));
    r = __hfma2(q, __low2bfloat162(p), __high2bfloat162(p));
  }
  uint32_t out;
  memcpy(&out, &r, 4);
  return out;
#else
  // host emulation: the exact q * s + m in double (exact: q < 16, s and m in T), rounded once to T
  auto val = [](uint16_t b) {
    T t;
    memcpy(&t, &b, 2);
    return double(Conv<T>::load(t));
  };
  const double s = val(uint16_t(sm)), m = val(uint16_t(sm >> 16));
  const double q0 = val(uint16_t(x)) - Magic<T>::kBase, q1 = val(uint16_t(x >> 16)) - Magic<T>::kBase;
  auto round = [](double v) {
    T t;
    if constexpr (std::is_same_v<T, __half>) t = __double2half(v);
    else t = __double2bfloat16(v);
    uint16_t b;
    memcpy(&b, &t, 2);
    return uint32_t(b);
  };
  return round(q0 * s + m) | (round(q1 * s + m) << 16);
#endif
}

// fp16 only: the same from x = kBits | (q0 in bits 4..7) | (q1 in bits 20..23), i.e. 1024 + 16 q_i: q_i =
// x / 16 - 64 (exact), then w_i = round(q_i * s + m).
DK_DEVICE uint32_t decode2_high(uint32_t x, uint32_t sm) {
#if defined(__CUDA_ARCH__)
  __half2 v, p;
  memcpy(&v, &x, 4);
  memcpy(&p, &sm, 4);
  const __half2 q = __hfma2(v, __float2half2_rn(1.f / 16), __float2half2_rn(-64.f));  // exact: small integers
  const __half2 r = __hfma2(q, __low2half2(p), __high2half2(p));
  uint32_t out;
  memcpy(&out, &r, 4);
  return out;
#else
  // host emulation: 1024 + 16 q has q in bits 4..7 of the fp16 mantissa; moved down, decode2's path
  return decode2<__half>(Magic<__half>::kBits | ((x >> 4) & 0x000f000fu), sm);
#endif
}

// The shared-memory byte offset of 16-byte chunk c (0..3) of weight row r, and of chunk c (0..15) of row r
// of a: XOR swizzles that spread a warp's reads over all banks.
DK_DEVICE int w_off(int r, int c) { return r * 64 + 16 * (c ^ ((r >> 1) & 3)); }
DK_DEVICE int a_off(int r, int c) { return r * 256 + 16 * (c ^ (r & 7)); }

// kPacked: qweight is int4_marlin_pack.h's packed buffer (units contiguous, codes in the order the lanes
// decode them, T scale pairs inside; scales / mins unused); else int4.h's layout. kG: the group size at
// compile time (the packed kernels: its chunk -> group arithmetic folds away), 0: the argument G.
template <class T, int MT, bool kPacked, int kG>
__global__ void __launch_bounds__(kWarps * 32, 1)
int4_gemm_marlin_kernel(T* __restrict__ out,                 // [M, N]
                        const T* __restrict__ a,              // [M, K], row stride a_stride
                        int64_t a_stride,
                        const uint8_t* __restrict__ qweight,  // [N, K/2]; kPacked: [int4_marlin_packed_bytes]
                        const __half* __restrict__ scales,    // [N, K/G] (not kPacked)
                        const __half* __restrict__ mins,      // [N, K/G] (not kPacked)
                        const T* __restrict__ bias,           // [N] or null
                        float* __restrict__ partial,          // [P + n_tiles, M, 128] fp32 workspace
                        unsigned* __restrict__ counters,      // [n_tiles], zero on entry and on exit
                        int M, int64_t N, int64_t K, int G_arg) {
  const int G = kG != 0 ? kG : G_arg;
  constexpr int BM = 16 * MT;
  constexpr int kABytes = BM * kBK * 2;
  constexpr int kStageBytes = kWBytes + kABytes + kSBytes;
  DK_DYNAMIC_SMEM(smem);
  __shared__ int last_flag;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gl = lane >> 2, cl = 2 * (lane & 3);
  // unit indices in 32 bits (int4_marlin_supported bounds the units), their products in 64
  const int n_tiles = int((N + kBN - 1) / kBN), k_tiles = int((K + kBK - 1) / kBK), U = n_tiles * k_tiles;
  const int P = int(gridDim.x), b = int(blockIdx.x);
  const int u0 = int(int64_t(b) * U / P), u1 = int(int64_t(b + 1) * U / P);
  const int count = u1 - u0;
  const int64_t ng = K / G;
  const int groups_per_chunk_shift = G == 32 ? 0 : G == 64 ? 1 : 2;  // chunk c: group c >> shift, j = c & mask

  // a stage: weights, scale / min pairs (together one packed unit), a
  auto w_s = [&](int slot) { return smem + slot * kStageBytes; };
  auto s_s = [&](int slot) { return reinterpret_cast<uint32_t*>(smem + slot * kStageBytes + kWBytes); };
  auto a_s = [&](int slot) { return smem + slot * kStageBytes + kWBytes + kSBytes; };

  // a unit's (column, k tile); the pipeline walks three cursors one unit per step (no divisions in the loop)
  struct Pos { int nt, kt; };
  auto pos_of = [&](int u) { return Pos{u / k_tiles, u - (u / k_tiles) * k_tiles}; };
  auto advance = [&](Pos& p) {
    if (++p.kt == k_tiles) {
      p.kt = 0;
      ++p.nt;
    }
  };
  const int g_shift = G == 32 ? 5 : G == 64 ? 6 : 7;

  // Loop-invariant parts of the copy addresses. Copy j of this thread: weight row (tid >> 2) + 32 j, chunk
  // tid & 3; a row (tid >> 4) + 8 j, chunk tid & 15 -- their swizzles do not depend on j (w_off, a_off).
  const int w_row = tid >> 2, w_chunk = tid & 3, a_row = tid >> 4, a_chunk = tid & 15;
  const int w_dst = w_off(w_row, w_chunk), a_dst = a_off(a_row, a_chunk);  // + j * 2048 bytes each
  const int64_t w_src = int64_t(w_row) * (K / 2) + 16 * w_chunk, a_src = int64_t(a_row) * a_stride + 8 * a_chunk;
  // issue the cp.async copies of unit p into stage `slot` (weights 512 chunks, a BM x 16 chunks)
  const int unit_chunks = int4_marlin_unit_bytes(G) / 16;  // packed: 16-byte chunks of a unit, 544..640
  auto load_tile = [&](Pos p, int slot) {
    const int64_t k0 = int64_t(p.kt) * kBK;
    const int64_t klen = K - k0 < kBK ? K - k0 : kBK;
    if constexpr (kPacked) {  // the unit's contiguous block (codes and scales) copied as it is
      const uint8_t* src = qweight + (int64_t(p.nt) * k_tiles + p.kt) * (16 * unit_chunks) + 16 * tid;
      unsigned char* dst = w_s(slot) + 16 * tid;
#pragma unroll
      for (int j = 0; j < 4; ++j) cp_async16(dst + 2048 * j, src + 2048 * j, 16);
      if (tid < unit_chunks - 512) cp_async16(dst + 8192, src + 8192, 16);
    } else {
      const int rows_left = int(N - int64_t(p.nt) * kBN < kBN ? N - int64_t(p.nt) * kBN : kBN);
      const uint8_t* wq = qweight + int64_t(p.nt) * kBN * (K / 2) + k0 / 2 + w_src;
      unsigned char* ws = w_s(slot) + w_dst;
      const bool w_in_k = 32 * w_chunk < klen;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = w_in_k && w_row + 32 * j < rows_left;
        cp_async16(ws + 2048 * j, ok ? wq + int64_t(32 * j) * (K / 2) : qweight, ok ? 16 : 0);
      }
    }
    const T* aq = a + k0 + a_src;
    unsigned char* as = a_s(slot) + a_dst;
    const bool a_in_k = 8 * a_chunk < klen;
#pragma unroll
    for (int j = 0; j < BM * 16 / (kWarps * 32); ++j) {
      const bool ok = a_in_k && a_row + 8 * j < M;
      cp_async16(as + 2048 * j, ok ? aq + int64_t(8 * j) * a_stride : a, ok ? 16 : 0);
    }
  };
  // the scale / min pairs of unit u's row `tid`: 4 groups (fewer valid: BK / G, K's tail), fp16 bits
  struct Scales { uint32_t v[4]; };
  auto load_scales = [&](Pos p) {
    Scales s;
    const int64_t k0 = int64_t(p.kt) * kBK, n = int64_t(p.nt) * kBN + tid;
    const int64_t klen = K - k0 < kBK ? K - k0 : kBK;
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales);
    const uint16_t* mp = reinterpret_cast<const uint16_t*>(mins);
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
      s.v[gi] = 0;
      if (n < N && gi * G < klen) {
        const int64_t idx = n * ng + (k0 >> g_shift) + gi;
        s.v[gi] = uint32_t(__ldg(sp + idx)) | (uint32_t(__ldg(mp + idx)) << 16);
      }
    }
    return s;
  };
  auto store_scales = [&](const Scales& s, int slot) {
    uint32_t* ss = s_s(slot);
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) ss[gi * kBN + tid] = scale_pair<T>(s.v[gi]);
  };

  float acc[MT][4][4];
  auto zero_acc = [&] {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;
  };
  zero_acc();

  // this lane's byte selection: bytes c, c+8, c+1, c+9 of its chunk (c = cl), from the words holding them
  const int off = cl & 3;
  const uint32_t sel = uint32_t(off) | uint32_t(4 + off) << 4 | uint32_t(off + 1) << 8 | uint32_t(5 + off) << 12;
  const bool first_words = cl < 4;

  // Loop-invariant parts of the compute side's shared-memory reads: weight row warp * 32 + 8 t + gl has the
  // swizzle (gl >> 1) & 3 for every t (w_off), a row 16 i + (lane & 15) has lane & 7 (a_off), so per chunk c
  // one offset each (+ 512 t, + 4096 i, + 32 t as immediates); chunk c's k16 steps and group from G.
  int w_rd[4], a_lo[4], a_hi[4], s_rd[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int gi = c >> groups_per_chunk_shift, j = c & ((1 << groups_per_chunk_shift) - 1);
    const int col_lo = gi * G + 16 * j, col_hi = col_lo + G / 2;  // the chunk's two k16 steps
    w_rd[c] = w_off(warp * 32 + gl, c);
    a_lo[c] = a_off(lane & 15, (col_lo >> 3) + (lane >> 4));
    a_hi[c] = a_off(lane & 15, (col_hi >> 3) + (lane >> 4));
    s_rd[c] = (gi * kBN + warp * 32 + gl) * 4;
  }
  auto compute = [&](Pos p, int slot) {
    const int64_t k0 = int64_t(p.kt) * kBK;
    const int chunks = int((K - k0 < kBK ? K - k0 : kBK) / 32);  // 16-byte chunks of a row in this tile
    const unsigned char* ws = w_s(slot);
    const unsigned char* as = a_s(slot);
    const unsigned char* ss = reinterpret_cast<const unsigned char*>(s_s(slot));
    uint4 wp[4];  // packed: this lane's words of tile t, chunks 0..3 (one 16-byte read each)
    if constexpr (kPacked) {
#pragma unroll
      for (int t = 0; t < 4; ++t) wp[t] = *reinterpret_cast<const uint4*>(ws + 16 * ((warp * 4 + t) * 32 + lane));
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (kPacked || c < chunks) {  // packed: past K the unit is zero codes and scales, a zero: all four
        uint32_t alo[MT][4], ahi[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          ldmatrix_x4(alo[i], as + a_lo[c] + 4096 * i);
          ldmatrix_x4(ahi[i], as + a_hi[c] + 4096 * i);
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t sm = *reinterpret_cast<const uint32_t*>(ss + s_rd[c] + 32 * t);
          uint32_t p;  // bytes cl, cl+8, cl+1, cl+9 of the row's chunk c
          if constexpr (kPacked) {
            p = c == 0 ? wp[t].x : c == 1 ? wp[t].y : c == 2 ? wp[t].z : wp[t].w;
          } else {
            const uint4 w = *reinterpret_cast<const uint4*>(ws + w_rd[c] + 512 * t);
            p = byte_perm(first_words ? w.x : w.y, first_words ? w.z : w.w, sel);
          }
          uint32_t blo[2], bhi[2];
          constexpr uint32_t kLow = 0x000f000fu, kHigh = 0x00f000f0u, kMag = Magic<T>::kBits;
          blo[0] = decode2<T>(and_or<kLow, kMag>(p), sm);       // elements cl, cl+1
          blo[1] = decode2<T>(and_or<kLow, kMag>(p >> 8), sm);  // cl+8, cl+9
          if constexpr (std::is_same_v<T, __half>) {            // high nibbles in place: 1024 + 16 q
            bhi[0] = decode2_high(and_or<kHigh, kMag>(p), sm);       // G/2 + cl, cl+1
            bhi[1] = decode2_high(and_or<kHigh, kMag>(p >> 8), sm);  // G/2 + cl+8, cl+9
          } else {  // bf16's 7 mantissa bits: shifted down first
            bhi[0] = decode2<T>(and_or<kLow, kMag>(p >> 4), sm);
            bhi[1] = decode2<T>(and_or<kLow, kMag>(p >> 12), sm);
          }
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma_m16n8k16<T>(acc[i][t], alo[i], blo);
            mma_m16n8k16<T>(acc[i][t], ahi[i], bhi);
          }
        }
      }
    }
  };

  // the CTA holding unit u (the largest b with floor(b U / P) <= u)
  auto cta_of = [&](int u) { return int((int64_t(u + 1) * P - 1) / U); };

  auto epilogue = [&](int nt) {
    const int first = cta_of(nt * k_tiles), last = cta_of(nt * k_tiles + k_tiles - 1);
    const int64_t n0 = int64_t(nt) * kBN + warp * 32;
    auto for_each = [&](auto&& f) {  // f(m, column in the 128-wide tile, feature, accumulator)
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int m = 16 * i + gl + (e >> 1) * 8;
            const int col = warp * 32 + 8 * t + cl + (e & 1);
            if (m < M && n0 + 8 * t + cl + (e & 1) < N) f(m, col, int64_t(nt) * kBN + col, acc[i][t][e]);
          }
    };
    auto finish = [&](int m, int64_t n, float v) {
      if (bias != nullptr) v += to_float(bias[n]);
      out[int64_t(m) * N + n] = from_float<T>(v);
    };
    if (first == last) {
      for_each([&](int m, int, int64_t n, float v) { finish(m, n, v); });
      return;
    }
    // slot of the segment (column nt, CTA b) = b + nt: unique, < P + n_tiles
    for_each([&](int m, int col, int64_t, float v) { st_cg(partial + (int64_t(b + nt) * M + m) * kBN + col, v); });
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      const unsigned arrived = atomicAdd(counters + nt, 1u);
      const bool is_last = arrived == unsigned(last - first);
      if (is_last) {
        atomicExch(counters + nt, 0u);
        __threadfence();
      }
      last_flag = is_last;
    }
    __syncthreads();
    if (last_flag) {
      for_each([&](int m, int col, int64_t n, float) {
        float v = 0.f;
        for (int s = first; s <= last; ++s) v += ld_cg(partial + (int64_t(s + nt) * M + m) * kBN + col);
        finish(m, n, v);
      });
    }
  };

  // pipeline: stage of unit u0 + i is i % kStages; scales ride two units ahead in registers (s_next, s_next2)
  // and are stored one unit ahead of their use
  Pos lp = pos_of(u0), sp = lp, cp = lp;  // next unit to load, next scales to load, unit to compute
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) load_tile(lp, s);
    cp_async_commit();
    advance(lp);
  }
  Scales s_next{}, s_next2{};
  if constexpr (!kPacked) {
    if (count > 0) store_scales(load_scales(sp), 0);
    advance(sp);
    if (count > 1) s_next = load_scales(sp);
    advance(sp);
    if (count > 2) s_next2 = load_scales(sp);
    advance(sp);
  }
#pragma unroll 1
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // unit i's stage is complete for all threads; stage (i - 1) % kStages is free
    if (i + kStages - 1 < count) load_tile(lp, (i + kStages - 1) % kStages);
    advance(lp);
    cp_async_commit();
    if constexpr (!kPacked) {
      if (i + 1 < count) store_scales(s_next, (i + 1) % kStages);  // used after the next barrier
      s_next = s_next2;
      if (i + 3 < count) s_next2 = load_scales(sp);
      advance(sp);
    }
    compute(cp, i % kStages);
    if (i == count - 1 || cp.kt == k_tiles - 1) {  // the end of a segment
      epilogue(cp.nt);
      zero_acc();
    }
    advance(cp);
  }
  cp_async_wait<0>();
}

}  // namespace marlin_detail

// The kernel instantiation for M rows (MT = 1, 2, 4 m16 tiles) and, packed, group size G: the one place that
// maps rows to MT.
template <class T, bool kPacked, int kG>
auto marlin_kernel_g(int64_t M) {
  using namespace marlin_detail;
  const int rows = int4_marlin_rows(M);
  return rows == 16 ? int4_gemm_marlin_kernel<T, 1, kPacked, kG>
                    : rows == 32 ? int4_gemm_marlin_kernel<T, 2, kPacked, kG> : int4_gemm_marlin_kernel<T, 4, kPacked, kG>;
}
template <class T, bool kPacked>
auto marlin_kernel(int64_t M, int G) {
  if constexpr (!kPacked) {
    (void)G;
    return marlin_kernel_g<T, false, 0>(M);
  } else {
    return G == 32 ? marlin_kernel_g<T, true, 32>(M) : G == 64 ? marlin_kernel_g<T, true, 64>(M)
                                                                : marlin_kernel_g<T, true, 128>(M);
  }
}

// Dynamic shared memory of the Marlin kernel for M rows (the kernel needs it opted in above 48 KB); packed:
// the kernels of every group size.
template <class T, bool kPacked>
cudaError_t int4_marlin_prepare(int64_t M) {
#if defined(__CUDACC__) && !defined(DK_CUDA_EMU)
  if constexpr (kIsMmaType<T>) {
    for (int G : {32, 64, 128}) {
      const cudaError_t e = cudaFuncSetAttribute(marlin_kernel<T, kPacked>(M, G),
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(int4_marlin_smem_bytes(int4_marlin_rows(M))));
      if (e != cudaSuccess || !kPacked) return e;
    }
  }
#endif
  (void)M;
  return cudaSuccess;
}

// CTAs of the Marlin kernel one SM holds at M rows (after int4_marlin_prepare; packed: the fewest of the group
// sizes' kernels), >= 1.
template <class T, bool kPacked>
int int4_marlin_ctas_per_sm(int64_t M) {
  int n = 1;
#if defined(__CUDACC__) && !defined(DK_CUDA_EMU)
  if constexpr (kIsMmaType<T>) {
    n = 1 << 20;
    for (int G : {32, 64, 128}) {
      int g = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&g, marlin_kernel<T, kPacked>(M, G), marlin_detail::kWarps * 32,
                                                    int4_marlin_smem_bytes(int4_marlin_rows(M)));
      n = g < n ? g : n;
      if (!kPacked) break;
    }
  }
#endif
  (void)M;
  return n > 0 ? n : 1;
}

// out [M, N] = a [M, K] @ w^T (+ bias), w packed INT4, 1 <= M <= 64 (kMarlinMaxM), T half or bf16 (float:
// cudaErrorInvalidValue), G in {32, 64, 128}, K a multiple of G; qweight, a and a's row stride 16-byte
// aligned. `ctas` (from int4_marlin_ctas) CTAs; workspace: `partial` int4_marlin_partial_floats(M, N, ctas)
// floats, `counters` int4_marlin_columns(N) zeros (left zero). int4_marlin_prepare<T, false>(M) must have run
// once per process and device (the shared-memory opt-in).
template <class T>
cudaError_t int4_gemm_marlin(T* out, const T* a, int64_t a_stride, const uint8_t* qweight, const __half* scales,
                             const __half* mins, const T* bias, int64_t M, int64_t N, int64_t K, int G, int ctas,
                             float* partial, unsigned* counters, cudaStream_t stream) {
  using namespace marlin_detail;
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (!int4_marlin_supported(M, N, K, G, a_stride * int64_t(sizeof(T))) || !aligned16(qweight) || !aligned16(a) ||
        mins == nullptr || ctas < 1 || ctas > int4_marlin_units(N, K) || partial == nullptr || counters == nullptr)
      return cudaErrorInvalidValue;
    const size_t smem = int4_marlin_smem_bytes(int4_marlin_rows(M));
    const dim3 grid{unsigned(ctas)}, block{unsigned(kWarps * 32)};
    const auto kernel = marlin_kernel<T, false>(M, G);
    kernel<<<grid, block, smem, stream>>>(out, a, a_stride, qweight, scales, mins, bias, partial, counters, int(M), N,
                                          K, G);
    return cudaGetLastError();
  }
}

// The same on the packed layout (int4_marlin_pack.h): `packed` int4_marlin_packed_bytes(N, K, G) bytes made
// by int4_marlin_pack with T's scale pairs; int4_marlin_prepare<T, true>(M) must have run.
template <class T>
cudaError_t int4_gemm_marlin_packed(T* out, const T* a, int64_t a_stride, const T* packed, const T* bias, int64_t M,
                                    int64_t N, int64_t K, int G, int ctas, float* partial, unsigned* counters,
                                    cudaStream_t stream) {
  using namespace marlin_detail;
  if constexpr (!kIsMmaType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (!int4_marlin_supported(M, N, K, G, a_stride * int64_t(sizeof(T))) || !aligned16(packed) || !aligned16(a) ||
        ctas < 1 || ctas > int4_marlin_units(N, K) || partial == nullptr || counters == nullptr)
      return cudaErrorInvalidValue;
    const size_t smem = int4_marlin_smem_bytes(int4_marlin_rows(M));
    const dim3 grid{unsigned(ctas)}, block{unsigned(kWarps * 32)};
    const auto kernel = marlin_kernel<T, true>(M, G);
    kernel<<<grid, block, smem, stream>>>(out, a, a_stride, reinterpret_cast<const uint8_t*>(packed), nullptr,
                                          nullptr, bias, partial, counters, int(M), N, K, G);
    return cudaGetLastError();
  }
}

// int4_marlin_pack.h's packed buffer for activations T from int4.h's layout, one thread per 32-bit word.
template <class T>
__global__ void int4_marlin_pack_kernel(uint32_t* __restrict__ out,            // [words]
                                        const uint8_t* __restrict__ qweight,   // [N, K/2]
                                        const uint16_t* __restrict__ scales,   // [N, K/G] fp16 bits
                                        const uint16_t* __restrict__ mins,     // [N, K/G] fp16 bits
                                        int64_t N, int64_t K, int G, int64_t words) {
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr bool kBf16 = !std::is_same_v<T, __half>;
  if (w < words) out[w] = int4_marlin_packed_word(qweight, scales, mins, N, K, G, kBf16, w);
}

// out: int4_marlin_packed_bytes(N, K, G) bytes (4-byte aligned); T: __half or __nv_bfloat16.
template <class T>
cudaError_t int4_marlin_pack(T* out, const uint8_t* qweight, const __half* scales, const __half* mins, int64_t N,
                             int64_t K, int G, cudaStream_t stream) {
  if (N <= 0 || K <= 0 || (G != 32 && G != 64 && G != 128) || K % G != 0) return cudaErrorInvalidValue;
  const int64_t words = int4_marlin_packed_bytes(N, K, G) / 4;
  const int threads = 256;
  const int64_t blocks = (words + threads - 1) / threads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  int4_marlin_pack_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(
      reinterpret_cast<uint32_t*>(out), qweight, reinterpret_cast<const uint16_t*>(scales),
      reinterpret_cast<const uint16_t*>(mins), N, K, G, words);
  return cudaGetLastError();
}

// int4_marlin_dequantize: rows [row0, row0 + R) of the weight held in int4_marlin_pack.h's layout, [R, K] in T,
// each weight as the Marlin-style kernel rounds it; one thread per 8 outputs (one 16-byte store): the codes by
// four 32-bit loads (int4_marlin_codes8; a unit's bytes come through L1 / L2), w = q s + m by one HFMA2 per pair
// (fused: rounded once, the bits of the CPU op's int4_marlin_fma_bits; the host emulator runs that instead).
template <class T>
__global__ void int4_marlin_dequantize_kernel(uint4* __restrict__ out,               // [R, K / 8]
                                              const uint8_t* __restrict__ packed,    // [packed bytes]
                                              int64_t R, int64_t K, int G, int64_t row0) {
  constexpr bool kBf16 = !std::is_same_v<T, __half>;
  const int64_t per_row = K / 8, total = R * per_row;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / per_row, k0 = (t - r * per_row) * 8;
    alignas(16) uint32_t v[4];
#if defined(__CUDA_ARCH__)
    int q[8];
    uint32_t pair;
    int4_marlin_codes8(packed, K, G, row0 + r, k0, q, &pair);
    using T2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
    T2 s2, m2;
    const uint32_t ss = (pair & 0xffffu) * 0x10001u, mm = (pair >> 16) * 0x10001u;
    memcpy(&s2, &ss, 4);
    memcpy(&m2, &mm, 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      T2 q2;
      if constexpr (kBf16) q2 = __floats2bfloat162_rn(float(q[2 * j]), float(q[2 * j + 1]));  // exact: q < 16
      else q2 = __floats2half2_rn(float(q[2 * j]), float(q[2 * j + 1]));
      const T2 w2 = __hfma2(q2, s2, m2);
      memcpy(&v[j], &w2, 4);
    }
#else
    int4_marlin_weights8(packed, K, G, kBf16, row0 + r, k0, reinterpret_cast<uint16_t*>(v));
#endif
    out[t] = *reinterpret_cast<const uint4*>(v);
  }
}

// out: [R, K] contiguous, 16-byte aligned; packed (4-byte aligned): int4_marlin_packed_bytes(N, K, G) bytes
// for T; T: __half or __nv_bfloat16; 0 <= row0 <= N - R.
template <class T>
cudaError_t int4_marlin_dequantize(T* out, const T* packed, int64_t N, int64_t K, int G, int64_t row0, int64_t R,
                                   cudaStream_t stream) {
  if (N <= 0 || K <= 0 || (G != 32 && G != 64 && G != 128) || K % G != 0 || row0 < 0 || R < 0 || row0 + R > N ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0 || reinterpret_cast<uintptr_t>(packed) % 4 != 0)
    return cudaErrorInvalidValue;
  if (R == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((R * (K / 8) + threads - 1) / threads, int64_t(1) << 20);
  int4_marlin_dequantize_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(
      reinterpret_cast<uint4*>(out), reinterpret_cast<const uint8_t*>(packed), R, K, G, row0);
  return cudaGetLastError();
}

}  // namespace dk::cuda
