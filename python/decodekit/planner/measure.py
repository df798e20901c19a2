"""Prediction vs measurement: run the engine's own `bench latency` (batch 1, one request at a time)
and set its time per output token next to the planner's ideal and calibrated predictions.

    decodekit plan --gpu cpu-calibrated --measure            (SmolLM2-135M, 32 + 64 tokens)
    decodekit bench latency --input-len 32 --output-len 64   (the measurement alone)
"""
from __future__ import annotations

import argparse
import dataclasses

from decodekit.planner import roofline as rf
from decodekit.planner.hardware import Hardware
from decodekit.planner.models import ModelSpec, WeightFormat


def run_engine_latency(input_len: int = 32, output_len: int = 64, iters: int = 3, model: str | None = None) -> dict:
    """`decodekit bench latency --peer none` in this process (the embedded SmolLM2 by default):
    its result dict (decodekit.tpot_s, ttft_s, weight_bytes, copy_bandwidth_gb_s, ...)."""
    from decodekit.bench import engine_bench
    p = argparse.ArgumentParser()
    engine_bench.add_args(p)
    argv = ["--input-len", str(input_len), "--output-len", str(output_len), "--iters", str(iters), "--peer", "none"]
    if model:
        argv += ["--model", model]
    return engine_bench.latency(p.parse_args(argv))


def compare(measured: dict, model: ModelSpec, hw: Hardware, wf: WeightFormat, *, kv_dtype: str,
            eff_ideal: rf.Efficiency, eff_cal: rf.Efficiency | None) -> dict:
    """Planner predictions for the measured run (batch 1, TP 1, context input + output / 2),
    with the hardware's copy bandwidth and with the one measured in the same run."""
    n_in, n_out = int(measured["input_len"]), int(measured["output_len"])
    ctx = n_in + n_out / 2
    got = measured["decodekit"]
    out = {"model": model.name, "device": measured.get("device"), "weights": wf.name,
           "weight_bytes_planner": wf.total_bytes(model), "weight_bytes_engine": measured.get("weight_bytes"),
           "kv_dtype": kv_dtype, "input_len": n_in, "output_len": n_out, "mean_context": ctx,
           "measured_tpot_s": got["tpot_s"], "measured_ttft_s": got["ttft_s"],
           "copy_gbps_planner": hw.mem_bw / 1e9, "copy_gbps_same_run": measured.get("copy_bandwidth_gb_s")}
    variants = {"ideal": (hw, eff_ideal)}
    if eff_cal is not None:
        variants["calibrated"] = (hw, eff_cal)
        if measured.get("copy_bandwidth_gb_s"):
            hw2 = dataclasses.replace(hw, mem_bw=float(measured["copy_bandwidth_gb_s"]) * 1e9)
            variants["calibrated_same_run_copy"] = (hw2, eff_cal)
    for name, (h, e) in variants.items():
        s = rf.decode_step(model, h, wf, batch=1, context=ctx, kv_dtype=kv_dtype, eff=e)
        p = rf.prefill(model, h, wf, n_in, eff=e)
        out[name] = {"tpot_s": s.tpot, "ttft_s": p.ttft, "t_weights_s": s.t_weights, "t_kv_s": s.t_kv,
                     "t_compute_s": s.t_compute, "tpot_pred_over_measured": s.tpot / got["tpot_s"]}
    return out


def format_comparison(c: dict) -> str:
    lines = [f"prediction vs measurement: {c['model']} ({c['weights']}, KV {c['kv_dtype']}) on {c['device']}, "
             f"batch 1, {c['input_len']} + {c['output_len']} tokens",
             f"  weight bytes: planner {c['weight_bytes_planner']:,.0f}, engine {c['weight_bytes_engine']:,}",
             f"  measured TPOT {c['measured_tpot_s'] * 1e3:.2f} ms, TTFT {c['measured_ttft_s'] * 1e3:.1f} ms "
             f"(copy bandwidth in that run {c['copy_gbps_same_run'] or float('nan'):.1f} GB/s; "
             f"planner's {c['copy_gbps_planner']:.1f} GB/s)"]
    for k in ("ideal", "calibrated", "calibrated_same_run_copy"):
        if k in c:
            v = c[k]
            lines.append(f"  {k:<25} TPOT {v['tpot_s'] * 1e3:7.2f} ms  ({v['tpot_pred_over_measured']:.2f}x measured)"
                         f"   TTFT {v['ttft_s'] * 1e3:7.1f} ms")
    return "\n".join(lines)
