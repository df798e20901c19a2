"""gemm_allreduce with packed weights on the CPU: gemm_allreduce_int4 (INT4 shards, int4_gemm's
operands) and gemm_allreduce_fp8 (fp8 W8A8 shards, activations quantized per token), threads as
ranks (test_allreduce.ThreadRanks).

Exactness: each tile is int4_gemm / fp8_gemm over the tile's weight rows, whose per-element arithmetic
does not depend on N, so the fused result equals ops.linear on each rank then custom_all_reduce, bit for
bit, on every rank. Tolerance against the float64 reference (reference.gemm_allreduce, which decodes
the INT4 weight / quantizes the activations exactly as the kernels do): test_allreduce's GEMM bound
with |w| taken as |scale q| + |min| for INT4 (the kernel sums scale * sum(a q) and min * sum(a)
separately, so cancellation inside w does not shrink its error), plus, for bf16 from 9 rows on an AMX
CPU (gemm/quant_amx.h), the weight's rounding to bf16 (2^-9 of |a| |w|); for fp8 a = q_a * a_scale,
w = q_w * w_scale (fp8 products are exact in fp32; the two scalings add 2 roundings: K + 4)."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight, Int8Weight
from decodekit.quant.fp8 import Fp8Weight
from dk_testing import cpu_bf16_products_min_rows
from test_allreduce import DTYPES, TINY, U, U32, ThreadRanks, rand

GEMM_SHAPES = [(1, 600, 64), (5, 24, 128), (16, 513, 256), (40, 300, 96)]  # 40: the tiled INT4 kernels


def int4_weight(N, K, G, gen, perm=False) -> Int4Weight:
    q = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    sc = (torch.rand(N, K // G, generator=gen) * 0.02 + 0.005).half()
    mn = (-(torch.rand(N, K // G, generator=gen) * 0.1)).half()
    p = torch.randperm(K, generator=gen) if perm else None
    return Int4Weight(q, sc, mn, G, p)


def fp8_weight(N, K, gen) -> Fp8Weight:
    w = torch.randn(N, K, generator=gen)
    s = w.abs().amax(1) / 448
    return Fp8Weight((w / s[:, None]).to(torch.float8_e4m3fn), s.float())


def bound(terms, abs_terms, bias, dtype, K, extra=2) -> torch.Tensor:
    """test_allreduce.gemm_bound from per-rank exact partials and their |a| @ |w| (float64)."""
    P, A = list(terms), list(abs_terms)
    if bias is not None:
        P[0], A[0] = P[0] + bias.double(), A[0] + bias.double().abs()
    S, sum_p = sum(P), sum(p.abs() for p in P)
    u = U[dtype]
    return 2 * (u * (S.abs() + sum_p) + len(P) * U32 * sum_p + (K + extra) * U32 * sum(A)) + TINY[dtype]


def int4_terms(a_list, w_list):
    P, A = [], []
    for a, w in zip(a_list, w_list):
        x = a.double() if w.perm is None else a.double().index_select(1, w.perm)
        dq = ref.int4_dequantize(w.qweight, w.scales, w.mins, w.group_size).double()
        sq = ref.int4_dequantize(w.qweight, w.scales, torch.zeros_like(w.mins), w.group_size).double()  # scale q
        wabs = sq.abs() + (dq - sq).abs()  # |scale q| + |min|
        P.append(x @ dq.T)
        A.append(x.abs() @ wabs.T)
    return P, A


def fp8_terms(a_list, w_list):
    P, A = [], []
    for a, w in zip(a_list, w_list):
        q, s = ref.quantize_fp8(a)
        x = q.double() * s.double()[:, None]
        wd = w.qweight.double() * w.scales.double()[:, None]
        P.append(x @ wd.T)
        A.append(x.abs() @ wd.abs().T)
    return P, A


def run(g, a_list, w_list, bias, residual=None, norm_weight=None):
    M, N = a_list[0].shape[0], w_list[0].shape[0]
    outs = [torch.full((M, N), float("nan"), dtype=a_list[0].dtype) for _ in a_list]
    res = [None if residual is None else residual.clone() for _ in a_list]
    g.run(lambda r: ops.gemm_allreduce(a_list[r], w_list[r], g.buffer_ptrs, g.signal_ptrs, r, g.buffer_bytes,
                                       bias=bias, residual=res[r], norm_weight=norm_weight, out=outs[r]))
    return outs, res


def check(g, a_list, w_list, bias, dtype, terms, extra, wround=0.0):
    outs, _ = run(g, a_list, w_list, bias)
    for r, o in enumerate(outs):
        assert not torch.isnan(o).any(), f"rank {r}: poisoned output left"
        assert torch.equal(o, outs[0]), f"rank {r} differs from rank 0"
    parts = [ops.linear(a, w, bias if r == 0 else None) for r, (a, w) in enumerate(zip(a_list, w_list))]
    unfused = g.all_reduce(parts, False)[0] if len(parts) > 1 else parts[0]
    assert torch.equal(outs[0], unfused), "fused != ops.linear + custom_all_reduce"
    exp, _ = ref.gemm_allreduce([a.double() for a in a_list], w_list, bias.double())
    P, A = terms(a_list, w_list)
    torch.testing.assert_close(exp, sum(P) + bias.double(), rtol=1e-12, atol=1e-12)  # the oracle's own check
    err = (outs[0].double() - exp).abs()
    b = bound(P, A, bias, dtype, a_list[0].shape[1], extra) + 2 * wround * sum(A)
    assert (err <= b).all(), f"worst err {err.max():.3g}, bound there {b.view(-1)[err.argmax()]:.3g}"
    return outs[0]


@pytest.mark.parametrize("ws", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_gemm_allreduce_int4(ws, dtype, M, N, K, gen):
    G = [32, 64, 128][(M + N) % 3] if K % 128 == 0 else 32
    g = ThreadRanks(ws)
    a_list = [rand((M, K), dtype, gen) for _ in range(ws)]
    w_list = [int4_weight(N, K, G, gen) for _ in range(ws)]
    # bf16 past cpu_bf16_products_min_rows: the decoded weight rounded to bf16 (half an ulp, 2^-9 relative)
    lo = cpu_bf16_products_min_rows()
    wround = 2.0 ** -9 if dtype == torch.bfloat16 and lo is not None and M >= lo else 0.0
    check(g, a_list, w_list, rand((N,), dtype, gen), dtype, int4_terms, 2, wround)


@pytest.mark.parametrize("ws", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_gemm_allreduce_fp8(ws, dtype, M, N, K, gen):
    g = ThreadRanks(ws)
    a_list = [rand((M, K), dtype, gen) for _ in range(ws)]
    w_list = [fp8_weight(N, K, gen) for _ in range(ws)]
    check(g, a_list, w_list, rand((N,), dtype, gen), dtype, fp8_terms, 4)


@pytest.mark.parametrize("kind", ["int4", "int4-act-order", "fp8"])
def test_epilogue_and_act_order(kind, gen):
    """residual + RMSNorm epilogue: exactly fused_add_rms_norm of the reduced output on every rank."""
    ws, M, N, K, dtype = 3, 7, 136, 128, torch.bfloat16
    g = ThreadRanks(ws)
    a_list = [rand((M, K), dtype, gen) for _ in range(ws)]
    w_list = [fp8_weight(N, K, gen) if kind == "fp8" else int4_weight(N, K, 64, gen, perm=kind != "int4")
              for _ in range(ws)]
    bias = rand((N,), dtype, gen)
    out = check(g, a_list, w_list, bias, dtype, fp8_terms if kind == "fp8" else int4_terms, 4 if kind == "fp8" else 2)
    residual, nw = rand((M, N), dtype, gen), rand((N,), dtype, gen, scale=0.5) + 1
    outs, res = run(g, a_list, w_list, bias, residual, nw)
    x_exp, r_exp = out.clone(), residual.clone()
    ops.fused_add_rms_norm(x_exp, r_exp, nw, 1e-6)
    for r in range(ws):
        assert torch.equal(outs[r], x_exp) and torch.equal(res[r], r_exp), f"rank {r}: epilogue differs"


def test_opcheck_and_argument_errors(gen):
    g = ThreadRanks(1)
    comm = (g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes, None, None, 1e-6)
    a, w = rand((3, 64), torch.float32, gen), int4_weight(24, 64, 32, gen)
    opcheck(torch.ops.decodekit.gemm_allreduce_int4.default,
            (torch.empty(3, 24), a, w.qweight, w.scales, w.mins, 32, None, *comm))
    f = fp8_weight(24, 64, gen)
    q, s = ops.quantize_fp8(a)
    # test_schema compares tensors with torch ops that have no Float8_e4m3fn kernels (as test_fp8_gemm)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    opcheck(torch.ops.decodekit.gemm_allreduce_fp8.default, (torch.empty(3, 24), q, s, f.qweight, f.scales, None, *comm),
            test_utils=utils)
    with pytest.raises(RuntimeError, match="gemm_allreduce_int4: 'group_size' must be 32, 64 or 128, got 48"):
        torch.ops.decodekit.gemm_allreduce_int4(torch.empty(3, 24), a, w.qweight, w.scales, w.mins, 48, None, *comm)
    with pytest.raises(RuntimeError, match="gemm_allreduce_int4: 'scales'"):
        torch.ops.decodekit.gemm_allreduce_int4(torch.empty(3, 24), a, w.qweight, w.scales[:, :1], w.mins, 32, None,
                                                *comm)
    with pytest.raises(RuntimeError, match="gemm_allreduce_fp8: K = 48 must be a multiple of 32"):
        q48, s48 = ops.quantize_fp8(rand((3, 48), torch.float32, gen))
        torch.ops.decodekit.gemm_allreduce_fp8(torch.empty(3, 24), q48, s48, f.qweight[:, :48].contiguous(), f.scales,
                                               None, *comm)
    with pytest.raises(RuntimeError, match="gemm_allreduce_fp8: 'residual' and 'norm_weight' go together"):
        torch.ops.decodekit.gemm_allreduce_fp8(torch.empty(3, 24), q, s, f.qweight, f.scales, None, g.buffer_ptrs,
                                               g.signal_ptrs, 0, g.buffer_bytes, torch.empty(3, 24), None, 1e-6)
    i8 = Int8Weight(torch.zeros(24, 64, dtype=torch.int8), torch.ones(24, 2, dtype=torch.float16), 32)
    with pytest.raises(TypeError, match="'weight' must be a tensor, Int4Weight or Fp8Weight, got Int8Weight"):
        ops.gemm_allreduce(a, i8, g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes)
