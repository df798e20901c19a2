"""Prediction vs measurement plumbing (the engine run itself is replaced by a recorded result:
tests never time anything)."""
import json

import pytest

from decodekit import planner as P
from decodekit.planner import measure
from decodekit.planner.hardware import Hardware

FAKE = {"bench": "latency", "device": "Fake CPU (2 cpus)", "input_len": 32, "output_len": 64,
        "decodekit": {"ttft_s": 0.05, "tpot_s": 0.012}, "weight_bytes": 96_576_768, "copy_bandwidth_gb_s": 20.0}
CPU = Hardware("CPU fake", 16e9, 25e9, {"fp32": 0.3e12}, None, 0.0, act_dtype="fp32")


def test_compare_by_hand():
    m, wf = P.load_model("smollm2-135m"), P.weight_format("q4_1")
    eff = P.Efficiency("cal", weight_bw={"int4": 0.4, "int8": 0.5, "all": 0.5}, kv_bw=0.25, decode_mfu=0.9,
                       prefill_mfu=0.9)
    c = measure.compare(FAKE, m, CPU, wf, kv_dtype="fp32", eff_ideal=P.ideal(), eff_cal=eff)
    b = wf.bytes_by_class(m)
    kv = 64 * m.kv_bytes_per_token("fp32")  # mean context 32 + 64 / 2
    want = (b["linear"] + b["norm"]) / (25e9 * 0.4) + b["embed"] / (25e9 * 0.5) + kv / (25e9 * 0.25)
    assert c["calibrated"]["tpot_s"] == pytest.approx(want)
    assert c["calibrated"]["tpot_pred_over_measured"] == pytest.approx(want / 0.012)
    # the same run's copy bandwidth (20 GB/s) scales every byte term
    assert c["calibrated_same_run_copy"]["tpot_s"] == pytest.approx(want * 25 / 20)
    assert c["ideal"]["tpot_s"] == pytest.approx((sum(b.values()) + kv) / 25e9)
    assert c["weight_bytes_planner"] == pytest.approx(c["weight_bytes_engine"])
    text = measure.format_comparison(c)
    assert "measured TPOT 12.00 ms" in text and "calibrated" in text


def test_cli_measure_uses_the_engine_result(capsys, monkeypatch, tmp_path):
    from decodekit.cli import main
    from decodekit.planner import hardware
    cal = hardware.load_calibration(hardware.cpu_device_name(), act_dtype="fp32")
    if cal.copy_gbps is None or cal.matmul_tflops is None:
        pytest.skip("no bench/results rows for this CPU (would measure)")
    monkeypatch.setattr(measure, "run_engine_latency", lambda *a, **k: dict(FAKE))
    out_json = tmp_path / "cmp.json"
    assert main(["plan", "--gpu", "cpu-calibrated", "--prompt-len", "32", "--output-len", "64", "--measure",
                 "--measure-json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "prediction vs measurement" in out and "measured TPOT 12.00 ms" in out
    d = json.loads(out_json.read_text())
    assert d["comparison"]["measured_tpot_s"] == 0.012 and "calibrated" in d["comparison"]
