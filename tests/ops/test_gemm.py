"""dense_gemm (small-M CPU GEMM) vs the float64 reference."""
import math

import pytest
import torch
from torch.library import opcheck

from dk_testing import DTYPES, TOL, randn
from decodekit import ops
from decodekit.ops import reference as ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 3, 4, 7, 16, 33, 64])
@pytest.mark.parametrize("N,K", [(576, 576), (1536, 576), (576, 1536), (37, 769), (19, 31), (5, 64)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_dense_gemm(M, N, K, dtype, bias, strided, gen):
    if strided:
        buf = torch.full((M, K + 9), float("nan"), dtype=dtype)
        buf[:, :K] = randn((M, K), dtype, "cpu", gen)
        a = buf[:, :K]
    else:
        a = randn((M, K), dtype, "cpu", gen)
    w = randn((N, K), dtype, "cpu", gen, scale=1 / math.sqrt(K))
    b = randn((N,), dtype, "cpu", gen) if bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype)
    ops.dense_gemm(a, w, b, out=out)
    want = ref.dense_gemm(a.double(), w.double(), None if b is None else b.double())
    # fp32 accumulation over K terms of size ~1/sqrt(K): error ~ sqrt(K) * 2^-24, far below
    # the output rounding; the bound is the dtype's half-ulp rounding (TOL).
    torch.testing.assert_close(out.double(), want, **TOL[dtype])
    if dtype in (torch.bfloat16, torch.float16):
        lo, hi, _ = ops.dense_route(dtype)
        if lo <= M <= hi:  # ops.linear routes here
            assert torch.equal(ops.linear(a, w, b), out)


def test_dense_gemm_errors():
    a, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="'weight'.*K = a.size"):
        ops.dense_gemm(a, torch.randn(5, 7))
    with pytest.raises(RuntimeError, match="'bias'"):
        ops.dense_gemm(a, w, torch.randn(4))
    with pytest.raises(RuntimeError, match="M\\)' must be in \\[0, 64\\]"):
        ops.dense_gemm(torch.randn(65, 8), w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype, gen):
    a, w, b = randn((3, 40), dtype, "cpu", gen), randn((7, 40), dtype, "cpu", gen), randn((7,), dtype, "cpu", gen)
    opcheck(torch.ops.decodekit.dense_gemm.default, (torch.empty(3, 7, dtype=dtype), a, w, b))
    opcheck(torch.ops.decodekit.dense_gemm.default, (torch.empty(3, 7, dtype=dtype), a, w, None))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 8, 9, 32, 33, 127, 128, 300])
def test_linear_routes_agree(M, dtype, gen):
    # every CPU route of ops.linear (dense_gemm, torch bf16, fp32 upcast) computes x @ w^T + b
    x = randn((M, 96), dtype, "cpu", gen)
    w = randn((40, 96), dtype, "cpu", gen, scale=0.1)
    b = randn((40,), dtype, "cpu", gen)
    torch.testing.assert_close(ops.linear(x, w, b).double(), ref.dense_gemm(x.double(), w.double(), b.double()),
                               **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_gemm_rows_alone(dtype, gen):
    """Each row's result does not depend on the rows that come with it (1 .. 64): one register-tile
    path for every M, so a speculative verification's rows are plain decoding's bits."""
    a = randn((64, 200), dtype, "cpu", gen)
    w = randn((70, 200), dtype, "cpu", gen, scale=0.07)
    b = randn((70,), dtype, "cpu", gen)
    alone = torch.cat([ops.dense_gemm(a[i:i + 1], w, b) for i in range(64)])
    for M in (2, 3, 5, 8, 17, 64):
        assert torch.equal(ops.dense_gemm(a[:M], w, b), alone[:M]), M
