"""The CPU's AMX path for fp32 / fp16 activations (include/decodekit/gemm/quant_amx_exact.h): from 9 rows,
int4_gemm / int8_gemm turn each 32-element block of a row of `a` into a 23-bit fixed point (s = 2^(e - 21),
2^e <= max |a| of the block, I = rne(a / s)), multiply the integer codes exactly on the AMX int8 unit and
scale the block sums in fp32: out = sum over blocks of fma(fl(R), d * s, acc) (+ fma(min, S, acc) for INT4),
+ bias, one rounding.

The oracle emulates exactly that in float64 (every fp32 rounding done by .float()): outputs must match it
bit for bit (double rounding of the float64 emulation may move a rare one by an ulp). The fp32 tiled
kernel (DECODEKIT_CPU_AMX=0) computes something else, so the test tells the paths apart; its general
error bound is test_int4.py's, which runs every CPU path.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dk_testing import cpu_amx_exact_expected, random_int4_weight, random_int8_weight, randn, strided_rows
from decodekit import ops
from decodekit.ops import reference as ref


EXACT_EXPECTED = cpu_amx_exact_expected()
needs_amx = pytest.mark.skipif(not EXACT_EXPECTED, reason="no AMX int8 on this CPU (or DECODEKIT_CPU_AMX=0 / a "
                                                          "non-native build)")


def _codes(w) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes [N, K] float64, per-block scales [N, K / 32], per-block mins or None) of a packed weight."""
    G = w.group_size
    if hasattr(w, "mins"):
        codes = ref._int4_codes(w.qweight, G).reshape(w.qweight.shape[0], -1).to(torch.int64)
        mins = w.mins.float().double().repeat_interleave(G // 32, dim=1)
    else:
        codes, mins = w.qweight.to(torch.int64), None
    return codes.double(), w.scales.float().double().repeat_interleave(G // 32, dim=1), mins


def _emulate(a: torch.Tensor, w, bias, out_dtype) -> torch.Tensor:
    """The kernel's arithmetic in float64, rounding to fp32 where it does (see the module docstring)."""
    codes, scales, mins = _codes(w)
    M, K = a.shape
    nb = K // 32
    x = a.float().double().view(M, nb, 32)
    amax = x.abs().amax(dim=2)  # [M, nb]
    _, E = torch.frexp(amax)    # amax = f 2^E, f in [0.5, 1): floor(log2 amax) = E - 1
    s = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), E - 22), torch.zeros_like(amax))
    I = torch.round(x / torch.where(s > 0, s, torch.ones_like(s))[..., None])  # half to even
    acc = torch.zeros(M, codes.shape[0], dtype=torch.float64)
    for b in range(nb):
        Ib, qb = I[:, b], codes[:, b * 32:(b + 1) * 32]
        if mins is not None:  # INT4: R exact, one rounding
            r = (Ib @ qb.T).float().double()
        else:                 # INT8: base-256 digits, R = 2^16 C2 + fl(2^8 C1 + C0)
            d0 = torch.remainder(Ib + 128, 256) - 128
            t = (Ib - d0) / 256
            d1 = torch.remainder(t + 128, 256) - 128
            d2 = (t - d1) / 256
            low = (256 * (d1 @ qb.T) + d0 @ qb.T).float().double()
            r = (65536 * (d2 @ qb.T) + low).float().double()
        ds = (scales[None, :, b] * s[:, b, None]).float().double()
        acc = (r * ds + acc).float().double()
        if mins is not None:
            S = (Ib.sum(dim=1).float().double() * s[:, b]).float().double()
            acc = (mins[None, :, b] * S[:, None] + acc).float().double()
    if bias is not None:
        acc = (acc + bias.float().double()).float().double()
    return acc.float().to(out_dtype)


def _weight(kind, N, K, G, gen):
    return random_int4_weight(N, K, G, "cpu", gen) if kind == "int4" else random_int8_weight(N, K, G, "cpu", gen)


def _gemm(kind, a, w, bias):
    out = torch.full((a.shape[0], w.scales.shape[0]), float("nan"), dtype=a.dtype)
    (ops.int4_gemm if kind == "int4" else ops.int8_gemm)(a, w, bias, out=out)
    return out


def _agreement(out, want) -> tuple[float, float]:
    """(fraction bitwise equal, largest difference in ulps of the emulation)."""
    ulp = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(torch.finfo(want.dtype).tiny)
    return (out == want).double().mean().item(), ((out.float() - want.float()).abs() / ulp).max().item()


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("M, N, K, G, with_bias", [
    (9, 67, 192, 64, True),       # fewest rows on the path, 7 zero rows, N tail (67 = 2 x 32 + 3)
    (17, 33, 96, 32, False),      # a second 16-row block with one row
    (40, 577, 256, 32, True),     # 3 row blocks, 19 tasks of 32 columns (the last one column)
    (37, 130, 1024, 128, False),  # long K, G = 128 (4 blocks a group: low nibbles, then high)
    (129, 96, 640, 64, True),     # two row chunks of <= 128 (the second one row)
])
def test_amx_exact_semantics(kind, dtype, M, N, K, G, with_bias, gen):
    w = _weight(kind, N, K, G, gen)
    a, _ = strided_rows(M, K, dtype, "cpu", gen)
    a[1] *= 1e-20                       # a tiny row (its own exponent per block)
    a[2, 7] = 2000.0                    # one large element: its block's other elements lose low bits
    a[3, :64] = 0.0                     # all-zero blocks
    bias = randn((N,), dtype, "cpu", gen) if with_bias else None
    out = _gemm(kind, a, w, bias)
    assert not out.isnan().any(), "unwritten (NaN-poisoned) outputs"
    frac, ulps = _agreement(out, _emulate(a, w, bias, dtype))
    assert frac >= 0.999 and ulps <= 1.0, f"{frac:.5f} of the outputs bitwise, {ulps:.2f} ulps"


@needs_amx
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_amx_exact_rows_do_not_depend_on_the_batch(kind, gen):
    """Integer products and per-row scales: from 9 rows, a row's bits do not depend on the other rows,
    their number or its position."""
    N, K, G = 130, 576, 32
    w = _weight(kind, N, K, G, gen)
    a = randn((40, K), torch.float32, "cpu", gen)
    full = _gemm(kind, a, w, None)
    perm = torch.randperm(40, generator=gen)
    assert torch.equal(_gemm(kind, a[perm], w, None), full[perm])
    assert torch.equal(_gemm(kind, a[5:14].contiguous(), w, None), full[5:14])


@needs_amx
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_amx_exact_non_finite_rows(kind, gen):
    """A NaN or an infinity in a row makes that row's outputs NaN; the other rows keep their bits."""
    N, K, G = 67, 192, 32
    w = _weight(kind, N, K, G, gen)
    a = randn((12, K), torch.float32, "cpu", gen)
    clean = _gemm(kind, a, w, None)
    a[3, 100] = float("inf")
    a[7, 5] = float("nan")
    out = _gemm(kind, a, w, None)
    assert out[3].isnan().all() and out[7].isnan().all()
    keep = [i for i in range(12) if i not in (3, 7)]
    assert torch.equal(out[keep], clean[keep])


@needs_amx
def test_amx_off_runs_the_fp32_kernel():
    """DECODEKIT_CPU_AMX=0: fp32 activations from 9 rows go to the fp32 tiled kernel, whose bits differ."""
    code = textwrap.dedent("""
        import sys, torch
        sys.path[:0] = [{tests!r}, {ops!r}]
        from test_quant_amx_exact import _weight, _gemm, _emulate, _agreement
        from dk_testing import randn
        g = torch.Generator().manual_seed(7)
        w = _weight("int4", 130, 512, 32, g)
        a = randn((33, 512), torch.float32, "cpu", g)
        print(_agreement(_gemm("int4", a, w, None), _emulate(a, w, None, torch.float32))[0])
    """).format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
               ops=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, DECODEKIT_CPU_AMX="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) < 0.8
