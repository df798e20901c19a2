"""Fake model + driver loop for the engine-core tests (pure Python, no torch).

The fake model keeps its own paged "KV cache": one value per (block, slot). Computing the
token at position p writes ``mix(kv[p-1], token, p)`` into its slot, reading kv[p-1] back
THROUGH THE REQUEST'S BLOCK TABLE, so the value depends on the whole prefix exactly like
real attention KV does. The sampled token is derived from the value at the last position.
Hence a request's output is a pure function of its prompt (``reference_output``) if and
only if the scheduler and the block manager keep every request's KV intact: a wrong prefix
hit, a block reused while still referenced, a skipped or misplaced chunk or a bad
preemption/recompute all change the outputs. The model also asserts that it never reads
an unwritten slot and never writes into a block shared by several requests, and the driver
poisons every free, uncached block before each step (so reading one is caught).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from decodekit.engine import KVCacheManager, Request, RequestStatus, Scheduler, SchedulerConfig

VOCAB = 61
SEED = 0x5EED


class Params:
    """Duck-typed sampling params: the scheduler only reads .max_tokens and .n."""

    def __init__(self, max_tokens, n=1):
        self.max_tokens, self.n = max_tokens, n


def mix(prev: int, tok: int, pos: int) -> int:
    return hash((prev, tok, pos)) & 0xFFFFFFFFFFFF      # ints hash deterministically


def token_from(value: int) -> int:
    return (value >> 7) % VOCAB


def reference_output(prompt: list[int], max_tokens: int, stop_token: int | None = None) -> list[int]:
    v, toks, out = SEED, list(prompt), []
    for p in range(10 ** 9):
        v = mix(v, toks[p], p)
        if p == len(toks) - 1:
            t = token_from(v)
            out.append(t)
            toks.append(t)
            if len(out) == max_tokens or t == stop_token:
                return out
    raise AssertionError


class FakeModel:
    """window: a sliding-window model: computing position p also reads (checks) every slot of positions
    p - window + 1 .. p - 1 through the block table, which must hold them (no released entry there)."""

    def __init__(self, kv: KVCacheManager, window: int | None = None, rope_switch_len: int | None = None):
        self.kv = kv
        self.window = window
        self.bs = kv.block_size
        self.store: list[list[int | None]] = [[None] * self.bs for _ in range(kv.num_blocks)]
        self.tokens_computed = 0
        # LongRoPE (SchedulerConfig.rope_switch_len): each slot also records whether it was computed on the long
        # factors; a position reads only its own kind, and only a rope_long request computes past the switch
        self.rope_switch_len = rope_switch_len
        self.long: list[list[bool | None]] = [[None] * self.bs for _ in range(kv.num_blocks)]
        self.rope_restarts = 0

    def poison_free_blocks(self) -> None:
        for b in self.kv.free_block_ids():
            if self.kv.block_hash(b) is None:
                self.store[b] = [None] * self.bs
                self.long[b] = [None] * self.bs

    def execute(self, out) -> dict[str, list[int]]:
        bs = self.bs
        for src, dst in out.blocks_to_copy:
            self.store[dst] = list(self.store[src])
            self.long[dst] = list(self.long[src])
        sampled = {}
        for sr in out.scheduled:
            req, bt = sr.request, sr.request.block_ids
            new_toks = sr.token_ids     # drafts included
            assert len(bt) * bs >= sr.start_pos + sr.num_new_tokens, "block table too short"
            for p in range(sr.start_pos, sr.start_pos + sr.num_new_tokens):
                if self.window is not None:
                    for q in range(max(0, p - self.window + 1), p):
                        assert bt[q // bs] >= 0, f"{req}: position {q} (in the window of {p}) is released"
                        assert self.store[bt[q // bs]][q % bs] is not None, f"{req}: window KV at {q} lost"
                if p == 0:
                    prev = SEED
                else:
                    assert bt[(p - 1) // bs] >= 0, f"{req}: reads a released block at position {p - 1}"
                    prev = self.store[bt[(p - 1) // bs]][(p - 1) % bs]
                    assert prev is not None, f"{req}: reads unwritten KV at position {p - 1}"
                blk = bt[p // bs]
                assert blk >= 0 and self.kv.ref_count(blk) == 1, f"{req}: writes into shared block {blk}"
                self.store[blk][p % bs] = mix(prev, new_toks[p - sr.start_pos], p)
                if self.rope_switch_len is not None:
                    assert req.rope_long or p < self.rope_switch_len, f"{req}: position {p} on the short factors"
                    if p:
                        assert self.long[bt[(p - 1) // bs]][(p - 1) % bs] == req.rope_long, \
                            f"{req}: position {p} reads KV of the other LongRoPE factors at {p - 1}"
                    self.long[blk][p % bs] = req.rope_long
            self.tokens_computed += sr.num_new_tokens
            if sr.will_sample:
                # greedy verification: the model's token after the last real token and after each draft;
                # keep drafts while they equal it, then emit the model's own token
                end = sr.start_pos + sr.num_new_tokens
                drafts = sr.token_ids[sr.num_new_tokens - sr.num_spec:]
                out = []
                for i, p in enumerate(range(end - 1 - sr.num_spec, end)):
                    t = token_from(self.store[bt[p // bs]][p % bs])
                    out.append(t)
                    if i == len(drafts) or drafts[i] != t:
                        break
                sampled[sr.request_id] = out
        return sampled


@dataclass
class Spec:
    rid: str
    arrival: int                    # step at which it is added
    prompt: list[int]
    max_tokens: int
    stop_token: int | None = None   # the caller finishes it (FINISHED_STOPPED) on this token
    abort_at: int | None = None     # step at which the caller aborts it

    def expected(self) -> list[int]:
        return reference_output(self.prompt, self.max_tokens, self.stop_token)


@dataclass
class RunResult:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    status: dict[str, RequestStatus] = field(default_factory=dict)
    stop_reason: dict[str, object] = field(default_factory=dict)
    num_preemptions: int = 0
    max_preempted_outputs: int = 0      # most output tokens a request had when preempted
    hit_rate: float = 0.0
    steps: int = 0
    tokens_computed: int = 0
    rejected: dict[str, str] = field(default_factory=dict)
    rope_long: set[str] = field(default_factory=set)   # requests that ended on LongRoPE's long factors


def run(specs: list[Spec], *, num_blocks: int, block_size: int, max_model_len: int,
        budget: int = 2048, max_seqs: int = 256, prefix_caching: bool = True,
        chunked: bool = True, hash_fn=None, check: bool = True, max_steps: int = 100_000,
        spec_k: int = 0, draft_accuracy: float = 0.7, seed: int = 0, window: int | None = None,
        rope_switch_len: int | None = None) -> RunResult:
    """spec_k > 0: before each step every decoding request gets 0 .. spec_k draft tokens, each the
    reference continuation with probability draft_accuracy (else random), not capped at max_tokens
    or max_model_len (the scheduler must cut them)."""
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                          block_size=block_size, enable_prefix_caching=prefix_caching, chunked_prefill=chunked,
                          sliding_window=window, rope_switch_len=rope_switch_len)
    kv = KVCacheManager(num_blocks, block_size, prefix_caching, hash_fn=hash_fn)
    sched = Scheduler(cfg, kv)
    model = FakeModel(kv, window, rope_switch_len)
    res = RunResult()
    reqs: dict[str, Request] = {}
    by_arrival = sorted(specs, key=lambda s: s.arrival)
    stops = {s.rid: s.stop_token for s in specs}
    aborts: dict[int, list[str]] = {}
    for s in specs:
        if s.abort_at is not None:
            aborts.setdefault(s.abort_at, []).append(s.rid)
    rng = random.Random(seed)
    futures: dict[str, list[int]] = {}
    stop_len: dict[str, int] = {}
    k = step = 0
    while k < len(by_arrival) or sched.has_unfinished_requests():
        while k < len(by_arrival) and by_arrival[k].arrival <= step:
            s = by_arrival[k]
            k += 1
            r = Request(s.rid, s.prompt, Params(s.max_tokens), arrival_time=float(step))
            try:
                sched.add_request(r)
                reqs[s.rid] = r
            except ValueError as e:
                res.rejected[s.rid] = str(e)
        for rid in aborts.get(step, []):
            sched.abort_request(rid)
            sched.abort_request(rid)            # idempotent
        model.poison_free_blocks()
        if spec_k:
            for r in sched.running:
                r.spec_token_ids = []
                if r.num_computed_tokens == r.num_tokens - 1:
                    exp = futures.setdefault(r.request_id, reference_output(r.prompt_token_ids, 10 ** 6 // 1000))
                    n = r.num_output_tokens
                    r.spec_token_ids = [exp[n + i] if n + i < len(exp) and rng.random() < draft_accuracy
                                        else rng.randrange(VOCAB) for i in range(rng.randint(0, spec_k))]
        out = sched.schedule()
        for rid in out.preempted_req_ids:
            res.max_preempted_outputs = max(res.max_preempted_outputs, reqs[rid].num_output_tokens)
        if check:
            sched.check_invariants()
        assert out.num_scheduled_tokens == sum(sr.num_new_tokens for sr in out.scheduled) <= budget
        sampled = model.execute(out)
        sched.update_from_output(out, sampled)
        for sr in out.scheduled:                # the caller's stop-token check
            r = sr.request
            if r.status not in (RequestStatus.RUNNING, RequestStatus.FINISHED_LENGTH) or not sr.will_sample \
                    or r.request_id in stop_len:
                continue
            new = r.output_token_ids[len(r.output_token_ids) - len(sampled[r.request_id]):]
            if stops[r.request_id] in new:      # stop at the first stop token; what followed it is dropped
                stop_len[r.request_id] = len(r.output_token_ids) - len(new) + new.index(stops[r.request_id]) + 1
                if r.status == RequestStatus.RUNNING:
                    sched.finish_request(r.request_id, RequestStatus.FINISHED_STOPPED, stops[r.request_id])
                elif stop_len[r.request_id] < len(r.output_token_ids):  # max_tokens came after the stop
                    r.status, r.stop_reason = RequestStatus.FINISHED_STOPPED, stops[r.request_id]
        if check:
            sched.check_invariants()
            for r in sched.running:     # rejected drafts' blocks were given back
                assert len(r.block_ids) <= kv.blocks_needed(r.num_tokens), r
                if window is not None:  # a window's worth (and a step's) of blocks at most
                    held = sum(1 for b in r.block_ids if b >= 0)
                    assert held <= kv.blocks_needed(window + budget + spec_k) + 1, (r, held)
        step += 1
        assert step < max_steps, "no progress (livelock?)"
    assert kv.num_free_blocks == num_blocks, "blocks leaked"
    assert kv.usage == 0.0
    kv.check_invariants([])
    for rid, r in reqs.items():
        assert r.is_finished, r
        res.outputs[rid] = list(r.output_token_ids[:stop_len.get(rid)])
        res.status[rid] = r.status
        res.stop_reason[rid] = r.stop_reason
        if r.rope_long:
            res.rope_long.add(rid)
    res.num_preemptions = sched.num_preemptions
    res.hit_rate = kv.prefix_cache_hit_rate
    res.steps = step
    res.tokens_computed = model.tokens_computed
    return res


def check_against_reference(specs: list[Spec], res: RunResult) -> None:
    """Every request finished with exactly the reference tokens (aborted: a prefix of them)."""
    for s in specs:
        if s.rid in res.rejected:
            continue
        exp, got, st = s.expected(), res.outputs[s.rid], res.status[s.rid]
        if st == RequestStatus.FINISHED_ABORTED:
            assert s.abort_at is not None and got == exp[:len(got)], (s.rid, got, exp)
            continue
        if res.stop_reason[s.rid] == "kv_cache_capacity":     # longer than the whole cache
            assert st == RequestStatus.FINISHED_LENGTH and got == exp[:len(got)], (s.rid, got, exp)
            continue
        assert got == exp, f"{s.rid}: got {got}\nexpected {exp}"
        stopped = len(exp) < s.max_tokens      # at max_tokens the scheduler's LENGTH comes first
        assert st == (RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_LENGTH), (s.rid, st)


def random_specs(rng: random.Random, n: int, *, max_prompt: int = 300, max_out: int = 50,
                 spread: int = 60, abort_prob: float = 0.0, stop_prob: float = 0.0,
                 prefixes: list[list[int]] | None = None) -> list[Spec]:
    specs = []
    for i in range(n):
        if prefixes:
            base = rng.choice(prefixes)
            prompt = base + [rng.randrange(VOCAB) for _ in range(rng.randint(1 if not base else 0, 40))]
            prompt = prompt[:max_prompt] or [1]
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt))]
        arrival = rng.randint(0, spread)
        specs.append(Spec(
            rid=f"r{i}", arrival=arrival, prompt=prompt, max_tokens=rng.randint(1, max_out),
            stop_token=rng.randrange(VOCAB) if rng.random() < stop_prob else None,
            abort_at=arrival + rng.randint(0, 80) if rng.random() < abort_prob else None))
    return specs
