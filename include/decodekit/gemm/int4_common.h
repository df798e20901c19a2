// Per-element logic of the INT4 weight layout (include/decodekit/gemm/int4.h), shared by the CPU
// and CUDA kernels: the code of element k and its decoded value.
#pragma once
#include <cstdint>

#include "decodekit/common/macros.h"

namespace dk {

// The 4-bit code of element k of a row (row: the row's K / 2 bytes).
DK_HD int int4_code(const uint8_t* row, int group_size, int64_t k) {
  const int64_t g = k / group_size;
  const int i = int(k - g * group_size), half = group_size / 2;
  const uint8_t b = row[g * half + (i < half ? i : i - half)];
  return i < half ? (b & 15) : (b >> 4);
}

// The weight value of a code: scale * q + min in fp32 (scale * q exact).
DK_HD float int4_weight(int q, float scale, float min) { return scale * float(q) + min; }

// The CUTLASS sm90 mixed-input GEMM (gemm/sm90_gemm.cuh) reads a row's K / 2 bytes as plain packed
// 4-bit elements: logical element j of a byte run is the low nibble of byte j / 2 when j is even, the
// high nibble when odd. In that reading, logical element j of a group is our element
// int4_interleaved_source(j, G) of the same group (byte i holds elements i and i + G / 2), so the GEMM
// runs on activations interleaved the same way, x'[gG + j] = x[gG + int4_interleaved_source(j, G)]:
// the dot products, and the group each weight's scale and min come from, are unchanged.
DK_HD int int4_interleaved_source(int j, int group_size) { return (j >> 1) + (j & 1) * (group_size / 2); }

}  // namespace dk
