// fp8 e4m3 conversions of include/decodekit/common/fp8.h against a reference written
// differently: the 126 finite positive fp8 values are built with ldexp, and a float is
// rounded by searching them in double (nearest, ties to the even encoding, saturating at
// 448 as CUDA's __NV_SATFINITE does; NaN -> NaN).
//
// Covered: every fp8 pattern (exact decode, round-trip), every tie between neighbours and
// the floats +-4 ulps around it, the saturation threshold, signed zero, NaN, +-inf, fp32
// subnormals, a strided sweep over all 2^32 fp32 patterns, hand-computed expectations.
#include <algorithm>
#include <cfloat>
#include <mutex>
#include <vector>

#include "check.h"
#include "decodekit/attention/cpu.h"  // cache_row_to_float (vectorized fp8 path)
#include "decodekit/common/fp8.h"

namespace {

// value of a non-negative fp8 code c (0..0x7e), built from its fields
double ref_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 7 - 3);
}

uint8_t ref_from_float(float f) {
  if (std::isnan(f)) return 0x7f;  // sign checked separately
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(double(f));
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {  // codes are increasing in value
    const double d = std::fabs(ref_value(c) - a), db = std::fabs(ref_value(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return uint8_t(sign | best);
}

bool ok(float f, uint8_t got) {
  if (std::isnan(f)) return (got & 0x7f) == 0x7f;
  return got == ref_from_float(f);
}

template <class Gen>
void sweep(const char* what, uint64_t n, Gen gen) {
  long long bad = 0;
  std::mutex mu;
  std::string first;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float f = gen(uint64_t(i));
    const uint8_t got = dk::float_to_fp8_e4m3(f);
    if (!ok(f, got) && bad++ == 0) {
      std::lock_guard<std::mutex> lock(mu);
      char buf[160];
      std::snprintf(buf, sizeof buf, "f=%a got 0x%02x want 0x%02x", double(f), got, ref_from_float(f));
      first = buf;
    }
  }
  dk_test::n_checks() += int64_t(n) - 1;
  CHECK(bad == 0) << what << ":" << bad << "mismatches of" << n << "e.g." << first;
}

void all_patterns() {
  long long bad = 0;
  for (int u = 0; u < 256; ++u) {
    const float f = dk::fp8_e4m3_to_float(uint8_t(u));
    const bool neg = u & 0x80;
    if ((u & 0x7f) == 0x7f) {
      bad += !(std::isnan(f) && std::signbit(f) == neg);
      bad += (dk::float_to_fp8_e4m3(f) & 0x7f) != 0x7f;
      continue;
    }
    const double want = neg ? -ref_value(u & 0x7f) : ref_value(u & 0x7f);
    bad += !(double(f) == want && std::signbit(f) == neg);
    bad += dk::float_to_fp8_e4m3(f) != uint8_t(u);
  }
  dk_test::n_checks() += 511;
  CHECK(bad == 0) << bad << "fp8 patterns decode or round-trip wrongly";
}

// The CPU attention kernel's row conversion (AVX-512 where built with it, a table otherwise)
// equals fp8_e4m3_to_float bit for bit (signed zeros, subnormals, NaN) for every code, at
// every alignment and tail length.
void row_conversion() {
  dk::fp8_e4m3_t in[256 + 37];
  float out[256 + 37];
  long long bad = 0;
  for (int off = 0; off < 19; ++off) {
    for (int i = 0; i < 256 + 37; ++i) in[i].bits = uint8_t((i * 7 + off) & 0xff);
    const int n = 256 + 37 - off;
    dk::cpu::cache_row_to_float(in + off, out, n);
    for (int i = 0; i < n; ++i) {
      const float want = dk::fp8_e4m3_to_float(in[off + i].bits);
      bad += !((std::isnan(want) && std::isnan(out[i])) || dk::float_to_bits(want) == dk::float_to_bits(out[i]));
    }
    dk_test::n_checks() += n;
  }
  CHECK(bad == 0) << bad << "fp8 cache-row conversions differ from fp8_e4m3_to_float";
}

void hand_computed() {
  using dk::float_to_fp8_e4m3;
  CHECK(float_to_fp8_e4m3(1.0f) == 0x38);
  CHECK(float_to_fp8_e4m3(1.0625f) == 0x38);   // tie 1 (0x38, even) / 1.125 (0x39): down
  CHECK(float_to_fp8_e4m3(1.1875f) == 0x3a);   // tie 1.125 (odd) / 1.25 (0x3a): up
  CHECK(float_to_fp8_e4m3(448.0f) == 0x7e);
  CHECK(float_to_fp8_e4m3(460.0f) == 0x7e);    // saturates (would round to 448 anyway)
  CHECK(float_to_fp8_e4m3(1e9f) == 0x7e);
  CHECK(float_to_fp8_e4m3(-INFINITY) == 0xfe);
  CHECK(float_to_fp8_e4m3(-0.0f) == 0x80);
  CHECK(float_to_fp8_e4m3(0x1p-9f) == 0x01);   // smallest subnormal
  CHECK(float_to_fp8_e4m3(0x1p-10f) == 0x00);  // tie with 0: even
  CHECK(float_to_fp8_e4m3(0x1.000002p-10f) == 0x01);
  CHECK(float_to_fp8_e4m3(0x1p-6f) == 0x08);   // smallest normal
  CHECK(float_to_fp8_e4m3(0x1.ep-7f) == 0x08);  // 7.5 subnormal units: tie 7/8, up to even 8
  CHECK((float_to_fp8_e4m3(NAN) & 0x7f) == 0x7f);
  CHECK(dk::fp8_e4m3_to_float(0x7e) == 448.0f);
  CHECK(dk::fp8_e4m3_to_float(0x01) == 0x1p-9f);
  CHECK(dk::fp8_e4m3_to_float(0xb9) == -1.125f);
  CHECK(dk::quantize_fp8_e4m3(3.0f, 2.0f) == 0x3c);  // 1.5
  dk_test::n_checks() += 18;
}

}  // namespace

int main() {
  hand_computed();
  row_conversion();
  all_patterns();
  // ties between neighbouring codes (and 448 vs the next step 480) +-4 ulps, both signs
  std::vector<double> mids;
  for (int c = 0; c < 0x7e; ++c) mids.push_back((ref_value(c) + ref_value(c + 1)) / 2);
  mids.push_back(464.0);
  sweep("ties", mids.size() * 18, [&](uint64_t i) {
    const int k = int(i % 9) - 4;
    const float mid = float(mids[(i / 9) / 2]);
    uint32_t b = dk::float_to_bits(mid) + uint32_t(k);
    if ((i / 9) & 1) b |= 0x80000000u;
    return dk::bits_to_float(b);
  });
  sweep("fp32 subnormals", uint64_t(1) << 21, [](uint64_t i) {
    return dk::bits_to_float(uint32_t((i * 4 + (i & 3)) & 0x7fffff) | uint32_t(i & 1) << 31);
  });
  sweep("+-inf, nan", 4, [](uint64_t i) {
    const float v[4] = {INFINITY, -INFINITY, NAN, -NAN};
    return v[i];
  });
  // stride 997 (odd: the low mantissa bits take every value) over all 2^32 patterns
  const uint64_t stride = 997;
  sweep("fp32 sweep", (uint64_t(1) << 32) / stride, [&](uint64_t i) {
    return dk::bits_to_float(uint32_t(i * stride + (i & 0xff)));
  });
  return dk_test::finish("test_fp8");
}
