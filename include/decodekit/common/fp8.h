// FP8 E4M3 ("e4m3fn", torch.float8_e4m3fn, CUDA __nv_fp8_e4m3): 1 sign, 4 exponent (bias 7),
// 3 mantissa bits; no infinities, NaN = S.1111.111, largest finite 448, smallest subnormal
// 2^-9. Written once for host and device: the KV-cache kernels (CPU and CUDA) quantize and
// dequantize through these functions, and the reference (torch) computes the same thing:
//   store: q = fp8(clamp(x / scale, -448, 448))  (fp32 division, then round-to-nearest-even;
//          out-of-range values saturate, as CUDA's __NV_SATFINITE; NaN stays NaN)
//   load:  x = float(q) * scale                   (exact conversion, one fp32 multiply)
#pragma once
#include <cstdint>

#include "decodekit/common/dtype.h"
#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace dk {

struct fp8_e4m3_t { uint8_t bits; };

inline constexpr float kFp8E4M3Max = 448.0f;

// fp8 e4m3 -> fp32, exact.
DK_HD float fp8_e4m3_to_float(uint8_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The hardware conversion (F2FP): every e4m3 value, subnormals and +-448 included, is an fp16
  // value, so e4m3 -> fp16 -> fp32 is exact, and NaN stays NaN (its sign and payload aside: the
  // tests take any NaN). The bit path below cost the fp8-KV decode ~10 instructions and branches a
  // key element (fp8 KV ran 2.3-3x slower than bf16 KV on the H200, 2026-12-04).
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3)));
#else
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_to_float(sign | 0x7fc00000u);  // NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));
  const float mag = float(man) * 0.001953125f;  // subnormal: man * 2^-9, exact
  return sign ? -mag : mag;
#endif
}

// fp32 -> fp8 e4m3, round-to-nearest-even, saturating to +-448 (inf too); NaN -> NaN.
DK_HD uint8_t float_to_fp8_e4m3(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);   // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // |f| >= 448: saturate
  if (a < 0x3c800000u) {
    // below 2^-6: subnormal (or zero) result: round |f| * 2^9 to an integer, ties to even;
    // 8 (= 2^-6) comes out as the smallest normal's encoding, as it should
    const float m = bits_to_float(a) * 512.0f;
    const float r = (m + 8388608.0f) - 8388608.0f;
    return uint8_t(sign | uint8_t(r));
  }
  uint32_t v = a - (120u << 23);  // exponent - 120: bias 127 -> 7
  v += 0x7ffffu + ((v >> 20) & 1u);
  return uint8_t(sign | uint8_t(v >> 20));
}

template <> struct Conv<fp8_e4m3_t> {
  DK_HD static float load(const fp8_e4m3_t& x) { return fp8_e4m3_to_float(x.bits); }
  DK_HD static fp8_e4m3_t store(float x) { return fp8_e4m3_t{float_to_fp8_e4m3(x)}; }
};

// True for the fp8 KV-cache storage type (its values carry a scale).
template <class C> inline constexpr bool kIsFp8 = false;
template <> inline constexpr bool kIsFp8<fp8_e4m3_t> = true;

// Quantize one value for an fp8 cache: x / scale (fp32 division), then saturating RNE.
DK_HD uint8_t quantize_fp8_e4m3(float x, float scale) { return float_to_fp8_e4m3(x / scale); }

// Dynamic (per-token / per-channel) scale of a row whose largest |x| is amax: amax maps to 448;
// an all-zero row gets scale 1 (its codes are zeros either way); NaN propagates.
DK_HD float fp8_dynamic_scale(float amax) { return amax > 0.f ? amax / kFp8E4M3Max : (amax == 0.f ? 1.f : amax); }

}  // namespace dk
