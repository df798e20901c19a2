"""`decodekit bench serve`: a serving benchmark client for any OpenAI-compatible server (vLLM's
conventions). Streams every request and reports TTFT, TPOT, ITL and end-to-end latency (mean, median,
p90, p99), request / output-token / total-token throughput and goodput under SLOs.

Arrivals: --request-rate R requests/s with gamma-distributed gaps of shape --burstiness (1 = Poisson;
inf rate = all at once), at most --max-concurrency in flight. Prompts: random token ids of --input-len
(sent as token lists to /v1/completions, --output-len tokens each with ignore_eos) or the first turn
of a ShareGPT-format JSON (--dataset, tokenized by the server; output length from the answer's length
in characters / 4, capped by --output-len; --output-len for items without an answer).
TPOT = (e2e - ttft) / (output tokens - 1, from the usage chunk); ITL = gaps between streamed chunks
(as vLLM counts them: a speculative step's chunk may carry several tokens).
--launch "ENGINE ARGS" [--compare-offline]: starts the server itself and compares it with the offline
engine on the same requests in one run (bench/serve_compare.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time

from decodekit.bench.datasets import dataset_pairs, random_token_prompts
from decodekit.bench.output import check_output_file, dumps

def _pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _summary(xs) -> dict:
    ms = [1e3 * x for x in xs]
    return {"mean_ms": statistics.fmean(ms) if ms else None, "median_ms": _pct(ms, 50), "p90_ms": _pct(ms, 90),
            "p99_ms": _pct(ms, 99)}


def parse_goodput(items) -> dict:
    """["ttft:500", "tpot:50"] -> {"ttft": 0.5, "tpot": 0.05} (seconds)."""
    out = {}
    for it in items or []:
        k, _, v = it.partition(":")
        if k not in ("ttft", "tpot", "e2el") or not v:
            raise ValueError(f"--goodput items are ttft:MS, tpot:MS or e2el:MS, got {it!r}")
        try:
            ms = float(v)
        except ValueError:
            raise ValueError(f"--goodput {k}: {v!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise ValueError(f"--goodput {k} must be > 0 ms, got {v}")
        out[k] = ms / 1e3
    return out


def _requests(args) -> list[dict]:
    rng = random.Random(args.seed)
    if args.dataset:
        pairs = dataset_pairs(args.dataset)
        rng.shuffle(pairs)
        return [{"prompt": q, "max_tokens": max(1, min(args.output_len, len(a) // 4 or args.output_len))}
                for q, a in (pairs[i % len(pairs)] for i in range(args.num_prompts))]
    return [{"prompt": p, "max_tokens": args.output_len}
            for p in random_token_prompts(rng, args.num_prompts, args.input_len, args.vocab)]


class _Timeline:
    """Per-request timing from the streamed events."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.ttft = self.last = None
        self.itl, self.n, self.err, self.usage = [], 0, None, None

    def event(self, data: str) -> bool:
        """Handles one SSE data payload; False when the stream is over."""
        if data == "[DONE]":
            return False
        chunk = json.loads(data)
        if "error" in chunk:
            self.err = chunk["error"].get("message")
            return False
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            now = time.perf_counter()
            if self.ttft is None:
                self.ttft = now - self.t0
            elif self.last is not None:
                self.itl.append(now - self.last)
            self.last = now
            self.n += 1
        return True

    def result(self, req) -> dict:
        e2e = time.perf_counter() - self.t0
        out_tokens = self.usage["completion_tokens"] if self.usage else self.n
        prompt_tokens = self.usage["prompt_tokens"] if self.usage else (
            len(req["prompt"]) if isinstance(req["prompt"], list) else 0)
        return {"ok": self.err is None and self.ttft is not None, "error": self.err, "ttft": self.ttft, "e2e": e2e,
                "itl": self.itl, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens}


def _body(model, req) -> dict:
    return {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"], "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def _one(client, url, model, req, headers, timeout: float) -> dict:
    """One streamed request: through the raw SSE client (client None) or httpx."""
    tl = _Timeline()
    try:
        if client is None:
            from decodekit.bench.sse_client import stream_events
            async for data in stream_events(url, _body(model, req), headers, timeout):
                if not tl.event(data):
                    break
        else:
            async with client.stream("POST", url, json=_body(model, req), headers=headers) as r:
                if r.status_code != 200:
                    tl.err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                else:
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and not tl.event(line[6:]):
                            break
    except Exception as e:  # noqa: BLE001 -- a failed request is counted, not fatal
        from decodekit.bench.sse_client import HTTPStatusError
        tl.err = str(e) if isinstance(e, HTTPStatusError) else f"{type(e).__name__}: {e}"
    return tl.result(req)


async def _run(args, reqs, model) -> tuple[list[dict], float]:
    import httpx
    url = args.base_url.rstrip("/") + args.endpoint
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rng = random.Random(args.seed + 1)
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    limits = httpx.Limits(max_connections=args.max_concurrency or len(reqs) + 8, max_keepalive_connections=64)

    raw = getattr(args, "client", "auto") != "httpx" and url.startswith("http://")
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as hclient:
        client = None if raw else hclient

        async def guarded(req):
            if sem is None:
                return await _one(client, url, model, req, headers, args.timeout)
            async with sem:
                return await _one(client, url, model, req, headers, args.timeout)

        tasks = []
        t0 = time.perf_counter()
        for req in reqs:
            tasks.append(asyncio.ensure_future(guarded(req)))
            if math.isfinite(args.request_rate):
                theta = 1.0 / (args.request_rate * args.burstiness)
                await asyncio.sleep(rng.gammavariate(args.burstiness, theta))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0


def run(args) -> int:
    import httpx
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate must be > 0 (inf: all at once), got {args.request_rate}")
    if not 0 < args.burstiness < math.inf:
        raise ValueError(f"--burstiness must be a finite number > 0, got {args.burstiness}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if not 0 < args.timeout < math.inf:
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    if not args.dataset and args.vocab < 1:
        raise ValueError(f"--vocab must be >= 1 (random prompts draw token ids below it), got {args.vocab}")
    if args.launch is None and not args.base_url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url must start with http:// or https://, got {args.base_url!r}")
    if args.launch is not None and not 0 < args.launch_timeout < math.inf:
        raise ValueError(f"--launch-timeout must be a finite number of seconds > 0, got {args.launch_timeout}")
    check_output_file(args.output_json)  # before the run, not after it
    slo = parse_goodput(args.goodput)
    if args.compare_offline and args.launch is None:
        raise ValueError("--compare-offline needs --launch (the server this run starts)")
    if args.launch is not None:
        from decodekit.bench.serve_compare import run_compare
        return _emit(run_compare(args), args.output_json)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model
    if model is None:
        url = args.base_url.rstrip("/") + "/v1/models"
        try:
            r = httpx.get(url, headers=headers, timeout=30)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, LookupError, TypeError) as e:
            raise ValueError(f"argument --base-url: cannot read the model id from {url} ({type(e).__name__}: {e}); "
                             f"is the server running? (or pass --model)") from None
    reqs = _requests(args)
    results, dur = asyncio.run(_run(args, reqs, model))
    ok = [r for r in results if r["ok"]]
    out_tok = sum(r["output_tokens"] for r in ok)
    tpots = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]

    def good(r):
        tpot = (r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) if r["output_tokens"] > 1 else 0.0
        return all({"ttft": r["ttft"], "tpot": tpot, "e2el": r["e2e"]}[k] <= v for k, v in slo.items())

    res = {"bench": "serve", "base_url": args.base_url, "model": model, "num_prompts": len(reqs),
           "request_rate": _rate(args.request_rate), "burstiness": args.burstiness,
           "max_concurrency": args.max_concurrency,
           "completed": len(ok), "failed": len(results) - len(ok),
           "errors": sorted({r["error"] for r in results if r["error"]})[:5],
           "duration_s": dur, "request_throughput": len(ok) / dur, "output_throughput": out_tok / dur,
           "total_token_throughput": (out_tok + sum(r["prompt_tokens"] for r in ok)) / dur,
           "ttft": _summary([r["ttft"] for r in ok]), "tpot": _summary(tpots),
           "itl": _summary([g for r in ok for g in r["itl"]]), "e2el": _summary([r["e2e"] for r in ok]),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    if slo:
        res["goodput"] = {"slo_s": slo, "request_goodput": sum(good(r) for r in ok) / dur}
    _emit(res, args.output_json)
    return 0 if ok else 1


def _rate(rate: float):
    """--request-rate as JSON takes it: "inf" (all at once, as vLLM writes it) instead of an Infinity token."""
    return rate if math.isfinite(rate) else "inf"


def _emit(res: dict, path: str | None) -> int:
    text = dumps(res)  # strict JSON: a NaN / inf figure is null
    print(text)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    return 0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--endpoint", default="/v1/completions", help="completions endpoint path")
    p.add_argument("--model", default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    p.add_argument("--dataset", default=None, help="ShareGPT-format JSON (default: random token prompts)")
    p.add_argument("--num-prompts", type=int, default=100, help="requests (default 100)")
    p.add_argument("--input-len", type=int, default=128, help="random prompts: tokens (default 128)")
    p.add_argument("--output-len", type=int, default=64, help="tokens per request (default 64; dataset: a cap)")
    p.add_argument("--vocab", type=int, default=49152, help="random prompts: token ids below this (default 49152)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--goodput", nargs="*", default=None, help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--client", default="auto", choices=["auto", "httpx"],
                   help="auto: a minimal asyncio HTTP client for http:// (a few us of CPU per streamed chunk, so the "
                        "client steals little from a server on the same cores), httpx for https; httpx: always")
    p.add_argument("--seed", type=int, default=0, help="prompt and arrival seed")
    p.add_argument("--output-json", default=None, help="write the result here")
    from decodekit.bench.serve_compare import add_args as add_compare_args
    add_compare_args(p.add_argument_group("server vs offline engine (one run)"))
