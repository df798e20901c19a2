"""Sliding-window models: running requests release the blocks before their window
(KVCacheManager.release_out_of_window). The fake model (engine_harness) checks every step that each
position's window is still readable through the block table; outputs must equal the reference and
the runs with a full cache, blocks must never leak, and prompts longer than the whole cache run."""
from __future__ import annotations

import random

import pytest

from decodekit.engine import KVCacheManager, Request
from decodekit.engine.kv_cache import RELEASED
from engine_harness import Params, check_against_reference, random_specs, run

MAX_MODEL_LEN = 360


@pytest.mark.parametrize("seed", range(12))
def test_random_scenarios_release_blocks(seed):
    rng = random.Random(1000 + seed)
    block_size = rng.choice([1, 4, 16])
    window = rng.choice([2, 5, 17, 64])
    budget = rng.choice([7, 32, 100])
    # room for one request's window and one step, sometimes a little more: far below the longest prompts
    need = -(-(window + budget) // block_size) + 2
    num_blocks = need + rng.randint(0, 2 * need)
    kw = dict(num_blocks=num_blocks, block_size=block_size, max_model_len=MAX_MODEL_LEN, budget=budget,
              max_seqs=rng.choice([1, 3, 8]), prefix_caching=rng.random() < 0.7, window=window,
              spec_k=rng.choice([0, 0, 3]), seed=seed)
    specs = random_specs(rng, 20, abort_prob=0.15, stop_prob=0.3)
    res = run(specs, **kw)
    assert not res.rejected, res.rejected
    check_against_reference(specs, res)
    assert all(r != "kv_cache_capacity" for r in res.stop_reason.values())
    big = run(specs, num_blocks=4096, block_size=16, max_model_len=MAX_MODEL_LEN, budget=100_000, check=False)
    done = [s.rid for s in specs if s.abort_at is None]
    assert [res.outputs[r] for r in done] == [big.outputs[r] for r in done]


def test_prompt_longer_than_the_cache():
    """A 300-token prompt in a 12-block x 4 cache (48 tokens): it runs, holding about its window."""
    rng = random.Random(7)
    specs = random_specs(rng, 4, max_prompt=300, max_out=30, spread=0)
    res = run(specs, num_blocks=12, block_size=4, max_model_len=MAX_MODEL_LEN, budget=16, window=9)
    assert not res.rejected
    check_against_reference(specs, res)
    with pytest.raises(AssertionError):  # without the window: the prompts are refused
        assert not run(specs, num_blocks=12, block_size=4, max_model_len=MAX_MODEL_LEN, budget=16).rejected


def test_window_larger_than_the_cache():
    """A window the cache cannot hold only matters to requests that outgrow the cache: the rest run."""
    rng = random.Random(11)
    specs = random_specs(rng, 6, max_prompt=30, max_out=10)
    res = run(specs, num_blocks=12, block_size=4, max_model_len=MAX_MODEL_LEN, budget=16, window=4096)
    assert not res.rejected
    check_against_reference(specs, res)


def test_prefix_cache_keeps_released_blocks_hittable():
    """Released blocks that were cached stay in the prefix cache (evictable): a later request with the
    same prompt hits them."""
    rng = random.Random(3)
    prompt = [rng.randrange(61) for _ in range(120)]
    specs = random_specs(rng, 1, max_prompt=1)
    specs[0].prompt, specs[0].max_tokens = prompt, 5
    later = random_specs(rng, 1, max_prompt=1)[0]
    later.rid, later.prompt, later.max_tokens, later.arrival = "again", list(prompt), 5, 200
    res = run(specs + [later], num_blocks=200, block_size=8, max_model_len=MAX_MODEL_LEN, budget=32, window=10)
    check_against_reference(specs + [later], res)
    assert res.hit_rate > 0.4


def test_release_fork_free_invariants():
    kv = KVCacheManager(16, 4)
    r = Request("a", list(range(30)), Params(8))
    assert kv.allocate_slots(r, 30)
    r.num_computed_tokens = 30
    kv.cache_full_blocks(r)
    assert kv.release_out_of_window(r, 9) == 5        # keys < 30 - 9 + 1 = 22: blocks 0-4 (tokens 0-19)
    assert r.block_ids[:5] == [RELEASED] * 5 and RELEASED not in r.block_ids[5:]
    assert kv.release_out_of_window(r, 9) == 0        # idempotent
    kv.check_invariants([r])
    assert kv.num_free_blocks == 16 - 3 and kv.num_cached_blocks == 7   # released full blocks stay cached
    child = Request("b", list(range(30)) + [7], Params(8))
    assert kv.fork(r, child) == [(r.block_ids[7], child.block_ids[7])]  # the partial block copied
    assert child.block_ids[:5] == [RELEASED] * 5
    kv.check_invariants([r, child])
    kv.free(r)
    kv.free(child)
    kv.check_invariants([])
    assert kv.num_free_blocks == 16
