"""`decodekit bench serve --launch "ENGINE ARGS" [--compare-offline]`: the server against the offline
engine on the same requests, in one run.

1. Starts `decodekit serve ENGINE ARGS` on a free loopback port and waits for /health.
2. Saturation: --num-prompts random token prompts sent at --request-rate (default: all at once),
   streamed; output tokens/s over the whole run (what `bench serve` reports).
3. Low load: --low-load-prompts other prompts of the same length, one at a time; median TTFT.
4. Stops the server (SIGTERM), so the offline run below has the cores to itself.
5. --compare-offline: builds the engine in this process with the same ENGINE ARGS, times the
   prefill of each low-load prompt alone (the time to its first token, `timed_request`), then
   submits the saturation prompts at once and steps until done (`LLMEngine.step`, as
   `LLM.generate` does): output tokens/s.

Reports server/offline output throughput (target >= 0.9) and median server TTFT at low load over
the median offline prefill time of the same prompts (target <= 1.2). Both sides get one short
warm-up request first; the low-load prompts differ from the saturation ones, so neither side's
prefill is served from its prefix cache.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from decodekit.bench.datasets import random_token_prompts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, log_path: str, timeout: float) -> None:
    import httpx
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            with open(log_path) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready:\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s (log: {log_path})")


def _engine_namespace(engine_argv: list[str]) -> argparse.Namespace:
    from decodekit.engine.args import EngineArgs
    p = argparse.ArgumentParser(prog="--launch", add_help=False)
    EngineArgs.add_cli_args(p)
    ns, rest = p.parse_known_args(engine_argv)
    if rest:
        raise ValueError(f"--launch: not engine options: {' '.join(rest)}")
    return ns


def _client_run(args, reqs, model, *, max_concurrency=None):
    from decodekit.bench.serve_bench import _run
    a = copy.copy(args)
    a.max_concurrency = max_concurrency
    if max_concurrency == 1:
        a.request_rate = float("inf")
    return asyncio.run(_run(a, reqs, model))


def _server_phase(args, engine_argv, sat_reqs, low_reqs, warm_req) -> dict:
    import httpx
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", prefix="decodekit-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "decodekit.cli", "serve", "--port", str(port), *engine_argv]
    print(f"[serve-compare] starting: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(proc, base, log.name, args.launch_timeout)
        model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        a = copy.copy(args)
        a.base_url, a.endpoint, a.api_key = base, "/v1/completions", None
        _client_run(a, [warm_req], model, max_concurrency=1)
        t0 = time.perf_counter()
        sat, sat_dur = _client_run(a, sat_reqs, model, max_concurrency=args.max_concurrency)
        print(f"[serve-compare] saturation: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        low, _ = _client_run(a, low_reqs, model, max_concurrency=1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    bad = [r["error"] for r in sat + low if not r["ok"]]
    if bad:
        raise RuntimeError(f"{len(bad)} server requests failed, e.g. {bad[0]} (log: {log.name})")
    os.unlink(log.name)
    out_tok = sum(r["output_tokens"] for r in sat)
    return {"duration_s": sat_dur, "output_tokens": out_tok, "output_tok_s": out_tok / sat_dur,
            "low_load_ttft_s": [r["ttft"] for r in low],
            "saturation_ttft_median_s": statistics.median(r["ttft"] for r in sat)}


def _offline_phase(engine_argv, sat_reqs, low_reqs, warm_req, output_len) -> dict:
    from decodekit.bench.engine_bench import timed_request
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.sampling import SamplingParams
    eng = LLMEngine(EngineArgs.from_cli(_engine_namespace(engine_argv)))
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    timed_request(eng, warm_req["prompt"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    prefill = [timed_request(eng, r["prompt"], first)[1] for r in low_reqs]
    p = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    for r in sat_reqs:
        eng.add_request(None, list(r["prompt"]), p)
    n_out = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                n_out += len(o.outputs[0].token_ids)
    dt = time.perf_counter() - t0
    return {"duration_s": dt, "output_tokens": n_out, "output_tok_s": n_out / dt, "prefill_s": prefill,
            "device": str(eng.device), "dtype": str(eng.dtype).replace("torch.", "")}


def run_compare(args) -> dict:
    if args.dataset:
        raise ValueError("--launch compares on random token prompts; drop --dataset")
    engine_argv = shlex.split(args.launch)
    ns = _engine_namespace(engine_argv)  # bad engine options fail here, before anything starts
    if args.low_load_prompts < 1:
        raise ValueError(f"--low-load-prompts must be >= 1, got {args.low_load_prompts}")
    rng = random.Random(args.seed)
    sat = random_token_prompts(rng, args.num_prompts, args.input_len, args.vocab)
    low = random_token_prompts(rng, args.low_load_prompts, args.input_len, args.vocab)
    warm = random_token_prompts(rng, 1, 8, args.vocab)[0]
    sat_reqs = [{"prompt": p, "max_tokens": args.output_len} for p in sat]
    low_reqs = [{"prompt": p, "max_tokens": args.output_len} for p in low]
    warm_req = {"prompt": warm, "max_tokens": 4}
    server = _server_phase(args, engine_argv, sat_reqs, low_reqs, warm_req)
    res = {"bench": "serve_vs_offline", "engine_args": engine_argv, "model": ns.model or "(embedded default)",
           "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
           "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
           "low_load_prompts": args.low_load_prompts, "server": server,
           "server_low_load_ttft_median_s": statistics.median(server["low_load_ttft_s"]),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    if args.compare_offline:
        off = _offline_phase(engine_argv, sat_reqs, low_reqs, warm_req, args.output_len)
        res["offline"] = off
        res["offline_prefill_median_s"] = statistics.median(off["prefill_s"])
        res["throughput_ratio"] = server["output_tok_s"] / off["output_tok_s"]
        res["ttft_ratio"] = res["server_low_load_ttft_median_s"] / res["offline_prefill_median_s"]
        res["targets"] = {"throughput_ratio >= 0.9": res["throughput_ratio"] >= 0.9,
                          "ttft_ratio <= 1.2": res["ttft_ratio"] <= 1.2}
    return res


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launch", default=None, metavar="ENGINE_ARGS",
                   help='start `decodekit serve ENGINE_ARGS` on a free loopback port for this run (e.g. "" for the '
                        'embedded default, or "--model random:smollm2-135m"); --base-url is then ignored')
    p.add_argument("--compare-offline", action="store_true",
                   help="with --launch: after the server stops, run the same requests through the engine in this "
                        "process and report server/offline throughput and low-load TTFT/prefill ratios")
    p.add_argument("--low-load-prompts", type=int, default=8,
                   help="with --launch: prompts sent one at a time for the low-load TTFT (default 8)")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for the launched server")
