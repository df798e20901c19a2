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

}  // namespace dk
