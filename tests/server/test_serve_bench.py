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


@pytest.mark.parametrize("client", ["auto", "httpx"])
def test_bench_serve_reports(server, tmp_path, client):
    from decodekit.bench import serve_bench
    assert serve_bench.run(_args(server, tmp_path, client=client)) == 0
    r = json.load(open(tmp_path / "serve.json"))
    assert r["completed"] == 12 and r["failed"] == 0 and r["model"] == "smollm2"
    for k in ("ttft", "tpot", "itl", "e2el"):
        assert set(r[k]) == {"mean_ms", "median_ms", "p90_ms", "p99_ms"} and r[k]["median_ms"] > 0
    assert r["ttft"]["p99_ms"] >= r["ttft"]["median_ms"]
    assert r["output_throughput"] == pytest.approx(12 * 6 / r["duration_s"], rel=1e-6)
    assert r["goodput"]["request_goodput"] == pytest.approx(r["request_throughput"])   # generous SLOs: all good


@pytest.mark.parametrize("client", ["auto", "httpx"])
def test_bench_serve_counts_failed_requests(server, tmp_path, client):
    """Requests the server refuses (unknown model: 404) are counted as failed with the status, not fatal."""
    from decodekit.bench import serve_bench
    assert serve_bench.run(_args(server, tmp_path, client=client, model="no-such-model", num_prompts=3)) == 1
    r = json.load(open(tmp_path / "serve.json"))
    assert r["completed"] == 0 and r["failed"] == 3 and r["errors"][0].startswith("HTTP 404")


def test_bench_serve_bad_options(server, tmp_path):
    from decodekit.bench import serve_bench
    for kw, field in [({"request_rate": 0.0}, "request-rate"), ({"burstiness": -1.0}, "burstiness"),
                      ({"goodput": ["ttft:abc"]}, "ttft"), ({"goodput": ["speed:3"]}, "goodput"),
                      ({"num_prompts": 0}, "num-prompts")]:
        with pytest.raises(ValueError, match=field):
            serve_bench.run(_args(server, tmp_path, **kw))


def test_bench_serve_launch_compare_offline(tmp_path):
    """--launch starts its own server, --compare-offline runs the same requests through the engine in
    this process: both sides complete every request and the ratios are reported."""
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    from decodekit.cli import main
    out = tmp_path / "cmp.json"
    assert main(["bench", "serve", "--launch", "--max-model-len 256", "--compare-offline", "--num-prompts", "6",
                 "--input-len", "12", "--output-len", "5", "--low-load-prompts", "2", "--rounds", "2",
                 "--output-json", str(out)]) == 0
    r = json.load(open(out))
    assert r["bench"] == "serve_vs_offline" and r["engine_args"] == ["--max-model-len", "256"]
    assert r["server"]["output_tokens"] == r["offline"]["output_tokens"] == 6 * 5
    assert len(r["server"]["rounds"]) == len(r["offline"]["rounds"]) == len(r["throughput_ratio_per_round"]) == 2
    assert len(r["server"]["low_load_ttft_s"]) == len(r["offline"]["prefill_s"]) == 2
    assert r["throughput_ratio"] == pytest.approx(r["server"]["output_tok_s"] / r["offline"]["output_tok_s"])
    assert r["ttft_ratio"] > 0 and set(r["targets"]) == {"throughput_ratio >= 0.9", "ttft_ratio <= 1.2"}


def test_bench_serve_launch_bad_options(tmp_path):
    from decodekit.cli import main
    assert main(["bench", "serve", "--compare-offline"]) == 2                      # needs --launch
    assert main(["bench", "serve", "--launch", "--no-such-flag 3"]) == 2           # not an engine option
    assert main(["bench", "serve", "--launch", "", "--low-load-prompts", "0"]) == 2
    assert main(["bench", "serve", "--launch", "", "--rounds", "0"]) == 2
