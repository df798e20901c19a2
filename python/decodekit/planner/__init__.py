"""Capacity planner: a roofline model of prefill and decode ("TP for latency, replicas for
throughput"), KV capacity, TP/PP/replica shapes, the Pareto front, plots, calibrated by our
own bench/results measurements. Pure Python (no torch); matplotlib only for the plots.

    from decodekit import planner as P
    m, hw = P.load_model("llama3-70b"), P.load_hardware("h100")
    wf = P.weight_format("bf16")
    P.decode_step(m, hw, wf, batch=1, tp=8).tpot          # seconds per token
    P.plan(m, hw, wf, P.Workload(2000, 500), P.Constraints(8, ttft_s=0.5, tpot_s=0.05)).front

The CLI is `decodekit plan` (decodekit.planner.cli).
"""
from decodekit.planner.hardware import (PRESETS as HARDWARE_PRESETS, Calibration, Hardware, cpu_calibrated,
                                        load_calibration, load_hardware)
from decodekit.planner.models import (PRESETS as MODEL_PRESETS, ModelSpec, WeightFormat, load_model,
                                      weight_format)
from decodekit.planner.roofline import (Capacity, DecodeStep, Efficiency, Prefill, SpecDecode, activation_reserve,
                                        allreduce, calibrated, capacity, crossover_batch, decode_floor, decode_step,
                                        expected_tokens, ideal, min_devices, prefill, weight_read_time)
from decodekit.planner.shapes import Constraints, Plan, PlanRow, Workload, dominates, pareto_front, plan

__all__ = [
    "HARDWARE_PRESETS", "MODEL_PRESETS", "Calibration", "Capacity", "Constraints", "DecodeStep", "Efficiency",
    "Hardware", "ModelSpec", "Plan", "PlanRow", "Prefill", "SpecDecode", "WeightFormat", "Workload",
    "activation_reserve", "allreduce", "calibrated", "capacity", "cpu_calibrated", "crossover_batch",
    "decode_floor", "decode_step", "dominates", "expected_tokens", "ideal", "load_calibration", "load_hardware",
    "load_model", "min_devices", "pareto_front", "plan", "prefill", "weight_format", "weight_read_time",
]
