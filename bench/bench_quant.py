#!/usr/bin/env python3
"""Weight-only quantized GEMV/GEMM (int4_gemm: GGUF Q4-style packed INT4; int8_gemm: Q8_0) through
decodekit.ops, against a dense linear on the same (decoded) weights in the activations' dtype.

Shapes (N x K): SmolLM2-135M's projections (576x576, 1536x576 (half gate-up), 576x1536) and LM head
(49152x576, INT8), Llama-3-8B's (6144x4096 QKV, 4096x4096, 28672x4096 gate-up, 4096x14336 down) on
CUDA. Rows M = 1, 4, 5 (a decode step verifying 4 drafts), 8 and the kernels' largest (CPU 16,
CUDA 8). Bytes counted: the packed weight
(codes + fp16 scales/mins) + activations read + output written, against the copy ceiling; the peer
(torch's dense linear: oneDNN/MKL or cuBLAS) reads 2-4x more. Each case is checked against float64.

CUDA, the issue's rows (M = 1, 4, 16, 32, 64, 128, 512, 4096; Llama-3-8B QKV 6144x4096 and down 4096x14336;
bf16; the 70B projections in bench/cpp/bench_quant.cpp): "int4 ops route" rows time decodekit.ops.int4_gemm as
the engine calls it on a weight held as its packed Marlin copy alone (the Marlin kernel to 64 rows, the copy
decoded by int4_marlin_dequantize + cuBLAS beyond), the
"int4_gemm" rows the raw op's dispatch table of
csrc/cuda/gemm_launch.cpp (INT4 g128: the Marlin-style kernel to 64 rows, int4_gemm_mma below 128, the CUTLASS
sm90 mixed-input kernel from 128; fp8: mma.sync below 128, CUTLASS QGMMA from 128) in GB/s of the copy
ceiling below 512 rows and TFLOP/s from 512 against torch's
bf16 linear (cuBLAS) on the decoded weight, and fp8 also against torch._scaled_mm with the same per-token x
per-channel scales. DECODEKIT_SM90_GEMM=never / always and DECODEKIT_INT4_MARLIN=never in the environment
pin either side of the table.

CPU, larger M (batched decode, prefill: M = 32, 256, 2048 on the SmolLM2 shapes plus 192x576 (K/V),
the CPU kernels' tiled path, include/decodekit/gemm/int4_tiled.h): compute-bound rows in TFLOP/s
against the measured fp32 matmul rate, two rows per case: the op vs torch's fp32 linear on the
dequantized weight ("... vs torch fp32"), and vs ops._packed_dense (decode a chunk to the activations'
dtype, then ops.linear: the pre-tiled CPU route; "... vs packed_dense"). The three are timed in
alternating rounds (median round kept); weights are not rotated (compute-bound).

    python bench/bench_quant.py --device cuda --out bench/results
    python bench/bench_quant.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

try:
    import decodekit
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import decodekit

from decodekit import ops
from decodekit.bench import BenchContext, Result, add_common_args, bench, check_close, rel_err, tensor_bytes
from decodekit.ops import reference
from decodekit.quant import Int4Weight, Int8Weight

NAME = "quant"
SHAPES = {"cpu": [(576, 576), (1536, 576), (576, 1536)],
          "cpu_large": [(576, 576), (192, 576), (1536, 576), (576, 1536)],
          "cuda": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1536, 576)]}
LM_HEAD = (49152, 576)


def _int4(N, K, dev, g, G=32):
    return Int4Weight(torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8).to(dev),
                      (torch.rand(N, K // G, generator=g) * 0.02 + 0.002).half().to(dev),
                      (torch.randn(N, K // G, generator=g) * 0.05).half().to(dev), G)


def _int8(N, K, dev, g):
    return Int8Weight(torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8).to(dev),
                      (torch.rand(N, K // 32, generator=g) * 0.004 + 0.001).half().to(dev), 32)


def case(ctx: BenchContext, kind: str, N: int, K: int, M: int, dtype: torch.dtype) -> Result:
    dev = ctx.device
    g = torch.Generator().manual_seed(N * 7 + K * 13 + M)
    w = _int4(N, K, dev, g) if kind == "int4" else _int8(N, K, dev, g)
    wd = (reference.int4_dequantize(w.qweight, w.scales, w.mins, 32) if kind == "int4"
          else reference.int8_dequantize(w.qweight, w.scales, 32))                    # [N, K] float32, exact
    a = torch.randn(M, K, generator=g).to(dtype).to(dev)
    fn = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
    fn(a, w, out=out)
    ref = a.double() @ wd.double().T
    err = check_close(out, ref, dtype, f"{kind}_gemm M={M} {N}x{K}")
    dense = wd.to(dtype)
    peer_err = rel_err(ops.linear(a, dense), ref)
    del wd
    # weights rotate (as in a decode step, where every layer's weights come from memory, not cache);
    # the raw ops are timed (no Python wrapper), the peer is torch's own linear
    if kind == "int4":
        sets = ctx.rotate((a, out, w.qweight, w.scales, w.mins), keep=(0,))
        t = ctx.time(lambda a, o, q, s, m: torch.ops.decodekit.int4_gemm(o, a, q, s, m, 32, None), sets)
    else:
        sets = ctx.rotate((a, out, w.qweight, w.scales), keep=(0,))
        t = ctx.time(lambda a, o, q, s: torch.ops.decodekit.int8_gemm(o, a, q, s, 32, None), sets)
    psets = ctx.rotate((a, dense), keep=(0,))
    tp = ctx.time(lambda a, wd: torch.nn.functional.linear(a, wd), psets)
    e = a.element_size()
    nbytes = w.nbytes + a.numel() * e + out.numel() * e
    return Result.from_timings(f"{kind}_gemm", f"M={M} {N}x{K} g32", dtype, dev, t, nbytes=nbytes,
                               peer=f"torch linear ({dtype}) on the decoded weight", peer_timing=tp,
                               rotate_bytes=tensor_bytes(sets), max_rel_err=err, peer_rel_err=peer_err)


def case_large(ctx: BenchContext, kind: str, N: int, K: int, M: int, dtype: torch.dtype,
               rounds: int = 3) -> list[Result]:
    """CPU, M > 8: the op (tiled path) vs torch fp32 linear on the decoded weight and vs _packed_dense."""
    g = torch.Generator().manual_seed(N * 7 + K * 13 + M)
    w = _int4(N, K, ctx.device, g) if kind == "int4" else _int8(N, K, ctx.device, g)
    wd = (reference.int4_dequantize(w.qweight, w.scales, w.mins, 32) if kind == "int4"
          else reference.int8_dequantize(w.qweight, w.scales, 32))                    # [N, K] float32, exact
    a = torch.randn(M, K, generator=g).to(dtype)
    af = a.float()
    out = torch.full((M, N), float("nan"), dtype=dtype)
    (ops.int4_gemm if kind == "int4" else ops.int8_gemm)(a, w, out=out)
    ref = a.double() @ wd.double().T
    err = check_close(out, ref, dtype, f"{kind}_gemm M={M} {N}x{K}")
    pd_err = rel_err(ops._packed_dense(a, w, None, torch.empty(M, N, dtype=dtype)), ref)
    peer_err = rel_err(torch.nn.functional.linear(af, wd), ref)
    del ref
    if kind == "int4":
        op = lambda: torch.ops.decodekit.int4_gemm(out, a, w.qweight, w.scales, w.mins, 32, None)  # noqa: E731
    else:
        op = lambda: torch.ops.decodekit.int8_gemm(out, a, w.qweight, w.scales, 32, None)  # noqa: E731
    pd_out = torch.empty(M, N, dtype=dtype)
    fns = {"op": op, "packed_dense": lambda: ops._packed_dense(a, w, None, pd_out),
           "torch": lambda: torch.nn.functional.linear(af, wd)}
    flops = 2.0 * M * N * K
    warmup = 1 if flops > 2e10 else ctx.warmup
    runs = {k: [] for k in fns}
    for _ in range(rounds):  # alternate the three: drift on a shared machine hits all alike
        for k, fn in fns.items():
            runs[k].append(bench(fn, warmup=warmup, repeats=ctx.repeats, device=ctx.device,
                                 max_time_s=ctx.max_time_s / rounds))
    t = {k: sorted(v, key=lambda x: x.median_s)[len(v) // 2] for k, v in runs.items()}
    case = f"M={M} {N}x{K} g32"
    return [Result.from_timings(f"{kind}_gemm vs torch fp32", case, dtype, ctx.device, t["op"], flops=flops,
                                peer="torch linear (float32) on the decoded weight", peer_timing=t["torch"],
                                max_rel_err=err, peer_rel_err=peer_err),
            Result.from_timings(f"{kind}_gemm vs packed_dense", case, dtype, ctx.device, t["op"], flops=flops,
                                peer=f"ops._packed_dense ({dtype}: decode chunks, ops.linear)",
                                peer_timing=t["packed_dense"], max_rel_err=err, peer_rel_err=pd_err)]


# Llama-3-8B QKV and down (the 70B projections are rows of the C++ bench, bench/cpp/bench_quant.cpp: their
# float64 references and host-generated weights would not fit this bench's time on the GPU machine)
CUDA_LARGE = [(6144, 4096), (4096, 14336)]
CUDA_LARGE_M = [1, 4, 16, 32, 64, 128, 512, 4096]


def case_cuda_large(ctx: BenchContext, kind: str, N: int, K: int, M: int) -> list[Result]:
    """CUDA, bf16: int4_gemm (g128) or fp8_gemm through the op's dispatch table vs cuBLAS bf16
    (and fp8 vs torch._scaled_mm, row-wise scales)."""
    dev, dtype = ctx.device, torch.bfloat16
    g = torch.Generator().manual_seed(N * 7 + K * 13 + M)
    x = torch.randn(M, K, generator=g).to(dtype).to(dev)
    out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
    # the ceiling each row is measured against: copy bandwidth where the weight read dominates (the targets
    # at M <= 64 are fractions of it), the bf16 matmul rate from 512 rows
    flops = 2.0 * M * N * K if M >= 512 else None
    if kind == "int4":
        w = _int4(N, K, dev, g, G=128)
        wd = reference.int4_dequantize(w.qweight, w.scales, w.mins, 128)                 # [N, K] float32, exact
        op = lambda x, o, q, s, m: torch.ops.decodekit.int4_gemm(o, x, q, s, m, 128, None)  # noqa: E731
        args, a_ref = (x, out, w.qweight, w.scales, w.mins), x
        nbytes = w.nbytes + (x.numel() + out.numel()) * 2
    else:
        from decodekit.quant.fp8 import quantize_fp8_weight
        w = quantize_fp8_weight(torch.randn(N, K, generator=g).mul_(0.05).to(dev))
        wd = w.qweight.float() * w.scales[:, None]                                       # [N, K] float32, exact
        aq, a_s = ops.quantize_fp8(x)
        a_ref = aq.float() * a_s[:, None]  # the values the op multiplies (codes x scales)
        x = a_ref.to(dtype)                # the bf16 peer's input: those values, rounded
        op = lambda a, o, q, sa, sw: torch.ops.decodekit.fp8_gemm(o, a, sa, q, sw, None)  # noqa: E731
        args = (aq, out, w.qweight, a_s, w.scales)
        nbytes = w.qweight.numel() + aq.numel() + out.numel() * 2
    op(*args)
    ref = a_ref.double() @ wd.double().T
    err = check_close(out, ref, dtype, f"{kind}_gemm M={M} {N}x{K}")
    sets = ctx.rotate(args, keep=(0,) if kind == "int4" else (0, 3))
    t = ctx.time(op, sets)
    dense = wd.to(dtype)
    del wd
    peer_err = rel_err(torch.nn.functional.linear(x, dense), ref)
    tp = ctx.time(lambda a, wd: torch.nn.functional.linear(a, wd), ctx.rotate((x, dense), keep=(0,)))
    case = f"M={M} {N}x{K}" + (" g128" if kind == "int4" else "")
    rows = [Result.from_timings(f"{kind}_gemm vs cuBLAS bf16", case, dtype, dev, t, flops=flops, nbytes=nbytes,
                                peer="torch linear (bf16, cuBLAS) on the decoded weight", peer_timing=tp,
                                rotate_bytes=tensor_bytes(sets), max_rel_err=err, peer_rel_err=peer_err)]
    if kind == "int4":  # the engine's route (decodekit.ops) on a weight held as its Marlin copy alone, as a
        # CUDA model holds it: the Marlin kernel to 64 rows, int4_marlin_dequantize + cuBLAS beyond
        wmap = {st[2].data_ptr(): Int4Weight(st[2], st[3], st[4], 128) for st in sets}
        for wo in wmap.values():
            ops.prepare_marlin(wo, dtype, drop_stored=True)  # made once, as at model load
        route = lambda x, o, q, s, m: ops.int4_gemm(x, wmap[q.data_ptr()], None, out=o)  # noqa: E731
        route(*sets[0])
        r_err = check_close(sets[0][1], ref, dtype, f"int4 ops route M={M} {N}x{K}")
        tr = ctx.time(route, sets)
        rows.append(Result.from_timings("int4 ops route vs cuBLAS bf16", case, dtype, dev, tr, flops=flops,
                                        nbytes=nbytes, peer="torch linear (bf16, cuBLAS) on the decoded weight",
                                        peer_timing=tp, rotate_bytes=tensor_bytes(sets), max_rel_err=r_err,
                                        peer_rel_err=peer_err))
        if 64 < M <= 512:  # the experiment: Marlin launches over 64-row slices instead of decode + cuBLAS
            os.environ["DECODEKIT_INT4_MARLIN_SLICED_MAX_M"] = str(M)
            try:
                route(*sets[0])
                s_err = check_close(sets[0][1], ref, dtype, f"int4 sliced Marlin M={M} {N}x{K}")
                ts = ctx.time(route, sets)
            finally:
                del os.environ["DECODEKIT_INT4_MARLIN_SLICED_MAX_M"]
            rows.append(Result.from_timings("int4 ops route, Marlin in 64-row slices vs cuBLAS bf16", case, dtype,
                                            dev, ts, flops=flops, nbytes=nbytes,
                                            peer="torch linear (bf16, cuBLAS) on the decoded weight", peer_timing=tp,
                                            rotate_bytes=tensor_bytes(sets), max_rel_err=s_err,
                                            peer_rel_err=peer_err))
    if kind == "fp8":
        def scaled_mm(a, q, sa, sw):
            return torch._scaled_mm(a, q.t(), scale_a=sa[:, None], scale_b=sw[None, :], out_dtype=dtype)
        try:
            sm_err = rel_err(scaled_mm(args[0], args[2], args[3], args[4]), ref)
            ts = ctx.time(lambda a, o, q, sa, sw: scaled_mm(a, q, sa, sw), sets)
            rows.append(Result.from_timings("fp8_gemm vs torch._scaled_mm", case, dtype, dev, t, flops=flops,
                                            nbytes=nbytes, peer="torch._scaled_mm (row-wise scales)",
                                            peer_timing=ts, max_rel_err=err, peer_rel_err=sm_err))
        except RuntimeError as e:  # row-wise scaling needs a recent torch / cuBLASLt
            print(f"bench_quant: torch._scaled_mm peer skipped: {e}")
    return rows


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_quant: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    kind = ctx.device.type
    max_m = 16 if kind == "cpu" else 8
    ctx.copy_ceiling()
    for dtype in ctx.dtypes:
        shapes = SHAPES[kind][:1] if ctx.quick else SHAPES[kind]
        for M in ([1] if ctx.quick else [1, 4, 5, 8, max_m]):
            for N, K in shapes:
                ctx.add(case(ctx, "int4", N, K, M, dtype))
            if not ctx.quick:
                ctx.add(case(ctx, "int8", *LM_HEAD, M, dtype))
        if kind == "cuda" and dtype == torch.bfloat16:
            for M in ([512] if ctx.quick else CUDA_LARGE_M):
                for N, K in (CUDA_LARGE[:1] if ctx.quick else CUDA_LARGE):
                    for k in ("int4", "fp8"):
                        for r in case_cuda_large(ctx, k, N, K, M):
                            ctx.add(r)
        if kind == "cpu":
            for M in ([32] if ctx.quick else [32, 256, 2048]):
                for N, K in (SHAPES["cpu_large"][:1] if ctx.quick else SHAPES["cpu_large"]):
                    for r in case_large(ctx, "int4", N, K, M, dtype):
                        ctx.add(r)
                if not ctx.quick:
                    for r in case_large(ctx, "int8", *LM_HEAD, M, dtype):
                        ctx.add(r)
    return ctx.finish()


if __name__ == "__main__":
    main()
