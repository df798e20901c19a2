"""Randomised scheduler runs against the fake paged model (see engine_harness).

Each run checks, after every step, the scheduler and KV-cache invariants; at the end, that
every request finished with exactly the reference tokens (aborted ones: a prefix), the
right finish status, and that no block leaked. Tiny KV caches force preemption, small
budgets force chunked prefill; outputs must not depend on any of it.
"""
from __future__ import annotations

import random

import pytest

from engine_harness import RunResult, check_against_reference, random_specs, run

MAX_MODEL_LEN = 360     # prompts <= 300 + max_tokens <= 50


def min_blocks(block_size: int) -> int:
    """Smallest cache in which any single request can run to completion."""
    return -(-(MAX_MODEL_LEN - 1) // block_size)


def big_run(specs) -> RunResult:
    return run(specs, num_blocks=4096, block_size=16, max_model_len=MAX_MODEL_LEN, budget=100_000,
               check=False)


def non_aborted(res: RunResult, specs):
    return {s.rid: res.outputs[s.rid] for s in specs if s.abort_at is None and s.rid not in res.rejected}


@pytest.mark.parametrize("seed", range(16))
def test_random_scenarios(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    chunked = seed % 4 != 3
    num_blocks = min_blocks(block_size) + rng.randint(0, min_blocks(block_size))   # tiny: 1-2 requests
    kw = dict(num_blocks=num_blocks, block_size=block_size, max_model_len=MAX_MODEL_LEN,
              budget=rng.choice([7, 32, 100, 512]) if chunked else 512,
              max_seqs=rng.choice([1, 3, 8, 64]), prefix_caching=rng.random() < 0.7, chunked=chunked)
    specs = random_specs(rng, 24, abort_prob=0.2, stop_prob=0.3)
    res = run(specs, **kw)
    check_against_reference(specs, res)
    # preemption/recompute and chunking are transparent: same tokens as with a huge cache
    ref = big_run(specs)
    assert ref.num_preemptions == 0
    assert non_aborted(res, specs) == non_aborted(ref, specs)


def test_tight_cache_preempts_and_recomputes_generated_tokens():
    rng = random.Random(1234)
    specs = random_specs(rng, 30, max_prompt=120, spread=10)
    res = run(specs, num_blocks=min_blocks(4), block_size=4, max_model_len=MAX_MODEL_LEN, budget=64, max_seqs=16)
    check_against_reference(specs, res)
    assert res.num_preemptions > 0 and res.max_preempted_outputs > 0
    res_off = run(specs, num_blocks=min_blocks(4), block_size=4, max_model_len=MAX_MODEL_LEN, budget=64,
                  max_seqs=16, prefix_caching=False)
    check_against_reference(specs, res_off)


def shared_prefix_specs(seed: int, n: int = 30):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(61) for _ in range(rng.randint(20, 200))] for _ in range(3)] + [[]]
    return random_specs(rng, n, max_out=20, spread=40, prefixes=prefixes, stop_prob=0.2)


@pytest.mark.parametrize("seed", range(3))
def test_prefix_caching_on_off_identical_and_hits(seed):
    specs = shared_prefix_specs(seed)
    kw = dict(num_blocks=120, block_size=8, max_model_len=MAX_MODEL_LEN, budget=96, max_seqs=8)
    on = run(specs, prefix_caching=True, **kw)
    off = run(specs, prefix_caching=False, **kw)
    check_against_reference(specs, on)
    assert on.outputs == off.outputs and on.status == off.status
    assert on.hit_rate > 0.2 and off.hit_rate == 0
    assert on.tokens_computed < off.tokens_computed


@pytest.mark.parametrize("hash_name", ["constant", "mod3", "ignore_parent"])
def test_weak_hash_never_gives_wrong_hits(hash_name):
    """With a colliding hash, the collision guard (tokens + parent registration) keeps
    every output exact; the fake model would produce different tokens on a wrong hit."""
    hash_fn = {"constant": lambda p, t, e: 0,
               "mod3": lambda p, t, e: (sum(t) + (p or 0)) % 3,
               "ignore_parent": lambda p, t, e: t}[hash_name]
    specs = shared_prefix_specs(7, n=24)
    # short prompts built from a tiny alphabet so equal blocks under different prefixes abound
    rng = random.Random(99)
    for i, s in enumerate(specs[::2]):
        s.prompt = [rng.choice([1, 2]) for _ in range(rng.randint(5, 60))]
    res = run(specs, num_blocks=80, block_size=4, max_model_len=MAX_MODEL_LEN, budget=64, max_seqs=6,
              hash_fn=hash_fn)
    check_against_reference(specs, res)


@pytest.mark.parametrize("chunked", [True, False])
def test_cache_smaller_than_some_requests(chunked):
    """Requests that outgrow the whole cache are cut (FINISHED_LENGTH, "kv_cache_capacity")
    with a correct prefix of their output; everyone else is unaffected; no livelock."""
    rng = random.Random(5 + chunked)
    specs = random_specs(rng, 20, max_prompt=60, max_out=50, spread=20, abort_prob=0.1)
    res = run(specs, num_blocks=20, block_size=4, max_model_len=MAX_MODEL_LEN, budget=512 if not chunked else 24,
              max_seqs=4, chunked=chunked)
    check_against_reference(specs, res)
    cut = [rid for rid, why in res.stop_reason.items() if why == "kv_cache_capacity"]
    assert cut and all(len(s.prompt) + s.max_tokens > 81 for s in specs if s.rid in cut)
