"""Batch invariance of the CPU projections (ops.linear's decode_rows; csrc/decoder_layer.cpp: project_rows).

With decode_rows >= 0 the rows [0, decode_rows) run in blocks of at most DECODE_ROW_BLOCK rows and the others in one
block of at least PREFILL_ROWS_MIN rows, so every row's bits are those it gets in any batch: a decode row as it gets
alone (the one-row GEMV / dense tile), a prompt row as it gets among any number of prompt rows. Checked bitwise on
fresh random inputs of awkward sizes for every packed format, group size and activation dtype, plus closeness to the
unsplit result (the split may not change values beyond rounding) and the argument errors."""
import pytest
import torch

from dk_testing import DTYPES, randn, random_int4_weight, random_int8_weight
from decodekit import ops
from decodekit.quant.fp8 import quantize_fp8_weight

N, K = 75, 384   # N odd (column tails of every kernel), K = 3 groups of 128


def _weight(kind: str, dtype, gen):
    if kind.startswith("int4"):
        return random_int4_weight(N, K, int(kind.split("/")[1]), "cpu", gen)
    if kind == "int8":
        return random_int8_weight(N, K, 32, "cpu", gen)
    w = torch.randn(N, K, generator=gen) * K ** -0.5
    return quantize_fp8_weight(w) if kind == "fp8" else w.to(dtype)


KINDS = ["int4/32", "int4/64", "int4/128", "int8", "fp8", "dense"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("M,D", [(37, 37), (37, 17), (29, 24), (45, 0), (21, 9), (8, 3), (9, 8), (70, 66), (31, 31), (30, 22),
                                 (20, 12)])
def test_decode_rows_get_their_one_row_bits(M, D, kind, dtype, gen):
    """Each decode row equals the row computed alone; the result is close to the unsplit one."""
    w = _weight(kind, dtype, gen)
    x = randn((M, K), dtype, "cpu", gen)
    bias = randn((N,), dtype, "cpu", gen)
    got = ops.linear(x, w, bias, decode_rows=D)
    assert got.shape == (M, N) and got.dtype == dtype and not torch.isnan(got.float()).any()
    for i in range(D):
        alone = ops.linear(x[i:i + 1], w, bias)
        assert torch.equal(got[i], alone[0]), f"decode row {i} of {D} differs from the row alone"
    # the split changes rounding only: summation order, and in bf16 the many-row kernels' bf16-rounded weights
    # (2^-9 relative each, over K = 384 terms); per row relative to its largest output
    whole = ops.linear(x, w, bias).float()
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6
    bound = tol * (whole.abs().amax(1, keepdim=True) + 1)
    assert ((got.float() - whole).abs() <= bound).all(), "the split result is not the unsplit one up to rounding"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", [1, 5, 12, 16, 17, 18, 30, 33, 40])
def test_prompt_rows_do_not_depend_on_the_other_prompt_rows(p, kind, dtype, gen):
    """A block of p prompt rows (padded to PREFILL_ROWS_MIN when shorter; dense weights: dense_prefill_rows_min,
    past dense_gemm's rows -- was: 17..32 float32 rows on dense_gemm, 33+ on torch's GEMM, other bits) gives each
    row the bits it gets among more prompt rows, and after decode rows."""
    w = _weight(kind, dtype, gen)
    x = randn((p, K), dtype, "cpu", gen)
    alone = ops.linear(x, w, decode_rows=0)
    more = randn((p + 23, K), dtype, "cpu", gen)
    more[7:7 + p] = x
    assert torch.equal(ops.linear(more, w, decode_rows=0)[7:7 + p], alone)
    after = torch.cat([randn((11, K), dtype, "cpu", gen), x])
    assert torch.equal(ops.linear(after, w, decode_rows=11)[11:], alone)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_off_and_errors(dtype, gen):
    w = _weight("int4/32", dtype, gen)
    x = randn((20, K), dtype, "cpu", gen)
    assert torch.equal(ops.linear(x, w, decode_rows=-1), ops.linear(x, w))
    for bad in (-2, 21):
        with pytest.raises(ValueError, match=r"decode_rows must be in \[-1, M = 20\]"):
            ops.linear(x, w, decode_rows=bad)
    assert ops.DECODE_ROW_BLOCK < 9 and ops.PREFILL_ROWS_MIN == 17    # dense_cpu.h's kDecodeRowBlock / kPrefillRowsMin
    for kind in ("int4/32", "int8"):
        w = _weight(kind, dtype, gen)
        out = torch.empty(20, N, dtype=dtype)
        fn = torch.ops.decodekit.int4_gemm if kind == "int4/32" else torch.ops.decodekit.int8_gemm
        with pytest.raises(RuntimeError, match="decode_rows"):
            fn(out, x, *w.operands(), w.group_size, None, None, 21)


@pytest.mark.parametrize("kind", ["int4/64", "int8"])
def test_opcheck_with_decode_rows(kind, gen):
    from torch.library import opcheck
    w = _weight(kind, torch.float32, gen)
    x = randn((19, K), torch.float32, "cpu", gen)
    out = torch.empty(19, N)
    fn = torch.ops.decodekit.int4_gemm if kind.startswith("int4") else torch.ops.decodekit.int8_gemm
    opcheck(fn, (out, x, *w.operands(), w.group_size, None, None, 5))
