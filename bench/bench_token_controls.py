#!/usr/bin/env python3
"""Per-step cost of the token controls on the CPU (embedded SmolLM2-135M Q4_1):

1. SamplingMetadata.build for 32 rows of one request with a full-vocabulary logit_bias and allowed_token_ids
   (first build: the request's tensors are made; second: reused);
2. LLM.generate, n=32, 16 tokens, T=1: ms per engine step with no controls, a full-vocabulary logit_bias,
   allowed_token_ids = the whole vocabulary (min of --runs runs);
3. guided_choice with 256 choices of ~1 KB (3 bytes a character) vs one short choice: seconds for 6 tokens.

    python bench/bench_token_controls.py [--runs 2] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import time

from decodekit import LLM, SamplingParams
from decodekit.bench.timing import emit_json
from decodekit.sampling import SamplingMetadata


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llm = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", seed=0)
    V = llm.engine.model_config.vocab_size
    res: dict = {}

    p = SamplingParams(temperature=1.0, logit_bias={t: 0.5 for t in range(V)}, allowed_token_ids=list(range(V)))
    times = []
    for _ in range(2):
        t = time.perf_counter()
        SamplingMetadata.build([p] * 32, [[]] * 32, [[0]] * 32, list(range(32)), None, None, "cpu", V)
        times.append((time.perf_counter() - t) * 1e3)
    res["metadata_build_ms_first_then_reused"] = times

    base = dict(temperature=1.0, seed=1, n=32, max_tokens=16, ignore_eos=True)
    steps = {}
    for name, kw in [("none", {}), ("logit_bias_full_vocab", {"logit_bias": {t: 0.5 for t in range(V)}}),
                     ("allowed_full_vocab", {"allowed_token_ids": list(range(V))})]:
        llm.generate("Once upon a time", SamplingParams(**{**base, "max_tokens": 2}, **kw))
        ts = []
        for _ in range(args.runs):
            t = time.perf_counter()
            llm.generate("Once upon a time", SamplingParams(**base, **kw))
            ts.append(time.perf_counter() - t)
        steps[name] = min(ts) / 16 * 1e3
    res["generate_n32_ms_per_step"] = steps

    guided = {}
    for name, choices in [("256_choices_of_1KB", ["日" * 1020 + f"{i:03d}" for i in range(256)]),
                          ("1_short_choice", ["日" * 10])]:
        t = time.perf_counter()
        llm.generate("Hi", SamplingParams(max_tokens=6, guided_choice=choices))
        guided[name] = time.perf_counter() - t
    res["guided_choice_s_for_6_tokens"] = guided
    emit_json(res, args.json)


if __name__ == "__main__":
    main()
