// Gumbel-max sampling from logits, host and device: the rule of the gumbel_argmax op (CPU kernel
// below, CUDA in gumbel_max.cuh) and of its torch reference (decodekit.ops.reference.gumbel_argmax):
//
//   token = argmax_v  x_v + g_v,   g_v = -log(-log(max(u_v, 2^-24))),
//   u_v = token_uniform(seed, position, v, stream)   (philox.h; the sampler's noise is stream 0)
//
// ties -> the lowest v; rows as torch.argmax(x + g) treats them: a NaN logit -> the first NaN, a
// +inf maximum -> the first +inf, every logit -inf -> 0. A logit of -inf is never drawn otherwise.
//
// Drawing all V keys costs a Philox block per 4 tokens and two logs per token; most are skipped,
// exactly. The maximum logit's key `best` is drawn first; a token can still reach it only if
// x + g >= best, and g <= -log(1 - u) (as -log u >= 1 - u), so
//   * x + 17 < best (17 > the largest key, -log(-log(1 - 2^-24)) = 16.64): out of reach, no draw;
//   * else its Philox word decides: 1 - u > exp(x - best + slack) (bounded by a power of two, from
//     integers) means g < best - x - slack: skipped without logs.
// `slack` covers logf's and the additions' rounding, so a skipped key is strictly below `best` and
// the result is bit for bit that of evaluating every key. The keys left to evaluate number about
// 2 sum_v exp(x_v - best) ~ 2 / p_max (filtered rows: only their finite logits).
#pragma once
#include <cmath>
#include <cstdint>

#include "decodekit/common/macros.h"
#include "decodekit/sampling/argmax.h"
#include "decodekit/sampling/philox.h"

// The skips' slack assumes logf within a few ulp: fast-math logs (__logf) are not.
#if defined(__USE_FAST_MATH__) || defined(__FAST_MATH__)
#error "decodekit/sampling/gumbel_max.h needs accurate logf: build without fast math"
#endif

namespace dk {

inline constexpr float kUniformMin = 5.9604644775390625e-8f;  // 2^-24, the smallest non-zero uniform
inline constexpr float kGumbelMax = 17.f;  // > the largest key (16.64), with room for rounding

// g = -log(-log(max(u, 2^-24))): finite for every u in [0, 1) (about [-2.8, 16.64]).
DK_HD float gumbel_from_uniform(float u) {
  u = u < kUniformMin ? kUniformMin : u;
  return -logf(-logf(u));
}

// The Gumbel key of token v for (seed, position) in `stream`.
DK_HD float token_gumbel(uint64_t seed, uint64_t position, uint32_t v, uint32_t stream) {
  return gumbel_from_uniform(token_uniform(seed, position, v, stream));
}

// A finite (or -inf) logit x whose key stays below `best` whatever its draw.
DK_HD bool gumbel_out_of_reach(float x, float best) { return x + kGumbelMax < best; }

// False when logit x with Philox word `word` has a key x + g < best for sure (see the header).
DK_HD bool gumbel_may_win(float x, float best, uint32_t word) {
  const float t = best - x - (1e-3f + 1e-6f * (fabsf(x) + fabsf(best)));  // g must reach t
  if (!(t > 0.f)) return true;
  const float e = ceilf(-t * 1.44269504f + 1e-3f);  // exp(-t) <= 2^e
  if (e >= 0.f) return true;
  if (e < -24.f) return false;
  const uint32_t m = (word >> 8) > 1u ? (word >> 8) : 1u;  // u = m 2^-24 (clamped as gumbel_from_uniform)
  return (1u << 24) - m <= (1u << (24 + int(e)));          // 1 - u <= 2^e
}

// Offers tokens 4j .. 4j+n-1 (n <= 4; one Philox block) to the running best (best, bi), all but
// `skip` (whose key is already in). x(v): the logit of token v. Ties -> the lower v.
template <class X>
DK_HD void gumbel_offer_block(X x, int64_t j, int n, int64_t skip, uint64_t seed, uint64_t position, uint32_t stream,
                              float& best, int64_t& bi) {
  const int64_t v0 = 4 * j;
  bool any = false;
  for (int i = 0; i < n; ++i) any |= v0 + i != skip && !gumbel_out_of_reach(x(v0 + i), best);
  if (!any) return;
  const Philox4 w = philox4x32_10(Philox4{{uint32_t(j), uint32_t(position), uint32_t(position >> 32), stream}},
                                  uint32_t(seed), uint32_t(seed >> 32));
  for (int i = 0; i < n; ++i) {
    const int64_t v = v0 + i;
    const float xv = x(v);
    const uint32_t word = philox_word(w, i);
    if (v == skip || gumbel_out_of_reach(xv, best) || !gumbel_may_win(xv, best, word)) continue;
    const float key = xv + gumbel_from_uniform(philox_uniform(word));
    if (key > best || (key == best && v < bi)) {
      best = key;
      bi = v;
    }
  }
}

// gumbel_offer_block for weights instead of logits: token v's key is log(w(v)) + g_v (w(v) >= 0; 0 or NaN:
// never drawn), the logs taken only for tokens that pass the weight-space test w >= exp(best - 17) (below
// it a key cannot reach best, as gumbel_out_of_reach), so a peaked row costs a compare per token.
// Bit for bit the keys log(w) + g of a scan that evaluates every token (the rejection sampler's rule).
// `below` = gumbel_weight_floor(best), kept by the caller (updated here when best moves), so a block costs no exp.
DK_HD float gumbel_weight_floor(float best) {
  return expf(best - kGumbelMax);  // rounds either way by an ulp: 0.36 of margin in the key
}

template <class W>
DK_HD void gumbel_offer_block_w(W w, int64_t j, int n, int64_t skip, uint64_t seed, uint64_t position,
                                uint32_t stream, float& best, int64_t& bi, float& below) {
  const int64_t v0 = 4 * j;
  bool any = false;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i < n && v0 + i != skip) {
      const float x = w(v0 + i);
      any |= x > 0.f && !(x < below);
    }
  if (!any) return;
  const Philox4 ph = philox4x32_10(Philox4{{uint32_t(j), uint32_t(position), uint32_t(position >> 32), stream}},
                                   uint32_t(seed), uint32_t(seed >> 32));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t v = v0 + i;
    if (i >= n || v == skip) continue;
    const float x = w(v);
    if (!(x > 0.f) || x < below) continue;
    const float lx = logf(x);
    const uint32_t word = philox_word(ph, i);
    if (!gumbel_may_win(lx, best, word)) continue;
    const float key = lx + gumbel_from_uniform(philox_uniform(word));
    if (key > best || (key == best && v < bi)) {
      best = key;
      bi = v;
      below = gumbel_weight_floor(best);
    }
  }
}

// One row of V logits (x: contiguous), on one thread: the token of the header's rule.
inline int64_t gumbel_argmax_row(const float* x, int64_t V, uint64_t seed, uint64_t position, uint32_t stream) {
  const int64_t first = argmax_row(x, V);  // the first NaN, else the first maximum
  const float xmax = x[first];
  if (!(xmax > -INFINITY) || xmax == INFINITY) return first;  // NaN, every logit -inf, or +inf
  float best = xmax + token_gumbel(seed, position, uint32_t(first), stream);
  int64_t bi = first;
  auto xv = [x](int64_t v) { return x[v]; };
  for (int64_t j = 0; 4 * j < V; ++j) {
    const int n = V - 4 * j < 4 ? int(V - 4 * j) : 4;
    gumbel_offer_block(xv, j, n, first, seed, position, stream, best, bi);
  }
  return bi;
}

}  // namespace dk
