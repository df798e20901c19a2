// sort_desc_stable's CPU kernel and its order key (include/decodekit/sampling/sort_desc.h) against the
// definition it must reproduce, torch.sort(x, descending=True, stable=True): a stable comparison sort
// whose "greater" is x > y with every NaN above everything (and equal to the others) and -0.0 == +0.0.
// Rows of awkward lengths (1, 2, 2047 .. 2049: one 11-bit digit's buckets, 49157, 131075) with heavy
// ties (values rounded to a few levels), NaNs of both signs and any payload, +-inf, +-0, subnormals, the
// float extremes; keys checked for order on random pairs; outputs poisoned before each call; scratch
// reused across rows of different lengths (as the kernel's thread-local buffers are).
#include <algorithm>
#include <numeric>
#include <vector>

#include "check.h"
#include "decodekit/sampling/sort_desc.h"

using namespace dk_test;

namespace {

bool is_nan(float x) { return x != x; }

// a sorts strictly before b in torch's descending order
bool before(float a, float b) {
  if (is_nan(a)) return !is_nan(b);
  if (is_nan(b)) return false;
  return a > b;  // -0.0 > +0.0 is false both ways: equal
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float special(Rng& rng) {
  switch (rng.u32() % 12) {
    case 0: return bits_to_float(0x7fc00000u | (rng.u32() & 0x3fffffu));  // +NaN, any payload
    case 1: return bits_to_float(0xff800001u + (rng.u32() & 0x3fffffu));  // -NaN (signalling bits too)
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return -std::numeric_limits<float>::infinity();
    case 4: return 0.f;
    case 5: return -0.f;
    case 6: return bits_to_float(rng.u32() & 0x007fffffu);                // +subnormal
    case 7: return bits_to_float(0x80000000u | (rng.u32() & 0x007fffffu));  // -subnormal
    case 8: return std::numeric_limits<float>::max();
    case 9: return -std::numeric_limits<float>::max();
    case 10: return std::numeric_limits<float>::min();
    default: return bits_to_float(rng.u32());                              // any bit pattern
  }
}

}  // namespace

int main() {
  Rng rng(20261203);
  // the key's order on random pairs (including specials)
  for (int i = 0; i < 2000000; ++i) {
    const float a = i % 3 ? float(rng.normal() * 4.0) : special(rng);
    const float b = i % 5 ? float(rng.normal() * 4.0) : special(rng);
    const uint32_t ka = dk::sort_desc_key(a), kb = dk::sort_desc_key(b);
    CHECK((ka < kb) == before(a, b)) << "a" << a << "b" << b;
    CHECK((ka == kb) == (!before(a, b) && !before(b, a))) << "a" << a << "b" << b;
  }
  std::vector<uint32_t> keys, tmp_keys, ids, tmp_ids;  // shared across rows, lengths going up and down
  const int64_t lengths[] = {1, 2, 3, 17, 2047, 2048, 2049, 49157, 5, 131075, 1000};
  for (int64_t V : lengths)
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(static_cast<size_t>(V));
      for (auto& e : x) {
        switch (kind) {
          case 0: e = float(rng.normal() * 3.0); break;                               // distinct
          case 1: e = float(std::round(rng.normal() * 2.0)) / 2.f; break;              // heavy ties
          case 2: e = rng.u32() % 4 ? float(std::round(rng.normal())) : special(rng); break;  // ties + specials
          case 3: e = -1.5f; break;                                                    // one value
          default: e = special(rng); break;                                            // specials only
        }
      }
      std::vector<float> values(static_cast<size_t>(V), std::numeric_limits<float>::quiet_NaN());
      std::vector<int64_t> indices(static_cast<size_t>(V), -7);
      dk::cpu::sort_desc_row(values.data(), indices.data(), x.data(), V, keys, tmp_keys, ids, tmp_ids);
      std::vector<int64_t> want(static_cast<size_t>(V));
      std::iota(want.begin(), want.end(), 0);
      std::stable_sort(want.begin(), want.end(), [&](int64_t i, int64_t j) { return before(x[size_t(i)], x[size_t(j)]); });
      int64_t bad = 0;
      for (int64_t r = 0; r < V; ++r) {
        const size_t s = size_t(r);
        const bool ok = indices[s] == want[s] && indices[s] >= 0 && indices[s] < V &&
                        std::memcmp(&values[s], &x[size_t(indices[s])], 4) == 0;
        if (!ok && bad++ < 3) {
          CHECK(ok) << "V" << V << "kind" << kind << "rank" << r << "got" << indices[s] << "want" << want[s];
        }
      }
      CHECK(bad == 0) << "V" << V << "kind" << kind << "wrong ranks:" << bad;
    }
  // the batched entry point: rows with a stride, each row its own order
  {
    const int64_t B = 5, V = 3001, stride = 3010;
    std::vector<float> x(static_cast<size_t>(B * stride), std::numeric_limits<float>::quiet_NaN());  // padding NaN
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v) x[size_t(b * stride + v)] = float(std::round(rng.normal() * 8.0));
    std::vector<float> values(static_cast<size_t>(B * V), -1.f);
    std::vector<int64_t> indices(static_cast<size_t>(B * V), -7);
    dk::cpu::sort_desc_stable(values.data(), indices.data(), x.data(), stride, B, V);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> want(static_cast<size_t>(V));
      std::iota(want.begin(), want.end(), 0);
      const float* row = x.data() + b * stride;
      std::stable_sort(want.begin(), want.end(), [&](int64_t i, int64_t j) { return before(row[i], row[j]); });
      bool same = true;
      for (int64_t r = 0; r < V; ++r)
        same &= indices[size_t(b * V + r)] == want[size_t(r)] && values[size_t(b * V + r)] == row[want[size_t(r)]];
      CHECK(same) << "strided row" << b;
    }
  }
  return dk_test::finish("test_sort_desc");
}
