#!/usr/bin/env python3
"""silu_and_mul through torch.ops.decodekit, against F.silu(x[..., :d]) * x[..., d:].

Widths d = 1536 (SmolLM-135M's MLP) and 14336 (Llama-3-8B's). Each case is checked against
the float64 reference before it is timed. Bytes counted: the [T, 2d] input read once and
the [T, d] output written once.

    python bench/bench_activation.py --device cuda --out bench/results
    python bench/bench_activation.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

try:
    import decodekit
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import decodekit

from decodekit.bench import BenchContext, Result, add_common_args, check_close, rel_err, tensor_bytes
from decodekit.ops import reference

NAME = "activation"
TOKENS = [1, 16, 256, 4096]
TOKENS_QUICK = [1, 256]
WIDTHS = [1536, 14336]


def peer_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def case_silu(ctx: BenchContext, T: int, d: int, dtype: torch.dtype) -> Result:
    dev = ctx.device
    x = (2.0 * torch.randn(T, 2 * d, device=dev)).to(dtype)
    out = torch.full((T, d), float("nan"), dtype=dtype, device=dev)  # poisoned: every element must be written
    torch.ops.decodekit.silu_and_mul(out, x)
    ref = reference.silu_and_mul(x.double())
    err = check_close(out, ref, dtype, f"silu_and_mul T={T} d={d}")
    peer_err = rel_err(peer_silu_and_mul(x), ref)

    sets = ctx.rotate((x, out))
    t = ctx.time(lambda x, o: torch.ops.decodekit.silu_and_mul(o, x), sets)
    tp = ctx.time(lambda x, o: peer_silu_and_mul(x), sets)
    e = x.element_size()
    return Result.from_timings("silu_and_mul", f"T={T} d={d}", dtype, dev, t, nbytes=3 * T * d * e,
                               peer="F.silu(x[:d]) * x[d:]", peer_timing=tp, rotate_bytes=tensor_bytes(sets),
                               max_rel_err=err, peer_rel_err=peer_err)


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args, unknown = p.parse_known_args(argv)  # run_all.py passes every family's options to all
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_activation: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    ctx.copy_ceiling()
    for dtype in ctx.dtypes:
        for d in WIDTHS:
            for T in (TOKENS_QUICK if ctx.quick else TOKENS):
                ctx.add(case_silu(ctx, T, d, dtype))
    return ctx.finish()


if __name__ == "__main__":
    main()
