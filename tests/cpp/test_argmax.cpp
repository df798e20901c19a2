// argmax_rows's rule (include/decodekit/sampling/argmax.h) against its definition, torch.argmax's: the
// largest value, ties -> the lowest index, the first NaN beats everything, -0.0 == +0.0. The order key
// (argmax_key) is checked on random pairs of any bits, and the CPU row kernel (AVX-512 where built, else
// the scalar loop) and the scalar loop against a direct scan, on rows of awkward lengths (1, 15, 16,
// 17, 4097, 49157) with heavy ties, NaNs of both signs and any payload, +-inf, +-0 and subnormals.
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "decodekit/sampling/argmax.h"

using namespace dk_test;

namespace {

bool is_nan(float x) { return x != x; }

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// torch.argmax's rule as a direct scan
int64_t definition(const std::vector<float>& x) {
  int64_t bi = 0;
  for (int64_t v = 0; v < int64_t(x.size()); ++v) {
    if (is_nan(x[size_t(v)])) return v;
    if (x[size_t(v)] > x[size_t(bi)]) bi = v;
  }
  return bi;
}

float value(Rng& rng, int kind) {
  switch (kind == 0 ? 12 : rng.u32() % 40) {
    case 0: return from_bits(0x7fc00000u | (rng.u32() & 0x3fffffu));  // +NaN
    case 1: return from_bits(0xff800001u + (rng.u32() & 0x3fffffu));  // -NaN
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return -std::numeric_limits<float>::infinity();
    case 4: return 0.f;
    case 5: return -0.f;
    case 6: return from_bits(rng.u32() & 0x807fffffu);  // subnormal of either sign
    default: return float(int(rng.u32() % 7) - 3);      // heavy ties
    case 12: return float(rng.normal());
  }
}

}  // namespace

int main() {
  Rng rng(11);
  for (int i = 0; i < 200000; ++i) {  // the key orders floats as '<' does (NaN on top, -0.0 == +0.0)
    const float a = from_bits(rng.u32()), b = from_bits(rng.u32() & (i % 2 ? 0xffffffffu : 0x807fffffu));
    const uint32_t ka = dk::argmax_key(a), kb = dk::argmax_key(b);
    if (is_nan(a) || is_nan(b)) {
      CHECK((ka == 0xffffffffu) == is_nan(a) && (kb == 0xffffffffu) == is_nan(b)) << a << b;
    } else {
      CHECK((a < b) == (ka < kb) && (a == b) == (ka == kb)) << a << b;
    }
  }
  CHECK(dk::argmax_key(0.f) == dk::argmax_key(-0.f));
  for (int64_t V : {1, 2, 15, 16, 17, 31, 33, 4097, 49157}) {
    for (int kind = 0; kind < 3; ++kind) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> x(static_cast<size_t>(V));
        for (auto& e : x) e = value(rng, kind);
        if (kind == 2 && rep % 2) x[size_t(rng.u32() % V)] = from_bits(0x7fc00001u);  // one NaN
        const int64_t want = definition(x);
        CHECK(dk::argmax_row_scalar(x.data(), V) == want) << "scalar V" << V << "kind" << kind;
        CHECK(dk::argmax_row(x.data(), V) == want) << "row V" << V << "kind" << kind << "got" << dk::argmax_row(x.data(), V)
                                                   << "want" << want;
      }
    }
  }
#if defined(__AVX512F__)
  std::printf("test_argmax: AVX-512 row kernel\n");
#else
  std::printf("test_argmax: scalar row kernel\n");
#endif
  return finish("test_argmax");
}
