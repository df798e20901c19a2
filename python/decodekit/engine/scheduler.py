"""Token-budget scheduler (vLLM v1 design): no prefill/decode phases, one budget per step.

Each step, every scheduled request gets ``num_tokens_with_spec - num_computed_tokens`` new
tokens (1 for a decode, the rest of the prompt otherwise), chunked to the remaining budget.

schedule():
  1. RUNNING requests first, oldest first. The new tokens are capped by the remaining token
     budget (chunked prefill) and by max_model_len. If the KV cache cannot hold them, the
     NEWEST running request is preempted (recompute-style: blocks freed, num_computed_tokens
     reset to 0, status PREEMPTED, put at the FRONT of the waiting queue; its generated tokens
     are kept and are re-prefilled with the prompt), and the allocation is retried. If the
     request that cannot grow is the newest one, it preempts itself, unless it is the only
     running request: then it can never fit (its tokens exceed the whole cache) and it is
     finished with FINISHED_LENGTH, stop_reason "kv_cache_capacity".
  2. Then, only if nothing was preempted in this step, WAITING requests in FCFS order while
     budget and max_num_seqs allow: a prefix-cache hit skips its computed tokens, the rest is
     chunked to the remaining budget (without chunked prefill the loop stops at the first
     request that does not fit whole). The loop stops at the first request the cache cannot
     hold (head-of-line, no overtaking).
  A request samples a token this step only if its chunk reaches num_tokens; an earlier
  prompt chunk produces nothing.

Optimistic num_computed_tokens: at the end of schedule() every scheduled request's
num_computed_tokens is advanced by its num_new_tokens, BEFORE the model runs. So between
schedule() and update_from_output() it counts the tokens whose KV this step writes; the
step's start position is kept in the output (ScheduledRequest.start_pos). After a decode or
a final prompt chunk, num_computed_tokens == num_tokens; update_from_output() appends the
sampled token(s), making num_tokens = num_computed_tokens + 1, so the next step computes
exactly that token. (Speculative decoding would roll back rejected drafts here.) Calling
schedule() twice without update_from_output() schedules nothing for requests that are
waiting for their sampled token. The engine is synchronous: aborts and finish_request()
calls happen between steps, never while the model runner is writing KV.

Stop conditions owned here: max_tokens and max_model_len (FINISHED_LENGTH). EOS, stop
tokens and stop strings (which need the detokenizer) are the caller's: it calls
finish_request(request_id, RequestStatus.FINISHED_STOPPED) after update_from_output().

Beam search (engine/beam_group.py): a `paused` request is skipped in both queues (it keeps its
blocks while its group picks its next token; if only paused requests run and a waiting one
cannot get blocks, or only paused ones run before a request that cannot grow, the newest paused one is
preempted, so the queue always moves);
replace_last_token() swaps a request's sampled, not yet computed token; add_forked() puts a
child in the running queue with the parent's full blocks shared and its partial block copied
(SchedulerOutput.blocks_to_copy, done by the runner before the next forward). Resumed beams
can outnumber max_num_seqs for a while: each step schedules at most max_num_seqs requests.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from decodekit.sampling.params import _show

from .kv_cache import KVCacheManager
from .request import Request, RequestStatus


# a request with prompt_logprobs computes at most this many prompt tokens a step: its logits rows (fp32,
# vocabulary wide: 256 MB at Llama-3's 128k) are all materialised
PROMPT_LOGPROBS_CHUNK = 512


def _check_int(name: str, value, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"SchedulerConfig.{name} must be an int {rng}, got {value!r}")


@dataclass(kw_only=True)
class SchedulerConfig:
    max_num_seqs: int = 256              # running requests at most
    max_num_batched_tokens: int = 2048   # token budget of one step
    max_model_len: int                   # prompt + output tokens of one request at most
    block_size: int = 16
    enable_prefix_caching: bool = True
    chunked_prefill: bool = True
    # every layer attends over this many keys (None: the whole context): running requests release the
    # blocks before their window (KVCacheManager.release_out_of_window)
    sliding_window: int | None = None
    # LongRoPE's original context (None: no LongRoPE): a request computing a position past it switches to the
    # long factors (Request.rope_long) and recomputes its KV with them, as transformers' Phi-3 generate does
    rope_switch_len: int | None = None

    def __post_init__(self):
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_model_len", self.max_model_len, 2)
        _check_int("block_size", self.block_size, 1, 1024)
        if self.sliding_window is not None:
            _check_int("sliding_window", self.sliding_window, 1)
        if self.rope_switch_len is not None:
            _check_int("rope_switch_len", self.rope_switch_len, 1)
        for name in ("enable_prefix_caching", "chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SchedulerConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, SchedulerConfig.max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len}), "
                f"or a long prompt could never be scheduled")


@dataclass
class ScheduledRequest:
    """One request's share of a step: compute tokens [start_pos, start_pos + num_new_tokens)."""
    request: Request
    num_new_tokens: int
    start_pos: int          # num_computed_tokens before this step (first new token's position)
    will_sample: bool       # the chunk reaches num_tokens: sample the next token
    is_new: bool            # first step since admission/resumption: its block table is fresh
    num_spec: int = 0       # draft tokens among the new tokens (the last ones): verify them
    num_prompt_logits: int = 0  # the first new tokens whose logits give prompt logprobs (positions <= prompt - 2)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_decode(self) -> bool:
        """Decode phase: every new token is past the prompt (generated tokens and drafts)."""
        return self.start_pos >= self.request.num_prompt_tokens

    @property
    def token_ids(self) -> list[int]:
        """The new tokens; draft tokens are read from request.spec_token_ids when this is called
        (model drafters fill their placeholders after scheduling)."""
        req, end = self.request, self.start_pos + self.num_new_tokens
        toks = req.all_token_ids
        if end <= len(toks):
            return toks[self.start_pos:end]
        return toks[self.start_pos:] + req.spec_token_ids[:end - len(toks)]

    @property
    def block_ids(self) -> list[int]:
        return self.request.block_ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0                   # total new tokens this step
    preempted_req_ids: list[str] = field(default_factory=list)
    # Requests that left the engine since the previous schedule() (finished, aborted, or
    # cut by KV capacity): the model runner can drop any per-request state it keeps.
    finished_req_ids: list[str] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)   # (src, dst); fork only

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager):
        if kv_cache_manager.block_size != config.block_size:
            raise ValueError(f"KVCacheManager.block_size ({kv_cache_manager.block_size}) != "
                             f"SchedulerConfig.block_size ({config.block_size})")
        if kv_cache_manager.enable_prefix_caching != config.enable_prefix_caching:
            raise ValueError(f"KVCacheManager.enable_prefix_caching ({kv_cache_manager.enable_prefix_caching})"
                             f" != SchedulerConfig.enable_prefix_caching ({config.enable_prefix_caching})")
        self.config = config
        self.kv = kv_cache_manager
        self.requests: dict[str, Request] = {}     # unfinished requests only
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []           # admission order: newest last
        self.num_preemptions = 0
        self.num_steps = 0
        self._finished_ids: list[str] = []         # for the next SchedulerOutput
        self._copies: list[tuple[int, int]] = []   # forked blocks to copy, for the next SchedulerOutput
        self._finished_in_schedule: list[Request] = []   # for the next update_from_output

    # ---------------------------------------------------------------- requests in / out
    def max_output_tokens(self, req: Request) -> int:
        """The request's output-token limit: max_tokens, or what max_model_len leaves."""
        mt = req.sampling_params.max_tokens
        return self.config.max_model_len - req.num_prompt_tokens if mt is None else mt

    def add_request(self, req: Request, front: bool = False) -> None:
        """Queue a request (at the front of the waiting queue with `front`), or raise ValueError if it can
        never run (nothing else changes)."""
        rid, cfg = req.request_id, self.config
        if rid in self.requests:
            raise ValueError(f"request {rid!r}: a request with this id is already in the scheduler")
        if req.status != RequestStatus.WAITING or req.output_token_ids or req.block_ids:
            raise ValueError(f"request {rid!r}: only fresh requests can be added ({req})")
        n = req.sampling_params.n
        if n is not None and n > 1 and req.parent_id is None:
            raise ValueError(f"request {rid!r}: n={n} > 1; expand it with engine.request.split_n() "
                             f"into n one-sequence child requests")
        p = req.num_prompt_tokens
        if p == 0:
            raise ValueError(f"request {rid!r}: the prompt is empty (needs >= 1 token)")
        mt = req.sampling_params.max_tokens
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise ValueError(f"request {rid!r}: max_tokens must be an int >= 1 or None, got {_show(mt)}")
        if mt is None and p >= cfg.max_model_len:
            raise ValueError(f"request {rid!r}: prompt ({p} tokens) leaves no room for output "
                             f"within max_model_len ({cfg.max_model_len})")
        if mt is not None and p >= cfg.max_model_len:  # the prompt alone is too long, whatever max_tokens
            raise ValueError(f"request {rid!r}: prompt ({p} tokens) exceeds max_model_len ({cfg.max_model_len}) - 1 "
                             f"= {cfg.max_model_len - 1} tokens, the most a prompt may hold (one token of output "
                             f"at least)")
        if mt is not None and p + mt > cfg.max_model_len:
            raise ValueError(f"request {rid!r}: prompt ({p} tokens) + max_tokens ({_show(mt)}) = "
                             f"{_show(p + mt)} exceeds max_model_len ({cfg.max_model_len})")
        cap = self.kv.num_blocks * self.kv.block_size
        if cfg.sliding_window is not None and cfg.chunked_prefill:  # it holds about a window at a time
            if min(p, cfg.sliding_window + self.kv.block_size) > cap:
                raise ValueError(f"request {rid!r}: prompt ({p} tokens) can never fit in the KV cache "
                                 f"({self.kv.num_blocks} blocks x {self.kv.block_size} = {cap} tokens), nor the "
                                 f"sliding window ({cfg.sliding_window} tokens) and a block")
        elif p > cap:
            raise ValueError(f"request {rid!r}: prompt ({p} tokens) can never fit in the KV cache "
                             f"({self.kv.num_blocks} blocks x {self.kv.block_size} = {cap} tokens)")
        self.requests[rid] = req
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def add_forked(self, child: Request, parent: Request) -> bool:
        """Queue `child` as a continuation of `parent`'s computed KV: it runs from the next step holding the
        parent's full blocks and a copy of its partial one (copied before that step's forward). Needs a
        running parent whose only uncomputed token is its last, a child whose tokens start with the parent's
        computed ones, room in max_num_seqs and a free block; otherwise returns False and changes nothing (the
        caller adds the child as an ordinary request: it recomputes through the prefix cache)."""
        n = parent.num_computed_tokens
        if parent.status != RequestStatus.RUNNING or self.requests.get(parent.request_id) is not parent \
                or n != parent.num_tokens - 1 or parent.spec_token_ids or n == 0 \
                or self._num_active() >= self.config.max_num_seqs:
            return False
        child.rope_long = parent.rope_long          # (it shares the parent's blocks)
        self.add_request(child)                     # the same checks as any request
        self.waiting.pop()                          # (it runs at once instead)
        copies = self.kv.fork(parent, child)
        if copies is None:
            del self.requests[child.request_id]
            return False
        child.status = RequestStatus.RUNNING
        child.num_cached_tokens = n
        self.running.append(child)
        self._copies.extend(copies)
        return True

    def replace_last_token(self, req: Request, token_id: int) -> None:
        """Make `token_id` the request's last (sampled, not yet computed) output token instead of the one
        sampled: beam search continues a beam with another candidate."""
        if not req.output_token_ids or req.num_computed_tokens >= req.num_tokens:
            raise ValueError(f"replace_last_token: {req.request_id!r} has no uncomputed output token")
        req.output_token_ids[-1] = req.all_token_ids[-1] = int(token_id)
        del req.block_hashes[(req.num_tokens - 1) // self.config.block_size:]  # hashed with the old token

    def _num_active(self) -> int:
        """Running requests that take part in steps (paused ones wait outside the batch)."""
        return sum(1 for r in self.running if not r.paused)

    def get_request(self, request_id: str) -> Request | None:
        """An unfinished request by id (finished ones are forgotten)."""
        return self.requests.get(request_id)

    def finish_request(self, request_id: str, status: RequestStatus, stop_reason=None) -> bool:
        """Finish a request in any state (e.g. EOS/stop string found by the caller) and free
        its blocks. Idempotent: returns False if the id is unknown or already finished."""
        if not RequestStatus.is_finished(status):
            raise ValueError(f"finish_request: {status!r} is not a finished status")
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, status, stop_reason)
        return True

    def abort_request(self, request_id: str) -> bool:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED, "abort")

    def _finish(self, req: Request, status: RequestStatus, stop_reason=None) -> None:
        req.spec_token_ids = []
        req.status = status
        req.stop_reason = stop_reason
        self.kv.free(req)
        self.requests.pop(req.request_id, None)
        self._finished_ids.append(req.request_id)

    # ---------------------------------------------------------------- queries
    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---------------------------------------------------------------- scheduling
    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        req.spec_token_ids = []
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted_req_ids.append(req.request_id)

    @staticmethod
    def _rope_long(req: Request) -> None:
        """LongRoPE: req is longer than the original context: its rows take the long factors from now on (its
        block hashes, which include the rule, start again)."""
        req.rope_long, req.block_hashes = True, []

    def _rope_restart(self, req: Request, out: SchedulerOutput) -> None:
        """req's next position is past LongRoPE's original context: its KV is recomputed on the long factors (as
        preemption does; not counted as one)."""
        self._rope_long(req)
        self._preempt(req, out)
        req.num_preemptions -= 1
        self.num_preemptions -= 1

    def _chunk_cap(self, req: Request) -> int:
        """The most tokens req may compute in one step, the step's budget aside: PROMPT_LOGPROBS_CHUNK while
        its prompt logprobs are pending (with chunked prefill), else no cap."""
        return PROMPT_LOGPROBS_CHUNK if req.prompt_logprobs_pending and self.config.chunked_prefill else 1 << 62

    def schedule(self) -> SchedulerOutput:
        cfg, kv = self.config, self.kv
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens
        plan: list[tuple[Request, int, bool]] = []    # (request, num_new_tokens, is_new)

        # 1. running requests, oldest first; victims are popped from the (newest) end.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.paused:
                i += 1
                continue
            if len(plan) >= cfg.max_num_seqs:   # resumed beams may outnumber it: the rest go next step
                break
            num_new = min(req.num_tokens_with_spec - req.num_computed_tokens, budget,
                          cfg.max_model_len - req.num_computed_tokens)
            num_new = min(num_new, self._chunk_cap(req))
            if num_new <= 0:        # waiting for its sampled token (no update since last step)
                i += 1
                continue
            rs = cfg.rope_switch_len
            if rs is not None and not req.rope_long and req.num_computed_tokens + num_new > rs:
                if req.num_tokens > rs:     # its last token's position is past the original context
                    self._rope_restart(self.running.pop(i), out)
                    continue
                num_new = rs - req.num_computed_tokens  # (only drafts reach past it: they wait for the switch)
            if req.spec_token_ids:  # drafts that miss the budget / max_model_len / rope switch are dropped
                keep = max(0, req.num_computed_tokens + num_new - req.num_tokens)
                del req.spec_token_ids[keep:]
            scheduled = True
            if cfg.sliding_window is not None:
                kv.release_out_of_window(req, cfg.sliding_window)
            while not kv.allocate_slots(req, num_new):
                if self.running[-1] is req and 0 < i and all(r.paused for r in self.running[:i]):
                    # only paused beams before it: they keep their blocks until their group goes on, which
                    # may wait for a request queued behind this one (preempting itself, it would be
                    # readmitted first and preempt itself again, forever); the newest paused one goes
                    self._preempt(self.running.pop(i - 1), out)
                    i -= 1
                    continue
                if self.running[-1] is req:
                    self.running.pop()
                    if i == 0:      # alone and still does not fit: it never will
                        self._finish(req, RequestStatus.FINISHED_LENGTH, "kv_cache_capacity")
                        self._finished_in_schedule.append(req)
                    else:
                        self._preempt(req, out)
                    scheduled = False
                    break
                self._preempt(self.running.pop(), out)
            if not scheduled:
                break
            plan.append((req, num_new, False))
            budget -= num_new
            i += 1

        # 2. waiting requests, only if nothing was preempted in this step.
        if not out.preempted_req_ids:
            active = self._num_active()
            paused: list[Request] = []      # skipped: they wait for their beam group
            while self.waiting and budget > 0 and active < cfg.max_num_seqs:
                req = self.waiting[0]
                if req.paused:
                    paused.append(self.waiting.popleft())
                    continue
                req.spec_token_ids = []     # drafts only for running requests
                if cfg.rope_switch_len is not None and not req.rope_long and req.num_tokens > cfg.rope_switch_len:
                    self._rope_long(req)    # (a prompt past LongRoPE's original context)
                # prompt logprobs need every prompt position's logits: no prefix-cache hit
                hit_blocks, num_hit = kv.get_computed_blocks(req) if not req.prompt_logprobs_pending else ([], 0)
                num_new = req.num_tokens_with_spec - num_hit
                if not cfg.chunked_prefill and num_new > budget:
                    break
                if (req.num_preemptions > 0 and cfg.sliding_window is None and any(not r.paused for r in self.running)
                        and kv.blocks_needed(req.num_tokens_with_spec) - len(hit_blocks) > kv.num_free_blocks):
                    # a preempted request comes back once all its tokens fit in the free blocks: admitted a chunk
                    # at a time it preempted itself again on its next chunk, throwing the chunk away (a request
                    # without prefix-cache hits -- prompt logprobs, caching off -- recomputed 5-20x its tokens)
                    break
                num_new = min(num_new, budget, self._chunk_cap(req))
                if not kv.allocate_slots(req, num_new, hit_blocks, num_hit, cfg.sliding_window):
                    if not self.running:    # the whole cache is free and it still does not fit
                        self.waiting.popleft()
                        self._finish(req, RequestStatus.FINISHED_LENGTH, "kv_cache_capacity")
                        self._finished_in_schedule.append(req)
                        continue
                    if all(r.paused for r in self.running):  # nothing running would ever free a block
                        victim = self.running.pop()
                        self._preempt(victim, out)
                        paused.append(self.waiting.popleft())
                        continue
                    break
                self.waiting.popleft()
                active += 1
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_hit
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = num_hit
                plan.append((req, num_new, True))
                budget -= num_new

            self.waiting.extendleft(reversed(paused))

        assert len(plan) <= cfg.max_num_seqs
        # 3. build the output and advance num_computed_tokens optimistically; decode-phase requests first (stable),
        # so a step's decode rows lead its batch (ModelRunner marks them for batch invariance).
        plan.sort(key=lambda p: p[0].num_computed_tokens < p[0].num_prompt_tokens)
        for req, num_new, is_new in plan:
            start = req.num_computed_tokens
            req.num_computed_tokens = start + num_new
            will_sample = start + num_new >= req.num_tokens_with_spec
            num_lp = max(0, min(start + num_new, req.num_prompt_tokens - 1) - start) \
                if req.prompt_logprobs_pending else 0
            out.scheduled.append(ScheduledRequest(req, num_new, start, will_sample, is_new,
                                                  len(req.spec_token_ids) if will_sample else 0, num_lp))
            out.num_scheduled_tokens += num_new
        out.finished_req_ids, self._finished_ids = self._finished_ids, []
        out.blocks_to_copy, self._copies = self._copies, []
        self.num_steps += 1
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           sampled: dict[str, list[int]]) -> list[Request]:
        """Append the sampled tokens, apply max_tokens / max_model_len, free finished
        requests and make newly full blocks hittable. Returns the newly finished requests
        (including any cut by KV capacity during schedule()). Requests aborted or finished
        since schedule() are skipped (their sampled tokens are dropped).

        Speculative rows (num_spec drafts verified): `sampled` holds the 1 .. num_spec + 1
        emitted tokens (accepted drafts, then the verifier's own token); num_computed_tokens
        rolls back over the rejected drafts (their KV slots are simply overwritten later) and
        blocks past the sequence's need are freed. Tokens past max_tokens / max_model_len are
        cut from `sampled[request_id]` in place, so the caller sees only what was appended."""
        finished, self._finished_in_schedule = self._finished_in_schedule, []
        max_len = self.config.max_model_len
        for sr in scheduler_output.scheduled:
            req = sr.request
            if req.status != RequestStatus.RUNNING or self.requests.get(req.request_id) is not req:
                continue
            tokens = sampled.get(req.request_id) or []
            if sr.will_sample and not tokens:
                raise ValueError(f"update_from_output: no sampled token for {req.request_id!r}")
            if tokens and not sr.will_sample:
                raise ValueError(f"update_from_output: {req.request_id!r} got tokens for a partial prefill chunk")
            if sr.num_spec and not 1 <= len(tokens) <= sr.num_spec + 1:
                raise ValueError(f"update_from_output: {req.request_id!r} verified {sr.num_spec} drafts "
                                 f"but got {len(tokens)} tokens (1 .. {sr.num_spec + 1} expected)")
            if len(tokens) > 1 and not sr.num_spec:
                raise ValueError(f"update_from_output: {req.request_id!r} got {len(tokens)} tokens for one row")
            status = None
            max_tokens = self.max_output_tokens(req)
            appended = 0
            for tok in tokens:
                req.append_output_token(tok)
                appended += 1
                if req.num_output_tokens >= max_tokens or req.num_tokens >= max_len:
                    status = RequestStatus.FINISHED_LENGTH
                    break
            if sr.num_spec:
                del tokens[appended:]
                # KV is valid for the last token's predecessors only: accepted drafts are real now
                req.num_computed_tokens = sr.start_pos + sr.num_new_tokens - sr.num_spec - 1 + appended
                req.spec_token_ids = []
                self.kv.free_surplus(req)
            self.kv.cache_full_blocks(req)
            if status is not None:
                self.running.remove(req)
                self._finish(req, status, "length")
                finished.append(req)
        return finished

    # ---------------------------------------------------------------- checking
    def check_invariants(self) -> None:
        """Assert scheduler + KV-cache consistency (tests call it after every step)."""
        # beams resumed by their group may outnumber max_num_seqs for a step (schedule() caps each step's
        # batch); ordinary requests are admitted only below it
        assert sum(1 for r in self.running if not r.no_spec) <= self.config.max_num_seqs
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        assert len(ids) == len(set(ids)), "a request is queued twice"
        assert set(ids) == set(self.requests), "requests dict out of sync with the queues"
        for r in self.running:
            assert r.status == RequestStatus.RUNNING, r
            r.check_invariants()
            assert r.num_computed_tokens <= self.config.max_model_len
        for r in self.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), r
            assert r.num_computed_tokens == 0 and not r.block_ids, r
            r.check_invariants()
        self.kv.check_invariants(self.running)
