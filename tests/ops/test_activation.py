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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_specials(dtype, device):
    """inf, -inf, NaN, the edges of the CPU kernel's exp range (|x| near 87) and tiny values, as the gate
    and as the up half, in a row whose length (21) leaves a masked tail: NaN exactly where the reference
    has it (silu(-inf) = -inf / inf), the rest close to it."""
    inf, nan = float("inf"), float("nan")
    g = torch.tensor([[inf, -inf, nan, 86.9, -86.9, 87.1, -87.1, 89.0, -89.0, 1e-30, -1e-30, 0.0, -0.0,
                       -1e4, 1e4, 3.0, -3.0, 0.5, -0.5, 60.0, -60.0]])
    u = torch.tensor([[1.0, 1.0, 1.0, 2.0, 2.0, -1.0, -1.0, 1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0, inf, nan,
                       -2.0, 2.0, 0.5, 0.5]])
    x = torch.cat([g, u], dim=-1).to(dtype).to(device)
    out = torch.full((1, g.shape[1]), 7.0, dtype=dtype, device=device)
    ops.silu_and_mul(x, out=out)
    want = ref.silu_and_mul(x.double().cpu())
    got = out.double().cpu()
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    ok = ~want.isnan()
    assert torch.equal(got[ok].isinf(), want[ok].isinf()) and torch.equal(got[ok & want.isinf()], want[ok & want.isinf()])
    fin = ok & ~want.isinf()
    assert_close(got[fin], want[fin], dtype, "silu specials")


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
