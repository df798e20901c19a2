"""PNG plots of a Plan (matplotlib, Agg backend, imported only here).

frontier.png   tokens/s per GPU vs per-token latency: infeasible shapes grey, feasible ones by
               TP, the Pareto front as a line
tp_scaling.png TPOT vs TP (1..16, those the model's heads split over) for several batch sizes, with and
               without the AllReduce
roofline.png   attainable FLOP/s vs arithmetic intensity, decode batches placed on it
"""
from __future__ import annotations

import math
import os

from decodekit.planner import roofline as rf
from decodekit.planner.shapes import Plan, tp_problem


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise ValueError("--plot needs matplotlib (pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, ax, path: str) -> str:
    """The figures' common finish: grid, legend, layout, PNG, close."""
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def frontier(plan: Plan, path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    bad = [r for r in plan.rows if not r.feasible and math.isfinite(r.tpot_s) and r.tok_s_cluster > 0]
    ok = [r for r in plan.rows if r.feasible]
    ax.scatter([r.tpot_s * 1e3 for r in bad], [r.tok_s_per_gpu for r in bad], c="0.8", s=14,
               label="infeasible", zorder=1)
    tps = sorted({r.tp for r in ok})
    cmap = plt.get_cmap("viridis", max(2, len(tps)))
    for i, tp in enumerate(tps):
        rs = [r for r in ok if r.tp == tp]
        ax.scatter([r.tpot_s * 1e3 for r in rs], [r.tok_s_per_gpu for r in rs], color=cmap(i), s=22,
                   label=f"TP={tp}", zorder=2)
    front = sorted(plan.front, key=lambda r: r.tpot_s)
    if front:
        ax.plot([r.tpot_s * 1e3 for r in front], [r.tok_s_per_gpu for r in front], "-o", color="tab:green",
                mfc="none", ms=9, lw=2, label="Pareto front", zorder=3)
        for r in front[:: max(1, len(front) // 8)]:
            ax.annotate(f"{r.shape} b{r.batch}", (r.tpot_s * 1e3, r.tok_s_per_gpu), fontsize=7,
                        xytext=(4, -10), textcoords="offset points")
    if plan.constraints.tpot_s:
        ax.axvline(plan.constraints.tpot_s * 1e3, color="tab:red", ls="--", lw=1, label="TPOT limit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time per output token (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"{plan.model.name}, {plan.weights.name} weights, {plan.constraints.gpus} x {plan.hardware.name}"
                 f" ({plan.primary.label.split(' (')[0]})", fontsize=10)
    return _save(plt, fig, ax, path)


def valid_tps(model, hw, tps=(1, 2, 4, 8, 16)) -> list:
    """The TP degrees of `tps` the model splits over (heads, KV heads) on this hardware (TP 1 only without an
    interconnect): the TP-scaling plot draws no shape the planner calls impossible."""
    return [tp for tp in tps if tp == 1 or tp_problem(model, hw, tp, 1) is None]


def tp_scaling(plan: Plan, path: str, batches=(1, 8, 32, 128), tps=(1, 2, 4, 8, 16)) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    m, hw, wf = plan.model, plan.hardware, plan.weights
    ctx = plan.workload.mean_context
    tps = tuple(valid_tps(m, hw, tps))
    for b in batches:
        with_ar, no_ar = [], []
        for tp in tps:
            s = rf.decode_step(m, hw, wf, batch=b, context=ctx, tp=tp, kv_dtype=plan.kv_dtype, eff=plan.primary)
            with_ar.append(s.tpot * 1e3)
            no_ar.append((s.tpot - s.t_allreduce) * 1e3)
        line, = ax.plot(tps, with_ar, "-o", label=f"batch {b}")
        ax.plot(tps, no_ar, ":", color=line.get_color(), alpha=0.7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(tps))
    ax.set_xticklabels([str(t) for t in tps])
    ax.set_xlabel("tensor parallel degree (dotted: without AllReduce)")
    ax.set_ylabel("time per output token (ms)")
    ax.set_title(f"TP scaling: {m.name} on {hw.name} (context {ctx:g})", fontsize=10)
    return _save(plt, fig, ax, path)


def roofline(plan: Plan, path: str, batches=(1, 4, 16, 64, 256, 1024)) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    hw, m, wf = plan.hardware, plan.model, plan.weights
    peak = hw.flops_for(wf.compute)
    xs = [10 ** (i / 20) for i in range(-20, 81)]
    ax.plot(xs, [min(peak, x * hw.mem_bw) for x in xs], "k-", lw=2, label="roofline (peak)")
    ax.axvline(peak / hw.mem_bw, color="0.5", ls=":", lw=1)
    for ctx, mk in ((0, "o"), (plan.workload.mean_context, "s")):
        pts = []
        for b in batches:
            s = rf.decode_step(m, hw, wf, batch=b, context=ctx, kv_dtype=plan.kv_dtype, eff=rf.ideal())
            t = max(s.t_mem, s.t_compute)
            pts.append((s.intensity, s.flops / t, b))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], mk + "--", label=f"decode, context {ctx:g}")
        for x, y, b in pts:
            ax.annotate(f"B={b}", (x, y), fontsize=7, xytext=(4, 5) if ctx == 0 else (6, -11),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attained FLOP/s")
    ax.set_title(f"Roofline: {hw.name}, {m.name} ({wf.name}), ridge {peak / hw.mem_bw:.0f} FLOP/B", fontsize=10)
    return _save(plt, fig, ax, path)


def write_all(plan: Plan, out_dir: str) -> list:
    """The three PNGs in out_dir (created): frontier, tp_scaling, roofline."""
    os.makedirs(out_dir, exist_ok=True)
    return [frontier(plan, os.path.join(out_dir, "frontier.png")),
            tp_scaling(plan, os.path.join(out_dir, "tp_scaling.png")),
            roofline(plan, os.path.join(out_dir, "roofline.png"))]
