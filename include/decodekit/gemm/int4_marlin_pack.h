// The packed INT4 layout of the Marlin-style CUDA kernel (gemm/int4_marlin.cuh, "packed" variant):
// per-element logic shared by the pack op (CPU and CUDA), the CPU int4_gemm_marlin op and the kernel.
// Torch-free, __host__ __device__.
//
// From int4.h's layout (qweight [N, K/2] group-split nibbles, scales / mins [N, K/G] fp16) the weight is
// cut into units of 128 output x 128 input features, unit (nt, kt) at index nt * k_tiles + kt (k-fastest
// within a 128-feature column: the order the kernel's CTAs stream them), each unit one contiguous block of
// int4_marlin_unit_bytes(G) bytes, so that a CTA reads one contiguous range of memory:
//   codes  [8192 bytes]: [warp w 4][n8 tile t 4][lane 32][chunk c 4][4 bytes]: the word the kernel's lane
//          (gl = lane / 4, c2 = 2 (lane % 4)) of warp w decodes for the B fragments of tile t, chunk c:
//          bytes c2, c2 + 8, c2 + 1, c2 + 9 of 16-byte chunk c of unit row w * 32 + 8 t + gl's 64 code
//          bytes (int4.h's bytes of that row for input features kt * 128 .. + 127). One 16-byte shared-
//          memory read per lane and tile gives all four chunks' words: no byte shuffles in the kernel.
//   scales [128 / G groups][128 rows][2 x 16 bits]: (scale, min) of the unit's group gi of row r, in the
//          activation type T (fp16: the fp16 values themselves; bf16: each rounded to bf16, as the kernel
//          multiplies in T: w = round_T(s_T * q + m_T)).
// Rows past N and input features past K (K a multiple of G, not of 128) are zero codes with zero scale
// and min. The packed buffer is typed T (its bits are bytes); total int4_marlin_packed_bytes(N, K, G).
#pragma once
#include <cstdint>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"

namespace dk {

inline constexpr int kMarlinUnitN = 128, kMarlinUnitK = 128;
inline constexpr int kMarlinCodeBytes = kMarlinUnitN * kMarlinUnitK / 2;  // 8192

DK_HD int int4_marlin_unit_bytes(int G) { return kMarlinCodeBytes + 4 * kMarlinUnitN * (kMarlinUnitK / G); }
DK_HD int64_t int4_marlin_k_tiles(int64_t K) { return (K + kMarlinUnitK - 1) / kMarlinUnitK; }
DK_HD int64_t int4_marlin_packed_bytes(int64_t N, int64_t K, int G) {
  return (N + kMarlinUnitN - 1) / kMarlinUnitN * int4_marlin_k_tiles(K) * int4_marlin_unit_bytes(G);
}

// Byte i (< 8192) of a unit's codes comes from unit row `row` (0..127), byte `byte` (0..63) of its 64.
DK_HD void int4_marlin_code_src(int i, int& row, int& byte) {
  const int w = i >> 11, t = (i >> 9) & 3, lane = (i >> 4) & 31, c = (i >> 2) & 3, j = i & 3;
  row = w * 32 + 8 * t + (lane >> 2);
  byte = 16 * c + 2 * (lane & 3) + 8 * (j & 1) + (j >> 1);
}
// The inverse: where unit row `row`'s byte `byte` lies among the unit's 8192 code bytes.
DK_HD int int4_marlin_code_pos(int row, int byte) {
  const int c = byte >> 4, r = byte & 15, h = r >> 3, c2 = r & 6, l = r & 1;
  const int lane = 4 * (row & 7) + c2 / 2;
  return (row >> 5) << 11 | ((row >> 3) & 3) << 9 | lane << 4 | c << 2 | (h + 2 * l);
}

// The packed buffer's 32-bit word `word` (< int4_marlin_packed_bytes / 4), from int4.h's layout:
// qweight [N, K/2], scales / mins [N, K/G] as fp16 bits; bf16: the scale pairs rounded to bf16.
DK_HD uint32_t int4_marlin_packed_word(const uint8_t* qweight, const uint16_t* scales, const uint16_t* mins,
                                       int64_t N, int64_t K, int G, bool bf16, int64_t word) {
  const int ub = int4_marlin_unit_bytes(G);
  const int64_t byte0 = word * 4, unit = byte0 / ub, k_tiles = int4_marlin_k_tiles(K);
  const int off = int(byte0 - unit * ub);
  const int64_t nt = unit / k_tiles, kt = unit - nt * k_tiles;
  if (off < kMarlinCodeBytes) {
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      int row, byte;
      int4_marlin_code_src(off + j, row, byte);
      const int64_t n = nt * kMarlinUnitN + row, kb = kt * (kMarlinUnitK / 2) + byte;  // byte column
      if (n < N && kb < K / 2) v |= uint32_t(qweight[n * (K / 2) + kb]) << (8 * j);
    }
    return v;
  }
  const int s = (off - kMarlinCodeBytes) / 4, gi = s / kMarlinUnitN, row = s - gi * kMarlinUnitN;
  const int64_t n = nt * kMarlinUnitN + row, k = kt * kMarlinUnitK + int64_t(gi) * G;
  if (n >= N || k >= K) return 0;
  const int64_t idx = n * (K / G) + k / G;
  uint16_t sc = scales[idx], mn = mins[idx];
  if (bf16) {
    sc = float_to_bf16(half_to_float(sc));
    mn = float_to_bf16(half_to_float(mn));
  }
  return uint32_t(sc) | uint32_t(mn) << 16;
}

// round_T(q * s + m) as T's bits (T = fp16 / bf16; s, m T's bits): rounded once, like the kernel's fused
// multiply-add in T (q < 16 and s, m of 11 / 8 significant bits: q s + m is exact in double; to float with
// round-to-odd, whose 13+ spare bits keep T's round-to-nearest-even exact, then to T).
DK_HD uint16_t int4_marlin_fma_bits(int q, uint16_t sb, uint16_t mb, bool bf16) {
  const double s = bf16 ? bf16_to_float(sb) : half_to_float(sb), m = bf16 ? bf16_to_float(mb) : half_to_float(mb);
  const double w = double(q) * s + m;
  float f = float(w);
  if (double(f) != w) {
    uint32_t u = float_to_bits(f);
    if (f > 0 ? double(f) > w : double(f) < w) --u;  // toward zero: the truncation
    f = bits_to_float(u | 1u);
  }
  return bf16 ? float_to_bf16(f) : float_to_half(f);
}

// The 8 codes of weights (n, k0 .. k0 + 7) of a packed buffer (bytes, G, K), k0 a multiple of 8 (one run of 8
// code bytes of one group half, inside one unit), and their group's (scale, min) pair as T's bits (low, high
// 16 bits of *pair). The run's bytes lie two per lane in 4 lanes' 16-byte groups (int4_marlin_code_pos: bytes
// b, b + 1 of a pair of lanes' words at offsets h and h + 2): four 32-bit loads.
DK_HD void int4_marlin_codes8(const uint8_t* packed, int64_t K, int G, int64_t n, int64_t k0, int* q,
                              uint32_t* pair) {
  const int64_t nt = n / kMarlinUnitN, kt = k0 / kMarlinUnitK;
  const uint8_t* unit = packed + (nt * int4_marlin_k_tiles(K) + kt) * int4_marlin_unit_bytes(G);
  const int row = int(n - nt * kMarlinUnitN), kk = int(k0 - kt * kMarlinUnitK);
  const int gi = kk / G, i = kk - gi * G, half = G / 2;  // int4.h: byte gi*G/2 + i % half, high nibble past half
  const int byte0 = gi * half + (i < half ? i : i - half), shift = i < half ? 0 : 4;
  const int pos = int4_marlin_code_pos(row, byte0);  // lane 4 (row % 8), byte h of chunk byte0 / 16's word
  const int h = pos & 1;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(unit + (pos & ~3));
  for (int u = 0; u < 4; ++u) {  // bytes byte0 + 2u, + 2u + 1: lane + u, word bytes h, h + 2
    const uint32_t x = w[4 * u] >> (8 * h + shift);
    q[2 * u] = int(x & 15);
    q[2 * u + 1] = int((x >> 16) & 15);
  }
  *pair = *reinterpret_cast<const uint32_t*>(unit + kMarlinCodeBytes + 4 * (gi * kMarlinUnitN + row));
}

// Weights (n, k0 .. k0 + 7) as T's bits, each rounded once (int4_marlin_fma_bits): int4_marlin_dequantize's
// 16-byte pieces on the CPU (the CUDA kernel: the same codes, one HFMA2 per pair).
DK_HD void int4_marlin_weights8(const uint8_t* packed, int64_t K, int G, bool bf16, int64_t n, int64_t k0,
                                uint16_t* out) {
  int q[8];
  uint32_t pair;
  int4_marlin_codes8(packed, K, G, n, k0, q, &pair);
  for (int j = 0; j < 8; ++j) out[j] = int4_marlin_fma_bits(q[j], uint16_t(pair), uint16_t(pair >> 16), bf16);
}

// Weight (n, k) of a packed buffer (bytes, G, K): round_T(s_T * q + m_T) as a float (the tests' per-weight view).
DK_HD float int4_marlin_weight(const uint8_t* packed, int64_t K, int G, bool bf16, int64_t n, int64_t k) {
  uint16_t v[8];
  int4_marlin_weights8(packed, K, G, bf16, n, k & ~int64_t(7), v);
  return bf16 ? bf16_to_float(v[k & 7]) : half_to_float(v[k & 7]);
}

}  // namespace dk
