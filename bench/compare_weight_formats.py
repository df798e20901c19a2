#!/usr/bin/env python3
"""Paired in-process comparison of the engine with GGUF 4-bit/8-bit weights kept packed vs
dequantized at load (same model, same process, runs alternated so machine drift cancels):
batch-1 decode tok/s (median step time) and 32-request throughput.

    PYTHONPATH=python python bench/compare_weight_formats.py --dtype float32 [--model PATH.gguf]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from decodekit.engine.args import EngineArgs
from decodekit.engine.llm_engine import LLMEngine
from decodekit.sampling import SamplingParams


def decode_tps(eng, prompt, n=48) -> float:
    eng.add_request(None, prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    steps = []
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        eng.step()
        steps.append(time.perf_counter() - t0)
    return 1 / statistics.median(steps[2:])


def throughput(eng, prompts, n=64) -> float:
    t0 = time.perf_counter()
    for p in prompts:
        eng.add_request(None, p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    return len(prompts) * n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    engs = {wf: LLMEngine(EngineArgs(model=args.model, dtype=args.dtype, weight_format=wf, kv_cache_memory="512MiB"))
            for wf in ("packed", "dequantized")}
    prompt = engs["packed"].tokenizer.encode("The history of science is the study of the development of science")
    rng = random.Random(0)
    vocab = engs["packed"].model_config.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(128)] for _ in range(32)]
    for e in engs.values():
        decode_tps(e, prompt, 8)
    dec = {k: [] for k in engs}
    for _ in range(args.rounds):
        for k, e in engs.items():
            dec[k].append(decode_tps(e, prompt))
    ratios = [a / b for a, b in zip(dec["packed"], dec["dequantized"])]
    tp = {k: throughput(e, prompts) for k, e in engs.items()}
    print(f"{args.dtype}: batch-1 decode packed {statistics.median(dec['packed']):.1f} tok/s, dequantized "
          f"{statistics.median(dec['dequantized']):.1f} tok/s, paired ratio median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); 32 x (128 in / 64 out): packed {tp['packed']:.1f}, "
          f"dequantized {tp['dequantized']:.1f} output tok/s")


if __name__ == "__main__":
    main()
