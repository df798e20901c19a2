"""silu_and_mul vs the float64 reference."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, randn, strided_rows
from decodekit import ops
from decodekit.ops import reference as ref

NUM_TOKENS = [1, 7, 83, 4096]
D = [64, 769, 1536, 5120]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", D)
@pytest.mark.parametrize("tokens", NUM_TOKENS)
@pytest.mark.parametrize("strided", [False, True])
def test_silu_and_mul(tokens, d, dtype, device, strided, gen):
    if strided:
        x, _ = strided_rows(tokens, 2 * d, dtype, device, gen, pad=7)
    else:
        x = randn((tokens, 2 * d), dtype, device, gen, scale=3.0)
    out = torch.full((tokens, d), float("nan"), dtype=dtype, device=device)
    ops.silu_and_mul(x, out=out)
    assert_close(out, ref.silu_and_mul(x.double()), dtype, "silu_and_mul")


@pytest.mark.parametrize("device", DEVICES)
def test_silu_and_mul_extremes(device):
    # Large |x|: exp overflows to inf for very negative x; silu must still give -0/0, not NaN.
    g = torch.tensor([[-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, 3.0]], device=device)
    x = torch.cat([g, torch.ones_like(g)], dim=-1)
    out = ops.silu_and_mul(x)
    assert_close(out, ref.silu_and_mul(x.double()), torch.float32, "silu extremes")


def test_silu_and_mul_errors():
    with pytest.raises(RuntimeError, match="'input' last dim must be even"):
        ops.silu_and_mul(torch.randn(3, 7))
    with pytest.raises(RuntimeError, match="'out'"):
        ops.silu_and_mul(torch.randn(3, 8), out=torch.empty(3, 5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype, device, gen):
    x = randn((5, 2 * 77), dtype, device, gen)
    opcheck(torch.ops.decodekit.silu_and_mul.default, (torch.empty(5, 77, dtype=dtype, device=device), x))
