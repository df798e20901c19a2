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
#include "decodekit/sampling/argmax.h"  // argmax_key: torch.argmax's order (NaN first)
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

// Gumbel-max over weights w(v) for v < V (w: a callable, weights >= 0); -1 if all are zero. Ties -> the
// lowest v. The largest weight's key is drawn first; then each block of 4 tokens (the Philox blocks of
// gumbel_max.h) is offered with gumbel_offer_block_w, whose exact skips draw only the tokens that can
// still win (a peaked row: a compare per token; a flat one: a Philox block per 4 tokens and the logs of
// those whose uniform can reach the running best). The result is exactly that of drawing every key.
// (The CUDA kernel, rejection.cuh, draws slices of the row the same way and merges them by the same order.)
template <class W>
DK_HD int64_t spec_sample(W w, int64_t V, uint64_t seed, uint64_t pos) {
  int64_t first = -1;
  float wmax = 0.f;
  for (int64_t v = 0; v < V; ++v) {
    const float x = w(v);
    if (x > wmax) {
      wmax = x;
      first = v;
    }
  }
  if (first < 0) return -1;
  float best = logf(wmax) + spec_gumbel(seed, pos, uint32_t(first));
  float below = gumbel_weight_floor(best);
  int64_t bi = first;
  // 64 tokens at a time, their weights first compared with `below` in a loop that vectorizes on the CPU:
  // a chunk where none reaches it has no token to draw (what the blocks' own test would find)
  constexpr int64_t kChunk = 64;
  for (int64_t c0 = 0; c0 < V; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < V ? c0 + kChunk : V;
    int reach = 0;
    for (int64_t v = c0; v < c1; ++v) reach |= w(v) >= below;
    if (!reach) continue;
    for (int64_t j = c0 / 4; 4 * j < c1; ++j)
      gumbel_offer_block_w(w, j, c1 - 4 * j < 4 ? int(c1 - 4 * j) : 4, first, seed, pos, kStreamSpecResample, best,
                           bi, below);
  }
  return bi;
}

// The residual weight max(p - q, 0) the rule samples at a rejection (q: the draft probability, or the
// one-hot draft's 0 / 1).
DK_HD float spec_residual(float p, float q) {
  const float r = p - q;
  return r > 0.f ? r : 0.f;
}

// Sampled mode: the first draft position the accept rule rejects (n: all n accepted, the bonus row next).
// p(i, v), q(i, v), has_q as spec_verify.
template <class P, class Q>
DK_HD int spec_first_rejected(const int64_t* draft, int n, P p, Q q, bool has_q, int64_t V, uint64_t seed,
                              uint64_t position) {
  for (int i = 0; i < n; ++i) {
    const int64_t x = draft[i];
    const bool in_vocab = x >= 0 && x < V;
    const float px = in_vocab ? p(i, x) : 0.f;
    const float qx = has_q ? (in_vocab ? q(i, x) : 0.f) : 1.f;
    if (!(in_vocab && qx > 0.f && spec_accept_uniform(seed, position + uint64_t(i)) * qx < px)) return i;
  }
  return n;
}

// Greedy's token of a row: torch.argmax's rule (argmax.h: the largest value, ties -> the lowest index, the first
// NaN beats everything), compared as argmax_key integers like the CUDA kernel's slices.
template <class W>
DK_HD int64_t spec_argmax(W w, int64_t V) {
  int64_t best = 0;
  uint32_t bk = argmax_key(w(0));
  for (int64_t v = 1; v < V; ++v) {
    const uint32_t k = argmax_key(w(v));
    if (k > bk) {
      bk = k;
      best = v;
    }
  }
  return best;
}

// One request. p(i, v): target probability of token v at draft position i (i <= n); q(i, v): draft
// probability (has_q false: one-hot of the draft). out: n + 1 slots. Returns the tokens emitted.
template <class P, class Q>
DK_HD int spec_verify(const int64_t* draft, int n, P p, Q q, bool has_q, int64_t V, uint64_t seed, uint64_t position,
                      bool greedy, int64_t* out) {
  if (greedy) {
    for (int i = 0; i < n; ++i) {
      out[i] = spec_argmax([&](int64_t v) { return p(i, v); }, V);
      if (out[i] != draft[i]) return i + 1;
    }
    out[n] = spec_argmax([&](int64_t v) { return p(n, v); }, V);
    return n + 1;
  }
  const int r = spec_first_rejected(draft, n, p, q, has_q, V, seed, position);
  for (int i = 0; i < r; ++i) out[i] = draft[i];
  const uint64_t pos = position + uint64_t(r);
  auto pr = [&](int64_t v) { return p(r, v); };
  if (r == n) {
    out[n] = spec_sample(pr, V, seed, pos);  // all accepted: the bonus token
    return n + 1;
  }
  const int64_t x = draft[r];
  int64_t t = spec_sample([&](int64_t v) { return spec_residual(p(r, v), has_q ? q(r, v) : (v == x ? 1.f : 0.f)); },
                          V, seed, pos);
  if (t < 0) t = spec_sample(pr, V, seed, pos);
  out[r] = t;
  return r + 1;
}

}  // namespace dk
