"""rms_norm and fused_add_rms_norm vs the float64 reference."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, randn, strided_rows
from decodekit import ops
from decodekit.ops import reference as ref

NUM_TOKENS = [1, 7, 83, 4096]
HIDDEN = [64, 576, 769, 5120, 8192]
EPS = 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", NUM_TOKENS)
@pytest.mark.parametrize("strided", [False, True])
def test_rms_norm(tokens, hidden, dtype, device, strided, gen):
    if strided:
        x, buf = strided_rows(tokens, hidden, dtype, device, gen)
    else:
        x = randn((tokens, hidden), dtype, device, gen)
    w = randn((hidden,), dtype, device, gen, scale=0.5) + 1
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device=device)
    before = x.clone()
    ops.rms_norm(x, w, EPS, out=out)
    expected = ref.rms_norm(x.double(), w.double(), EPS)
    assert_close(out, expected, dtype, "rms_norm")
    assert torch.equal(x, before), "rms_norm modified its input"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_3d_and_large_values(dtype, device, gen):
    # [batch, seq, hidden] input and values far from 1 (scale invariance of the norm).
    x = randn((3, 5, 769), dtype, device, gen, scale=40.0)
    w = randn((769,), dtype, device, gen)
    out = ops.rms_norm(x, w, EPS)
    assert out.shape == x.shape
    assert_close(out, ref.rms_norm(x.double(), w.double(), EPS), dtype, "rms_norm 3d")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", NUM_TOKENS)
@pytest.mark.parametrize("strided", [False, True])
def test_fused_add_rms_norm(tokens, hidden, dtype, device, strided, gen):
    if strided:
        x, xbuf = strided_rows(tokens, hidden, dtype, device, gen)
        r, rbuf = strided_rows(tokens, hidden, dtype, device, gen, pad=5)
    else:
        x = randn((tokens, hidden), dtype, device, gen)
        r = randn((tokens, hidden), dtype, device, gen)
    w = randn((hidden,), dtype, device, gen, scale=0.5) + 1
    # Reference first: the kernel works in place.
    exp_out, exp_res = ref.fused_add_rms_norm(x.double(), r.double(), w.double(), EPS)
    ops.fused_add_rms_norm(x, r, w, EPS)
    assert_close(x, exp_out, dtype, "fused_add_rms_norm out")
    assert_close(r, exp_res, dtype, "fused_add_rms_norm residual")
    if strided:  # padding between rows untouched
        assert torch.isnan(xbuf[:, hidden:]).all() and torch.isnan(rbuf[:, hidden:]).all()


def test_rms_norm_errors_name_the_argument():
    x = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match="'weight'.*64"):
        ops.rms_norm(x, torch.randn(63), EPS)
    with pytest.raises(RuntimeError, match="'weight' has dtype"):
        ops.rms_norm(x, torch.randn(64, dtype=torch.float16), EPS)
    with pytest.raises(RuntimeError, match="'input' has dtype"):
        ops.rms_norm(x.double(), torch.randn(64).double(), EPS)
    with pytest.raises(RuntimeError, match="'epsilon' must be in"):
        ops.rms_norm(x, torch.randn(64), -1.0)
    with pytest.raises(RuntimeError, match="'out'"):
        ops.rms_norm(x, torch.randn(64), EPS, out=torch.empty(4, 65))
    with pytest.raises(RuntimeError, match="'input'.*contiguous last dim"):  # the raw op; ops.rms_norm copies
        torch.ops.decodekit.rms_norm(torch.empty(4, 64), torch.randn(64, 4).t(), torch.randn(64), EPS)
    with pytest.raises(RuntimeError, match="'residual'"):
        ops.fused_add_rms_norm(x, torch.randn(4, 32), torch.randn(64), EPS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype, device, gen):
    x = randn((7, 769), dtype, device, gen)
    w = randn((769,), dtype, device, gen)
    out = torch.empty_like(x)
    opcheck(torch.ops.decodekit.rms_norm.default, (out, x, w, EPS))
    r = randn((7, 769), dtype, device, gen)
    opcheck(torch.ops.decodekit.fused_add_rms_norm.default, (x.clone(), r, w, EPS))
