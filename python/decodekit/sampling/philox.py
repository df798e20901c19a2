"""Philox4x32-10 counter-based RNG in vectorised torch integer ops (CPU and CUDA).

Random123's Philox4x32 with 10 rounds (Salmon et al., SC'11). Every 32-bit word is held in
an int64 tensor with value in [0, 2**32); the 32x32 -> 64-bit product is computed from
16-bit halves so no int64 ever overflows (no reliance on wrap-around). Any shapes that
broadcast together may be passed: one call evaluates the whole [B, V] noise of a decode
step in a fixed sequence of elementwise kernels (no host sync, CUDA-graph capturable).

Contract shared with include/decodekit/sampling/philox.h (the C++/CUDA port must match
this bit for bit; the Random123 known-answer vectors are in tests/sampling/test_philox.py):

* round(ctr, key):   (hi0, lo0) = mulhilo(0xD2511F53, ctr[0])
                     (hi1, lo1) = mulhilo(0xCD9E8D57, ctr[2])
                     ctr = (hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0)
  10 rounds; before rounds 2..10 the key is bumped: key[0] += 0x9E3779B9,
  key[1] += 0xBB67AE85 (mod 2**32).
* key from a 64-bit seed:   key = (seed & 0xFFFFFFFF, seed >> 32).
* uint32 -> float (``uniform``):  u = float32(x >> 8) * 2**-24, i.e. the top 24 bits as a
  multiple of 2**-24: u in {0, 2**-24, ..., 1 - 2**-24}, exact in float32, never 1.0.
* sampling-noise layout (``token_uniforms``): the uniform for (seed, position, token v) is
  word (v & 3) of philox(key(seed), ctr = (v >> 2, position & 0xFFFFFFFF, position >> 32,
  STREAM_SAMPLING = 0)). Word 3 of the counter is a stream tag so other consumers
  (speculative decoding: acceptance 1, residual 2, model drafters' draws STREAM_SPEC_DRAFT = 3)
  use STREAM_* != 0 without overlapping.
* Gumbel noise (``gumbel_from_uniform``): g = -log(-log(max(u, 2**-24))). The clamp maps
  u == 0 to the smallest non-zero u, so g is always finite (in about [-2.8, 16.6]) and a
  masked token (logit -inf) stays -inf. log is not bit-reproducible across libms, so
  only u is bit-exact across implementations; g agrees to a few ulp.
"""
from __future__ import annotations

import torch

M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF
ROUNDS = 10
STREAM_SAMPLING = 0
STREAM_SEED_DERIVE = 0x5EED
STREAM_SPEC_DRAFT = 3   # model drafters' draws (1 and 2: the verifier's, include/decodekit/sampling/rejection.h)
UNIFORM_SCALE = 2.0 ** -24


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product m * x (m a uint32 constant, x in [0, 2**32))."""
    a = (x & 0xFFFF) * m                 # < 2**48
    b = (x >> 16) * m                    # < 2**48; product = a + b * 2**16
    t = a + ((b & 0xFFFF) << 16)         # < 2**48 + 2**32
    lo = t & MASK32
    hi = (t >> 32) + (b >> 16)           # = floor(m * x / 2**32) < 2**32
    return hi, lo


def philox4x32(counter, key, rounds: int = ROUNDS) -> tuple[torch.Tensor, ...]:
    """Philox4x32-R of ``counter`` (4 words) under ``key`` (2 words).

    Words are int64 tensors (or Python ints) with values in [0, 2**32) that broadcast
    together; returns 4 int64 tensors in [0, 2**32) of the broadcast shape.
    """
    tensors = [t for t in (*counter, *key) if isinstance(t, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")

    def as_t(v):
        if isinstance(v, torch.Tensor):
            return v.to(torch.int64)
        # torch.full is a fill kernel, not a host-to-device copy: CUDA-graph capturable
        return torch.full((), int(v) & MASK32, dtype=torch.int64, device=device)

    c0, c1, c2, c3 = (as_t(v) for v in counter)
    k0, k1 = (as_t(v) for v in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    shape = torch.broadcast_shapes(c0.shape, c1.shape, c2.shape, c3.shape)
    return tuple(c.expand(shape) for c in (c0, c1, c2, c3))


def seed_to_key(seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split int64 seeds in [0, 2**63) into the key words (low, high)."""
    seed = seed.to(torch.int64)
    return seed & MASK32, (seed >> 32) & MASK32


def uniform(x: torch.Tensor) -> torch.Tensor:
    """uint32 words (int64 tensor) -> float32 in [0, 1): float32(x >> 8) * 2**-24 (exact)."""
    return (x >> 8).to(torch.float32) * UNIFORM_SCALE


def token_uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                   stream: int = STREAM_SAMPLING) -> torch.Tensor:
    """[B, V] float32 uniforms; row b depends only on (seeds[b], positions[b], v).

    ``seeds`` and ``positions`` are [B] int64 tensors (seed in [0, 2**63), position >= 0)
    on the target device. Layout: see the module docstring.
    """
    device = seeds.device
    n_blocks = (vocab_size + 3) // 4
    k0, k1 = seed_to_key(seeds[:, None])
    pos = positions.to(torch.int64)[:, None]
    c0 = torch.arange(n_blocks, dtype=torch.int64, device=device)[None, :]
    words = philox4x32((c0, pos & MASK32, (pos >> 32) & MASK32, stream), (k0, k1))
    # words[w][b, j] is the uniform of token 4*j + w
    x = torch.stack(words, dim=-1).reshape(seeds.shape[0], n_blocks * 4)[:, :vocab_size]
    return uniform(x)


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log(max(u, 2**-24))): finite for every u in [0, 1)."""
    return -torch.log(-torch.log(u.clamp_min(UNIFORM_SCALE)))


def token_gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] float32 Gumbel noise for the sampling stream (see ``token_uniforms``)."""
    return gumbel_from_uniform(token_uniforms(seeds, positions, vocab_size))


def derive_seed(seed: int, index: int) -> int:
    """Seed of the ``index``-th parallel sample (n > 1) of a request seeded with ``seed``.

    index 0 keeps ``seed``; index i > 0 takes the low 63 bits of words (0, 1) of
    philox(key(seed), ctr=(i & 0xFFFFFFFF, i >> 32, 0, STREAM_SEED_DERIVE)).
    """
    if index == 0:
        return int(seed)
    key = (int(seed) & MASK32, (int(seed) >> 32) & MASK32)
    w = philox4x32((int(index) & MASK32, (int(index) >> 32) & MASK32, 0, STREAM_SEED_DERIVE), key)
    return (int(w[0]) | (int(w[1]) << 32)) & ((1 << 63) - 1)
