"""`decodekit bench serve` against a live server: every request completes, the report has the
latency percentiles, throughputs and goodput; bad options are rejected by name."""
from __future__ import annotations

import argparse
import json

import pytest


def _args(server, tmp_path, **kw):
    from decodekit.bench import serve_bench
    p = argparse.ArgumentParser()
    serve_bench.add_args(p)
    a = p.parse_args(["--base-url", server.url, "--num-prompts", "12", "--input-len", "16", "--output-len", "6",
                      "--request-rate", "40", "--max-concurrency", "8", "--goodput", "ttft:60000", "tpot:60000",
                      "--output-json", str(tmp_path / "serve.json")])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_bench_serve_reports(server, tmp_path):
    from decodekit.bench import serve_bench
    assert serve_bench.run(_args(server, tmp_path)) == 0
    r = json.load(open(tmp_path / "serve.json"))
    assert r["completed"] == 12 and r["failed"] == 0 and r["model"] == "smollm2"
    for k in ("ttft", "tpot", "itl", "e2el"):
        assert set(r[k]) == {"mean_ms", "median_ms", "p90_ms", "p99_ms"} and r[k]["median_ms"] > 0
    assert r["ttft"]["p99_ms"] >= r["ttft"]["median_ms"]
    assert r["output_throughput"] == pytest.approx(12 * 6 / r["duration_s"], rel=1e-6)
    assert r["goodput"]["request_goodput"] == pytest.approx(r["request_throughput"])   # generous SLOs: all good


def test_bench_serve_bad_options(server, tmp_path):
    from decodekit.bench import serve_bench
    for kw, field in [({"request_rate": 0.0}, "request-rate"), ({"burstiness": -1.0}, "burstiness"),
                      ({"goodput": ["ttft:abc"]}, "ttft"), ({"goodput": ["speed:3"]}, "goodput"),
                      ({"num_prompts": 0}, "num-prompts")]:
        with pytest.raises(ValueError, match=field):
            serve_bench.run(_args(server, tmp_path, **kw))
