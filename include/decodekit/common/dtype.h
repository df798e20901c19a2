// 16-bit float storage types and their conversions, written once for host and device.
// On the CPU the kernels store bf16/fp16 as these plain structs (bit-compatible with
// at::BFloat16 / at::Half and with __nv_bfloat16 / __half); all arithmetic is fp32.
#pragma once
#include <cstring>
#include "decodekit/common/macros.h"

namespace dk {

struct bf16_t { uint16_t bits; };
struct half_t { uint16_t bits; };

DK_HD float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
DK_HD uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits.
DK_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// fp32 -> bf16 with round-to-nearest-even; NaN stays a (quiet) NaN.
DK_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE fp16 -> fp32, exact (normals, subnormals, inf, NaN).
DK_HD float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in fp32
  const float mag = float(man) * 5.9604644775390625e-08f;
  return sign ? -mag : mag;
}

// fp32 -> IEEE fp16 with round-to-nearest-even, overflow to inf, NaN kept.
DK_HD uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // result is subnormal or zero: round a * 2^24 to an integer, ties to even
    // (the float adds are exact up to the final rounding, which is RNE)
    const float m = bits_to_float(a) * 16777216.0f;  // |f| * 2^24 < 1024
    const float r = (m + 8388608.0f) - 8388608.0f;   // RNE to integer
    return uint16_t(sign | uint16_t(r));
  }
  // normal: rebias exponent and round the 13 dropped mantissa bits to nearest even
  uint32_t v = a - 0x38000000u;  // exponent - 112
  v += 0xfffu + ((v >> 13) & 1u);
  return uint16_t(sign | uint16_t(v >> 13));
}

// Load/store of one element of storage type T as fp32.
template <class T> struct Conv;
template <> struct Conv<float> {
  DK_HD static float load(const float& x) { return x; }
  DK_HD static float store(float x) { return x; }
};
template <> struct Conv<bf16_t> {
  DK_HD static float load(const bf16_t& x) { return bf16_to_float(x.bits); }
  DK_HD static bf16_t store(float x) { return bf16_t{float_to_bf16(x)}; }
};
template <> struct Conv<half_t> {
  DK_HD static float load(const half_t& x) { return half_to_float(x.bits); }
  DK_HD static half_t store(float x) { return half_t{float_to_half(x)}; }
};

template <class T> DK_HD float to_float(const T& x) { return Conv<T>::load(x); }
template <class T> DK_HD T from_float(float x) { return Conv<T>::store(x); }

}  // namespace dk
