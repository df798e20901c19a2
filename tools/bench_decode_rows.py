"""Milliseconds of SmolLM2-135M's 30 layers of INT4 projections (960x576, 576x576, 3072x576, 576x1536, groups of 32)
and its Q8_0 LM head (49152x576) for M activation rows, weights from DRAM (30 distinct layers: ~45 MB), through
decodekit.ops.linear two ways in the same process: by the row count (decode_rows=-1: the tiled / bf16-product
kernels from int4.h's thresholds) and as M decode rows (decode_rows=M: each row with its one-row bits, batch
invariance). Best of 3.

Usage: python tools/bench_decode_rows.py [--dtype float32|bfloat16|float16] [M ...]   (default M: 9 16 24 32 64)
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from bench_cpu_layer_gemms import SHAPES  # noqa: E402  (SmolLM2's four projections, [N, K])
from dk_testing import random_int4_weight, random_int8_weight, randn  # noqa: E402
from decodekit import ops  # noqa: E402


def best(fn, reps: int = 3) -> float:
    fn()
    t = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("rows", nargs="*", type=int, default=[9, 16, 24, 32, 64])
    args = p.parse_args()
    torch.set_grad_enabled(False)
    dt = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(1)
    layers = [[random_int4_weight(N, K, 32, "cpu", gen) for N, K in SHAPES] for _ in range(30)]
    head = random_int8_weight(49152, 576, 32, "cpu", gen)
    print(f"{args.dtype}, {torch.get_num_threads()} threads; ms: by row count / as decode rows")
    for M in args.rows:
        xs = [randn((M, K), dt, "cpu", gen) for _, K in SHAPES]
        xh = randn((M, 576), dt, "cpu", gen)
        res = []
        for dr in (-1, M):
            res.append(best(lambda: [ops.linear(x, w, decode_rows=dr) for ws in layers for w, x in zip(ws, xs)]))
            res.append(best(lambda: ops.linear(xh, head, decode_rows=dr)))
        print(f"M={M:4d}  layers {res[0]:7.2f} / {res[2]:7.2f}   LM head {res[1]:6.2f} / {res[3]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
