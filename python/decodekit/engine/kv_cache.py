"""Paged KV-cache block accounting with automatic prefix caching (vLLM v1 design).

Blocks are the integers 0 .. num_blocks-1; the KV tensors themselves live in the model
runner. This module only decides which physical block holds which logical block of which
request, and which computed blocks can be reused by later requests.

Free-block queue
    An OrderedDict used as an intrusive doubly-linked list: O(1) pop from the head, append
    at the tail, and removal from the middle (a cached block that gets hit again). Blocks
    are allocated from the head. A freed block that holds a cached (hashed) full block keeps
    its hash and goes to the TAIL (LRU order; a request's blocks are freed in reverse, so its
    last block is evicted first). A freed block without a hash has no value and goes to the
    HEAD, so it is reused before any cached block. A cached block is evicted lazily: its
    hash is dropped only when the block is popped to be allocated for something else.

Prefix caching
    Only FULL blocks are cached. Block i of a request has the chained hash
    ``hash_fn(hash of block i-1 (None for i=0), tuple(block tokens), request.block_key)``;
    the default is SHA-256 over an unambiguous byte encoding (deterministic across processes).
    Collision guard: every registered block stores its key (parent registration serial, block
    tokens, extra_key) and a lookup accepts a block only if the tokens and extra key match AND
    its parent serial is the serial of the block hit just before it. Registration serials are
    never reused, so by induction a hit's whole prefix equals the query's: a wrong hit is
    impossible even with a weak hash_fn (tests use a deliberately colliding one). When a block's
    hash is already taken by different content: if the other entry is stale (its parent
    registration was evicted, so nothing can reach it) it is replaced, otherwise the new block
    is left uncached, and so is the rest of that request's chain.

    The hit is capped so at least the last token is recomputed (its logits are needed):
    hit tokens <= num_tokens - 1. Full blocks become hittable only when ``cache_full_blocks``
    is called after the step that computed them (the scheduler does it in update_from_output),
    so no request can hit a block whose KV is still being written.

Forking (n > 1)
    The scheduler supports n > 1 by independent child requests that share full prompt blocks
    through the prefix cache (see request.split_n). ``fork`` is also provided as a primitive
    for a runner that wants to branch a sequence mid-flight: the child shares all of the
    parent's computed full blocks (refcount + 1) and gets a private copy of the partial last
    block; fork returns the (src, dst) block copies the model runner must perform (copy_blocks)
    before the child's next step. Shared blocks are never written: a request only writes at
    positions >= num_computed_tokens, which always lie in blocks it owns alone.

Sliding window
    When every layer attends over a window of W keys, a request's leading blocks whose keys all lie
    W or more positions before its next token are never read again: ``release_out_of_window`` (the
    scheduler calls it before a running request grows) returns them to the pool and marks their
    table entries RELEASED, so a sequence holds about W / block_size blocks however long it gets.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Callable, Hashable, Iterable

from .request import Request

HashFn = Callable[[Hashable, tuple, Hashable], Hashable]
RELEASED = -1   # a block-table entry whose block went back to the pool (release_out_of_window)


def sha256_block_hash(parent_hash: bytes | None, tokens: tuple[int, ...], extra_key: Hashable) -> bytes:
    """Default chained block hash: SHA-256(parent digest, int64 tokens, repr(extra_key))."""
    h = hashlib.sha256()
    if parent_hash is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01")
        h.update(parent_hash)
    h.update(len(tokens).to_bytes(4, "little"))
    h.update(array("q", tokens).tobytes())
    if extra_key is not None:
        h.update(repr(extra_key).encode())
    return h.digest()


class _Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "key", "serial")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Hashable | None = None   # set only while registered in the hash map
        self.key: tuple | None = None             # (parent serial, tokens, extra_key)
        self.serial = 0                           # registration serial (> 0 while registered)


class KVCacheManager:
    """Block pool + prefix cache. See the module docstring for the design."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: HashFn | None = None):
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.hash_fn: HashFn = hash_fn or sha256_block_hash
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[Hashable, _Block] = {}
        self._next_serial = 1
        self._by_serial: dict[int, _Block] = {}    # live registrations
        # request_id -> registration serial of each of its leading full blocks (None: chain
        # broken by a collision, nothing after it gets cached for this request).
        self._req_serials: dict[str, list[int | None]] = {}
        self.prefix_cache_requests = 0
        self.prefix_cache_queries = 0    # tokens looked up
        self.prefix_cache_hits = 0       # tokens found

    # ---------------------------------------------------------------- pool state
    @property
    def num_free_blocks(self) -> int:
        """Blocks not referenced by any request (including evictable cached ones)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    hit_rate = prefix_cache_hit_rate

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_cnt

    def block_hash(self, block_id: int) -> Hashable | None:
        return self._blocks[block_id].block_hash

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (head first)."""
        return list(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---------------------------------------------------------------- hashing
    def _update_block_hashes(self, request: Request) -> list:
        """Extend request.block_hashes to cover every full block of its tokens."""
        hashes, bs, toks = request.block_hashes, self.block_size, request.all_token_ids
        for i in range(len(hashes), len(toks) // bs):
            parent = hashes[i - 1] if i else None
            hashes.append(self.hash_fn(parent, tuple(toks[i * bs:(i + 1) * bs]), request.block_key))
        return hashes

    # ---------------------------------------------------------------- lookup
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of full blocks: (block ids, number of tokens they cover).

        Capped at num_tokens - 1 tokens so the last token is recomputed. Pure lookup: no
        refcount changes, no stats (those happen in allocate_slots when the hit is used).
        """
        if not self.enable_prefix_caching or request.num_tokens <= 1:
            return [], 0
        hashes = self._update_block_hashes(request)
        bs, toks = self.block_size, request.all_token_ids
        max_blocks = (request.num_tokens - 1) // bs
        hits: list[int] = []
        prev_serial = 0
        for i in range(max_blocks):
            blk = self._cached.get(hashes[i])
            if blk is None or blk.key != (prev_serial, tuple(toks[i * bs:(i + 1) * bs]), request.block_key):
                break
            hits.append(blk.block_id)
            prev_serial = blk.serial
        return hits, len(hits) * bs

    # ---------------------------------------------------------------- allocation
    def _pop_free(self) -> _Block:
        block_id, _ = self._free.popitem(last=False)
        blk = self._blocks[block_id]
        blk.ref_cnt = 1
        if blk.block_hash is not None:          # lazy eviction of a cached block
            self._unregister(blk)
        return blk

    def _register(self, blk: _Block, block_hash: Hashable, key: tuple) -> int:
        blk.block_hash, blk.key, blk.serial = block_hash, key, self._next_serial
        self._next_serial += 1
        self._cached[block_hash] = blk
        self._by_serial[blk.serial] = blk
        return blk.serial

    def _unregister(self, blk: _Block) -> None:
        del self._cached[blk.block_hash]
        del self._by_serial[blk.serial]
        blk.block_hash, blk.key, blk.serial = None, None, 0
        if blk.ref_cnt == 0:                    # now worthless: reuse it first
            self._free.move_to_end(blk.block_id, last=False)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[int] | None = None,
                       num_new_computed_tokens: int = 0, window: int | None = None) -> bool:
        """Make room for num_computed + num_new_computed + num_new_tokens tokens.

        new_computed_blocks / num_new_computed_tokens: a prefix-cache hit from
        get_computed_blocks (only when the request holds no blocks yet); the hit blocks are
        referenced and appended to the block table (with a sliding `window`, those the request's
        next token no longer sees are entered RELEASED instead, unreferenced). Returns False,
        changing nothing, when there are not enough free blocks.
        """
        hits = new_computed_blocks or []
        skip = min(self._blocks_before_window(num_new_computed_tokens, window), len(hits)) if window else 0
        if num_new_tokens < 0 or num_new_computed_tokens != len(hits) * self.block_size:
            raise ValueError(f"allocate_slots({request.request_id!r}): num_new_tokens={num_new_tokens}, "
                             f"num_new_computed_tokens={num_new_computed_tokens} for {len(hits)} hit blocks")
        if hits and request.block_ids:
            raise ValueError(f"request {request.request_id!r}: prefix hits only on a request without blocks")
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_new_blocks = max(0, self.blocks_needed(total) - len(request.block_ids) - len(hits))
        hit_blocks = [self._blocks[b] for b in hits]
        if num_new_blocks + sum(1 for b in hit_blocks[skip:] if b.ref_cnt == 0) > len(self._free):
            return False
        if self.enable_prefix_caching and not request.block_ids:   # an admission: count the query
            self.prefix_cache_requests += 1
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_new_computed_tokens
        if hits:
            for blk in hit_blocks[skip:]:
                if blk.ref_cnt == 0:
                    del self._free[blk.block_id]
                blk.ref_cnt += 1
            request.block_ids.extend([RELEASED] * skip + hits[skip:])
            self._req_serials[request.request_id] = [b.serial for b in hit_blocks]
        for _ in range(num_new_blocks):
            request.block_ids.append(self._pop_free().block_id)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's computed full blocks so later requests can hit them.

        Call after the step that computed them (all of request.num_computed_tokens must be
        in the cache). Cheap when there is nothing new; works for generated tokens too.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = min(request.num_computed_tokens // bs, len(request.block_ids))
        if num_full == 0:
            return
        serials = self._req_serials.setdefault(request.request_id, [])
        if len(serials) >= num_full or (serials and serials[-1] is None):
            return
        hashes = self._update_block_hashes(request)
        toks = request.all_token_ids
        for i in range(len(serials), num_full):
            parent = serials[i - 1] if i else 0
            serial = None
            if request.block_ids[i] == RELEASED:            # (released before it was cached)
                serials.append(None)
                return
            if parent == 0 or parent in self._by_serial:    # else: our chain went stale
                blk = self._blocks[request.block_ids[i]]
                key = (parent, tuple(toks[i * bs:(i + 1) * bs]), request.block_key)
                if blk.block_hash is not None:      # a shared block someone registered
                    serial = blk.serial if blk.key == key else None
                else:
                    other = self._cached.get(hashes[i])
                    if other is not None and other.key != key and other.key[0] \
                            and other.key[0] not in self._by_serial:
                        self._unregister(other)     # unreachable (dead parent): replace it
                        other = None
                    if other is None:
                        serial = self._register(blk, hashes[i], key)
                    elif other.key == key:          # same content cached in another block
                        serial = other.serial
            serials.append(serial)
            if serial is None:                      # collision: stop caching this chain
                return

    # ---------------------------------------------------------------- release
    def release_out_of_window(self, request: Request, window: int) -> int:
        """Sliding-window models: drop the request's leading blocks that no later query sees (all their keys
        are more than `window` - 1 positions before its next token, num_computed_tokens). Their block-table
        entries become RELEASED (-1; the attention ops never read them); cached ones stay in the prefix cache
        (evictable). Returns the number of blocks released."""
        table = request.block_ids
        released = 0
        # (released entries lead the table: walk back from the last out-of-window one, so a step costs
        # the blocks it releases, not the sequence's length)
        for i in range(min(self._blocks_before_window(request.num_computed_tokens, window), len(table)) - 1, -1, -1):
            if table[i] == RELEASED:
                break
            self._drop(table[i])
            table[i] = RELEASED
            released += 1
        return released

    def _blocks_before_window(self, next_pos: int, window: int) -> int:
        """Leading blocks all of whose keys lie before the window of the token at next_pos (Python's
        window_first_key of include/decodekit/attention/common.h, in whole blocks)."""
        return max(0, next_pos - window + 1) // self.block_size

    def _drop(self, block_id: int) -> None:
        blk = self._blocks[block_id]
        blk.ref_cnt -= 1
        assert blk.ref_cnt >= 0, f"block {block_id} refcount below zero"
        if blk.ref_cnt == 0:
            self._free[block_id] = None
            if blk.block_hash is None:          # worthless: reuse it first
                self._free.move_to_end(block_id, last=False)

    def free(self, request: Request) -> None:
        """Drop the request's references (blocks in reverse order); idempotent."""
        for block_id in reversed(request.block_ids):
            if block_id != RELEASED:
                self._drop(block_id)
        request.block_ids = []
        self._req_serials.pop(request.request_id, None)

    def free_surplus(self, request: Request) -> None:
        """Free the blocks past what request.num_tokens need (speculative decoding: the slots of
        rejected drafts). They hold no registered content (only computed full blocks are
        cached), so they go to the front of the free queue."""
        keep = self.blocks_needed(request.num_tokens)
        while len(request.block_ids) > keep:
            blk = self._blocks[request.block_ids.pop()]
            assert blk.ref_cnt == 1 and blk.block_hash is None, f"surplus block {blk.block_id} is shared"
            blk.ref_cnt = 0
            self._free[blk.block_id] = None
            self._free.move_to_end(blk.block_id, last=False)

    def fork(self, parent: Request, child: Request) -> list[tuple[int, int]] | None:
        """Give `child` the parent's computed KV: share full blocks, copy the partial one.

        Call between steps (parent.num_computed_tokens all written). The child must hold no
        blocks and its tokens must start with the parent's computed tokens. Sets
        child.num_computed_tokens = parent.num_computed_tokens. Returns the block copies
        [(src, dst)] for the model runner, or None (nothing changed) if no block is free.
        """
        n = parent.num_computed_tokens
        if child.block_ids:
            raise ValueError(f"fork: child {child.request_id!r} already holds blocks")
        if child.all_token_ids[:n] != parent.all_token_ids[:n]:
            raise ValueError("fork: the child's tokens must start with the parent's computed tokens")
        num_full, partial = divmod(n, self.block_size)
        if partial and not self._free:
            return None
        self.cache_full_blocks(parent)
        shared = parent.block_ids[:num_full]
        for b in shared:
            if b != RELEASED:
                self._blocks[b].ref_cnt += 1
        copies = []
        child.block_ids = list(shared)
        if partial:
            dst = self._pop_free().block_id
            copies.append((parent.block_ids[num_full], dst))
            child.block_ids.append(dst)
        child.block_hashes = list(parent.block_hashes[:num_full])
        if self.enable_prefix_caching:
            self._req_serials[child.request_id] = list(self._req_serials.get(parent.request_id, [])[:num_full])
        child.num_computed_tokens = n
        return copies

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Only when no block is in use (else returns False)."""
        if len(self._free) != self.num_blocks:
            return False
        for blk in list(self._cached.values()):
            self._unregister(blk)
        self._req_serials.clear()
        self.prefix_cache_requests = self.prefix_cache_queries = self.prefix_cache_hits = 0
        return True

    # ---------------------------------------------------------------- checking
    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Assert pool consistency against the live requests holding blocks (raises AssertionError)."""
        requests = list(requests)
        refs = [0] * self.num_blocks
        bs = self.block_size
        for req in requests:
            held = [b for b in req.block_ids if b != RELEASED]
            assert len(set(held)) == len(held), f"{req}: duplicate block in table"
            assert len(req.block_ids) * bs >= req.num_computed_tokens, f"{req}: too few blocks"
            nrel = len(req.block_ids) - len(held)
            assert req.block_ids[:nrel] == [RELEASED] * nrel, f"{req}: released blocks must lead the table"
            for i, b in enumerate(req.block_ids):
                if b == RELEASED:
                    continue
                assert 0 <= b < self.num_blocks, f"{req}: bad block id {b}"
                refs[b] += 1
                blk = self._blocks[b]
                if blk.key is not None and i < req.num_computed_tokens // bs:
                    assert blk.key[1] == tuple(req.all_token_ids[i * bs:(i + 1) * bs]), \
                        f"{req}: cached block {b} content differs from the request's tokens"
        for blk in self._blocks:
            assert blk.ref_cnt == refs[blk.block_id], \
                f"block {blk.block_id}: ref_cnt {blk.ref_cnt} != {refs[blk.block_id]} holders"
            assert (blk.ref_cnt == 0) == (blk.block_id in self._free), \
                f"block {blk.block_id}: ref_cnt {blk.ref_cnt} but in_free_queue={blk.block_id in self._free}"
            if blk.block_hash is not None:
                assert self._cached.get(blk.block_hash) is blk, f"block {blk.block_id}: hash not mapped to it"
                assert blk.serial > 0 and blk.key is not None and self._by_serial.get(blk.serial) is blk
            else:
                assert blk.key is None and blk.serial == 0
        assert len(self._free) == sum(1 for r in refs if r == 0)
        for h, blk in self._cached.items():
            assert blk.block_hash == h, f"hash map entry for block {blk.block_id} is stale"
        assert len(self._by_serial) == len(self._cached), "serial map out of sync with the hash map"
        live = {r.request_id for r in requests}
        assert set(self._req_serials) <= live, "registration state kept for a request holding no blocks"


BlockPool = KVCacheManager
