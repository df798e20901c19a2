// include/decodekit/sampling/gumbel_max.h: gumbel_argmax_row (which skips the keys that cannot win)
// against drawing every key with the same float arithmetic -- bit-for-bit the same token on every row:
// flat, peaked and huge-range logits, large offsets (the skips' rounding slack), rows masked with
// -inf, duplicated logits, vocabularies around the Philox block of 4, and the special rows (NaN,
// +inf, all -inf). Plus the skip tests' soundness at their boundaries: a token they skip never has a
// key at or above the running best.
#include "check.h"
#include "decodekit/sampling/gumbel_max.h"

namespace {

int64_t every_key(const std::vector<float>& x, uint64_t seed, uint64_t pos, uint32_t stream) {
  const int64_t V = int64_t(x.size());
  for (int64_t v = 0; v < V; ++v)
    if (x[v] != x[v]) return v;
  int64_t best = 0;
  float bk = -INFINITY;
  bool any = false;
  for (int64_t v = 0; v < V; ++v) {
    const float key = x[v] + dk::token_gumbel(seed, pos, uint32_t(v), stream);
    if (!any || key > bk) {
      bk = key;
      best = v;
      any = true;
    }
  }
  return best;
}

void rows(dk_test::Rng& rng, int64_t V, double scale, double offset, double masked, bool dup, int n) {
  for (int r = 0; r < n; ++r) {
    std::vector<float> x(static_cast<size_t>(V));
    for (auto& e : x) e = float(offset + scale * rng.normal());
    if (dup)
      for (int64_t v = 1; v < V; v += 2) x[size_t(v)] = x[size_t(v - 1)];
    if (masked > 0)
      for (auto& e : x)
        if (rng.uniform() < masked) e = -INFINITY;
    const uint64_t seed = rng.next() >> 1, pos = rng.next() >> (rng.u32() % 64);
    const uint32_t stream = rng.u32() % 4;
    const int64_t got = dk::gumbel_argmax_row(x.data(), V, seed, pos, stream);
    const int64_t want = every_key(x, seed, pos, stream);
    CHECK(got == want) << "V" << V << "scale" << scale << "offset" << offset << "masked" << masked << "dup" << dup
                       << "row" << r << ": got" << got << "want" << want;
  }
}

}  // namespace

int main() {
  dk_test::Rng rng(2026);
  for (int64_t V : {1, 2, 3, 4, 5, 7, 8, 9, 63, 1023, 4099}) {
    for (double scale : {0.0, 0.01, 0.5, 2.0, 5.0, 20.0, 1e3})
      for (double offset : {0.0, -50.0, 3e4, -2e6})
        rows(rng, V, scale, offset, 0.0, false, V > 1000 ? 6 : 40);
    rows(rng, V, 3.0, 0.0, 0.9, false, 40);
    rows(rng, V, 3.0, 10.0, 0.5, true, 40);
    rows(rng, V, 0.0, 1.0, 0.0, true, 10);  // all equal: the lowest token of the best key
  }
  // special rows (torch.argmax(x + g) semantics)
  {
    std::vector<float> x(37, 1.f);
    x[9] = NAN;
    x[20] = NAN;
    CHECK(dk::gumbel_argmax_row(x.data(), 37, 1, 2, 0) == 9);
    x.assign(37, -INFINITY);
    CHECK(dk::gumbel_argmax_row(x.data(), 37, 1, 2, 0) == 0);
    x[30] = -3e38f;
    CHECK(dk::gumbel_argmax_row(x.data(), 37, 1, 2, 0) == 30);
    x[11] = INFINITY;
    x[12] = INFINITY;
    CHECK(dk::gumbel_argmax_row(x.data(), 37, 1, 2, 0) == 11);
  }
  // the skip tests never skip a key that reaches best: every (x, best, word) near their boundaries
  long long skipped = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float best = float(rng.uniform(-30.0, 30.0)) * (i % 3 == 0 ? 1e4f : 1.f);
    const float x = best - float(rng.uniform(-1.0, 18.0));
    uint32_t word = rng.u32();
    if (i % 2) word |= 0xFF000000u;  // u near 1: the large keys
    const float key = x + dk::gumbel_from_uniform(dk::philox_uniform(word));
    const bool skip = dk::gumbel_out_of_reach(x, best) || !dk::gumbel_may_win(x, best, word);
    skipped += skip;
    if (skip) CHECK(key < best) << "x" << x << "best" << best << "word" << word << "key" << key;
  }
  CHECK(skipped > 500000) << "the skips should fire on most of these draws:" << skipped;
  return dk_test::finish("test_gumbel_max");
}
