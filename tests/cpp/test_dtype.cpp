// fp16 / bf16 conversions of include/decodekit/common/dtype.h against a reference written
// differently: the value is rounded in double with ilogb/ldexp/nearbyint (IEEE
// round-to-nearest-even of the current rounding mode) and then encoded field by field.
//
// Covered: every 16-bit pattern (decode exactly, round-trip), every tie between two
// neighbouring fp16/bf16 values and the floats a few ulps around it, all fp32 subnormals,
// a strided sweep over all 2^32 fp32 patterns (every pattern with DK_EXHAUSTIVE=1),
// overflow to inf, NaN, signed zero, and hand-computed expectations that do not depend on
// the reference at all.
#include <algorithm>
#include <cfenv>
#include <cfloat>
#include <cstdlib>
#include <mutex>

#include "check.h"

using dk_test::Rng;

namespace {

// ---- reference ------------------------------------------------------------------------

// A binary floating-point format: p significant bits (incl. the implicit one), minimum
// normal exponent emin, maximum exponent emax, exponent bias.
struct Format {
  int p, emin, emax, bias;
  double max_finite() const { return std::ldexp(2.0 - std::ldexp(1.0, 1 - p), emax); }
};
constexpr Format kHalf{11, -14, 15, 15};
constexpr Format kBf16{8, -126, 127, 127};

// Round a >= 0 (finite) to the format, ties to even; +inf when the rounded value (with
// unbounded exponent) exceeds the largest finite value (IEEE 754 overflow rule).
double ref_round(double a, const Format& F) {
  if (a == 0) return 0;
  const int e = std::max(std::ilogb(a), F.emin);   // subnormals share the quantum of emin
  const double q = std::ldexp(1.0, e - (F.p - 1));  // spacing of the format around a
  const double r = std::nearbyint(a / q);           // a / q is exact (power-of-two scale)
  const double v = r * q;
  return v > F.max_finite() ? INFINITY : v;
}

// Encode a representable value v >= 0 (or +inf) into sign/exponent/mantissa fields.
uint16_t ref_encode(double v, bool negative, const Format& F) {
  const int mbits = F.p - 1;
  uint32_t bits;
  if (std::isinf(v)) {
    bits = uint32_t((F.emax + F.bias + 1)) << mbits;
  } else if (v < std::ldexp(1.0, F.emin)) {  // subnormal or zero: v = m * 2^(emin - mbits)
    bits = uint32_t(std::ldexp(v, -(F.emin - mbits)));
  } else {
    const int e = std::ilogb(v);
    const uint32_t m = uint32_t(std::ldexp(v, mbits - e)) - (1u << mbits);
    bits = (uint32_t(e + F.bias) << mbits) | m;
  }
  return uint16_t(bits | (negative ? 0x8000u : 0u));
}

// Decode by fields (double holds every fp16/bf16 value exactly). NaN -> NaN with the sign.
double ref_decode(uint16_t h, const Format& F) {
  const int mbits = F.p - 1;
  const int ebits = 15 - mbits;
  const bool neg = h & 0x8000u;
  const int e = (h >> mbits) & ((1 << ebits) - 1);
  const uint32_t m = h & ((1u << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(double(m), F.emin - mbits);
  else v = std::ldexp(double(m + (1u << mbits)), e - F.bias - mbits);
  return neg ? -v : v;  // also sets the NaN sign bit
}

bool is_nan16(uint16_t h, const Format& F) {
  const int mbits = F.p - 1;
  const uint16_t exp_mask = uint16_t(0x7fffu & ~((1u << mbits) - 1));
  return (h & exp_mask) == exp_mask && (h & ((1u << mbits) - 1)) != 0;
}

// Expected conversion of one float; `ok` compares with NaN semantics (any NaN of the same
// sign is accepted: the payload of a converted NaN is implementation-defined).
uint16_t ref_from_float(float f, const Format& F) {
  if (std::isnan(f)) return uint16_t((std::signbit(f) ? 0x8000u : 0u) | 0x7fffu);
  const double a = std::fabs(double(f));
  return ref_encode(std::isinf(a) ? a : ref_round(a, F), std::signbit(f), F);
}
bool ok_from_float(float f, uint16_t got, const Format& F) {
  if (std::isnan(f)) return is_nan16(got, F) && (got >> 15) == uint16_t(std::signbit(f));
  return got == ref_from_float(f, F);
}

uint16_t dut(float f, const Format& F) { return &F == &kHalf ? dk::float_to_half(f) : dk::float_to_bf16(f); }
float dut_to_float(uint16_t h, const Format& F) { return &F == &kHalf ? dk::half_to_float(h) : dk::bf16_to_float(h); }

// Convert every float produced by gen(i), i in [0, n), in parallel; CHECK that all match.
template <class Gen>
void sweep(const char* what, const Format& F, uint64_t n, Gen gen) {
  long long bad = 0;
  std::mutex mu;
  std::string first;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float f = gen(uint64_t(i));
    const uint16_t got = dut(f, F);
    if (!ok_from_float(f, got, F)) {
      if (bad++ == 0) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.empty()) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "f=%a (0x%08x) got 0x%04x want 0x%04x", double(f), dk::float_to_bits(f), got,
                        ref_from_float(f, F));
          first = buf;
        }
      }
    }
  }
  dk_test::n_checks() += int64_t(n) - 1;
  CHECK(bad == 0) << (&F == &kHalf ? "fp16" : "bf16") << what << ":" << bad << "mismatches of" << n << "e.g." << first;
}

// ---- tests -----------------------------------------------------------------------------

// Every 16-bit pattern decodes exactly and converts back to itself (NaN: stays NaN).
void all_patterns(const Format& F) {
  long long bad_decode = 0, bad_trip = 0;
  for (uint32_t u = 0; u < 65536; ++u) {
    const uint16_t h = uint16_t(u);
    const float f = dut_to_float(h, F);
    const double want = ref_decode(h, F);
    if (std::isnan(want)) {
      bad_decode += !(std::isnan(f) && std::signbit(f) == std::signbit(want));
      const uint16_t back = dut(f, F);
      bad_trip += !(is_nan16(back, F) && (back >> 15) == (h >> 15));
    } else {
      bad_decode += !(double(f) == want && std::signbit(f) == std::signbit(want));  // incl. -0
      bad_trip += dut(f, F) != h;
    }
  }
  dk_test::n_checks() += 2 * 65536 - 2;
  CHECK(bad_decode == 0) << bad_decode << "patterns decode wrongly";
  CHECK(bad_trip == 0) << bad_trip << "patterns do not round-trip";
}

// Ties: for every pair of neighbouring finite values (and the top one vs. the overflow
// threshold), the exact midpoint and the floats within +-4 ulps of it.
void all_ties(const Format& F) {
  const int kSpan = 4;
  const uint32_t top = uint32_t(F.emax + F.bias) << (F.p - 1) | ((1u << (F.p - 1)) - 1);  // max finite, positive
  sweep(" ties", F, uint64_t(top + 1) * 2 * (2 * kSpan + 1), [&](uint64_t i) {
    const int k = int(i % (2 * kSpan + 1)) - kSpan;
    const uint64_t j = i / (2 * kSpan + 1);
    const uint16_t h = uint16_t(j >> 1);
    const double lo = ref_decode(h, F);
    const double hi = h == top ? std::ldexp(1.0, F.emax + 1)  // the step that overflows
                               : ref_decode(uint16_t(h + 1), F);
    const float mid = float((lo + hi) / 2);  // exact: one more bit than the format has
    uint32_t b = dk::float_to_bits(mid) + uint32_t(k);
    if (j & 1) b |= 0x80000000u;
    return dk::bits_to_float(b);
  });
}

void hand_computed() {
  using dk::float_to_half;
  using dk::float_to_bf16;
  // fp16: 1 + 2^-11 is the tie between 1 (0x3c00, even) and 1 + 2^-10 (odd): down.
  CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie between 0x3c01 and 0x3c02: up
  CHECK(float_to_half(1.0f + 0x1p-11f + 0x1p-23f) == 0x3c01);  // just above the tie
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65519.99f) == 0x7bff);  // below the overflow threshold 65520
  CHECK(float_to_half(65520.0f) == 0x7c00);   // tie with 65536 (0x7bff is odd): inf
  CHECK(float_to_half(-1e30f) == 0xfc00);
  CHECK(float_to_half(INFINITY) == 0x7c00);
  CHECK(float_to_half(-INFINITY) == 0xfc00);
  CHECK(float_to_bf16(-INFINITY) == 0xff80);
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(0x1p-24f) == 0x0001);        // smallest subnormal
  CHECK(float_to_half(0x1p-25f) == 0x0000);        // tie with 0 (even): 0
  CHECK(float_to_half(0x1.000002p-25f) == 0x0001); // just above it
  CHECK(float_to_half(3 * 0x1p-25f) == 0x0002);    // tie between 1 and 2 subnormal units: 2
  CHECK(float_to_half(-5 * 0x1p-25f) == 0x8002);   // tie between 2 and 3: 2
  CHECK(float_to_half(0x1p-14f) == 0x0400);        // smallest normal
  CHECK(float_to_half(0x1p-14f - 0x1p-25f) == 0x0400);  // tie 0x3ff/0x400: up to even
  CHECK(float_to_half(FLT_MIN) == 0x0000);
  CHECK(float_to_half(FLT_TRUE_MIN) == 0x0000);
  CHECK(float_to_half(0.1f) == 0x2e66);
  CHECK(std::isnan(dk::half_to_float(float_to_half(NAN))));
  CHECK(dk::half_to_float(0x0001) == 0x1p-24f);
  CHECK(dk::half_to_float(0x7bff) == 65504.0f);
  CHECK(dk::half_to_float(0x3555) == 0x1.554p-2f);
  // bf16: keeps the top 16 bits of the float, rounded to nearest even.
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);  // tie, 0x3f80 even: down
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);  // tie, up to even
  CHECK(float_to_bf16(1.0f + 0x1p-8f + 0x1p-23f) == 0x3f81);
  CHECK(float_to_bf16(FLT_MAX) == 0x7f80);         // rounds up past the largest bf16: inf
  CHECK(float_to_bf16(0x1.fep127f) == 0x7f7f);     // largest bf16
  CHECK(float_to_bf16(0x1.ffp127f) == 0x7f80);     // tie with 2^128 (0x7f7f odd): inf
  CHECK(float_to_bf16(-0x1.fefffep127f) == 0xff7f);
  CHECK(float_to_bf16(FLT_TRUE_MIN) == 0x0000);    // 2^-149 < half of 2^-133
  CHECK(float_to_bf16(0x1p-133f) == 0x0001);
  CHECK(float_to_bf16(0x1.8p-133f) == 0x0002);     // tie between 1 and 2 units: 2
  CHECK(float_to_bf16(0.1f) == 0x3dcd);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  const uint16_t snan = dk::float_to_bf16(dk::bits_to_float(0x7f800001u));  // payload only in low bits
  CHECK(snan != 0x7f80 && (snan & 0x7f80) == 0x7f80) << "signaling NaN must not become inf";
  CHECK(dk::float_to_bf16(dk::bits_to_float(0xffc00000u)) >> 15 == 1) << "NaN keeps its sign";
  CHECK(dk::float_to_half(dk::bits_to_float(0xff800001u)) == 0xfe00);
  // The generic wrappers used by the kernels.
  CHECK(dk::to_float(dk::from_float<dk::half_t>(0.5f)) == 0.5f);
  CHECK(dk::to_float(dk::from_float<dk::bf16_t>(-3.0f)) == -3.0f);
  CHECK(dk::to_float(dk::from_float<float>(0.1f)) == 0.1f);
  // Storage types must be layout-compatible with __half / __nv_bfloat16 / at::Half.
  static_assert(sizeof(dk::half_t) == 2 && sizeof(dk::bf16_t) == 2, "16-bit storage");
  static_assert(alignof(dk::half_t) == 2 && alignof(dk::bf16_t) == 2, "16-bit storage");
}

// The reference itself, spot-checked against the C++ library's float rounding where the
// two formats coincide: rounding a double to p = 24 through the same code must equal the
// hardware's double -> float conversion (which is RNE with overflow to inf).
void reference_self_check() {
  constexpr Format kFloat{24, -126, 127, 127};
  Rng rng(7);
  long long bad = 0;
  for (int i = 0; i < 200000; ++i) {
    double a = std::ldexp(1.0 + rng.uniform(), int(rng.u32() % 300) - 160);
    if (i % 3 == 0) {  // exact ties between neighbouring floats, and the doubles next to them
      const float f = dk::bits_to_float(rng.u32() & 0x7f7fffffu);
      a = (double(f) + double(std::nextafter(f, INFINITY))) / 2;
      if (i % 2) a = std::nextafter(a, (i % 4 == 1) ? 0.0 : INFINITY);
    }
    if (std::isnan(a) || std::isinf(a)) continue;
    bad += ref_round(a, kFloat) != double(float(a));
  }
  dk_test::n_checks() += 199999;
  CHECK(bad == 0) << bad << "reference roundings differ from double->float";
}

}  // namespace

int main() {
  if (std::fegetround() != FE_TONEAREST) { std::fprintf(stderr, "rounding mode is not to-nearest\n"); return 1; }
  reference_self_check();
  hand_computed();
  for (const Format* F : {&kHalf, &kBf16}) {
    all_patterns(*F);
    all_ties(*F);
    // every fp32 subnormal (and zero), both signs
    sweep(" fp32 subnormals", *F, uint64_t(1) << 24, [](uint64_t i) {
      return dk::bits_to_float(uint32_t(i & 0x7fffff) | uint32_t(i >> 23) << 31);
    });
    const bool exhaustive = std::getenv("DK_EXHAUSTIVE") && std::atoi(std::getenv("DK_EXHAUSTIVE"));
    if (exhaustive) {
      sweep(" all fp32", *F, uint64_t(1) << 32, [](uint64_t i) { return dk::bits_to_float(uint32_t(i)); });
    } else {
      // stride 251 (odd, so the low mantissa bits take every value) over all 2^32 patterns
      const uint64_t stride = 251;
      sweep(" fp32 +-inf", *F, 2, [](uint64_t i) { return i ? -INFINITY : INFINITY; });
      sweep(" fp32 sweep", *F, (uint64_t(1) << 32) / stride, [&](uint64_t i) {
        return dk::bits_to_float(uint32_t(i * stride + (i & 0xff)));
      });
    }
  }
  return dk_test::finish("test_dtype");
}
