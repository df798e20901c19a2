"""Host cost of repetition / frequency / presence penalties per sampling step (CPU): SamplingMetadata.build
with the prompts as lists (converted every step, as before) or as the cached distinct-id tensors the engine
now passes (sampler.penalty_prompt), and apply_penalties (gather / scatter on the seen ids) vs the same rule
as masks over the whole vocabulary (apply_penalties_dense, what ran before). Medians of 9 runs.

    python tools/bench_penalties.py [--batch 64] [--prompt-len 4000] [--output-len 500] [--vocab 49152]
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from decodekit.sampling.params import SamplingParams
from decodekit.sampling.sampler import SamplingMetadata, apply_penalties, apply_penalties_dense


def median_ms(f, n: int = 9) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=4000)
    ap.add_argument("--output-len", type=int, default=500)
    ap.add_argument("--vocab", type=int, default=49152)
    a = ap.parse_args()
    B, V, L, LO = a.batch, a.vocab, a.prompt_len, a.output_len
    rng = random.Random(0)
    ps = [SamplingParams(temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.2, seed=i) for i in range(B)]
    prompts = [[rng.randrange(V) for _ in range(L)] for _ in range(B)]
    cached = [torch.unique(torch.tensor(p)) for p in prompts]
    outs = [[rng.randrange(V) for _ in range(LO)] for _ in range(B)]
    logits = torch.randn(B, V)

    def build(pr):
        return SamplingMetadata.build(ps, outs, pr, list(range(B)), [LO] * B, 0, "cpu", V)

    md = build(cached)
    args = (logits, md.prompt_token_ids, md.output_token_ids, md.repetition_penalty, md.presence_penalty,
            md.frequency_penalty)
    print(f"B={B} prompt={L} output={LO} V={V} threads={torch.get_num_threads()}")
    print(f"  build: prompts as lists {median_ms(lambda: build(prompts)):.2f} ms, cached tensors "
          f"{median_ms(lambda: build(cached)):.2f} ms")
    print(f"  penalties: dense masks {median_ms(lambda: apply_penalties_dense(*args)):.2f} ms, seen ids "
          f"{median_ms(lambda: apply_penalties(*args)):.2f} ms")


if __name__ == "__main__":
    main()
