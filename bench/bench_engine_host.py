#!/usr/bin/env python3
"""The engine's host work per decode step, by phase, at batch 1 / 64 / 256 (or --batches).

A tiny random model (random:tiny-gqa4-d64: 2 layers, hidden 128) makes the forward pass nearly free, so
what a step costs is the Python around it: scheduling, the step's input arrays, sampling metadata, the
detokenizer and stop checks, the outputs. On a GPU that work runs while the device idles (between one
step's token read-back and the next step's launch) unless it overlaps the forward, so it caps decode
throughput at large batches whatever the kernels do. Phases (ms per step, wall):
  schedule     Scheduler.schedule                   host
  host_inputs  ModelRunner._host_inputs (numpy)     host
  execute      ModelRunner.execute (includes host_inputs; CPU: the forward; CUDA: H2D + graph launch)
  sample       LLMEngine._sample (CUDA: includes waiting for the forward at the read-back)
  update       Scheduler.update_from_output         host
  on_tokens    detokenizer, stop strings, logprobs  host
  collect      building RequestOutputs              host
host_only = schedule + host_inputs + update + on_tokens + collect. Requests are added as LLM.generate adds
them (final_only). Each batch runs --steps decode steps after a warm-up run.

    python bench/bench_engine_host.py [--device cpu|cuda] [--batches 1,64,256] [--steps 64] [--json OUT]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import decodekit  # noqa: F401
except ImportError:  # a checkout that is not installed
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

from decodekit import LLM, SamplingParams  # noqa: E402
from decodekit.bench.timing import emit_json  # noqa: E402

HOST_PHASES = ("schedule", "host_inputs", "update", "on_tokens", "collect")


def _wrap(obj, name: str, acc: collections.Counter, label: str) -> None:
    f = getattr(obj, name)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t
    setattr(obj, name, timed)


def run(argv: list[str] | None = None) -> dict:  # (not main(argv): run_all.py takes those as families)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="random:tiny-gqa4-d64")
    ap.add_argument("--batches", default="1,64,256", help="comma list of batch sizes (default 1,64,256)")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per timed run (default 64)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if any(b < 1 for b in batches) or args.steps < 2:
        ap.error("batches must be >= 1 and --steps >= 2")
    kw = dict(model=args.model, device=args.device, max_num_seqs=max(batches), enable_prefix_caching=False,
              seed=0)
    kw.update(dict(gpu_memory_utilization=0.2) if args.device == "cuda" else dict(kv_cache_memory="512MiB"))
    llm = LLM(**kw)
    eng = llm.engine
    params = SamplingParams(temperature=args.temperature, max_tokens=args.steps, ignore_eos=True)
    acc: collections.Counter = collections.Counter()
    for obj, name, label in ((eng.scheduler, "schedule", "schedule"), (eng.runner, "execute", "execute"),
                             (eng.runner, "_host_inputs", "host_inputs"), (eng, "_sample", "sample"),
                             (eng.scheduler, "update_from_output", "update"), (eng, "_on_tokens", "on_tokens"),
                             (eng, "_collect", "collect"), (eng, "step", "step")):
        _wrap(obj, name, acc, label)
    rows = []
    for B in batches:
        prompts = [{"prompt_token_ids": [(31 * i + 7 * j) % 900 + 50 for j in range(8)]} for i in range(B)]
        llm.generate(prompts, params)                       # warm-up (graphs, allocations)
        acc.clear()
        steps0 = eng.stats["steps"]
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t
        steps = eng.stats["steps"] - steps0
        assert all(len(o.outputs[0].token_ids) == args.steps for o in outs)
        per = {k: 1e3 * v / steps for k, v in acc.items()}
        host = sum(per.get(k, 0.0) for k in HOST_PHASES)
        rows.append({"batch": B, "steps": steps, "ms_per_step": 1e3 * wall / steps,
                     "host_only_ms_per_step": host, "host_only_us_per_request_step": 1e3 * host / B,
                     "phases_ms_per_step": per})
        print(f"B={B:4d}: {1e3 * wall / steps:8.3f} ms/step, host-only {host:7.3f} ms "
              f"({1e3 * host / B:6.1f} us per request) | " +
              " ".join(f"{k} {v:.3f}" for k, v in sorted(per.items())), flush=True)
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    res = {"bench": "engine_host", "model": args.model, "device": dev, "temperature": args.temperature,
           "torch_version": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows}
    emit_json(res, args.json)
    return res


if __name__ == "__main__":
    run()
