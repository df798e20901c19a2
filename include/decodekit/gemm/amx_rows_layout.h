// The layouts of quant_amx_rows.h's repacked INT4 / INT8 weights (plain C++: also for the op argument checks).
// INT4:
//   codes [S = amx_rows_strips(N)][K / 32][256] bytes: strip s = weight rows 16 s .. 16 s + 15, block b =
//     k 32 b .. 32 b + 31; byte p's low nibble is B-tile byte p, its high nibble B-tile byte 256 + p,
//     where B-tile byte 64 j + 4 n + i = q[16 s + n][32 b + 4 j + i] (j < 8: 8 rows of the tile unit's
//     "VNNI" operand, 4 consecutive k of a weight row in a dword);
//   then scales, then mins [S][K / G][16] fp16: the strip's 16 rows' values per group (rows past N: zero,
//     as their codes).
// INT8 (GGUF Q8_0): codes [S][K / 32][512] int8, byte 64 j + 4 n + i = q[16 s + n][32 b + 4 j + i] (the B tile
//   itself, loaded straight from the copy), then scales [S][K / G][16] fp16.
#pragma once
#include <cstdint>
#include <vector>

#include "decodekit/common/dtype.h"
#include "decodekit/common/macros.h"

namespace dk {
namespace cpu {

// Strips of 16 weight rows in the packed layout: an even number (a task takes two; the last may be zeros).
constexpr int64_t amx_rows_strips(int64_t N) { return (N + 31) / 32 * 2; }

// Bytes of the packed copy of an [N, K] INT4 weight of group size G: codes, then scales, then mins.
constexpr int64_t amx_rows_codes_bytes(int64_t N, int64_t K) { return amx_rows_strips(N) * (K / 32) * 256; }
constexpr int64_t amx_rows_scales_bytes(int64_t N, int64_t K, int G) { return amx_rows_strips(N) * (K / G) * 32; }
constexpr int64_t amx_rows_packed_bytes(int64_t N, int64_t K, int G) {
  return amx_rows_codes_bytes(N, K) + 2 * amx_rows_scales_bytes(N, K, G);
}

// The packed copy's three parts (packed: 32-byte aligned, as torch's allocations are).
struct AmxRowsWeight {
  const uint8_t* codes;   // [S][K / 32][256]
  const half_t* scales;   // [S][K / G][16]
  const half_t* mins;     // [S][K / G][16]
  AmxRowsWeight(const uint8_t* packed, int64_t N, int64_t K, int G)
      : codes(packed),
        scales(reinterpret_cast<const half_t*>(packed + amx_rows_codes_bytes(N, K))),
        mins(reinterpret_cast<const half_t*>(packed + amx_rows_codes_bytes(N, K) + amx_rows_scales_bytes(N, K, G))) {}
};

// The whole copy, at load (tests/cpp/test_amx_rows_cpu.cpp checks it against the byte-by-byte definition).
inline void amx_rows_pack_int4(uint8_t* packed,  // [amx_rows_packed_bytes(N, K, G)]
                               const uint8_t* qweight, const half_t* scales, const half_t* mins, int64_t N,
                               int64_t K, int G) {
  const int64_t S = amx_rows_strips(N), nb = K / 32, ng = K / G, half = G / 2, cb = amx_rows_codes_bytes(N, K);
  half_t* ps = reinterpret_cast<half_t*>(packed + cb);
  half_t* pm = ps + S * ng * 16;
  DK_OMP_PARALLEL_FOR_IF(S > 1 && N * K >= (int64_t(1) << 16))
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t tile[512] = {};  // B-tile bytes: 64 j + 4 n + i = q[16 s + n][32 b + 4 j + i]
      const int64_t w0 = 32 * b % G;  // the block's offset in its group (a group holds whole blocks)
      for (int n = 0; n < 16 && 16 * s + n < N; ++n) {
        const uint8_t* grp = qweight + (16 * s + n) * (K / 2) + (32 * b / G) * half;  // the group's bytes
        for (int c = 0; c < 32; ++c) {
          const int64_t w = w0 + c;  // group-split nibbles: elements 0..half-1 low, half..G-1 high
          tile[64 * (c / 4) + 4 * n + c % 4] = w < half ? grp[w] & 15 : grp[w - half] >> 4;
        }
      }
      uint8_t* dst = packed + (s * nb + b) * 256;
      for (int p = 0; p < 256; ++p) dst[p] = uint8_t(tile[p] | tile[256 + p] << 4);
    }
    for (int64_t g = 0; g < ng; ++g)
      for (int n = 0; n < 16; ++n) {
        const int64_t row = 16 * s + n;
        ps[(s * ng + g) * 16 + n] = row < N ? scales[row * ng + g] : half_t{0};
        pm[(s * ng + g) * 16 + n] = row < N ? mins[row * ng + g] : half_t{0};
      }
  }
}

constexpr int64_t amx_rows_int8_codes_bytes(int64_t N, int64_t K) { return amx_rows_strips(N) * (K / 32) * 512; }
constexpr int64_t amx_rows_int8_packed_bytes(int64_t N, int64_t K, int G) {
  return amx_rows_int8_codes_bytes(N, K) + amx_rows_scales_bytes(N, K, G);
}

// The whole INT8 copy, at load (checked the same way).
inline void amx_rows_pack_int8(uint8_t* packed,  // [amx_rows_int8_packed_bytes(N, K, G)]
                               const int8_t* qweight, const half_t* scales, int64_t N, int64_t K, int G) {
  const int64_t S = amx_rows_strips(N), nb = K / 32, ng = K / G;
  half_t* ps = reinterpret_cast<half_t*>(packed + amx_rows_int8_codes_bytes(N, K));
  DK_OMP_PARALLEL_FOR_IF(S > 1 && N * K >= (int64_t(1) << 16))
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = packed + (s * nb + b) * 512;
      for (int n = 0; n < 16; ++n)
        for (int c = 0; c < 32; ++c)
          dst[64 * (c / 4) + 4 * n + c % 4] = 16 * s + n < N ? uint8_t(qweight[(16 * s + n) * K + 32 * b + c]) : 0;
    }
    for (int64_t g = 0; g < ng; ++g)
      for (int n = 0; n < 16; ++n)
        ps[(s * ng + g) * 16 + n] = 16 * s + n < N ? scales[(16 * s + n) * ng + g] : half_t{0};
  }
}

// The inverses (the copy as the only stored form of a weight: rows of an op's fallback, tests): qweight [N, K / 2]
// (int4.h's group-split nibbles), scales / mins [N, K / G] fp16 from amx_rows_pack_int4's copy.
inline void amx_rows_unpack_int4(uint8_t* qweight, half_t* scales, half_t* mins,  // [N, K / 2], [N, K / G] x 2
                                 const uint8_t* packed, int64_t N, int64_t K, int G) {
  const int64_t nb = K / 32, ng = K / G, half = G / 2;
  const half_t* ps = reinterpret_cast<const half_t*>(packed + amx_rows_codes_bytes(N, K));
  const half_t* pm = ps + amx_rows_strips(N) * ng * 16;
  DK_OMP_PARALLEL_FOR_IF(N * K >= (int64_t(1) << 16))
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = n / 16, r = n % 16;
    std::vector<uint8_t> q(static_cast<size_t>(K));  // row n's codes: B-tile byte 64 j + 4 r + i of each block
    for (int64_t b = 0; b < nb; ++b)
      for (int c = 0; c < 32; ++c) {
        const int t = 64 * (c / 4) + 4 * int(r) + c % 4;
        const uint8_t byte = packed[(s * nb + b) * 256 + t % 256];
        q[size_t(32 * b + c)] = t < 256 ? byte & 15 : byte >> 4;
      }
    for (int64_t g = 0; g < ng; ++g) {  // group-split nibbles: element i low, half + i high
      for (int64_t i = 0; i < half; ++i)
        qweight[n * (K / 2) + g * half + i] = uint8_t(q[size_t(g * G + i)] | q[size_t(g * G + half + i)] << 4);
      scales[n * ng + g] = ps[(s * ng + g) * 16 + r];
      mins[n * ng + g] = pm[(s * ng + g) * 16 + r];
    }
  }
}

// One row n of an INT8 copy: q [K] int8, s [K / G] fp16 (the embedding lookup of a weight held only as its copy).
inline void amx_rows_row_int8(int8_t* q, half_t* s, const uint8_t* packed, int64_t N, int64_t K, int G, int64_t n) {
  const int64_t nb = K / 32, ng = K / G, st = n / 16, r = n % 16;
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 4; ++i) q[32 * b + 4 * j + i] = int8_t(packed[(st * nb + b) * 512 + 64 * j + 4 * r + i]);
  const half_t* ps = reinterpret_cast<const half_t*>(packed + amx_rows_int8_codes_bytes(N, K));
  for (int64_t g = 0; g < ng; ++g) s[g] = ps[(st * ng + g) * 16 + r];
}

// qweight [N, K] int8, scales [N, K / G] fp16 from amx_rows_pack_int8's copy.
inline void amx_rows_unpack_int8(int8_t* qweight, half_t* scales,  // [N, K], [N, K / G]
                                 const uint8_t* packed, int64_t N, int64_t K, int G) {
  DK_OMP_PARALLEL_FOR_IF(N * K >= (int64_t(1) << 16))
  for (int64_t n = 0; n < N; ++n) amx_rows_row_int8(qweight + n * K, scales + n * (K / G), packed, N, K, G, n);
}

}  // namespace cpu
}  // namespace dk
