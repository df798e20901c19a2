"""`decodekit plan` and `decodekit plan explain` through decodekit.cli.main."""
import json
import os

import pytest

from decodekit.cli import main

BASE = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "8", "--prompt-len", "2000",
        "--output-len", "500", "--ttft-ms", "500", "--tpot-ms", "50"]


def test_table(capsys):
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "Llama-3-70B" in out and "8 x H100" in out
    assert "TPOT ms" in out and "TTFT ms" in out and "tok/s/GPU" in out and "max conc" in out
    front = [ln for ln in out.splitlines() if ln.startswith("*")]
    assert front, "the Pareto front is marked"
    assert "TP1 PP1 x8: weights 141.1 GB" in out     # infeasible shapes are explained
    assert "lowest latency: TP8 PP1 x1 batch 1" in out


def test_json(capsys):
    assert main(BASE + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["kv_bytes_per_token"] == 327680
    assert d["crossover_batch"]["weights_only"] == pytest.approx(295.4, rel=0.01)
    rows, front = d["rows"], d["pareto_front"]
    assert front and all(rows[i]["on_front"] and rows[i]["feasible"] for i in front)
    for r in rows:
        assert {"tp", "pp", "replicas", "batch", "tpot_s", "ttft_s", "tok_s_cluster", "tok_s_per_gpu",
                "max_concurrency", "feasible", "reasons"} <= set(r)


def test_all_lists_infeasible_rows(capsys):
    assert main(BASE + ["--all"]) == 0
    out = capsys.readouterr().out
    assert "> 80 GB per GPU" in out and "infeasible rows (--all" not in out


def test_explain_has_units(capsys):
    assert main(["plan", "explain", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "8", "--tp", "8",
                 "--prompt-len", "2000", "--output-len", "500", "--spec-k", "4", "--spec-accept", "0.8"]) == 0
    out = capsys.readouterr().out
    for s in ("327,680 B", "141.1 GB", "3.35 TB/s", "989.5 TFLOP/s", "FLOP/byte", " ms", " us",
              "one-shot", "ring", "TPOT", "TTFT", "3.362", "KV budget"):
        assert s in out, s
    assert "TP=8 PP=1 replicas=1" in out


def test_explain_kv_replication_and_pp(capsys):
    assert main(["plan", "explain", "--model", "llama3-70b", "--gpu", "h100", "--tp", "16", "--pp", "2",
                 "--batch", "8", "--weights", "int4", "--group-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "replicated 2x" in out and "50% lost" in out and "PP=2" in out and "bubble" in out
    assert "35.28 GB" in out


def test_explain_int4_floor_is_10_4_ms(capsys):
    assert main(["plan", "explain", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "1", "--weights", "int4",
                 "--group-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "35.28 GB / 3.35 TB/s = 10.5 ms" in out and "at least 1 device(s)" in out


def test_plot_writes_three_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(BASE + ["--plot", str(tmp_path)]) == 0
    for name in ("frontier.png", "tp_scaling.png", "roofline.png"):
        p = tmp_path / name
        assert p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(p) > 10_000


def test_gpu_from_calibration_file(capsys, tmp_path):
    f = tmp_path / "20990101-0000_H200_ceilings.json"
    f.write_text(json.dumps([{"kind": "copy_gbps", "value": 4000.0, "device_name": "NVIDIA H200"},
                             {"kind": "matmul_tflops", "value": 800.0, "device_name": "NVIDIA H200"}]))
    assert main(["plan", "--gpu", str(f), "--model", "llama3-8b", "--gpus", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hardware"]["name"] == "H200 141GB" and d["calibration"]["copy_gbps"] == 4000.0
    assert d["efficiency"]["calibrated"]["weight_bw"]["all"] == pytest.approx(4000 / 4800)
    r = d["rows"][0]
    assert r["tpot_calibrated_s"] > r["tpot_ideal_s"]
    f2 = tmp_path / "other.json"
    f2.write_text(json.dumps([{"kind": "copy_gbps", "value": 1.0, "device_name": "Some TPU"}]))
    assert main(["plan", "--gpu", str(f2)]) == 2
    assert "gpu:" in capsys.readouterr().err


def test_cpu_calibrated_from_bench_results(capsys, monkeypatch):
    from decodekit.planner import hardware
    cal = hardware.load_calibration(hardware.cpu_device_name(), act_dtype="fp32")
    if cal.copy_gbps is None or cal.matmul_tflops is None:
        pytest.skip("no bench/results rows for this CPU (would measure)")
    assert main(["plan", "--gpu", "cpu-calibrated", "--prompt-len", "32", "--output-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M" in out and "q4_1 weights 0.10 GB" in out and "calibrated" in out


@pytest.mark.parametrize("argv,field", [
    (["--gpus", "0"], "--gpus"), (["--gpus", "two"], "--gpus"), (["--gpus", "1.5"], "--gpus"),
    (["--prompt-len", "-5"], "--prompt-len"), (["--output-len", "0"], "--output-len"),
    (["--spec-k", "-1"], "--spec-k"), (["--spec-accept", "1"], "--spec-accept"),
    (["--spec-accept", "-0.1"], "--spec-accept"), (["--tpot-ms", "0"], "--tpot-ms"),
    (["--weights", "int3"], "--weights"), (["--kv-dtype", "int2"], "--kv-dtype"),
    (["--prefill-mfu", "1.5"], "--prefill-mfu"), (["--group-size", "-4"], "--group-size"),
])
def test_bad_arguments_name_the_field(capsys, argv, field):
    with pytest.raises(SystemExit) as e:
        main(["plan"] + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


@pytest.mark.parametrize("argv,words", [
    (["--model", "gpt-5"], ["model", "llama3-8b"]), (["--gpu", "tpu"], ["gpu", "h100"]),
    (["--model", "/nonexistent/x.gguf"], ["model", "no such file"]),
    (["--gpu", "h100", "--measure"], ["--measure", "cpu-calibrated"]),
])
def test_bad_values_one_line(capsys, argv, words):
    assert main(["plan"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("decodekit: error:") and "Traceback" not in err
    for w in words:
        assert w in err


def test_explain_sliding_window(capsys):
    assert main(["plan", "explain", "--model", "mistral-7b-v0.1", "--gpu", "h200", "--gpus", "1",
                 "--prompt-len", "30000", "--output-len", "2000", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "sliding window 4096 tokens on 32 of 32 layers" in out and "keeps only a window" in out
    assert "KV bytes per GPU = 4 x 4096 tokens (attended of 31000: window 4096)" in out, out
    assert "max batch at 32000 tokens (holding 4112)" in out, out
