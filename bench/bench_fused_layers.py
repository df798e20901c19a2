#!/usr/bin/env python3
"""CPU decode with decoder_layers (one op call for all the layers, csrc/decoder_layer.cpp) against the same model
run op by op from Python (about ten op calls per layer), alternated in one process on one model object, so the
machine's drift hits both sides alike. Both paths issue the same kernels: the tokens must be equal (checked).

The interesting case is a model whose layers need more than the plain Llama graph inside the fused op - Qwen3's
q / k head norms (random:qwen3-0.6b: Qwen3-0.6B's shapes, random weights, INT4 RTN by default) - and the
embedded SmolLM2-135M as the reference point. With int4-rtn, a second engine with a float LM head
(quantize_lm_head=False) is timed in the same alternation: the INT8 head's share of a decode step.

    python bench/bench_fused_layers.py [--model random:qwen3-0.6b] [--quantization int4-rtn|none]
                                       [--out 48] [--pairs 3] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import statistics
import time

from decodekit import LLM, SamplingParams
from decodekit.bench.timing import emit_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="random:qwen3-0.6b", help="model (default random:qwen3-0.6b; "
                                                                 "'default': the embedded SmolLM2)")
    ap.add_argument("--quantization", default="int4-rtn", help="int4-rtn (default), fp8 or none")
    ap.add_argument("--out", type=int, default=48, help="decode tokens per run (default 48)")
    ap.add_argument("--pairs", type=int, default=3, help="fused / op-by-op pairs (default 3)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = None if args.model == "default" else args.model
    quant = None if args.quantization == "none" or model is None else args.quantization
    kw = dict(model=model, quantization=quant, kv_cache_memory="256MiB", max_model_len=1024,
              enable_prefix_caching=False)     # every run prefills the prompt: (run - prefill run) is the decode
    llm = LLM(**kw)
    float_head = LLM(**kw, quantize_lm_head=False) if quant == "int4-rtn" else None
    m = llm.engine.model
    prompt = {"prompt_token_ids": [(7 * i + 3) % 1000 + 10 for i in range(32)]}
    params = SamplingParams(temperature=0, max_tokens=args.out, ignore_eos=True)

    def run(op_by_op: bool, engine=llm) -> tuple[float, list[int]]:
        """Seconds per decode token: a run of `out` tokens minus the fastest of 3 prefill-only runs."""
        engine.engine.model.op_by_op = op_by_op
        prefill = []
        for _ in range(3):
            t = time.perf_counter()
            engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1))
            prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        (o,) = engine.generate(prompt, params)
        total = time.perf_counter() - t
        return (total - min(prefill)) / (args.out - 1), o.outputs[0].token_ids

    run(False), run(True)       # warm-up
    if float_head is not None:
        run(False, float_head)
    fused, unfused, head, tokens = [], [], [], set()
    for _ in range(args.pairs):
        for side, acc in ((False, fused), (True, unfused)):
            dt, toks = run(side)
            acc.append(dt)
            tokens.add(tuple(toks))
        if float_head is not None:
            head.append(run(False, float_head)[0])
    m.op_by_op = False
    if len(tokens) != 1:
        raise SystemExit("fused and op-by-op decoding gave different tokens")
    res = {"model": llm.engine.model_source, "architecture": llm.engine.model_config.architecture,
           "quantization": quant, "fused_layers": m.fused_layers, "decode_tokens": args.out, "pairs": args.pairs,
           "fused_ms_per_token": [round(x * 1e3, 3) for x in fused],
           "op_by_op_ms_per_token": [round(x * 1e3, 3) for x in unfused],
           "speedup_median": round(statistics.median(u / f for f, u in zip(fused, unfused)), 3),
           "float_head_ms_per_token": [round(x * 1e3, 3) for x in head] or None,
           "int8_head_speedup_median": round(statistics.median(h / f for f, h in zip(fused, head)), 3) if head
           else None,
           "threads": __import__("torch").get_num_threads(),
           "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    emit_json(res, args.json)


if __name__ == "__main__":
    main()
