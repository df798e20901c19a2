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
  // the skip tests never skip a key that reaches best. gumbel_may_win is monotone in the word (a larger
  // u, a larger key), so bisect for the largest word it skips and check that key: the boundary itself,
  // where the rounding slack matters, not random words that rarely land on it.
  long long bounded = 0;
  auto largest_skipped = [](float x, float best) -> int64_t {  // -1: no word is skipped
    if (dk::gumbel_may_win(x, best, 1u << 8)) return -1;
    uint32_t lo = 1, hi = (1u << 24) - 1;  // u = m 2^-24: skipped at lo
    if (!dk::gumbel_may_win(x, best, hi << 8)) return hi;
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (dk::gumbel_may_win(x, best, mid << 8) ? hi : lo) = mid;
    }
    return lo;
  };
  for (int i = 0; i < 400000; ++i) {
    static const float mags[] = {1.f, 30.f, 1e3f, 1.6e7f, 3.3e7f, 1e9f, 3e38f};
    const float mag = mags[i % 7];
    const float best = float(rng.uniform(-1.0, 1.0)) * mag;
    // best - x near 0, near k ln 2 (the power-of-two bound's steps), near 16.64 / 17 (the largest key)
    double gap = rng.uniform(-0.5, 18.0);
    if (i % 3 == 1) gap = 0.6931471805599453 * double(1 + rng.u32() % 24) + rng.uniform(-1e-3, 1e-3);
    if (i % 3 == 2) gap = 16.6355 + rng.uniform(-0.5, 0.5);
    const float x = best - float(gap);
    if (dk::gumbel_out_of_reach(x, best))  // skipped without a draw: even the largest key stays below
      CHECK(x + dk::gumbel_from_uniform(dk::philox_uniform(0xFFFFFFFFu)) < best) << "x" << x << "best" << best;
    const int64_t m = largest_skipped(x, best);
    if (m < 0) continue;
    ++bounded;
    for (uint32_t w : {uint32_t(m) << 8, (uint32_t(m) << 8) | 0xFFu}) {
      const float key = x + dk::gumbel_from_uniform(dk::philox_uniform(w));
      CHECK(key < best) << "x" << x << "best" << best << "word" << w << "key" << key;
    }
  }
  CHECK(bounded > 100000) << "boundary cases:" << bounded;
  // rows at large offsets with rounded (tied) logits: the slack's size-scaled term
  for (double offset : {1.6e7, 3.3e7, -3.3e7})
    for (int r = 0; r < 400; ++r) {
      const int64_t V = 64;
      std::vector<float> x(static_cast<size_t>(V));
      for (auto& e : x) e = float(offset + 2.0 * std::round(3.0 * rng.normal()) / 3.0);
      const uint64_t seed = rng.next() >> 1, pos = rng.u32();
      CHECK(dk::gumbel_argmax_row(x.data(), V, seed, pos, 0) == every_key(x, seed, pos, 0))
          << "offset" << offset << "row" << r;
    }
  return dk_test::finish("test_gumbel_max");
}
