// Philox4x32-10 counter-based RNG (Random123, Salmon et al. SC'11) for host and device: the C++ /
// CUDA port of python/decodekit/sampling/philox.py, bit for bit (the contract is that file's
// docstring): 10 rounds of (hi, lo) = mulhilo with 0xD2511F53 / 0xCD9E8D57, the key bumped by
// (0x9E3779B9, 0xBB67AE85) before rounds 2..10; key = (seed low, seed high); a word -> float32
// uniform as (x >> 8) * 2^-24 (exact, in [0, 1)); the sampling-noise layout puts token v of
// (seed, position) in word v & 3 of philox(ctr = (v >> 2, position lo, position hi, stream)).
// Streams keep consumers apart (0: sampling noise; speculative decoding uses its own).
#pragma once
#include <cstdint>

#include "decodekit/common/macros.h"

namespace dk {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
inline constexpr uint32_t kStreamSampling = 0;
inline constexpr uint32_t kStreamSeedDerive = 0x5EED;

struct Philox4 { uint32_t v[4]; };

DK_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t(kPhiloxM0) * c.v[0], p1 = uint64_t(kPhiloxM1) * c.v[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// Word i (0..3) of a block, by selects: indexing v[i] with a run-time i puts the block in local memory on
// the GPU.
DK_HD uint32_t philox_word(const Philox4& w, int i) {
  return i == 0 ? w.v[0] : i == 1 ? w.v[1] : i == 2 ? w.v[2] : w.v[3];
}

// A 32-bit word as a float32 uniform in [0, 1): its top 24 bits times 2^-24 (exact).
DK_HD float philox_uniform(uint32_t x) { return float(x >> 8) * 5.9604644775390625e-8f; }

// The uniform of token v for (seed, position) in `stream` (the layout of token_uniforms).
DK_HD float token_uniform(uint64_t seed, uint64_t position, uint32_t v, uint32_t stream = kStreamSampling) {
  const Philox4 w = philox4x32_10(Philox4{{v >> 2, uint32_t(position), uint32_t(position >> 32), stream}},
                                  uint32_t(seed), uint32_t(seed >> 32));
  return philox_uniform(w.v[v & 3]);
}

// Seed of the index-th parallel sample (n > 1) of a request seeded with seed (derive_seed).
DK_HD uint64_t derive_seed(uint64_t seed, uint64_t index) {
  if (index == 0) return seed;
  const Philox4 w = philox4x32_10(Philox4{{uint32_t(index), uint32_t(index >> 32), 0u, kStreamSeedDerive}},
                                  uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(w.v[0]) | (uint64_t(w.v[1]) << 32)) & ((uint64_t(1) << 63) - 1);
}

}  // namespace dk
