"""Unit tests of the block pool / prefix cache (decodekit.engine.kv_cache)."""
from __future__ import annotations

import pytest

from decodekit.engine import KVCacheManager, Request
from decodekit.engine.kv_cache import sha256_block_hash

from engine_harness import Params

BS = 4


def mk(rid: str, tokens, extra_key=None) -> Request:
    return Request(rid, list(tokens), Params(8), arrival_time=0.0, extra_key=extra_key)


def compute(kv: KVCacheManager, req: Request, n: int | None = None, hits=(), num_hit=0) -> None:
    """Allocate and 'compute' n more tokens (default: all), then register full blocks."""
    if num_hit:
        req.num_computed_tokens = 0
    n = req.num_tokens - req.num_computed_tokens - num_hit if n is None else n
    assert kv.allocate_slots(req, n, list(hits), num_hit)
    req.num_computed_tokens += num_hit + n
    kv.cache_full_blocks(req)


A, B, C, D = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]


def test_allocate_grow_and_free():
    kv = KVCacheManager(10, BS)
    r = mk("r", range(10))
    assert kv.allocate_slots(r, 10)
    assert len(r.block_ids) == 3 and kv.num_free_blocks == 7 and kv.usage == pytest.approx(0.3)
    r.num_computed_tokens = 10
    for t, nblocks in [(10, 3), (11, 3), (12, 4)]:      # decode: token at position 10, 11, 12
        r.append_output_token(t)
        assert kv.allocate_slots(r, 1)
        r.num_computed_tokens += 1
        assert len(r.block_ids) == nblocks
    kv.check_invariants([r])
    kv.free(r)
    kv.free(r)                                          # idempotent
    assert r.block_ids == [] and kv.num_free_blocks == 10 and kv.usage == 0
    kv.check_invariants([])


def test_allocation_failure_has_no_side_effects():
    kv = KVCacheManager(3, BS)
    r1, r2 = mk("a", A + B), mk("b", C + D)
    compute(kv, r1)
    free_before = kv.free_block_ids()
    assert not kv.allocate_slots(r2, 8)
    assert r2.block_ids == [] and kv.free_block_ids() == free_before
    # a hit that needs a free cached block counts against the free blocks too
    kv.free(r1)
    r3 = mk("c", A + B + C + D[:1])
    hits, n = kv.get_computed_blocks(r3)
    assert n == 8
    assert not kv.allocate_slots(r3, 9, hits, n)        # needs 2 (hit, free) + 3 new > 3
    assert r3.block_ids == [] and kv.num_free_blocks == 3
    kv.check_invariants([])


def test_refcounts_with_shared_prefix():
    kv = KVCacheManager(10, BS)
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    assert kv.num_cached_blocks == 3
    r2 = mk("b", A + B + D)
    hits, n = kv.get_computed_blocks(r2)
    assert hits == r1.block_ids[:2] and n == 8
    compute(kv, r2, 4, hits, n)
    assert [kv.ref_count(b) for b in r1.block_ids] == [2, 2, 1]
    kv.check_invariants([r1, r2])
    kv.free(r1)
    assert [kv.ref_count(b) for b in r2.block_ids] == [1, 1, 1]
    assert r1.block_ids == [] and kv.num_free_blocks == 10 - 3
    kv.check_invariants([r2])
    kv.free(r2)
    assert kv.num_free_blocks == 10
    kv.check_invariants([])


def test_lru_eviction_order_and_lazy_eviction():
    kv = KVCacheManager(6, BS)
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    assert r1.block_ids == [0, 1, 2]
    kv.free(r1)
    # never-used blocks first, then r1's blocks tail-first (reverse order), all still cached
    assert kv.free_block_ids() == [3, 4, 5, 2, 1, 0]
    assert kv.num_cached_blocks == 3
    r2 = mk("b", D + D + D[:1])
    compute(kv, r2)                 # 9 tokens: blocks 3, 4, 5 (two full D blocks get cached)
    r3 = mk("c", [20, 21, 22, 23, 24])
    compute(kv, r3)                 # 2 blocks: evicts r1's last block (2), then block 1
    assert r3.block_ids == [2, 1]
    assert kv.block_hash(2) is not None    # re-registered for r3's own full block
    hits, n = kv.get_computed_blocks(mk("q", A + B + C + [0]))
    assert hits == [0] and n == 4   # only r1's first block survived
    kv.check_invariants([r2, r3])


def test_uncached_freed_blocks_are_reused_first():
    kv = KVCacheManager(4, BS)
    r1 = mk("a", A + [1, 2])       # one full (cached) block + one partial (uncached)
    compute(kv, r1)
    kv.free(r1)
    assert kv.free_block_ids() == [1, 2, 3, 0]   # the partial block goes to the head
    kv.check_invariants([])


@pytest.mark.parametrize("prompt,expected_hit", [(A + B, 4), (A + B + [7], 8), (A, 0), (A[:1], 0)])
def test_hit_capped_so_last_token_is_recomputed(prompt, expected_hit):
    kv = KVCacheManager(8, BS)
    compute(kv, mk("a", A + B + C))
    hits, n = kv.get_computed_blocks(mk("q", prompt))
    assert n == expected_hit == len(hits) * BS
    assert n <= len(prompt) - 1 or n == 0


def test_chained_hash_same_block_under_other_prefix_does_not_hit():
    kv = KVCacheManager(12, BS)
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    r2 = mk("b", D + B + C)
    assert kv.get_computed_blocks(r2) == ([], 0)
    assert r2.block_hashes[1] != r1.block_hashes[1] and r2.block_hashes[2] != r1.block_hashes[2]
    assert kv.get_computed_blocks(mk("c", A + D + C + [1])) == (r1.block_ids[:1], 4)
    # extra_key (LoRA id, cache salt) partitions the cache
    assert kv.get_computed_blocks(mk("d", A + B + [1], extra_key="salt")) == ([], 0)
    # the default hash is deterministic and chained
    assert sha256_block_hash(None, tuple(A), None) == sha256_block_hash(None, tuple(A), None)
    assert sha256_block_hash(b"x", tuple(A), None) != sha256_block_hash(b"y", tuple(A), None)


def test_collision_guard_constant_hash():
    kv = KVCacheManager(12, BS, hash_fn=lambda parent, toks, extra: 0)   # everything collides
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    assert kv.num_cached_blocks == 1            # block 0 registered, the rest collide
    assert kv.get_computed_blocks(mk("b", D + B + C + [1])) == ([], 0)
    assert kv.get_computed_blocks(mk("c", A + B + C + [1])) == (r1.block_ids[:1], 4)
    kv.check_invariants([r1])


def test_collision_guard_checks_the_parent_chain():
    # A hash that ignores the parent: block B after C and block B after A collide. The KV of
    # B depends on its prefix, so B-after-C must not serve a request whose prefix is A.
    kv = KVCacheManager(12, BS, hash_fn=lambda parent, toks, extra: toks)
    ra = mk("a", A + D)
    compute(kv, ra)
    rc = mk("c", C + B)
    compute(kv, rc)
    hits, n = kv.get_computed_blocks(mk("q", A + B + [1]))
    assert hits == ra.block_ids[:1] and n == 4
    kv.check_invariants([ra, rc])


def test_stale_child_entry_is_replaced():
    """A cached block whose parent registration was evicted is unreachable; a new computation
    of the same block under a live parent replaces it so it can be hit again."""
    kv = KVCacheManager(8, BS)
    r0 = mk("r0", A + [1])
    compute(kv, r0)                             # registers A
    r1 = mk("r1", A + B + [1])
    compute(kv, r1)                             # computed without a hit: A duplicate, B registered
    kv.free(r0)
    filler = mk("f", range(100, 120))
    assert kv.allocate_slots(filler, 20)        # takes every free block: evicts r0's A
    kv.free(filler)
    kv.free(r1)                                 # B stays cached, but under a dead parent
    r3 = mk("r3", A + D + [1])
    compute(kv, r3)                             # A registered again
    r4 = mk("r4", A + B + [2])
    hits, n = kv.get_computed_blocks(r4)
    assert n == 4                               # the stale B is not hit
    compute(kv, r4, None, hits, n)
    assert kv.get_computed_blocks(mk("r5", A + B + [3])) == (r4.block_ids[:2], 8)
    kv.check_invariants([r3, r4])


def test_generated_tokens_become_hittable():
    kv = KVCacheManager(8, BS)
    r = mk("a", A + [1, 2])
    compute(kv, r)
    for t in (3, 4, 5):
        r.append_output_token(t)
        compute(kv, r, 1)
    # tokens: A + [1,2,3,4] + [5]; computed 8 -> two full blocks cached (the second from outputs)
    hits, n = kv.get_computed_blocks(mk("q", A + [1, 2, 3, 4, 5, 6]))
    assert hits == r.block_ids[:2] and n == 8


def test_duplicate_content_not_registered_twice():
    kv = KVCacheManager(8, BS)
    r1, r2 = mk("a", A + B), mk("b", A + B)
    compute(kv, r1, 8)
    assert kv.allocate_slots(r2, 8)             # computed in parallel: no hit, own blocks
    r2.num_computed_tokens = 8
    kv.cache_full_blocks(r2)
    assert kv.num_cached_blocks == 2 and all(kv.block_hash(b) is None for b in r2.block_ids)
    kv.check_invariants([r1, r2])
    dup = set(r2.block_ids)
    kv.free(r2)
    assert set(kv.free_block_ids()[:2]) == dup      # worthless duplicates are reused first


def test_prefix_cache_stats_and_reset():
    kv = KVCacheManager(8, BS)
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    r2 = mk("b", A + B + D)
    hits, n = kv.get_computed_blocks(r2)
    assert not kv.reset_prefix_cache()          # blocks in use
    compute(kv, r2, 4, hits, n)
    assert kv.prefix_cache_queries == 24 and kv.prefix_cache_hits == 8
    assert kv.prefix_cache_hit_rate == pytest.approx(8 / 24)
    kv.free(r1)
    kv.free(r2)
    assert kv.reset_prefix_cache()
    assert kv.num_cached_blocks == 0 and kv.get_computed_blocks(mk("c", A + B + C)) == ([], 0)
    kv.check_invariants([])


def test_prefix_caching_disabled():
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    r1 = mk("a", A + B + C)
    compute(kv, r1)
    assert kv.num_cached_blocks == 0 and kv.get_computed_blocks(mk("b", A + B + C)) == ([], 0)
    kv.free(r1)
    kv.check_invariants([])


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    kv = KVCacheManager(8, BS)
    parent = mk("p", A + B + [1, 2])
    compute(kv, parent)
    child = mk("p/1", A + B + [1, 2])
    copies = kv.fork(parent, child)
    assert child.block_ids[:2] == parent.block_ids[:2]
    assert copies == [(parent.block_ids[2], child.block_ids[2])] and child.block_ids[2] != parent.block_ids[2]
    assert child.num_computed_tokens == 10
    assert [kv.ref_count(b) for b in parent.block_ids] == [2, 2, 1]
    kv.check_invariants([parent, child])
    # they diverge: each writes its next token into its own last block
    parent.append_output_token(7)
    child.append_output_token(8)
    compute(kv, parent, 1)
    compute(kv, child, 1)
    kv.check_invariants([parent, child])
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 8
    kv.check_invariants([])


def test_fork_block_aligned_and_out_of_blocks():
    kv = KVCacheManager(3, BS)
    parent = mk("p", A + B)
    compute(kv, parent)
    child = mk("c", A + B)
    assert kv.fork(parent, child) == [] and child.block_ids == parent.block_ids
    kv.check_invariants([parent, child])
    kv.free(child)
    full = mk("f", A + B + [1, 2, 3])
    compute(kv, full, None, *kv.get_computed_blocks(full))   # takes the last free block
    parent2 = full
    child2 = mk("c2", A + B + [1, 2, 3])
    assert kv.num_free_blocks == 0 and kv.fork(parent2, child2) is None
    assert child2.block_ids == [] and child2.num_computed_tokens == 0
    with pytest.raises(ValueError):
        kv.fork(parent, mk("x", C + D))
    kv.check_invariants([parent, full])


def test_invariant_checker_catches_corruption():
    kv = KVCacheManager(4, BS)
    r = mk("a", A + B)
    compute(kv, r)
    kv.check_invariants([r])
    with pytest.raises(AssertionError):
        kv.check_invariants([])                 # r's blocks not accounted for
    kv._blocks[r.block_ids[0]].ref_cnt += 1
    with pytest.raises(AssertionError):
        kv.check_invariants([r])


def test_constructor_validation():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_blocks"):
            KVCacheManager(bad, 4)
        with pytest.raises(ValueError, match="block_size"):
            KVCacheManager(4, bad)


@pytest.mark.parametrize("seed", range(4))
def test_random_pool_operations(seed):
    """Random admit / compute / decode / fork / free sequences on a small pool. A shadow map
    records, per physical block, the token prefix its KV was computed under; every prefix
    hit must return blocks whose shadow equals the query's prefix, and writes may only go
    to blocks owned by one request."""
    import random
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    kv = KVCacheManager(rng.randint(8, 40), bs, hash_fn=None if seed % 2 else (lambda p, t, e: sum(t) % 5))
    shadow: dict[int, tuple] = {}
    patterns = [[rng.randrange(3) for _ in range(bs)] for _ in range(3)]
    live: list[Request] = []
    counter = 0

    def compute_more(r: Request, n: int) -> bool:
        if not kv.allocate_slots(r, n):
            return False
        for p in range(r.num_computed_tokens, r.num_computed_tokens + n):
            b = r.block_ids[p // bs]
            assert kv.ref_count(b) == 1, "write into a shared block"
            shadow[b] = tuple(r.all_token_ids[:p + 1])
        r.num_computed_tokens += n
        kv.cache_full_blocks(r)
        return True

    for _ in range(400):
        op = rng.random()
        if op < 0.3 or not live:
            counter += 1
            toks = sum((rng.choice(patterns) for _ in range(rng.randint(0, 4))), []) + \
                [rng.randrange(3) for _ in range(rng.randint(1, 2 * bs))]
            r = mk(f"r{counter}", toks)
            hits, n = kv.get_computed_blocks(r)
            assert n <= r.num_tokens - 1
            for i, b in enumerate(hits):
                assert shadow[b] == tuple(toks[:(i + 1) * bs]), "wrong prefix hit"
            k = rng.randint(1, r.num_tokens - n)
            if kv.allocate_slots(r, 0, hits, n):
                r.num_computed_tokens = n
                live.append(r)
                if not compute_more(r, k):
                    kv.free(r)
                    live.remove(r)
        elif op < 0.7:
            r = rng.choice(live)
            if r.num_computed_tokens == r.num_tokens:
                r.append_output_token(rng.randrange(3))
            compute_more(r, rng.randint(1, r.num_tokens - r.num_computed_tokens))
        elif op < 0.8:
            parent = rng.choice(live)
            counter += 1
            child = mk(f"r{counter}", parent.all_token_ids)
            copies = kv.fork(parent, child)
            if copies is not None:
                for src, dst in copies:
                    shadow[dst] = shadow[src]
                live.append(child)
        else:
            r = live.pop(rng.randrange(len(live)))
            kv.free(r)
        kv.check_invariants(live)
    assert kv.prefix_cache_hits > 0
    for r in live:
        kv.free(r)
    assert kv.num_free_blocks == kv.num_blocks
    kv.check_invariants([])
