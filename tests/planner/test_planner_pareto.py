"""The Pareto front: nothing on it is dominated, everything feasible off it is dominated by a
point on it, infeasible points never on it. Random point sets (with ties) and real plans."""
import random

import pytest

from decodekit import planner as P
from decodekit.planner.shapes import dominates, pareto_front


def check_front(points, feasible, front):
    fs = set(front)
    ok = [i for i, f in enumerate(feasible) if f]
    for i in fs:
        assert feasible[i], "infeasible point on the front"
        assert not any(dominates(points[j], points[i]) for j in ok), f"front point {points[i]} is dominated"
    for i in ok:
        if i not in fs:
            assert any(dominates(points[j], points[i]) for j in fs), f"{points[i]} off the front but undominated"


@pytest.mark.parametrize("seed", range(40))
def test_random_fronts(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    grid = rng.random() < 0.5  # coarse grids make ties and duplicates
    pts = [((rng.randint(1, 6) if grid else rng.random()), (rng.randint(1, 6) if grid else rng.random()))
           for _ in range(n)]
    feas = [rng.random() < 0.8 for _ in range(n)]
    front = pareto_front(pts, feas)
    check_front(pts, feas, front)
    # brute force agrees
    ok = [i for i in range(n) if feas[i]]
    assert front == [i for i in ok if not any(dominates(pts[j], pts[i]) for j in ok)]


def test_duplicates_share_the_front():
    pts = [(1.0, 5.0), (1.0, 5.0), (2.0, 4.0), (0.5, 1.0)]
    assert pareto_front(pts) == [0, 1, 3]
    assert pareto_front(pts, [False, True, True, True]) == [1, 3]
    assert pareto_front([]) == []


@pytest.mark.parametrize("model,gpu,gpus,weights", [("llama3-70b", "h100", 8, "bf16"), ("llama3-8b", "h200", 4, "int4"),
                                                     ("qwen2.5-72b", "a100", 16, "fp8")])
def test_plan_front_property(model, gpu, gpus, weights):
    m, hw = P.load_model(model), P.load_hardware(gpu)
    pl = P.plan(m, hw, P.weight_format(weights), P.Workload(2000, 500), P.Constraints(gpus, ttft_s=0.5, tpot_s=0.05))
    pts = [(r.tpot_s, r.tok_s_cluster) for r in pl.rows]
    front = [i for i, r in enumerate(pl.rows) if r.on_front]
    check_front(pts, [r.feasible for r in pl.rows], front)
    assert front, "some shape should meet these limits"
    for r in pl.rows:
        assert r.tp * r.pp * r.replicas == gpus
        assert r.feasible == (not r.reasons)
        if r.feasible:
            assert r.tpot_s <= 0.05 and r.ttft_s <= 0.5 and r.batch <= r.max_batch_mem


def test_plan_70b_on_8_h100():
    """TP for latency, replicas for throughput: TP=1 cannot hold bf16 70B; TP=8 batch 1 is the
    lowest-latency point of the front."""
    pl = P.plan(P.load_model("llama3-70b"), P.load_hardware("h100"), P.weight_format("bf16"),
                P.Workload(2000, 500), P.Constraints(8, ttft_s=0.5, tpot_s=0.05))
    assert all(not r.feasible for r in pl.rows if r.tp == 1 and r.pp == 1)
    best = min(pl.front, key=lambda r: r.tpot_s)
    assert (best.tp, best.batch) == (8, 1)
    assert best.tpot_s == pytest.approx(
        P.decode_step(pl.model, pl.hardware, pl.weights, batch=1, context=2250, tp=8).tpot)


def test_plan_concurrency_and_rate():
    m, hw, wf = P.load_model("llama3-8b"), P.load_hardware("h100"), P.weight_format("bf16")
    pl = P.plan(m, hw, wf, P.Workload(1000, 200, concurrency=64), P.Constraints(8))
    for r in pl.rows:
        assert r.batch == -(-64 // r.replicas)
    pl = P.plan(m, hw, wf, P.Workload(1000, 200, rate=1e6), P.Constraints(8))
    assert not any(r.feasible for r in pl.rows) and all("needed" in r.reasons[-1] for r in pl.rows)


def test_heads_must_split():
    pl = P.plan(P.load_model("smollm2-135m"), P.load_hardware("h100"), P.weight_format("bf16"),
                P.Workload(100, 100), P.Constraints(6))
    reasons = {r.tp: r.reasons for r in pl.rows if r.pp == 1}
    assert not reasons[1] and not reasons[3]
    assert any("query heads" in x for x in reasons[2]) and any("query heads" in x for x in reasons[6])
