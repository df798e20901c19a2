"""GFLOP/s of one SmolLM2-135M layer's four INT4 projections (960x576, 576x576, 3072x576, 576x1536, groups of 32)
through decodekit.ops.int4_gemm, by activation dtype and rows, against torch's dense matmul (oneDNN / MKL) of the
same shapes in the same process (the CPU's matmul rate: the physical reference). Best of 5 x 5 calls.

Usage: python tools/bench_cpu_layer_gemms.py [M ...]   (default 16 128 512)
A / B of a kernel switch: run it twice with the variable set, e.g. DECODEKIT_CPU_BF16_DOT=0.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from dk_testing import random_int4_weight, randn  # noqa: E402
from decodekit import ops  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def best_time(fn) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(5):
            fn()
        best = min(best, (time.perf_counter() - t) / 5)
    return best


def main() -> None:
    torch.set_grad_enabled(False)
    Ms = [int(x) for x in sys.argv[1:]] or [16, 128, 512]
    gen = torch.Generator().manual_seed(1)
    ws = [random_int4_weight(N, K, 32, "cpu", gen) for N, K in SHAPES]
    print(f"threads {torch.get_num_threads()}, DECODEKIT_CPU_BF16_DOT={os.environ.get('DECODEKIT_CPU_BF16_DOT', '1')}")
    for M in Ms:
        flops = sum(2 * M * N * K for N, K in SHAPES)
        for dt in (torch.float32, torch.bfloat16):
            xs = [randn((M, K), dt, "cpu", gen) for _, K in SHAPES]
            dense = [torch.randn(N, K, dtype=dt) for N, K in SHAPES]
            q = best_time(lambda: [ops.int4_gemm(x, w) for w, x in zip(ws, xs)])
            d = best_time(lambda: [torch.nn.functional.linear(x, w) for w, x in zip(dense, xs)])
            print(f"M={M:4d} {str(dt):15s} int4_gemm {flops / q / 1e9:6.0f} GFLOP/s | torch dense {flops / d / 1e9:6.0f} "
                  f"GFLOP/s | ratio {d / q:.2f}")


if __name__ == "__main__":
    main()
