"""Beam groups (engine/beam_group.py) over the real Scheduler + KVCacheManager with the fake paged model of
engine_harness: every beam's step table is a function of the KV value at its last position, which the fake
model computes THROUGH the block table, so a beam that continues its parent (last token replaced), a
forked child (shared full blocks, copied partial block), a preempted and recomputed beam, or a prefix-cache
hit that went wrong gives a different table. The result must equal a BeamSearch driven by tables computed
from scratch, in random scenarios: tiny KV caches (preemption, failed forks), max_num_seqs below the beam
width, prefix caching on and off, ordinary requests alongside (their outputs checked too), aborts; no
block leaks, invariants after every step, no livelock."""
from __future__ import annotations

import random

import pytest

from decodekit.engine import KVCacheManager, Request, RequestStatus, Scheduler, SchedulerConfig
from decodekit.engine.beam_group import BeamGroup
from decodekit.sampling.beam_search import BeamSearch, BeamSearchParams

from engine_harness import SEED, VOCAB, FakeModel, Params, mix, reference_output

EOS = 0


def table_of(value: int, k: int) -> tuple[list[int], list[float]]:
    """The fake model's top-k (ids, logprobs), best first, from the KV value at the last position."""
    lps = [-((hash((value, t)) & 0xFFFF) / 4096.0) for t in range(VOCAB)]
    order = sorted(range(VOCAB), key=lambda t: (-lps[t], t))[:k]
    return order, [lps[t] for t in order]


def value_of(tokens: list[int]) -> int:
    v = SEED
    for p, t in enumerate(tokens):
        v = mix(v, t, p)
    return v


def reference(prompt, params: BeamSearchParams):
    from decodekit.engine.outputs import Logprob
    s = BeamSearch(prompt, params, {EOS})
    k = params.num_step_logprobs
    while not s.done:
        tables = []
        for b in s.beams:
            ids, lps = table_of(value_of(b.tokens), k)
            tables.append({t: Logprob(v, i + 1) for i, (t, v) in enumerate(zip(ids, lps))})
        s.advance(tables)
    return [(q.tokens, q.cum_logprob, q.finish_reason) for q in s.result().sequences]


def drive(groups, plain, *, num_blocks, block_size, max_seqs, prefix, budget=64, max_model_len=64,
          aborts=None, max_steps=5000, seed=0):
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                          block_size=block_size, enable_prefix_caching=prefix, chunked_prefill=True)
    kv = KVCacheManager(num_blocks, block_size, prefix)
    sched = Scheduler(cfg, kv)
    model = FakeModel(kv)
    beam_of = {}
    for g in groups:
        for r in g.start(sched):
            beam_of[r.request_id] = g
    reqs = {}
    for rid, prompt, mt in plain:
        reqs[rid] = Request(rid, prompt, Params(mt), arrival_time=0.0)
        sched.add_request(reqs[rid])
    aborts = aborts or {}
    step = 0
    while sched.has_unfinished_requests():
        for g in groups:
            if aborts.get(g.request_id) == step and not g.finished:
                for r in g.abort(sched):
                    beam_of.pop(r.request_id, None)
        model.poison_free_blocks()
        out = sched.schedule()
        sched.check_invariants()
        model.execute(out)
        sampled, values = {}, {}
        for sr in out.scheduled:
            if not sr.will_sample:
                continue
            p = sr.start_pos + sr.num_new_tokens - 1
            v = model.store[sr.request.block_ids[p // block_size]][p % block_size]
            if sr.request_id in beam_of:
                values[sr.request_id] = v
                sampled[sr.request_id] = [table_of(v, 1)[0][0]]
            else:
                sampled[sr.request_id] = [(v >> 7) % VOCAB]     # the harness' own token rule
        finished = sched.update_from_output(out, sampled)
        touched = set()
        for rid, v in values.items():
            g = beam_of.get(rid)
            if g is None or g.finished:
                continue
            ids, lps = table_of(v, g.k)
            req = next(sr.request for sr in out.scheduled if sr.request_id == rid)
            g.on_sample(req, [(lps[0], (ids, lps, 1))])
            touched.add(g)
        for r in finished:
            g = beam_of.get(r.request_id)
            if g is not None:
                for d in g.on_finished(r, sched):
                    beam_of.pop(d.request_id, None)
        for g in touched:
            if g.ready:
                added, dropped = g.advance(sched)
                for d in dropped:
                    beam_of.pop(d.request_id, None)
                for a in added:
                    beam_of[a.request_id] = g
        sched.check_invariants()
        step += 1
        assert step < max_steps, "no progress"
    assert not beam_of
    assert kv.num_free_blocks == num_blocks, "blocks leaked"
    kv.check_invariants([])
    return sched, reqs


def _check(groups, reqs, plain, aborted=()):
    for g in groups:
        assert g.finished
        if g.request_id in aborted or g.cut:
            continue
        got = [(q.tokens, q.cum_logprob, q.finish_reason) for q in g.search.result().sequences]
        assert got == reference(g.search.prompt_token_ids, g.params), g.request_id
    for rid, prompt, mt in plain:
        assert reqs[rid].output_token_ids == reference_output(prompt, mt), rid


@pytest.mark.parametrize("seed", range(24))
def test_random_scenarios_match_fresh_search(seed):
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8])
    groups, plain = [], []
    for i in range(rng.randint(1, 4)):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 13))]
        p = BeamSearchParams(beam_width=rng.randint(1, 4), max_tokens=rng.randint(1, 12),
                             length_penalty=rng.choice([0.0, 1.0, 2.0]), ignore_eos=rng.random() < 0.3)
        groups.append(BeamGroup(f"g{i}", None, prompt, p, {EOS}, 64, can_fork=rng.random() < 0.8))
    for i in range(rng.randint(0, 3)):
        plain.append((f"r{i}", [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))], rng.randint(1, 10)))
    aborts = {}
    if rng.random() < 0.3:
        aborts[groups[0].request_id] = rng.randint(0, 8)
    # a cache from tight (preemptions, failed forks) to roomy; always enough for the largest single beam
    need = -(-(13 + 12) // bs) + 1
    num_blocks = rng.choice([need, need + 2, 3 * need, 64])
    sched, reqs = drive(groups, plain, num_blocks=num_blocks, block_size=bs, max_seqs=rng.choice([1, 2, 3, 8]),
                        prefix=rng.random() < 0.7, budget=rng.choice([8, 16, 64]), aborts=aborts, seed=seed)
    _check(groups, reqs, plain, aborted=aborts)


def test_forks_copy_and_preemption_actually_happen():
    """The mechanisms under test are exercised: forks (block copies) in a roomy cache, preemptions of paused
    beams in a tight one."""
    prompt = [5, 9, 2, 7, 7, 3]
    p = BeamSearchParams(beam_width=4, max_tokens=10, ignore_eos=True)
    g = BeamGroup("g", None, prompt, p, {EOS}, 64, can_fork=True)
    calls = {"fork": 0}
    orig = Scheduler.add_forked

    def counting(self, child, parent):
        ok = orig(self, child, parent)
        calls["fork"] += ok
        return ok
    Scheduler.add_forked = counting
    try:
        drive([g], [], num_blocks=64, block_size=4, max_seqs=8, prefix=True)
    finally:
        Scheduler.add_forked = orig
    assert calls["fork"] > 0
    _check([g], {}, [])
    g = BeamGroup("g", None, prompt, p, {EOS}, 64, can_fork=True)
    sched, _ = drive([g], [("x", [1, 2, 3], 12)], num_blocks=7, block_size=4, max_seqs=8, prefix=True)
    assert sched.num_preemptions > 0
    _check([g], {}, [])


def test_max_num_seqs_below_beam_width_does_not_deadlock():
    gs = [BeamGroup(f"g{i}", None, [3 + i, 4, 5], BeamSearchParams(beam_width=4, max_tokens=8), {EOS}, 64, True)
          for i in range(3)]
    drive(gs, [], num_blocks=12, block_size=4, max_seqs=1, prefix=False)
    _check(gs, {}, [])


def test_replace_last_token_checks():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          enable_prefix_caching=True, chunked_prefill=True)
    sched = Scheduler(cfg, KVCacheManager(16, 4, True))
    r = Request("a", [1, 2, 3, 4, 5, 6, 7], Params(5))
    sched.add_request(r)
    with pytest.raises(ValueError):
        sched.replace_last_token(r, 4)          # no output token yet
    out = sched.schedule()
    sched.update_from_output(out, {"a": [9]})
    # the second block's hash covers the sampled (uncomputed) token: it must go with it
    assert r.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 9] and len(r.block_hashes) == 2
    sched.replace_last_token(r, 8)
    assert r.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8] and r.output_token_ids == [8] and len(r.block_hashes) == 1
    assert r.status == RequestStatus.RUNNING
    out = sched.schedule()
    assert [(sr.request_id, sr.start_pos, sr.num_new_tokens) for sr in out.scheduled] == [("a", 7, 1)]
    sched.update_from_output(out, {"a": [3]})
    assert len(r.block_hashes) == 2
    b = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 1], Params(1))   # hits both blocks (the replaced token's too)
    sched.add_request(b)
    assert sched.kv.get_computed_blocks(b)[1] == 8
