// Speculative-decoding verification (Leviathan et al. 2023), one request, host and device: the
// rule the rejection_sample op (CPU kernel below, CUDA later) and the torch reference
// (decodekit.ops.reference.rejection_sample) all implement, with Philox numbers (philox.h) keyed
// by (seed, position), so a request's tokens depend on nothing else in the batch.
//
// Draft tokens x_0 .. x_{n-1} (n <= k) with draft probabilities q_i (or none: a deterministic
// drafter, q_i = one-hot(x_i)) and target probabilities p_0 .. p_n (row n: the bonus row):
//   for i in 0 .. n-1:  accept x_i iff u_i * q_i(x_i) < p_i(x_i)   (probability min(1, p/q)),
//                       u_i = philox_uniform(word 0 of philox(seed; ctr = (0, pos_i lo, pos_i hi,
//                       kStreamSpecAccept))), pos_i = position + i;
//                       at the first rejection emit a sample of max(p_i - q_i, 0) and stop;
//   all n accepted:     emit a sample of p_n (the bonus token).
// A "sample of w" (w >= 0, not normalised) is Gumbel-max: argmax_v log(w_v) + g_v with
// g_v = -log(-log(max(u_v, 2^-24))), u_v = token_uniform(seed, pos_i, v, kStreamSpecResample)
// (scale-free, so the residual needs no normalisation; ties -> the lowest v); an all-zero residual
// (p == q up to rounding) falls back to p_i.
// Greedy (temperature 0): accept iff x_i == argmax p_i (lowest index on ties), emit argmax p_i at
// the first mismatch, argmax p_n as the bonus.
// Emits 1 .. n + 1 tokens.
#pragma once
#include <cmath>
#include <cstdint>

#include "decodekit/common/macros.h"
#include "decodekit/sampling/gumbel_max.h"

namespace dk {

inline constexpr uint32_t kStreamSpecAccept = 1;
inline constexpr uint32_t kStreamSpecResample = 2;
inline constexpr uint32_t kStreamSpecDraft = 3;  // model drafters' own draws (Python: STREAM_SPEC_DRAFT)

DK_HD float spec_accept_uniform(uint64_t seed, uint64_t pos) {
  const Philox4 w = philox4x32_10(Philox4{{0u, uint32_t(pos), uint32_t(pos >> 32), kStreamSpecAccept}},
                                  uint32_t(seed), uint32_t(seed >> 32));
  return philox_uniform(w.v[0]);
}

DK_HD float spec_gumbel(uint64_t seed, uint64_t pos, uint32_t v) {
  return token_gumbel(seed, pos, v, kStreamSpecResample);
}

// Gumbel-max over weights w(v) for v in [v0, v1) (w: a callable, weights >= 0; v0 a multiple of 4, the
// Philox blocks of gumbel_max.h); -1 if all are zero. Ties -> the lowest v. The largest weight's key is
// drawn first; then each block of 4 tokens is offered with gumbel_offer_block_w, whose exact skips draw
// only the tokens that can still win (a peaked row: a compare per token; a flat one: a Philox block per 4
// tokens and the logs of those whose uniform can reach the running best). The result is exactly that of
// drawing every key. The CUDA kernel runs it per slice of the vocabulary (rejection.cuh) and merges the
// slices' (key, token) by the same order, so CPU and GPU agree.
template <class W>
DK_HD int64_t spec_sample_range(W w, int64_t v0, int64_t v1, uint64_t seed, uint64_t pos, float* key = nullptr) {
  int64_t first = -1;
  float wmax = 0.f;
  for (int64_t v = v0; v < v1; ++v) {
    const float x = w(v);
    if (x > wmax) {
      wmax = x;
      first = v;
    }
  }
  if (first < 0) {
    if (key) *key = -INFINITY;
    return -1;
  }
  float best = logf(wmax) + spec_gumbel(seed, pos, uint32_t(first));
  float below = gumbel_weight_floor(best);
  int64_t bi = first;
  // 64 tokens at a time, their weights first compared with `below` in a loop that vectorizes on the CPU:
  // a chunk where none reaches it has no token to draw (what the blocks' own test would find)
  constexpr int64_t kChunk = 64;
  for (int64_t c0 = v0; c0 < v1; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < v1 ? c0 + kChunk : v1;
    int reach = 0;
    for (int64_t v = c0; v < c1; ++v) reach |= w(v) >= below;
    if (!reach) continue;
    for (int64_t j = c0 / 4; 4 * j < c1; ++j)
      gumbel_offer_block_w(w, j, c1 - 4 * j < 4 ? int(c1 - 4 * j) : 4, first, seed, pos, kStreamSpecResample, best,
                           bi, below);
  }
  if (key) *key = best;
  return bi;
}

template <class W>
DK_HD int64_t spec_sample(W w, int64_t V, uint64_t seed, uint64_t pos) {
  return spec_sample_range(w, 0, V, seed, pos);
}

template <class W>
DK_HD int64_t spec_argmax(W w, int64_t V) {
  int64_t best = 0;
  float bv = w(0);
  for (int64_t v = 1; v < V; ++v)
    if (w(v) > bv) {
      bv = w(v);
      best = v;
    }
  return best;
}

// One request. p(i, v): target probability of token v at draft position i (i <= n); q(i, v): draft
// probability (has_q false: one-hot of the draft). out: n + 1 slots. Returns the tokens emitted.
template <class P, class Q>
DK_HD int spec_verify(const int64_t* draft, int n, P p, Q q, bool has_q, int64_t V, uint64_t seed, uint64_t position,
                      bool greedy, int64_t* out) {
  for (int i = 0; i < n; ++i) {
    const int64_t x = draft[i];
    const uint64_t pos = position + uint64_t(i);
    auto pi = [&](int64_t v) { return p(i, v); };
    if (greedy) {
      const int64_t t = spec_argmax(pi, V);
      out[i] = t;
      if (t != x) return i + 1;
      continue;
    }
    const bool in_vocab = x >= 0 && x < V;
    const float px = in_vocab ? p(i, x) : 0.f;
    const float qx = has_q ? (in_vocab ? q(i, x) : 0.f) : 1.f;
    if (in_vocab && qx > 0.f && spec_accept_uniform(seed, pos) * qx < px) {
      out[i] = x;
      continue;
    }
    auto resid = [&](int64_t v) {
      const float qv = has_q ? q(i, v) : (v == x ? 1.f : 0.f);
      const float r = p(i, v) - qv;
      return r > 0.f ? r : 0.f;
    };
    int64_t t = spec_sample(resid, V, seed, pos);
    if (t < 0) t = spec_sample(pi, V, seed, pos);
    out[i] = t;
    return i + 1;
  }
  auto pn = [&](int64_t v) { return p(n, v); };
  out[n] = greedy ? spec_argmax(pn, V) : spec_sample(pn, V, seed, position + uint64_t(n));
  return n + 1;
}

}  // namespace dk
