"""sort_desc_stable (include/decodekit/sampling/sort_desc.h, sort_desc.cuh): the kernels must give
torch.sort(x, dim=-1, descending=True, stable=True) bit for bit (values' bits and indices): ties in index
order, every NaN first (sign and payload ignored), -0.0 equal to +0.0. The oracle is torch's own sort on
the CPU; outputs are poisoned before the raw op call so an unwritten element fails."""
from __future__ import annotations

import pytest
import torch

from dk_testing import DEVICES, cuda_only
from decodekit import ops
from decodekit.ops import reference

_ops = torch.ops.decodekit


def _row_kinds(B, V, gen, kind):
    if kind == "distinct":
        return torch.randn(B, V, generator=gen) * 3
    if kind == "ties":
        return torch.round(torch.randn(B, V, generator=gen) * 2) / 2
    if kind == "specials":  # NaNs of both signs and odd payloads, +-inf, +-0, subnormals, extremes
        bits = torch.randint(-2 ** 31, 2 ** 31, (B, V), generator=gen, dtype=torch.int64).to(torch.int32)
        x = bits.view(torch.float32).clone()
        pick = torch.randint(0, 10, (B, V), generator=gen)
        table = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45,
                              3.4028235e38, -1.0])
        return torch.where(pick < 8, table[torch.randint(0, 10, (B, V), generator=gen)], x)
    return torch.full((B, V), -2.5)  # one value


def _check(x, values, indices, what):
    want_v, want_i = torch.sort(x.cpu(), dim=-1, descending=True, stable=True)
    assert torch.equal(indices.cpu(), want_i), f"{what}: indices differ at {(indices.cpu() != want_i).sum()} places"
    assert torch.equal(values.cpu().view(torch.int32), want_v.view(torch.int32)), f"{what}: values' bits differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,V", [(1, 1), (3, 2), (2, 2047), (1, 2049), (5, 4099), (2, 49157), (1, 128256)])
@pytest.mark.parametrize("kind", ["distinct", "ties", "specials", "constant"])
def test_matches_torch_sort_bitwise(device, B, V, kind):
    gen = torch.Generator().manual_seed(B * 100003 + V + len(kind))
    x = _row_kinds(B, V, gen, kind)
    values = torch.full((B, V), float("nan"), device=device)     # poison
    indices = torch.full((B, V), -7, dtype=torch.int64, device=device)
    _ops.sort_desc_stable(values, indices, x.to(device))
    _check(x, values, indices, f"{device} B={B} V={V} {kind}")


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_and_wrapper(device):
    gen = torch.Generator().manual_seed(5)
    buf = torch.full((4, 3001 + 13), float("nan"))          # NaN padding past each row: must not be read
    buf[:, :3001] = torch.round(torch.randn(4, 3001, generator=gen) * 4)
    x = buf[:, :3001].to(device) if device == "cpu" else buf.to(device)[:, :3001]
    values, indices = ops.sort_desc_stable(x)
    assert values.is_contiguous() and indices.dtype == torch.int64
    _check(buf[:, :3001], values, indices, f"{device} strided")
    rv, ri = reference.sort_desc_stable(buf[:, :3001])
    assert torch.equal(ri, indices.cpu())


@pytest.mark.parametrize("bad,match", [
    (dict(x=torch.zeros(2, 5, dtype=torch.float16)), "x"),
    (dict(x=torch.zeros(10)), "x"),
    (dict(x=torch.zeros(2, 6)[:, ::2]), "x"),
    (dict(values=torch.zeros(2, 4)), "values"),
    (dict(values=torch.zeros(2, 5, dtype=torch.float64)), "values"),
    (dict(indices=torch.zeros(2, 5, dtype=torch.int32)), "indices"),
    (dict(indices=torch.zeros(3, 5, dtype=torch.int64)), "indices"),
    (dict(values=torch.zeros(5, 2).t()), "values"),
])
def test_bad_arguments_name_the_field(bad, match):
    args = dict(values=torch.zeros(2, 5), indices=torch.zeros(2, 5, dtype=torch.int64), x=torch.zeros(2, 5))
    args.update(bad)
    with pytest.raises(RuntimeError, match=match):
        _ops.sort_desc_stable(args["values"], args["indices"], args["x"])


@pytest.mark.parametrize("shape", [(0, 7), (3, 0)])
def test_empty(shape):
    values, indices = ops.sort_desc_stable(torch.zeros(shape))
    assert values.shape == shape and indices.shape == shape


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_cuda_many_rows(device):
    # more rows than fit in the key's row bits of a power of two: 33 rows -> 6 bits
    gen = torch.Generator().manual_seed(9)
    x = torch.round(torch.randn(33, 50000, generator=gen) * 3)
    values, indices = ops.sort_desc_stable(x.to(device))
    _check(x, values, indices, "cuda 33 rows")
