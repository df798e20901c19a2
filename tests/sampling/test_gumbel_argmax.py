"""gumbel_argmax (include/decodekit/sampling/gumbel_max.h): the kernels draw only the Gumbel keys that can
win, so their token must be the argmax of *every* key. Oracle: the reference's keys in float64 from the
same Philox uniforms. The kernel's keys are float32 (x + g with logf), so a token may differ from the
float64 argmax only where the two best float64 keys lie within float32 rounding of each other
(|key| <= ~1e3 here: a few 1e-5); every other row must match exactly."""
from __future__ import annotations

import pytest
import torch

from dk_testing import DEVICES, cuda_only, strided_rows
from decodekit import ops
from decodekit.ops import reference
from decodekit.sampling.philox import gumbel_from_uniform, token_uniforms

_ops = torch.ops.decodekit
NEAR_TIE = 1e-4


def _keys64(x, seeds, positions, stream):  # [B, V] float64 keys of the reference
    u = token_uniforms(seeds.cpu(), positions.cpu(), x.shape[1], stream).double()
    return x.cpu().double() + gumbel_from_uniform(u)


def _check(tok, x, seeds, positions, stream, what=""):
    """tok [B]: each row's token is the float64 argmax, or within NEAR_TIE of its key."""
    keys = _keys64(x, seeds, positions, stream)
    want = keys.argmax(dim=1)
    tok = tok.cpu()
    assert tok.dtype == torch.int64 and tok.shape == want.shape
    for b in torch.nonzero(tok != want).flatten().tolist():
        t = int(tok[b])
        assert 0 <= t < x.shape[1], f"{what} row {b}: token {t} out of range"
        gap = float(keys[b, want[b]] - keys[b, t])
        assert gap <= NEAR_TIE and torch.isfinite(x[b, t].cpu()), \
            f"{what} row {b}: token {t}, want {int(want[b])} (key gap {gap:.3g})"
    return int((tok != want).sum())


def _inputs(B, V, gen, scale, masked=0.0, device="cpu"):
    x = torch.randn(B, V, generator=gen) * scale
    if masked:
        drop = torch.rand(B, V, generator=gen) < masked
        drop[torch.arange(B), torch.randint(0, V, (B,), generator=gen)] = False   # one survivor at least
        x = x.masked_fill(drop, float("-inf"))
    seeds = torch.randint(0, 2 ** 62, (B,), generator=gen) * 2 + 1
    positions = torch.randint(0, 2 ** 40, (B,), generator=gen)
    return x.to(device), seeds.to(device), positions.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [1, 2, 3, 5, 13, 257, 4099, 49157])
def test_matches_every_key(device, V):
    gen = torch.Generator().manual_seed(V)
    near = total = 0
    for scale, masked, stream in [(0.1, 0, 0), (2.0, 0, 0), (9.0, 0, 3), (40.0, 0, 0), (3.0, 0.97, 2),
                                  (1.0, 0.5, 0xFFFFFFFF)]:
        B = 7
        x, seeds, positions = _inputs(B, V, gen, scale, masked, device)
        out = torch.full((B,), -7, dtype=torch.int64, device=device)   # poison: every row must be written
        _ops.gumbel_argmax(out, x, seeds, positions, stream)
        near += _check(out, x, seeds, positions, stream, f"V={V} scale={scale} masked={masked}")
        total += B
        # the float32 reference (torch's own log) agrees the same way
        _check(reference.gumbel_argmax(x.cpu(), seeds.cpu(), positions.cpu(), stream), x, seeds, positions, stream)
    assert near <= total // 20


@pytest.mark.parametrize("device", DEVICES)
def test_skip_boundary_tokens(device):
    """Tokens 16-17 below the maximum win only with a near-maximal draw while the maximum draws low: the
    boundary of the kernels' skips. Many seeds; every winner must be the float64 argmax."""
    V = 4096
    x = torch.full((V,), -30.0)
    x[0] = 0.0
    x[1:] = -torch.linspace(1.0, 17.5, V - 1)           # up to past the out-of-reach bound (17)
    B = 512
    x = x[None, :].repeat(B, 1).to(device)
    seeds = torch.arange(B, dtype=torch.int64, device=device) * 7919 + 5
    positions = torch.arange(B, dtype=torch.int64, device=device)
    tok = ops.gumbel_argmax(x, seeds, positions, 0)
    _check(tok, x, seeds, positions, 0)
    keys = _keys64(x, seeds, positions, 0)
    assert int((keys.argmax(dim=1) != 0).sum()) > B // 2, "the test should exercise wins away from the maximum"


@pytest.mark.parametrize("device", DEVICES)
def test_special_rows(device):
    """As torch.argmax(x + g): the first NaN, the first +inf, 0 when every logit is -inf; a single finite
    logit among -inf is always drawn."""
    inf, nan = float("inf"), float("nan")
    V = 300
    rows = torch.zeros(6, V)
    rows[0, 17] = nan
    rows[0, 200] = nan
    rows[1, 40] = inf
    rows[1, 41] = inf
    rows[1, 5] = 3.0
    rows[2] = -inf
    rows[3] = -inf
    rows[3, 299] = -1e30
    rows[4] = -inf
    rows[4, 123] = 5.0
    rows[4, 124] = -1e9
    rows[5, :] = 1e30                                   # huge equal logits: the keys round to ties
    seeds = torch.arange(6, dtype=torch.int64) + 99
    positions = torch.zeros(6, dtype=torch.int64)
    tok = ops.gumbel_argmax(rows.to(device), seeds.to(device), positions.to(device), 0).cpu()
    assert tok.tolist() == [17, 40, 0, 299, 123, 0]   # row 5: every key rounds to 1e30, a tie -> the first
    assert int(reference.gumbel_argmax(rows[5:], seeds[5:], positions[5:])) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_row_stride_and_batch_invariance(device):
    """Rows of a padded buffer (NaN padding: a read past the row would be drawn); a row's token depends only
    on (row, seed, position): the same in any batch, alone or reordered."""
    gen = torch.Generator().manual_seed(3)
    B, V = 9, 1031
    x, buf = strided_rows(B, V, torch.float32, device, gen, pad=5)
    x.mul_(4.0)
    seeds = torch.randint(0, 2 ** 62, (B,), generator=gen).to(device)
    positions = torch.randint(0, 2 ** 33, (B,), generator=gen).to(device)
    tok = ops.gumbel_argmax(x, seeds, positions, 0)
    _check(tok, x, seeds, positions, 0)
    perm = torch.randperm(B, generator=gen).to(device)
    assert torch.equal(ops.gumbel_argmax(x[perm].contiguous(), seeds[perm], positions[perm], 0), tok[perm])
    for b in (0, 4, 8):
        assert torch.equal(ops.gumbel_argmax(x[b:b + 1], seeds[b:b + 1], positions[b:b + 1], 0), tok[b:b + 1])
    assert not ops.gumbel_argmax(x, seeds, positions, 1).equal(tok)   # another stream, other tokens


def test_distribution_chi_square():
    """Over many seeds the tokens follow softmax(x) (the skips must not bias anything)."""
    V, n = 12, 20000
    x = torch.tensor([3.0, 2.5, 0.0, -1.0, -4.0, -8.0, -12.0, -16.0, 1.0, 1.0, -30.0, float("-inf")])
    p = torch.softmax(x.double(), 0)
    tok = ops.gumbel_argmax(x[None, :].expand(n, V), torch.arange(n, dtype=torch.int64) * 31 + 7,
                            torch.full((n,), 11, dtype=torch.int64), 0)
    counts = torch.bincount(tok, minlength=V).double()
    assert counts[11] == 0
    expected = p * n
    big = expected >= 5
    chi2 = float((((counts - expected) ** 2 / expected)[big]).sum())
    # df <= 8 here; P(chi2 > 30) < 3e-4
    assert chi2 < 30, (chi2, counts.tolist(), expected.tolist())


@pytest.mark.parametrize("bad,match", [
    (dict(scores=torch.zeros(2, 5, dtype=torch.float64)), "scores"),
    (dict(scores=torch.zeros(2, 5, dtype=torch.bfloat16)), "scores"),
    (dict(scores=torch.zeros(10)), "scores"),
    (dict(scores=torch.zeros(2, 0)), "vocab size"),
    (dict(scores=torch.zeros(2, 6)[:, ::2]), "scores"),
    (dict(seeds=torch.zeros(3, dtype=torch.int64)), "seeds"),
    (dict(seeds=torch.zeros(2, dtype=torch.int32)), "seeds"),
    (dict(positions=torch.zeros(2, 1, dtype=torch.int64)), "positions"),
    (dict(out=torch.zeros(2, dtype=torch.int32)), "out"),
    (dict(out=torch.zeros(3, dtype=torch.int64)), "out"),
    (dict(stream=-1), "stream"),
    (dict(stream=2 ** 32), "stream"),
])
def test_bad_arguments_name_the_field(bad, match):
    args = dict(out=torch.zeros(2, dtype=torch.int64), scores=torch.zeros(2, 5),
                seeds=torch.zeros(2, dtype=torch.int64), positions=torch.zeros(2, dtype=torch.int64), stream=0)
    args.update(bad)
    with pytest.raises(RuntimeError, match=match):
        _ops.gumbel_argmax(args["out"], args["scores"], args["seeds"], args["positions"], args["stream"])


def test_empty_batch():
    out = ops.gumbel_argmax(torch.zeros(0, 7), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    assert out.shape == (0,)


@pytest.mark.parametrize("V", [pytest.param(v, marks=cuda_only) for v in (7, 50000, 128256)])
@pytest.mark.parametrize("B", [33, 2])
def test_cuda_matches_cpu(V, B):
    """B = 2: the CUDA kernel splits each row over CTAs (13 slices for V = 50000, 32 for 128256 on 132 SMs)
    and merges them; 33: fewer slices."""
    gen = torch.Generator().manual_seed(V)
    for scale, masked in [(1.0, 0), (6.0, 0), (3.0, 0.99)]:
        x, seeds, positions = _inputs(B, V, gen, scale, masked)
        cpu = ops.gumbel_argmax(x, seeds, positions, 0)
        gpu = ops.gumbel_argmax(x.cuda(), seeds.cuda(), positions.cuda(), 0).cpu()
        diff = int((cpu != gpu).sum())
        assert diff <= 1, f"{diff} rows differ (logf ulps may split a near-tie at most rarely)"
        _check(gpu, x, seeds, positions, 0)
