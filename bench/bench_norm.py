#!/usr/bin/env python3
"""rms_norm and fused_add_rms_norm through torch.ops.decodekit, against torch's own.

Peers: torch.nn.functional.rms_norm(x) and, for the fused op, rms_norm(x + residual)
(which also yields the new residual). Each case is checked against the float64 reference
(decodekit.ops.reference) before it is timed. Bytes counted are the fewest the op must
move: rms_norm reads x and weight and writes out; fused_add_rms_norm reads x, residual
and weight and writes both back.

    python bench/bench_norm.py --device cuda --out bench/results
    python bench/bench_norm.py --device cpu --quick
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

NAME = "norm"
EPS = 1e-6
TOKENS = [1, 16, 256, 4096]
HIDDEN = [576, 4096, 8192]
TOKENS_QUICK = [1, 256]
HIDDEN_QUICK = [576, 4096]


def _rand(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


def case_rms_norm(ctx: BenchContext, T: int, H: int, dtype: torch.dtype) -> Result:
    dev = ctx.device
    x = _rand((T, H), dtype, dev)
    w = (1.0 + 0.5 * torch.randn(H, device=dev)).to(dtype)
    out = torch.full((T, H), float("nan"), dtype=dtype, device=dev)  # poisoned: every element must be written
    torch.ops.decodekit.rms_norm(out, x, w, EPS)
    ref = reference.rms_norm(x.double(), w.double(), EPS)
    err = check_close(out, ref, dtype, f"rms_norm T={T} H={H}")
    peer_err = rel_err(F.rms_norm(x, (H,), w, EPS), ref)

    sets = ctx.rotate((x, w, out))
    t = ctx.time(lambda x, w, o: torch.ops.decodekit.rms_norm(o, x, w, EPS), sets)
    tp = ctx.time(lambda x, w, o: F.rms_norm(x, (H,), w, EPS), sets)
    e = x.element_size()
    return Result.from_timings("rms_norm", f"T={T} H={H}", dtype, dev, t, nbytes=(2 * T * H + H) * e,
                               peer="F.rms_norm", peer_timing=tp, rotate_bytes=tensor_bytes(sets),
                               max_rel_err=err, peer_rel_err=peer_err)


def case_fused(ctx: BenchContext, T: int, H: int, dtype: torch.dtype) -> Result:
    dev = ctx.device
    x = _rand((T, H), dtype, dev)
    r = _rand((T, H), dtype, dev)
    w = (1.0 + 0.5 * torch.randn(H, device=dev)).to(dtype)
    ref_out, ref_res = reference.fused_add_rms_norm(x.double(), r.double(), w.double(), EPS)
    xo, ro = x.clone(), r.clone()
    torch.ops.decodekit.fused_add_rms_norm(xo, ro, w, EPS)
    err = max(check_close(xo, ref_out, dtype, f"fused_add_rms_norm out T={T} H={H}"),
              check_close(ro, ref_res, dtype, f"fused_add_rms_norm residual T={T} H={H}"))
    s = x + r
    peer_err = max(rel_err(F.rms_norm(s, (H,), w, EPS), ref_out), rel_err(s, ref_res))

    sets = ctx.rotate((x, r, w))  # in place: each call normalizes the last call's output again
    t = ctx.time(lambda x, r, w: torch.ops.decodekit.fused_add_rms_norm(x, r, w, EPS), sets)
    tp = ctx.time(lambda x, r, w: F.rms_norm(x + r, (H,), w, EPS), sets)
    e = x.element_size()
    return Result.from_timings("fused_add_rms_norm", f"T={T} H={H}", dtype, dev, t, nbytes=(4 * T * H + H) * e,
                               peer="F.rms_norm(x + residual)", peer_timing=tp, rotate_bytes=tensor_bytes(sets),
                               max_rel_err=err, peer_rel_err=peer_err)


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args, unknown = p.parse_known_args(argv)  # run_all.py passes every family's options to all
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_norm: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    tokens, hidden = (TOKENS_QUICK, HIDDEN_QUICK) if ctx.quick else (TOKENS, HIDDEN)
    ctx.copy_ceiling()
    for dtype in ctx.dtypes:
        for H in hidden:
            for T in tokens:
                ctx.add(case_rms_norm(ctx, T, H, dtype))
                ctx.add(case_fused(ctx, T, H, dtype))
    return ctx.finish()


if __name__ == "__main__":
    main()
