"""`decodekit bench serve --launch "ENGINE ARGS" [--compare-offline]`: the server against the offline
engine on the same requests, in one run.

1. Starts `decodekit serve ENGINE ARGS` on a free loopback port and waits for /health; with
   --compare-offline also builds the engine in this process with the same ENGINE ARGS. Both get one
   short warm-up request.
2. Saturation, --rounds times: --num-prompts new random token prompts sent to the server at
   --request-rate (default: all at once), streamed (output tokens/s, as `bench serve` reports), then
   the same prompts submitted at once to the offline engine and stepped until done (as
   `LLM.generate` does). The idle side costs nothing, so alternating gives both the same machine.
3. Low load: --low-load-prompts other prompts, one at a time: the server's TTFT, then the offline
   engine's prefill of the same prompt alone (time to its first token, `timed_request`).
4. Stops the server (SIGTERM).

Reports the median server / median offline output throughput (target >= 0.9) and median server TTFT
at low load over the median offline prefill time (target <= 1.2). Every prompt is new to both sides,
so no prefill is served from a prefix cache.
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
        if proc.poll() is not None:  # its own error is the log's last line (bad engine options: one line, no traceback)
            with open(log_path, errors="replace") as f:
                last = next((ln.strip() for ln in reversed(f.read()[-4000:].splitlines()) if ln.strip()), "")
            raise ValueError(f"argument --launch: the server exited with code {proc.returncode} before it was ready: "
                             f"{last} (log: {log_path})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise ValueError(f"argument --launch-timeout: the server was not ready after {timeout:g} s (log: {log_path})")


def _engine_namespace(engine_argv: list[str]) -> argparse.Namespace:
    from decodekit.engine.args import EngineArgs
    p = argparse.ArgumentParser(prog="--launch", add_help=False)
    EngineArgs.add_cli_args(p)
    ns, rest = p.parse_known_args(engine_argv)
    if rest:
        raise ValueError(f"--launch: not engine options: {' '.join(rest)}")
    return ns


def _rate(rate):
    from decodekit.bench.serve_bench import _rate as rate_json
    return rate_json(rate)


def _client_run(args, reqs, model, *, max_concurrency=None):
    from decodekit.bench.serve_bench import _run
    a = copy.copy(args)
    a.max_concurrency = max_concurrency
    if max_concurrency == 1:
        a.request_rate = float("inf")
    return asyncio.run(_run(a, reqs, model))


class _Offline:
    """The engine in this process, built with the server's ENGINE ARGS."""

    def __init__(self, engine_argv: list[str]):
        from decodekit.engine.args import EngineArgs
        from decodekit.engine.llm_engine import LLMEngine
        self.eng = LLMEngine(EngineArgs.from_cli(_engine_namespace(engine_argv)))

    def prefill_s(self, prompt: list[int]) -> float:
        from decodekit.bench.engine_bench import timed_request
        from decodekit.sampling import SamplingParams
        return timed_request(self.eng, prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[1]

    def saturate(self, reqs: list[dict]) -> dict:
        from decodekit.sampling import SamplingParams
        eng = self.eng
        t0 = time.perf_counter()
        for r in reqs:
            eng.add_request(None, list(r["prompt"]),
                            SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True))
        n_out = 0
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    n_out += len(o.outputs[0].token_ids)
        dt = time.perf_counter() - t0
        return {"duration_s": dt, "output_tokens": n_out, "output_tok_s": n_out / dt}


def _server_saturate(a, reqs, model) -> dict:
    res, dur = _client_run(a, reqs, model, max_concurrency=a.max_concurrency)
    _check(res)
    out_tok = sum(r["output_tokens"] for r in res)
    return {"duration_s": dur, "output_tokens": out_tok, "output_tok_s": out_tok / dur,
            "ttft_median_s": statistics.median(r["ttft"] for r in res)}


def _check(results) -> None:
    bad = [r["error"] for r in results if not r["ok"]]
    if bad:
        raise RuntimeError(f"{len(bad)} server requests failed, e.g. {bad[0]}")


def _compare(args, engine_argv, rounds, low_reqs, warm_req) -> dict:
    """Server and offline engine alive together, measured in turns (the idle one costs nothing), so
    both see the same machine: saturation rounds alternate, low-load prompts alternate one by one."""
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
        _check(_client_run(a, [warm_req], model, max_concurrency=1)[0])
        off = _Offline(engine_argv) if args.compare_offline else None
        if off is not None:
            off.saturate([warm_req])
        res = {"server": [], "offline": [], "server_ttft_s": [], "offline_prefill_s": []}
        for i, reqs in enumerate(rounds):
            t0 = time.perf_counter()
            res["server"].append(_server_saturate(a, reqs, model))
            if off is not None:
                res["offline"].append(off.saturate(reqs))
            print(f"[serve-compare] saturation round {i + 1}/{len(rounds)}: {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
        for r in low_reqs:
            low, _ = _client_run(a, [r], model, max_concurrency=1)
            _check(low)
            res["server_ttft_s"].append(low[0]["ttft"])
            if off is not None:
                res["offline_prefill_s"].append(off.prefill_s(r["prompt"]))
    except BaseException:
        print(f"[serve-compare] server log: {log.name}", file=sys.stderr)
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    os.unlink(log.name)
    return res


def run_compare(args) -> dict:
    if args.dataset:
        raise ValueError("--launch compares on random token prompts; drop --dataset")
    engine_argv = shlex.split(args.launch)
    ns = _engine_namespace(engine_argv)  # bad engine options fail here, before anything starts
    if args.low_load_prompts < 1:
        raise ValueError(f"--low-load-prompts must be >= 1, got {args.low_load_prompts}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    rng = random.Random(args.seed)
    # every round and every low-load prompt new: neither side serves a prefill from its prefix cache
    rounds = [[{"prompt": p, "max_tokens": args.output_len}
               for p in random_token_prompts(rng, args.num_prompts, args.input_len, args.vocab)]
              for _ in range(args.rounds)]
    low_reqs = [{"prompt": p, "max_tokens": args.output_len}
                for p in random_token_prompts(rng, args.low_load_prompts, args.input_len, args.vocab)]
    warm_req = {"prompt": random_token_prompts(rng, 1, 8, args.vocab)[0], "max_tokens": 4}
    m = _compare(args, engine_argv, rounds, low_reqs, warm_req)
    med = statistics.median
    res = {"bench": "serve_vs_offline", "engine_args": engine_argv, "model": ns.model or "(embedded default)",
           "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
           "request_rate": _rate(args.request_rate), "max_concurrency": args.max_concurrency, "rounds": args.rounds,
           "low_load_prompts": args.low_load_prompts,
           "server": {"rounds": m["server"], "output_tok_s": med(r["output_tok_s"] for r in m["server"]),
                      "output_tokens": m["server"][0]["output_tokens"], "low_load_ttft_s": m["server_ttft_s"]},
           "server_low_load_ttft_median_s": med(m["server_ttft_s"]),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    if args.compare_offline:
        res["offline"] = {"rounds": m["offline"], "output_tok_s": med(r["output_tok_s"] for r in m["offline"]),
                          "output_tokens": m["offline"][0]["output_tokens"], "prefill_s": m["offline_prefill_s"]}
        res["offline_prefill_median_s"] = med(m["offline_prefill_s"])
        res["throughput_ratio"] = res["server"]["output_tok_s"] / res["offline"]["output_tok_s"]
        res["throughput_ratio_per_round"] = [s["output_tok_s"] / o["output_tok_s"]
                                             for s, o in zip(m["server"], m["offline"])]
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
    p.add_argument("--rounds", type=int, default=3,
                   help="with --launch: saturation rounds (new prompts each), server and offline in turns; "
                        "medians reported (default 3)")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for the launched server")
