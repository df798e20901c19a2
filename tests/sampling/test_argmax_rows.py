"""argmax_rows (include/decodekit/sampling/argmax.h, argmax.cuh): the greedy token of each row must be
torch.argmax(x, dim=-1)'s: the largest value, ties -> the lowest index, the first NaN beats everything,
-0.0 == +0.0. Oracles: reference.argmax_rows (float64, spelled-out rule) and torch.argmax on the CPU.
Outputs are poisoned before the raw op call so an unwritten element fails. Vocabulary sizes straddle the
kernels' 16-lane vectors and 256-thread strides (1, 15, 16, 17, 4097, 49157, 128256)."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, cuda_only
from decodekit import ops
from decodekit.ops import reference

_ops = torch.ops.decodekit


def _rows(B, V, gen, kind):
    if kind == "distinct":
        return torch.randn(B, V, generator=gen) * 3
    if kind == "ties":  # the maximum repeats within each row
        return torch.round(torch.randn(B, V, generator=gen))
    if kind == "specials":  # NaNs of both signs, +-inf, +-0, subnormals, extremes, in every row
        bits = torch.randint(-2 ** 31, 2 ** 31, (B, V), generator=gen, dtype=torch.int64).to(torch.int32)
        x = bits.view(torch.float32).clone()
        x = torch.where(x.isnan(), torch.zeros_like(x), x)
        table = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45,
                              3.4028235e38, -3.4028235e38])
        pick = torch.rand(B, V, generator=gen) < 0.002
        return torch.where(pick, table[torch.randint(0, 10, (B, V), generator=gen)], x)
    if kind == "late_max":  # the only maximum in the last (tail) element
        x = torch.randn(B, V, generator=gen)
        x[:, -1] = 100.0
        return x
    if kind == "neg_inf":  # every value -inf except some rows' single -1e30
        x = torch.full((B, V), -float("inf"))
        x[::2, V // 2] = -1e30
        return x
    return torch.full((B, V), -0.0).index_fill_(1, torch.tensor([V // 3]), 0.0)  # -0.0 and +0.0: equal


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,V", [(1, 1), (3, 15), (2, 16), (5, 17), (4, 4097), (37, 49157), (2, 128256)])
@pytest.mark.parametrize("kind", ["distinct", "ties", "specials", "late_max", "neg_inf", "signed_zeros"])
def test_matches_torch_argmax(device, B, V, kind):
    gen = torch.Generator().manual_seed(B * 100003 + V + len(kind))
    x = _rows(B, V, gen, kind)
    out = torch.full((B,), -7, dtype=torch.int64, device=device)  # poison
    _ops.argmax_rows(out, x.to(device))
    want = reference.argmax_rows(x)
    assert torch.equal(want, x.argmax(dim=-1)), "the reference disagrees with torch.argmax"
    assert torch.equal(out.cpu(), want), f"{device} B={B} V={V} {kind}: {out.cpu().tolist()[:8]} vs {want.tolist()[:8]}"


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_and_wrapper(device):
    gen = torch.Generator().manual_seed(5)
    buf = torch.full((6, 3001 + 13), float("nan"))  # NaN padding past each row: must not be read
    buf[:, :3001] = torch.round(torch.randn(6, 3001, generator=gen) * 4)
    x = buf.to(device)[:, :3001]
    got = ops.argmax_rows(x)
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), buf[:, :3001].argmax(dim=-1))
    # other dtypes / shapes: torch's argmax
    assert torch.equal(ops.argmax_rows(x.to(torch.bfloat16)).cpu(), x.to(torch.bfloat16).cpu().argmax(dim=-1))


@pytest.mark.parametrize("bad,match", [
    (dict(scores=torch.zeros(2, 5, dtype=torch.float16)), "scores"),
    (dict(scores=torch.zeros(10)), "scores"),
    (dict(scores=torch.zeros(2, 6)[:, ::2]), "scores"),
    (dict(scores=torch.zeros(2, 0)), "vocab size"),
    (dict(out=torch.zeros(3, dtype=torch.int64)), "out"),
    (dict(out=torch.zeros(2, dtype=torch.int32)), "out"),
])
def test_bad_arguments_name_the_field(bad, match):
    args = dict(out=torch.zeros(2, dtype=torch.int64), scores=torch.zeros(2, 5))
    args.update(bad)
    with pytest.raises(RuntimeError, match=match):
        _ops.argmax_rows(args["out"], args["scores"])


def test_empty_batch_and_opcheck():
    out = torch.zeros(0, dtype=torch.int64)
    _ops.argmax_rows(out, torch.zeros(0, 9))
    gen = torch.Generator().manual_seed(1)
    opcheck(_ops.argmax_rows, (torch.zeros(3, dtype=torch.int64), torch.randn(3, 300, generator=gen)))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_cuda_graph_replay(device):
    x = torch.randn(8, 49157, device=device)
    out = torch.empty(8, dtype=torch.int64, device=device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _ops.argmax_rows(out, x)
    x.copy_(torch.randn(8, 49157))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), x.cpu().argmax(dim=-1))
