#!/usr/bin/env python3
"""Dense (fp32 / bf16 / fp16) projections on the CPU through ops.linear, against torch's own linear.

ops.linear is the route every dense projection of the model takes (and decoder_layer's, bit for
bit): bf16 / fp16 decode batches (up to 32 rows) go to dense_gemm (weights widened to fp32 in
registers, include/decodekit/gemm/dense_cpu.h), larger fp16 batches and bf16 prefill (128+ rows) to
MKL's fp32 GEMM on upcast operands, the rest to torch (oneDNN / MKL). Shapes: SmolLM2-135M's
projections (576x576, 1536x576 (half gate-up), 576x1536) and its tied LM head (49152x576); rows
M = 1 (decode), 4 (a verification pass / small batch), 32 (batched decode) and 128 (a prefill chunk).
Rows up to 32 are memory-bound: weight + activation + output bytes against the measured copy
ceiling, weights rotated (as in a decode step, where each layer's weights come from DRAM); 128 rows
in GFLOP/s against the measured fp32 matmul rate. Each case is checked against float64.

    python bench/bench_dense.py --dtype fp32,bf16,fp16 --out bench/results
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

try:
    import decodekit  # noqa: F401
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from decodekit import ops
from decodekit.bench import BenchContext, Result, add_common_args, check_close, rel_err, tensor_bytes

NAME = "dense"
SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
ROWS = [1, 4, 32, 128]


def case(ctx: BenchContext, N: int, K: int, M: int, dtype: torch.dtype) -> Result:
    g = torch.Generator().manual_seed(N * 7 + K * 13 + M)
    w = (torch.randn(N, K, generator=g) / math.sqrt(K)).to(dtype)
    a = torch.randn(M, K, generator=g).to(dtype)
    ref = a.double() @ w.double().T
    out = ops.linear(a, w)
    err = check_close(out, ref, dtype, f"linear M={M} {N}x{K}")
    peer_err = rel_err(torch.nn.functional.linear(a, w), ref)
    memory_bound = M <= 32
    sets = ctx.rotate((a, w), keep=(0,)) if memory_bound else [(a, w)]
    t = ctx.time(lambda a, w: ops.linear(a, w), sets)
    tp = ctx.time(lambda a, w: torch.nn.functional.linear(a, w), sets)
    e = a.element_size()
    kw = dict(nbytes=(N * K + M * K + M * N) * e) if memory_bound else dict(flops=2.0 * M * N * K)
    return Result.from_timings("linear", f"M={M} {N}x{K}", dtype, ctx.device, t, **kw,
                               peer=f"torch linear ({dtype})", peer_timing=tp,
                               rotate_bytes=tensor_bytes(sets) if memory_bound else None,
                               max_rel_err=err, peer_rel_err=peer_err)


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type != "cpu":
        print(f"bench_{NAME}: CPU only (CUDA dense projections are cuBLAS); nothing to do on {ctx.device}")
        return ctx.finish()
    ctx.copy_ceiling()
    for dtype in ctx.dtypes:
        for M in ([1, 32] if ctx.quick else ROWS):
            for N, K in (SHAPES[1:2] if ctx.quick else SHAPES):
                ctx.add(case(ctx, N, K, M, dtype))
    return ctx.finish()


if __name__ == "__main__":
    main()
