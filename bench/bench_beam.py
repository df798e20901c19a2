#!/usr/bin/env python3
"""Beam search on the CPU (embedded SmolLM2-135M Q4_1): LLM.beam_search with 1, 2 and 4 beams over
2 prompts, OUT tokens each (ignore_eos, so every run takes OUT steps), against, in the same process:
greedy generation of the same prompts (the engine's decode rate), sampling n = beam_width (the same
number of sequences without the search), and HF transformers' generate(num_beams=...) on the same
GGUF (when transformers + gguf are installed; --no-hf skips it).

A beam-search step computes one token per beam (beams continue or fork their parent's KV; engine/
beam_group.py), so it should cost about what a decode step of beam_width sampled sequences costs.

    python bench/bench_beam.py [--out 32] [--json OUT.json] [--no-hf]
"""
from __future__ import annotations

import argparse
import time

from decodekit import LLM, BeamSearchParams, SamplingParams
from decodekit.bench.timing import emit_json

PROMPTS = ["Write a short story about a robot who learns to paint. Once upon a time",
           "The three most important inventions of the twentieth century are"]


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=int, default=32, help="tokens per hypothesis (default 32)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-hf", action="store_true")
    args = ap.parse_args()
    llm = LLM(kv_cache_memory="256MiB")
    T = args.out
    llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=4))  # warm-up
    res = {"model": llm.engine.model_source, "prompts": len(PROMPTS), "out_tokens": T, "runs": {}}
    greedy = _time(lambda: llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=T, ignore_eos=True)))
    res["greedy_s"] = greedy
    for bw in (1, 2, 4):
        s = min(_time(lambda: llm.beam_search(PROMPTS, BeamSearchParams(beam_width=bw, max_tokens=T,
                                                                         ignore_eos=True))) for _ in range(2))
        samp = min(_time(lambda: llm.generate(PROMPTS, SamplingParams(n=bw, temperature=1.0, seed=1, max_tokens=T,
                                                                      ignore_eos=True))) for _ in range(2))
        res["runs"][bw] = {"beam_s": s, "ms_per_step": 1e3 * s / T, "sampling_n_s": samp,
                           "beam_over_sampling": s / samp, "beam_over_greedy": s / greedy}
    if not args.no_hf:
        try:
            import os

            import torch
            import transformers
            src = llm.engine.model_source
            hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src),
                                                                   dtype=torch.float32).eval()
            ids = [torch.tensor([llm.tokenizer.encode(p, add_special_tokens=True)]) for p in PROMPTS]
            for bw in (1, 2, 4):
                with torch.no_grad():
                    t = _time(lambda: [hf.generate(x, num_beams=bw, do_sample=False, max_new_tokens=T, min_new_tokens=T,
                                                   early_stopping=False, length_penalty=1.0,
                                                   attention_mask=torch.ones_like(x)) for x in ids])
                res["runs"][bw]["hf_num_beams_s"] = t
                res["runs"][bw]["hf_over_decodekit"] = t / res["runs"][bw]["beam_s"]
        except Exception as e:  # noqa: BLE001 -- the peer is optional
            res["hf_error"] = f"{type(e).__name__}: {e}"
    emit_json(res, args.json)


if __name__ == "__main__":
    main()
