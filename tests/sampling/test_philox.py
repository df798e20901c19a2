"""Philox4x32-10: Random123 known answers, a scalar cross-check, the float mapping and the
sampling-noise layout (the contract include/decodekit/sampling/philox.h must match)."""
import random

import pytest
import torch

from dk_testing import DEVICES
from decodekit.sampling.philox import (derive_seed, gumbel_from_uniform, philox4x32,
                                       token_uniforms, uniform)

# Random123 tests/kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> output[4].
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]
M32 = 0xFFFFFFFF


def philox_scalar(ctr, key, rounds=10):
    """Textbook Philox4x32 on Python ints (bump the key before rounds 2..R)."""
    c, k = list(ctr), list(key)
    for r in range(rounds):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & M32]
    return tuple(c)


@pytest.mark.parametrize("device", DEVICES)
def test_known_answers(device):
    for ctr, key, want in KAT:
        got = philox4x32(tuple(torch.tensor(v, device=device) for v in ctr),
                         tuple(torch.tensor(v, device=device) for v in key))
        assert tuple(int(w) for w in got) == want
        assert philox_scalar(ctr, key) == want


@pytest.mark.parametrize("device", DEVICES)
def test_vectorised_matches_scalar(device):
    rng = random.Random(1)
    rows = [([rng.getrandbits(32) for _ in range(4)], [rng.getrandbits(32) for _ in range(2)])
            for _ in range(300)]
    rows += [([M32, 0, M32, 0], [0, M32]), ([1, 2, 3, 4], [5, 6])]
    ctr = [torch.tensor([r[0][i] for r in rows], device=device) for i in range(4)]
    key = [torch.tensor([r[1][i] for r in rows], device=device) for i in range(2)]
    got = torch.stack(philox4x32(ctr, key), dim=1).cpu().tolist()
    assert [tuple(g) for g in got] == [philox_scalar(c, k) for c, k in rows]


def test_broadcasting_and_ints():
    c0 = torch.arange(5)[None, :]
    k0 = torch.tensor([[7], [8]])
    out = philox4x32((c0, 1, 2, 3), (k0, 9))
    assert all(o.shape == (2, 5) for o in out)
    assert out[2][1, 3].item() == philox_scalar((3, 1, 2, 3), (8, 9))[2]


def test_uniform_mapping_exact():
    x = torch.tensor([0, 0xFF, 0x100, 0x80000000, 0xFFFFFEFF, 0xFFFFFF00, M32])
    u = uniform(x)
    assert u.dtype == torch.float32
    want = [0.0, 0.0, 2.0 ** -24, 0.5, 1 - 2.0 ** -23, 1 - 2.0 ** -24, 1 - 2.0 ** -24]
    assert u.tolist() == want                       # exact, never 1.0
    y = torch.randint(0, 2 ** 32, (10000,), dtype=torch.int64)
    assert torch.equal(uniform(y).double(), (y >> 8).double() / 2 ** 24)


@pytest.mark.parametrize("device", DEVICES)
def test_token_uniforms_layout(device):
    seeds = [0, 1, 2 ** 32 + 5, 2 ** 63 - 1]
    positions = [0, 7, 2 ** 32 + 3, 123456]
    V = 11
    u = token_uniforms(torch.tensor(seeds, device=device), torch.tensor(positions, device=device), V)
    assert u.shape == (4, V) and u.dtype == torch.float32
    u = u.cpu()
    for b, (s, pos) in enumerate(zip(seeds, positions)):
        key = (s & M32, s >> 32)
        for v in range(V):
            w = philox_scalar((v >> 2, pos & M32, pos >> 32, 0), key)[v & 3]
            assert u[b, v].item() == (w >> 8) / 2 ** 24, (b, v)


def test_token_uniforms_statistics():
    u = token_uniforms(torch.arange(100), torch.zeros(100, dtype=torch.int64), 1000)
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    # different seeds / positions / tokens are different streams
    assert not torch.equal(u[0], u[1])
    u2 = token_uniforms(torch.arange(100), torch.ones(100, dtype=torch.int64), 1000)
    assert (u2 == u).float().mean().item() < 0.01


def test_gumbel_finite():
    u = torch.tensor([0.0, 2.0 ** -24, 0.5, 1 - 2.0 ** -24])
    g = gumbel_from_uniform(u)
    assert torch.isfinite(g).all()
    assert g[0] == g[1]
    assert torch.all(torch.diff(g[1:]) > 0)
    assert g[-1].item() == pytest.approx(16.6355, abs=1e-3)


def test_derive_seed():
    assert derive_seed(1234, 0) == 1234
    ds = {derive_seed(1234, i) for i in range(1, 200)}
    assert len(ds) == 199 and all(0 <= d < 2 ** 63 for d in ds) and 1234 not in ds
    assert derive_seed(1234, 5) == derive_seed(1234, 5) != derive_seed(1235, 5)
