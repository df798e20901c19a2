#!/usr/bin/env python3
"""rotary_embedding (in place, query and key) through torch.ops.decodekit, against the reference.

Peer: decodekit.ops.reference.rotary_embedding (pure PyTorch: gathers cos/sin, computes in
float32, returns new tensors). Head layouts: 32 query / 8 key heads of 128 (Llama-3-8B) and
9 / 3 heads of 64 (SmolLM-135M), NeoX style. Each case is checked against the float64
reference before it is timed. Bytes counted: query and key read and written, the positions,
and one cos|sin row per token.

    python bench/bench_rope.py --device cuda --out bench/results
    python bench/bench_rope.py --device cpu --quick
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

from decodekit.bench import BenchContext, Result, add_common_args, check_close, rel_err, tensor_bytes
from decodekit.ops import reference

NAME = "rope"
TOKENS = [1, 16, 256, 4096]
TOKENS_QUICK = [1, 256]
HEADS = [(32, 8, 128, 500000.0), (9, 3, 64, 10000.0)]  # (query heads, key heads, head size, theta)
MAX_POSITION = 8192


def case_rope(ctx: BenchContext, T: int, hq: int, hk: int, D: int, theta: float, dtype: torch.dtype,
              is_neox: bool = True) -> Result:
    dev = ctx.device
    cache = reference.rope_cos_sin_cache(MAX_POSITION, D, theta).to(dev)  # [max_pos, D] float32
    pos = torch.randint(0, MAX_POSITION, (T,), dtype=torch.int64, device=dev)
    q = torch.randn(T, hq * D, device=dev).to(dtype)
    k = torch.randn(T, hk * D, device=dev).to(dtype)
    ref_q, ref_k = reference.rotary_embedding(pos, q.double(), k.double(), cache, D, is_neox)
    qo, ko = q.clone(), k.clone()
    torch.ops.decodekit.rotary_embedding(pos, qo, ko, cache, D, is_neox)
    case = f"T={T} {hq}/{hk}x{D}"
    err = max(check_close(qo, ref_q, dtype, f"rope query {case}"), check_close(ko, ref_k, dtype, f"rope key {case}"))
    pq, pk = reference.rotary_embedding(pos, q, k, cache, D, is_neox)
    peer_err = max(rel_err(pq, ref_q), rel_err(pk, ref_k))

    # positions and the cos|sin table are shared (one table for all layers); q and k rotate.
    sets = ctx.rotate((pos, q, k, cache), keep=(0, 3))
    t = ctx.time(lambda p, q, k, c: torch.ops.decodekit.rotary_embedding(p, q, k, c, D, is_neox), sets)
    tp = ctx.time(lambda p, q, k, c: reference.rotary_embedding(p, q, k, c, D, is_neox), sets)
    e = q.element_size()
    nbytes = 2 * T * (hq + hk) * D * e + T * 8 + T * D * 4
    return Result.from_timings("rotary_embedding", case + ("" if is_neox else " gptj"), dtype, dev, t,
                               nbytes=nbytes, peer="reference.rotary_embedding", peer_timing=tp,
                               rotate_bytes=tensor_bytes(sets), max_rel_err=err, peer_rel_err=peer_err)


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--gptj", action="store_true", help="also time the GPT-J (interleaved) style")
    args, unknown = p.parse_known_args(argv)  # run_all.py passes every family's options to all
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_rope: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    ctx.copy_ceiling()
    styles = [True, False] if args.gptj else [True]
    for dtype in ctx.dtypes:
        for hq, hk, D, theta in HEADS:
            for T in (TOKENS_QUICK if ctx.quick else TOKENS):
                for neox in styles:
                    ctx.add(case_rope(ctx, T, hq, hk, D, theta, dtype, neox))
    return ctx.finish()


if __name__ == "__main__":
    main()
