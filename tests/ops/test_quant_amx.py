"""The CPU's bf16 products for bf16 activations: from 9 rows, int4_gemm / int8_gemm with bf16 `a` run their
products on the AMX tile unit (include/decodekit/gemm/quant_amx.h) or, on CPUs with AVX512-BF16 but no AMX, with
VDPBF16PS (gemm/int4_tiled_bf16.h), the decoded weight rounded to bf16 (as the CUDA kernels' tensor cores do),
fp32 accumulation, bias in fp32, one rounding of the output.

The general error bound (|a| |w| relative, TOL[bf16]) is checked for every CPU path by test_int4.py;
here the oracle is exact about the semantics: each output is the bf16 rounding of the float64 product
with the bf16-rounded weight, except where fp32 accumulation lands within an ulp's sliver of a rounding
boundary. The same outputs against the unrounded weight differ in a large fraction of places, so the
test tells the two paths apart. With DECODEKIT_CPU_AMX=0 DECODEKIT_CPU_BF16_DOT=0 (or neither instruction set) the
fp32 kernels serve bf16.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dk_testing import (cpu_bf16_products_expected, cpu_bf16_products_min_rows, random_int4_weight, random_int8_weight,
                        randn, strided_rows)
from decodekit import ops
from decodekit.ops import reference as ref


BF16_PRODUCTS_EXPECTED = cpu_bf16_products_expected()


def _decoded(w) -> torch.Tensor:
    if hasattr(w, "mins"):
        return ref.int4_dequantize(w.qweight, w.scales, w.mins, w.group_size).float()
    return ref.int8_dequantize(w.qweight, w.scales, w.group_size).float()


def _match_fraction(out, a, wd, bias) -> tuple[float, float]:
    """(fraction of outputs equal to bf16(float64 a @ wd^T + bias), largest distance in units of one
    output ulp plus fp32 accumulation's 2^-20 |a| |wd|^T: the most a correctly rounded fp32 sum can be off)."""
    want = a.double() @ wd.double().T
    mag = a.double().abs() @ wd.double().abs().T
    if bias is not None:
        want += bias.double()
        mag += bias.double().abs()
    rounded = want.to(torch.bfloat16)
    bound = want.abs() * 2.0 ** -7 + mag * 2.0 ** -20 + 1e-30  # bf16: 8 significant bits
    return (out == rounded).double().mean().item(), ((out.double() - want).abs() / bound).max().item()


def _run(kind, M, N, K, G, with_bias, gen):
    w = random_int4_weight(N, K, G, "cpu", gen) if kind == "int4" else random_int8_weight(N, K, G, "cpu", gen)
    a, _ = strided_rows(M, K, torch.bfloat16, "cpu", gen)
    bias = randn((N,), torch.bfloat16, "cpu", gen) if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    (ops.int4_gemm if kind == "int4" else ops.int8_gemm)(a, w, bias, out=out)
    assert not out.isnan().any(), "unwritten (NaN-poisoned) outputs"
    return out, a, _decoded(w), bias


@pytest.mark.skipif(not BF16_PRODUCTS_EXPECTED,
                    reason="neither AMX nor AVX512-BF16 on this CPU (or both turned off / a non-native build)")
@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("M, N, K, G, with_bias", [
    (9, 67, 192, 64, True),       # fewest rows on the AMX path, one 16-row tile (7 zero rows), N tail
    (17, 33, 96, 32, False),      # a second 16-row tile with one row, 33 = 32 + 1 columns
    (32, 577, 256, 32, True),     # two full tiles, 19 strips (the last one column)
    (37, 130, 1024, 128, False),  # 3 tiles, long K, G = 128 (4 chunks of 16 codes a group)
    (300, 96, 640, 64, True),     # two row chunks of <= 256 (the second one 44 rows)
])
def test_bf16_products_use_bf16_weights(kind, M, N, K, G, with_bias, gen):
    if M < cpu_bf16_products_min_rows():
        pytest.skip("below the bf16-product kernel's rows on this CPU (the GEMV's arithmetic there)")
    out, a, wd, bias = _run(kind, M, N, K, G, with_bias, gen)
    frac_b, ulps_b = _match_fraction(out, a, wd.bfloat16(), bias)
    frac_w, _ = _match_fraction(out, a, wd, bias)
    # fp32 accumulation (the tile unit's order) moves a handful of outputs across a rounding boundary
    assert frac_b >= 0.97 and ulps_b <= 1.0, f"bf16-weight semantics: {frac_b:.4f} exact, {ulps_b:.2f} ulps"
    if kind == "int4":  # Q8_0-style weights (int8 x fp16) round to bf16 less often than d * q + m
        assert frac_w < frac_b - 0.02, f"matches the unrounded weight as well ({frac_w:.4f} vs {frac_b:.4f})"


def test_amx_off_uses_fp32_weights():
    """DECODEKIT_CPU_AMX=0 DECODEKIT_CPU_BF16_DOT=0: bf16 activations of many rows go to the fp32 tiled kernel
    (unrounded weights)."""
    code = textwrap.dedent("""
        import sys, torch
        sys.path[:0] = [{tests!r}, {ops!r}]
        from test_quant_amx import _run, _match_fraction
        g = torch.Generator().manual_seed(7)
        out, a, wd, bias = _run("int4", 33, 130, 512, 32, True, g)
        fw, uw = _match_fraction(out, a, wd, bias)
        fb, _ = _match_fraction(out, a, wd.bfloat16(), bias)
        print(fw, uw, fb)
    """).format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
               ops=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, DECODEKIT_CPU_AMX="0", DECODEKIT_CPU_BF16_DOT="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    fw, uw, fb = map(float, r.stdout.split()[-3:])
    assert fw >= 0.97 and uw <= 1.0, (fw, uw)
    assert fb < fw - 0.02, (fb, fw)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_bf16_rows_1_to_8_keep_the_gemv_arithmetic(kind, gen):
    """Speculative verification needs rows 1 .. 8 to give each row the bits it gets alone: the AMX path
    starts at 9 rows, below it bf16 stays on the GEMV's arithmetic whatever the machine."""
    N, K, G = 130, 512, 32
    w = random_int4_weight(N, K, G, "cpu", gen) if kind == "int4" else random_int8_weight(N, K, G, "cpu", gen)
    a = randn((8, K), torch.bfloat16, "cpu", gen)
    fn = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    alone = torch.cat([fn(a[i:i + 1], w, None) for i in range(8)])
    assert torch.equal(fn(a, w, None), alone)
