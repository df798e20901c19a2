"""`decodekit plan` and `decodekit plan explain`: capacity planning from the roofline.

    decodekit plan --model llama3-70b --gpu h100 --gpus 8 --prompt-len 2000 --output-len 500 \\
                   --ttft-ms 500 --tpot-ms 50            table of shapes, Pareto front marked (*)
    decodekit plan ... --json                            the same for machines
    decodekit plan ... --plot DIR                        frontier.png, tp_scaling.png, roofline.png
    decodekit plan explain --model llama3-70b --gpu h100 --tp 8 --batch 1
                                                         the derivation for one shape, with units
    decodekit plan --gpu cpu-calibrated --measure        SmolLM2 on this CPU: prediction vs the engine

Memory sizes are decimal (GB = 1e9 bytes). Conventions that reproduce the seed documents:
every parameter (input embedding included) is read once per decode step; prefill FLOPs are
2 * params * tokens at --prefill-mfu (0.5) of peak; int4 carries a 16-bit scale per
--group-size weights (0: none, the seeds' 35 GB for a 70B).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

from decodekit.bench.output import finite_json
from decodekit.config import MAX_POSITION_EMBEDDINGS
from decodekit.planner import roofline as rf
from decodekit.planner.hardware import HARDWARE_CHOICES, cpu_calibrated, load_calibration, load_hardware
from decodekit.planner.models import KV_DTYPES, PRESETS, WEIGHT_FORMATS, load_model, weight_format
from decodekit.planner.shapes import Constraints, Workload, context_problem, plan


def _typed(kind, lo=None, hi=None, lo_open=False, hi_open=False, what=""):
    def conv(s):
        try:
            v = kind(s)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {what} (got {s!r})") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be {what} (got {s!r})")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {what} (got {s!r})")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise argparse.ArgumentTypeError(f"must be {what} (got {s!r})")
        return v
    conv.__name__ = kind.__name__
    return conv


POS_INT = _typed(int, 1, what="a positive integer")
NONNEG_INT = _typed(int, 0, what="an integer >= 0")
# upper bounds: the shapes of a cluster are enumerated (a typo of 1e12 GPUs would hang) and the arithmetic is in
# floats (a 400-digit count would overflow them); no real workload comes near these
MAX_GPUS = 1 << 20
MAX_COUNT = 1 << 40
MAX_SPEC_K = 1024
GPUS = _typed(int, 1, MAX_GPUS, what=f"an integer in [1, {MAX_GPUS}]")
TOKENS = _typed(int, 1, MAX_POSITION_EMBEDDINGS, what=f"an integer in [1, {MAX_POSITION_EMBEDDINGS}] (tokens)")
COUNT = _typed(int, 1, MAX_COUNT, what=f"an integer in [1, {MAX_COUNT}]")
SPEC_K = _typed(int, 0, MAX_SPEC_K, what=f"an integer in [0, {MAX_SPEC_K}]")
POS_FLOAT = _typed(float, 0, lo_open=True, what="a number > 0")
NONNEG_FLOAT = _typed(float, 0, what="a number >= 0")
FRACTION = _typed(float, 0, 1, lo_open=True, what="a number in (0, 1]")
ACCEPT = _typed(float, 0, 1, hi_open=True, what="a number in [0, 1)")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["explain"], default=None,
                   help="explain: print the derivation for one shape (--tp/--pp/--replicas/--batch)")
    g = p.add_argument_group("model and hardware")
    g.add_argument("--model", default=None,
                   help=f"preset ({', '.join(PRESETS)}), a config.json or a .gguf (default llama3-8b; "
                        "smollm2-135m on cpu-calibrated)")
    g.add_argument("--gpu", default="h100",
                   help=f"hardware: {', '.join(HARDWARE_CHOICES)}, or a bench/results calibration .json (default h100)")
    g.add_argument("--gpus", type=GPUS, default=None,
                   help=f"cluster size, 1..{MAX_GPUS} (default 8; 1 on cpu-calibrated)")
    g.add_argument("--weights", default=None, choices=list(WEIGHT_FORMATS),
                   help="weight format (default bf16; q4_1 = the engine's GGUF SmolLM2 on cpu-calibrated; "
                        "stored = a GGUF's own bytes, the default for .gguf)")
    g.add_argument("--group-size", type=NONNEG_INT, default=128,
                   help="int4 scale group (16-bit scale per group; 0 = scales not counted, as the seeds; default 128)")
    g.add_argument("--kv-dtype", default=None, choices=list(KV_DTYPES),
                   help="KV cache dtype (default: the activation dtype, bf16 on GPUs, fp32 on the CPU)")
    w = p.add_argument_group("workload and limits")
    w.add_argument("--prompt-len", type=TOKENS, default=1024, help="prompt tokens per request (default 1024; prompt + output at most the model's context length)")
    w.add_argument("--output-len", type=TOKENS, default=256, help="output tokens per request (default 256)")
    w.add_argument("--concurrency", type=COUNT, default=None,
                   help="sequences in flight over the cluster (fixes the batch per replica)")
    w.add_argument("--rate", type=POS_FLOAT, default=None, help="requests/s the cluster must sustain")
    w.add_argument("--ttft-ms", type=POS_FLOAT, default=None, help="time-to-first-token limit (ms)")
    w.add_argument("--tpot-ms", type=POS_FLOAT, default=None, help="time-per-output-token limit (ms)")
    w.add_argument("--spec-k", type=SPEC_K, default=0,
                   help="speculative decoding: drafted tokens k (default 0 = off)")
    w.add_argument("--spec-accept", type=ACCEPT, default=0.8, help="per-token acceptance a in [0, 1) (default 0.8)")
    w.add_argument("--spec-draft-cost", type=NONNEG_FLOAT, default=0.0,
                   help="cost of drafting one token as a fraction of a target decode step (default 0)")
    m = p.add_argument_group("model of the machine")
    m.add_argument("--prefill-mfu", type=FRACTION, default=0.5, help="ideal prefill fraction of peak (default 0.5)")
    m.add_argument("--prefill-attention", action="store_true", help="count causal attention FLOPs in prefill")
    m.add_argument("--reserve-gb", type=NONNEG_FLOAT, default=None,
                   help="activation reserve per GPU in GB (default: a 2048-token prefill chunk's buffers)")
    m.add_argument("--calibration", default="auto",
                   help="auto (bench/results rows for this device), none, or a results .json / directory")
    m.add_argument("--measure-bandwidth", action="store_true",
                   help="cpu-calibrated: measure copy bandwidth and matmul rate now instead of reading bench/results")
    e = p.add_argument_group("explain: the shape to derive")
    e.add_argument("--tp", type=GPUS, default=None, help="tensor parallel degree (default 1)")
    e.add_argument("--pp", type=GPUS, default=None, help="pipeline stages (default 1)")
    e.add_argument("--replicas", type=GPUS, default=None, help="replicas (default gpus / (tp * pp))")
    e.add_argument("--batch", type=COUNT, default=None, help="sequences per replica (default 1)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print JSON instead of the table")
    o.add_argument("--plot", default=None, metavar="DIR", help="write frontier.png, tp_scaling.png, roofline.png here")
    o.add_argument("--all", action="store_true", help="list infeasible rows too, with the reason")
    o.add_argument("--measure", action="store_true",
                   help="cpu-calibrated: also run the engine (bench latency) and compare with the prediction")
    o.add_argument("--measure-json", default=None, metavar="PATH", help="write the --measure comparison here")


@dataclasses.dataclass
class Setup:
    model: object
    hw: object
    wf: object
    kv_dtype: str
    workload: Workload
    constraints: Constraints
    spec: object
    eff_ideal: rf.Efficiency
    eff_cal: object
    cal: object
    cal_note: str
    reserve: float | None


def setup(args) -> Setup:
    """Resolves the arguments into planner objects (ValueError naming the field when bad)."""
    cpu = args.gpu == "cpu-calibrated"
    cal = None
    if cpu:
        hw, cal = cpu_calibrated(measure=args.measure_bandwidth,
                                 source=None if args.calibration in ("auto", "none") else args.calibration)
    else:
        hw = load_hardware(args.gpu)
    model = load_model(args.model or ("smollm2-135m" if cpu else "llama3-8b"))
    wname = args.weights or ("stored" if model.stored_bytes else "q4_1" if cpu and model is PRESETS["smollm2-135m"]
                             else "bf16")
    wf = weight_format(wname, args.group_size, model)
    kv = args.kv_dtype or hw.act_dtype
    gpus = args.gpus or (1 if cpu else 8)
    workload = Workload(args.prompt_len, args.output_len, args.concurrency, args.rate)
    if context_problem(model, workload):
        raise ValueError(f"argument --prompt-len/--output-len: {context_problem(model, workload)} (the "
                         f"longest context it takes; plan a longer, e.g. YaRN-extended, variant from its config.json)")
    cons = Constraints(gpus, args.ttft_ms / 1e3 if args.ttft_ms else None, args.tpot_ms / 1e3 if args.tpot_ms else None)
    spec = rf.SpecDecode(args.spec_k, args.spec_accept, args.spec_draft_cost) if args.spec_k else None
    eff_i = rf.ideal(args.prefill_mfu)
    note = ""
    if args.calibration == "none":
        cal = None
        note = "calibration off"
    elif not cpu:
        src = None if args.calibration == "auto" else args.calibration
        if src is None and args.gpu.endswith(".json"):  # --gpu FILE: calibrate from that file
            src = args.gpu
        try:
            cal = load_calibration(hw.device_names or (hw.name,), src, act_dtype=hw.act_dtype)
        except FileNotFoundError:
            if src:
                raise
            cal = None
        if cal is None or cal.empty:
            if src:
                raise ValueError(f"calibration: {src} has no rows for {hw.name} "
                                 f"({', '.join(hw.device_names)})")
            note = f"no measurements of {hw.name} in bench/results: ideal figures only"
            cal = None
    eff_c = rf.calibrated(hw, cal) if cal is not None else None
    if eff_c is not None and not note:
        note = f"{eff_c.label}; sources: {', '.join(cal.sources)}"
    reserve = args.reserve_gb * 1e9 if args.reserve_gb is not None else None
    return Setup(model, hw, wf, kv, workload, cons, spec, eff_i, eff_c, cal, note, reserve)


def _header(s: Setup) -> list:
    m, hw, wf = s.model, s.hw, s.wf
    lim = ", ".join(x for x in (f"TTFT {s.constraints.ttft_s * 1e3:g} ms" if s.constraints.ttft_s else "",
                                f"TPOT {s.constraints.tpot_s * 1e3:g} ms" if s.constraints.tpot_s else "") if x)
    x0 = rf.crossover_batch(m, hw, wf, context=0, kv_dtype=s.kv_dtype)
    xc = rf.crossover_batch(m, hw, wf, context=s.workload.mean_context, kv_dtype=s.kv_dtype)
    floor, tok = rf.decode_floor(m, hw, wf)
    lines = [f"decodekit plan: {m.name} ({m.params / 1e9:.2f}e9 params, {wf.name} weights "
             f"{wf.total_bytes(m) / 1e9:.2f} GB, "
             f"KV {m.kv_bytes_per_token(s.kv_dtype):,} B/token {s.kv_dtype}) on {s.constraints.gpus} x {hw.name}",
             f"workload: prompt {s.workload.prompt_len} + output {s.workload.output_len} tokens"
             + (f", concurrency {s.workload.concurrency}" if s.workload.concurrency else "")
             + (f", {s.workload.rate:g} requests/s" if s.workload.rate else "")
             + (f"; limits {lim}" if lim else "; no latency limits")
             + (f"; speculation k={s.spec.k} a={s.spec.accept:g} ({s.spec.expected_tokens:.3g} tokens/step)"
                if s.spec else ""),
             f"one device, batch 1: {floor * 1e3:.3g} ms/token ({tok:.4g} tokens/s) from weights alone; at least "
             f"{rf.min_devices(m, hw, wf)} device(s) hold the weights; compute-bound from batch {x0:.0f} (weights only)"
             + (", never at this context" if math.isinf(xc) else f", {xc:.0f} at context {s.workload.mean_context:g}"),
             f"efficiency: ideal = peak bandwidth, prefill at {s.eff_ideal.prefill_mfu:.0%} of peak; "
             + (s.cal_note or "no calibration")]
    return lines


def format_table(pl, s: Setup, show_all: bool = False) -> str:
    lines = _header(s)
    cal = s.eff_cal is not None
    rows = [r for r in pl.rows if r.feasible or show_all]
    head = (f"  {'TP':>3} {'PP':>3} {'R':>3} {'batch':>6} {'TPOT ms':>8} " + (f"{'ideal':>7} " if cal else "")
            + f"{'TTFT ms':>8} {'max conc':>8} {'tok/s/GPU':>10} {'tok/s cluster':>13} {'bound':>7}  notes")
    lines += ["", "* = Pareto front (no other feasible shape is both faster per token and higher in throughput)", head]
    for r in sorted(rows, key=lambda r: (r.tp, r.pp, r.batch)):
        notes = []
        if r.kv_replication > 1:
            notes.append(f"KV x{r.kv_replication:g} replicated")
        if r.bubble > 0:
            notes.append(f"bubble {r.bubble:.0%}")
        if not r.feasible:
            notes.append("; ".join(r.reasons))
        t = lambda v: f"{v * 1e3:8.2f}" if math.isfinite(v) else f"{'-':>8}"  # noqa: E731
        lines.append(f"{'*' if r.on_front else ' ':1} {r.tp:>3} {r.pp:>3} {r.replicas:>3} {r.batch:>6} {t(r.tpot_s)} "
                     + (f"{r.tpot_ideal_s * 1e3:7.2f} " if cal and math.isfinite(r.tpot_ideal_s)
                        else ("        " if cal else ""))
                     + f"{r.ttft_s * 1e3:8.1f} {r.max_concurrency:>8} {r.tok_s_per_gpu:>10.1f} "
                       f"{r.tok_s_cluster:>13.1f} "
                       f"{r.bound:>7}  {', '.join(notes)}")
    bad = [r for r in pl.rows if not r.feasible]
    if not rows:
        lines.append("  (no feasible shape)")
    if bad and not show_all:
        shapes = {}
        for r in bad:
            shapes.setdefault(r.shape, r.reasons[0])
        lines.append(f"\n{len(bad)} infeasible rows (--all lists them); first reason per shape:")
        lines += [f"  {k}: {v}" for k, v in shapes.items()]
    front = sorted(pl.front, key=lambda r: r.tpot_s)
    if front:
        a, b = front[0], front[-1]
        lines.append(f"\nlowest latency: {a.shape} batch {a.batch}: {a.tpot_s * 1e3:.2f} ms/token, "
                     f"{a.tok_s_cluster:.0f} tok/s; highest throughput: {b.shape} batch {b.batch}: "
                     f"{b.tok_s_cluster:.0f} tok/s at {b.tpot_s * 1e3:.2f} ms/token")
    return "\n".join(lines)


def to_json(pl, s: Setup) -> dict:
    m = dataclasses.asdict(s.model)
    m.update(params=s.model.params, kv_bytes_per_token=s.model.kv_bytes_per_token(s.kv_dtype),
             weight_bytes=s.wf.total_bytes(s.model))
    rows = []
    for r in pl.rows:
        d = dataclasses.asdict(r)
        d["shape"] = r.shape
        rows.append(d)
    return finite_json({
        "model": m, "hardware": dataclasses.asdict(s.hw), "weights": dataclasses.asdict(s.wf), "kv_dtype": s.kv_dtype,
        "workload": dataclasses.asdict(s.workload), "constraints": dataclasses.asdict(s.constraints),
        "spec": dataclasses.asdict(s.spec) | {"expected_tokens": s.spec.expected_tokens} if s.spec else None,
        "efficiency": {"ideal": dataclasses.asdict(s.eff_ideal),
                       "calibrated": dataclasses.asdict(s.eff_cal) if s.eff_cal else None},
        "calibration": dataclasses.asdict(s.cal) if s.cal is not None else None,
        "crossover_batch": {"weights_only": rf.crossover_batch(s.model, s.hw, s.wf, kv_dtype=s.kv_dtype),
                            "at_mean_context": rf.crossover_batch(s.model, s.hw, s.wf, context=s.workload.mean_context,
                                                                  kv_dtype=s.kv_dtype)},
        "rows": rows, "pareto_front": [i for i, r in enumerate(pl.rows) if r.on_front]})


def _check_outputs(args) -> None:
    """--plot DIR and --measure-json PATH, checked before any work (one line naming the option, no traceback)."""
    if args.measure_json and not args.measure:
        raise ValueError("argument --measure-json: writes the --measure comparison: add --measure")
    if args.plot:
        if os.path.exists(args.plot) and not os.path.isdir(args.plot):
            raise ValueError(f"argument --plot: {args.plot!r} is a file, not a directory")
        try:
            os.makedirs(args.plot, exist_ok=True)
        except OSError as e:
            raise ValueError(f"argument --plot: cannot create the directory {args.plot!r} ({e.strerror or e})") from None
    if args.measure_json:
        path = os.path.abspath(args.measure_json)
        if os.path.isdir(path):
            raise ValueError(f"argument --measure-json: {args.measure_json!r} is a directory, not a file")
        if not os.path.isdir(os.path.dirname(path)) or not os.access(os.path.dirname(path), os.W_OK):
            raise ValueError(f"argument --measure-json: cannot write {args.measure_json!r} (no writable directory "
                             f"{os.path.dirname(path)!r})")


def run(args) -> int:
    if args.action != "explain":  # the table covers every shape: a shape option there would be silently ignored
        for opt in ("tp", "pp", "replicas", "batch"):
            if getattr(args, opt) is not None:
                raise ValueError(f"argument --{opt}: picks the shape `plan explain` derives; `plan` lists every "
                                 f"TP x PP x replicas shape of --gpus (--concurrency fixes the batch)")
    s = setup(args)
    if args.measure and args.gpu != "cpu-calibrated":
        raise ValueError("--measure runs the engine on this CPU: use it with --gpu cpu-calibrated")
    _check_outputs(args)
    if args.action == "explain":
        from decodekit.planner.explain import explain
        tp, pp = args.tp or 1, args.pp or 1
        if args.replicas is None and tp * pp > s.constraints.gpus:
            s.constraints = Constraints(tp * pp, s.constraints.ttft_s, s.constraints.tpot_s)
        print(explain(s.model, s.hw, s.wf, s.workload, s.constraints, tp=tp, pp=pp, replicas=args.replicas,
                      batch=args.batch or 1, kv_dtype=s.kv_dtype, spec=s.spec, eff_ideal=s.eff_ideal, eff_cal=s.eff_cal,
                      reserve_bytes=s.reserve, prefill_attention=args.prefill_attention))
        return 0
    pl = plan(s.model, s.hw, s.wf, s.workload, s.constraints, kv_dtype=s.kv_dtype, spec=s.spec, eff_ideal=s.eff_ideal,
              eff_cal=s.eff_cal, reserve_bytes=s.reserve, prefill_attention=args.prefill_attention)
    out = to_json(pl, s) if args.json else None
    if args.plot:
        from decodekit.planner import plots
        files = plots.write_all(pl, args.plot)
        if out is not None:
            out["plots"] = files
        else:
            print(f"plots: {', '.join(files)}", file=sys.stderr)
    if args.measure:
        from decodekit.planner import measure
        got = measure.run_engine_latency(args.prompt_len, args.output_len)
        cmp = measure.compare(got, s.model, s.hw, s.wf, kv_dtype=s.kv_dtype, eff_ideal=s.eff_ideal, eff_cal=s.eff_cal)
        if args.measure_json:
            with open(args.measure_json, "w") as f:
                json.dump(finite_json({"comparison": cmp, "engine": got}), f, indent=2, default=str)
        if out is not None:
            out["measurement"] = cmp
    if out is not None:
        print(json.dumps(out, indent=1))
    else:
        print(format_table(pl, s, args.all))
        if args.measure:
            print()
            print(measure.format_comparison(cmp))
    return 0
