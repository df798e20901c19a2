"""Speculative decoding in the scheduler, against the fake paged model (see engine_harness).

Before every step each decoding request gets 0..k draft tokens (each the true continuation with
some probability, else random), not capped at max_tokens / max_model_len; the fake model verifies
them greedily and the scheduler rolls back rejected drafts. Outputs must equal the reference
exactly (a rollback that kept a rejected draft's KV, or lost an accepted one, changes every later
token), invariants must hold after every step, nothing may leak, and the tokens must be the same
as without speculation, under preemption, chunked prefill, prefix caching, stops and aborts.
"""
from __future__ import annotations

import random

import pytest

from engine_harness import check_against_reference, random_specs, run

MAX_MODEL_LEN = 360


@pytest.mark.parametrize("seed", range(12))
def test_random_spec_scenarios(seed):
    rng = random.Random(1000 + seed)
    block_size = rng.choice([1, 2, 4, 16])
    min_blocks = -(-(MAX_MODEL_LEN - 1) // block_size)
    kw = dict(num_blocks=min_blocks + rng.randint(0, 2 * min_blocks), block_size=block_size,
              max_model_len=MAX_MODEL_LEN, budget=rng.choice([5, 32, 100, 512]), max_seqs=rng.choice([1, 3, 8, 64]),
              prefix_caching=rng.random() < 0.7)
    specs = random_specs(rng, 24, abort_prob=0.15, stop_prob=0.3)
    res = run(specs, spec_k=rng.choice([1, 3, 6]), draft_accuracy=rng.choice([0.0, 0.5, 0.9, 1.0]), seed=seed, **kw)
    check_against_reference(specs, res)
    plain = run(specs, **kw)
    keep = [s.rid for s in specs if s.abort_at is None and s.rid not in res.rejected]
    assert {r: res.outputs[r] for r in keep} == {r: plain.outputs[r] for r in keep}


def test_accurate_drafts_save_steps_and_bad_ones_cost_none():
    rng = random.Random(7)
    specs = random_specs(rng, 6, max_prompt=40, max_out=50, spread=0)
    kw = dict(num_blocks=400, block_size=4, max_model_len=MAX_MODEL_LEN, budget=512)
    plain = run(specs, **kw)
    good = run(specs, spec_k=4, draft_accuracy=1.0, **kw)
    bad = run(specs, spec_k=4, draft_accuracy=0.0, **kw)
    for r in (good, bad):
        check_against_reference(specs, r)
    assert good.steps < plain.steps * 0.5
    assert bad.steps <= plain.steps      # a rejected draft still yields the model's own token (random ones may hit)
    assert bad.tokens_computed > plain.tokens_computed


def test_drafts_past_max_tokens_and_max_model_len_are_cut():
    rng = random.Random(3)
    specs = random_specs(rng, 10, max_prompt=50, max_out=8, spread=0)
    res = run(specs, num_blocks=200, block_size=2, max_model_len=60, budget=64, spec_k=8, draft_accuracy=1.0)
    check_against_reference(specs, res)
    assert all(len(res.outputs[s.rid]) <= s.max_tokens for s in specs)


@pytest.mark.parametrize("seed", range(6))
def test_longrope_switch_recomputes_on_the_long_factors(seed):
    """SchedulerConfig.rope_switch_len (LongRoPE's original context): a request computes no position past it on
    the short factors -- drafts that would are cut, and a request whose next position is past it restarts
    with Request.rope_long and recomputes its KV (the fake model checks each position reads KV of its own
    kind, prefix hits and forks included) -- with the same tokens, and no switch counts as a preemption."""
    rng = random.Random(500 + seed)
    rs = rng.choice([7, 40, 64])
    prefixes = [[rng.randrange(61) for _ in range(rng.randint(0, 80))] for _ in range(3)]
    specs = random_specs(rng, 16, max_prompt=90, max_out=60, spread=20, abort_prob=0.1, prefixes=prefixes)
    block_size = rng.choice([1, 4, 16])
    kw = dict(num_blocks=4000 // block_size, block_size=block_size, max_model_len=160,
              budget=rng.choice([8, 64, 512]), rope_switch_len=rs)
    plain = run(specs, **kw)
    res = run(specs, spec_k=rng.choice([0, 3, 6]), draft_accuracy=0.8, seed=seed, **kw)
    for r in (plain, res):
        check_against_reference(specs, r)
        assert r.num_preemptions == 0
        done = {s.rid for s in specs if s.abort_at is None}
        assert {s.rid for s in specs if s.rid in done and len(s.prompt) + len(r.outputs[s.rid]) - 1 > rs} \
            <= r.rope_long
    # a tight pool: preemption and the switch together
    tight = run(specs, **{**kw, "num_blocks": -(-160 // block_size) + 2})
    check_against_reference(specs, tight)
