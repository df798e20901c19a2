"""Cluster shapes: every (TP, PP, replicas) with TP * PP * replicas = GPUs, each at several
batch sizes, judged for feasibility, with the Pareto front of per-token latency vs throughput.

A row is feasible when the heads split over TP, the weights, activation reserve and the
batch's KV (at prompt + output tokens per sequence) fit each GPU, and the TTFT / TPOT limits,
a request rate or a concurrency hold. Step times use the mean context during generation
(prompt + output / 2). The front is computed on the primary figures (calibrated when a
calibration exists, else ideal): a feasible row is on it iff no feasible row has TPOT <= its
TPOT and cluster tokens/s >= its tokens/s with one of them strict.
"""
from __future__ import annotations

import dataclasses
import math

from decodekit.planner import roofline as rf
from decodekit.planner.hardware import Hardware
from decodekit.planner.models import ModelSpec, WeightFormat


@dataclasses.dataclass(frozen=True)
class Workload:
    """prompt_len / output_len: tokens per request; concurrency: sequences in flight over the
    cluster (fixes each replica's batch); rate: requests per second to sustain."""
    prompt_len: int
    output_len: int
    concurrency: int | None = None
    rate: float | None = None

    def __post_init__(self):
        if not isinstance(self.prompt_len, int) or self.prompt_len < 1:
            raise ValueError(f"prompt_len must be an integer >= 1 (got {self.prompt_len!r})")
        if not isinstance(self.output_len, int) or self.output_len < 1:
            raise ValueError(f"output_len must be an integer >= 1 (got {self.output_len!r})")
        if self.concurrency is not None and (not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise ValueError(f"concurrency must be an integer >= 1 (got {self.concurrency!r})")
        if self.rate is not None and not (self.rate > 0):
            raise ValueError(f"rate must be > 0 requests/s (got {self.rate!r})")

    @property
    def mean_context(self) -> float:
        return self.prompt_len + self.output_len / 2

    @property
    def max_context(self) -> int:
        return self.prompt_len + self.output_len


@dataclasses.dataclass(frozen=True)
class Constraints:
    """ttft_s / tpot_s: limits in seconds (None: none); gpus: cluster size."""
    gpus: int
    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self):
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or self.gpus < 1:
            raise ValueError(f"gpus must be a positive integer (got {self.gpus!r})")
        for f in ("ttft_s", "tpot_s"):
            v = getattr(self, f)
            if v is not None and not (v > 0):
                raise ValueError(f"{f} must be > 0 (got {v!r})")


@dataclasses.dataclass
class PlanRow:
    """One (TP, PP, replicas, batch-per-replica) point. Times in seconds, rates in tokens/s."""
    tp: int
    pp: int
    replicas: int
    batch: int
    feasible: bool
    reasons: list
    tpot_s: float              # primary (calibrated if available)
    tpot_ideal_s: float
    tpot_calibrated_s: float | None
    ttft_s: float
    ttft_ideal_s: float
    tok_s_cluster: float
    tok_s_per_gpu: float
    max_batch_mem: int          # per replica, memory only
    max_concurrency: int        # replicas x largest batch meeting memory and TPOT
    bound: str
    kv_replication: float
    bubble: float
    on_front: bool = False

    @property
    def shape(self) -> str:
        return f"TP{self.tp} PP{self.pp} x{self.replicas}"


@dataclasses.dataclass
class Plan:
    model: ModelSpec
    hardware: Hardware
    weights: WeightFormat
    kv_dtype: str
    workload: Workload
    constraints: Constraints
    spec: rf.SpecDecode | None
    eff_ideal: rf.Efficiency
    eff_cal: rf.Efficiency | None
    rows: list

    @property
    def front(self) -> list:
        return [r for r in self.rows if r.on_front]

    @property
    def primary(self) -> rf.Efficiency:
        return self.eff_cal or self.eff_ideal


def divisors(n: int) -> list:
    """The divisors of n, ascending (trial division up to sqrt(n): a large cluster size stays fast)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def context_problem(model: ModelSpec, workload: Workload) -> str | None:
    """Why the workload's sequences do not fit the model's context (None if fine or the limit is unknown)."""
    lim = model.context_limit
    if lim and workload.max_context > lim:
        return (f"prompt_len + output_len = {workload.prompt_len} + {workload.output_len} = {workload.max_context} "
                f"tokens exceeds {model.name}'s context length {lim}")
    return None


def tp_problem(model: ModelSpec, hw: Hardware, tp: int, pp: int) -> str | None:
    """Why a TP x PP split is impossible for this model / hardware (None if fine)."""
    if tp * pp > 1 and hw.link_bw is None:
        return f"{hw.name} has no interconnect: TP and PP need 1 device"
    if model.n_heads % tp:
        return f"TP={tp} does not divide {model.n_heads} query heads"
    if tp <= model.n_kv_heads and model.n_kv_heads % tp:
        return f"TP={tp} does not divide {model.n_kv_heads} KV heads"
    if tp > model.n_kv_heads and tp % model.n_kv_heads:
        return f"TP={tp} is not a multiple of {model.n_kv_heads} KV heads"
    if pp > model.n_layers:
        return f"PP={pp} > {model.n_layers} layers"
    return None


def dominates(a: tuple, b: tuple) -> bool:
    """a = (latency, throughput) dominates b: no worse in both, better in one."""
    return a[0] <= b[0] and a[1] >= b[1] and (a[0] < b[0] or a[1] > b[1])


def pareto_front(points: list, feasible: list | None = None) -> list:
    """Indices of the feasible (latency, throughput) points no feasible point dominates."""
    feasible = feasible if feasible is not None else [True] * len(points)
    cand = [i for i, f in enumerate(feasible) if f]
    # sweep by latency ascending, throughput descending: on the front iff its throughput beats
    # every earlier point's (equal points share the front)
    order = sorted(cand, key=lambda i: (points[i][0], -points[i][1]))
    front, best, last = [], -math.inf, None
    for i in order:
        p = points[i]
        if p[1] > best or (last is not None and p == last):
            front.append(i)
            last = p
        best = max(best, p[1])
    return sorted(front)


def batch_ladder(max_batch: int, cap: int = 4096) -> list:
    """1, 2, 4, ... up to max_batch (capped), and max_batch itself."""
    top = min(max_batch, cap)
    out = [b for b in (2 ** i for i in range(0, 13)) if b <= top]
    if top >= 1 and top not in out:
        out.append(top)
    return out or [1]


def plan(model: ModelSpec, hw: Hardware, wf: WeightFormat, workload: Workload, constraints: Constraints, *,
         kv_dtype: str = "bf16", spec: rf.SpecDecode | None = None, eff_ideal: rf.Efficiency | None = None,
         eff_cal: rf.Efficiency | None = None, reserve_bytes: float | None = None, batches: list | None = None,
         prefill_attention: bool = False) -> Plan:
    """Every shape of the cluster at a ladder of batch sizes (or `batches`, or the batch the
    workload's concurrency implies), feasibility, and the Pareto front."""
    problem = context_problem(model, workload)
    if problem:
        raise ValueError(problem)
    eff_ideal = eff_ideal or rf.ideal()
    primary = eff_cal or eff_ideal
    G = constraints.gpus
    rows = []
    for tp in divisors(G):
        for pp in divisors(G // tp):
            reps = G // (tp * pp)
            problem = tp_problem(model, hw, tp, pp)
            cap = rf.capacity(model, hw, wf, context=workload.max_context, tp=tp, pp=pp, kv_dtype=kv_dtype,
                              reserve_bytes=reserve_bytes)
            if workload.concurrency is not None:
                bl = [max(1, math.ceil(workload.concurrency / reps))]
            elif batches:
                bl = list(batches)
            else:
                bl = batch_ladder(cap.max_batch)
            kw = dict(context=workload.mean_context, tp=tp, pp=pp, kv_dtype=kv_dtype, spec=spec)
            pre_i = rf.prefill(model, hw, wf, workload.prompt_len, tp=tp, pp=pp, eff=eff_ideal,
                               attention=prefill_attention)
            pre_p = rf.prefill(model, hw, wf, workload.prompt_len, tp=tp, pp=pp, eff=primary,
                               attention=prefill_attention)
            max_ok = _max_batch_meeting(model, hw, wf, cap.max_batch, constraints.tpot_s, primary, kw)
            for b in bl:
                reasons = [problem] if problem else []
                if not cap.fits_weights:
                    reasons.append(f"weights {cap.weight_bytes / 1e9:.1f} GB + reserve "
                                   f"{cap.reserve_bytes / 1e9:.1f} GB > {hw.mem_bytes / 1e9:.0f} GB per GPU")
                elif b > cap.max_batch:
                    reasons.append(f"KV for {b} x {workload.max_context} tokens > "
                                   f"{cap.kv_budget_bytes / 1e9:.1f} GB free (max batch {cap.max_batch})")
                if problem and "interconnect" in problem:
                    step_i = step_p = None
                else:
                    step_i = rf.decode_step(model, hw, wf, batch=b, eff=eff_ideal, **kw)
                    step_p = rf.decode_step(model, hw, wf, batch=b, eff=primary, **kw)
                tpot = step_p.tpot if step_p else math.inf
                if step_p and not math.isfinite(tpot):
                    reasons.append("TPOT is not finite (no token is ever produced)")
                if constraints.tpot_s is not None and tpot > constraints.tpot_s:
                    reasons.append(f"TPOT {tpot * 1e3:.1f} ms > {constraints.tpot_s * 1e3:g} ms")
                if constraints.ttft_s is not None and pre_p.ttft > constraints.ttft_s:
                    reasons.append(f"TTFT {pre_p.ttft * 1e3:.0f} ms > {constraints.ttft_s * 1e3:g} ms")
                thr = reps * b / tpot if step_p else 0.0
                if workload.rate is not None and thr < workload.rate * workload.output_len:
                    reasons.append(f"{thr:.0f} tok/s < {workload.rate * workload.output_len:.0f} needed")
                rows.append(PlanRow(
                    tp=tp, pp=pp, replicas=reps, batch=b, feasible=not reasons, reasons=reasons, tpot_s=tpot,
                    tpot_ideal_s=step_i.tpot if step_i else math.inf,
                    tpot_calibrated_s=(step_p.tpot if (step_p and eff_cal) else None),
                    ttft_s=pre_p.ttft, ttft_ideal_s=pre_i.ttft, tok_s_cluster=thr, tok_s_per_gpu=thr / G,
                    max_batch_mem=cap.max_batch, max_concurrency=reps * max_ok if not problem else 0,
                    bound=step_p.bound if step_p else "-", kv_replication=cap.kv_replication,
                    bubble=step_p.bubble if step_p else 0.0))
    front = pareto_front([(r.tpot_s, r.tok_s_cluster) for r in rows], [r.feasible for r in rows])
    for i in front:
        rows[i].on_front = True
    return Plan(model, hw, wf, kv_dtype, workload, constraints, spec, eff_ideal, eff_cal, rows)


def _max_batch_meeting(model, hw, wf, max_batch, tpot_s, eff, kw) -> int:
    """Largest batch <= max_batch whose TPOT meets tpot_s (TPOT grows with batch): bisection."""
    if max_batch < 1 or (tpot_s is None):
        return max(0, max_batch)
    if hw.link_bw is None and kw["tp"] * kw["pp"] > 1:
        return 0
    ok = lambda b: rf.decode_step(model, hw, wf, batch=b, eff=eff, **kw).tpot <= tpot_s  # noqa: E731
    if not ok(1):
        return 0
    lo, hi = 1, max_batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
