"""One beam-search request inside the engine (LLMEngine.add_request with BeamSearchParams).

Each live beam is an engine Request (greedy, EOS an ordinary token, the step's top-K logprobs, never
drafted for). A beam computes one token per step like any decode, then *pauses* (the scheduler skips
it, its KV kept) until every beam of the group has its step table; then the search (sampling/
beam_search.py) picks the next beams, each a (parent beam, token) pair:

  - the first child of a parent continues the parent's own request: its last sampled (not yet
    computed) token is replaced by the chosen one and it resumes;
  - every further child forks the parent: a new request holding the parent's full KV blocks and a copy
    of its partial one (Scheduler.add_forked); if it cannot (the parent was preempted, no free block,
    max_num_seqs) it is an ordinary new request and recomputes through the prefix cache;
  - parents without children are aborted (their blocks freed, shared ones stay with the children).

So a step costs one decode token per beam, the same as sampling beam_width sequences. Preemption is the
scheduler's: a paused beam may be preempted (it keeps its table and recomputes when it resumes). When the
search is done (max_tokens steps, or no live beam), the remaining requests are aborted and the group
emits one RequestOutput: the beam_width best hypotheses, best first.
"""
from __future__ import annotations

import time

from decodekit.sampling.beam_search import BeamSearch, BeamSearchParams

from .outputs import CompletionOutput, Logprob, RequestOutput
from .request import Request


class BeamGroup:
    def __init__(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: BeamSearchParams,
                 eos_token_ids, max_model_len: int, can_fork: bool, taken=None):
        self.request_id, self.prompt, self.params = request_id, prompt, params
        self.search = BeamSearch(prompt_ids, params, eos_token_ids, max_model_len)
        self.max_model_len, self.can_fork = max_model_len, can_fork
        self.k = params.num_step_logprobs
        self.live: list[Request] = []            # one request per beam, in search.beams order
        self.tables: dict[str, dict] = {}        # request id -> this step's {token: Logprob}
        self._serial = 0
        self.taken = taken or (lambda rid: False)   # ids the engine already uses (beams never reuse one)
        self.finished = False
        self.dirty = False                       # finished and its output not collected yet
        self.cut = False                         # a beam could never fit the KV cache: ended early
        self.aborted = False
        self.arrival = time.monotonic()
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.finished_at: float | None = None
        self.num_cached_tokens = 0

    def new_request(self, sched, tokens: list[int]) -> Request:
        while True:     # "<id>#beam<k>", skipping any id a request already has
            rid = f"{self.request_id}#beam{self._serial}"
            self._serial += 1
            if sched.get_request(rid) is None and not self.taken(rid):
                break
        r = Request(rid, tokens, self.params.step_params(self.max_model_len - len(tokens)))
        r.no_spec = True
        return r

    def start(self, sched) -> list[Request]:
        r = self.new_request(sched, self.search.prompt_token_ids)
        sched.add_request(r)
        self.live = [r]
        return self.live

    # ------------------------------------------------------------------ per step
    def on_sample(self, req: Request, info) -> None:
        """The request's token of this step: its table from the sampler's top-K; the beam pauses."""
        lp, extra = info[0]
        ids, lps, _ = extra
        self.tables[req.request_id] = {t: Logprob(float(v), i + 1) for i, (t, v) in
                                       enumerate(zip(ids[:self.k], lps[:self.k]))}
        req.paused = True
        if self.first_token is None:
            self.first_token = time.monotonic()

    @property
    def ready(self) -> bool:
        return bool(self.live) and all(r.request_id in self.tables for r in self.live)

    def advance(self, sched) -> tuple[list[Request], list[Request]]:
        """The next beams from this step's tables (all in). Returns (requests added, requests dropped)."""
        parents = self.search.advance([self.tables[r.request_id] for r in self.live])
        self.tables.clear()
        if self.search.done:
            return [], self.finish(sched)
        added, plan, continued = [], [], set()
        for beam, j in zip(self.search.beams, parents):   # forks first: they copy the parent's KV as computed
            if j not in continued:
                continued.add(j)
                plan.append((beam, j, None))
                continue
            child = self.new_request(sched, beam.tokens)
            if not (self.can_fork and sched.add_forked(child, self.live[j])):
                sched.add_request(child)
            plan.append((beam, j, child))
            added.append(child)
        live = []
        for beam, j, child in plan:
            if child is None:
                child = self.live[j]
                sched.replace_last_token(child, beam.tokens[-1])
                child.paused = False
            live.append(child)
        dropped = [r for j, r in enumerate(self.live) if j not in continued]
        for r in dropped:
            sched.abort_request(r.request_id)
        self.live = live
        return added, dropped

    def on_finished(self, req: Request, sched) -> list[Request]:
        """A beam's request ended without the group (the KV cache can never hold it): the search ends
        with what it has. Returns the requests dropped."""
        if self.finished or req.request_id in self.tables:
            return []
        self.cut = True
        return self.finish(sched)

    def finish(self, sched) -> list[Request]:
        dropped = self.live
        for r in dropped:
            if not r.is_finished:
                sched.abort_request(r.request_id)
        self.live, self.tables = [], {}
        self.finished = self.dirty = True
        self.finished_at = time.monotonic()
        return dropped

    def abort(self, sched) -> list[Request]:
        self.aborted = True
        return self.finish(sched)

    # ------------------------------------------------------------------ output
    def output(self, tokenizer, decode_one) -> RequestOutput:
        """The beam_width best hypotheses (CompletionOutputs, best first); logprobs: per token the step's
        top-N (params.logprobs) and the token itself."""
        res = self.search.result(tokenizer).sequences
        aborted = self.aborted
        top = self.params.logprobs
        comps = []
        for i, s in enumerate(res):
            gen = s.generated_token_ids
            lps = None
            if top is not None:
                lps = []
                for table, tid in zip(s.logprobs, gen):
                    entry = {t: Logprob(x.logprob, x.rank, decode_one(t)) for t, x in table.items()
                             if t == tid or x.rank <= top}
                    lps.append(entry)
            reason = "abort" if aborted else s.finish_reason
            comps.append(CompletionOutput(index=i, text=s.text, token_ids=list(gen), cumulative_logprob=s.cum_logprob,
                                          logprobs=lps, finish_reason=reason,
                                          stop_reason=s.stop_reason if reason == "stop" else
                                          ("kv_cache_capacity" if self.cut else None),
                                          delta_text=s.text, delta_token_ids=list(gen)))
        metrics = {"arrival": self.arrival, "first_scheduled": self.first_scheduled, "first_token": self.first_token,
                   "finished": self.finished_at, "prompt_tokens": self.search.prompt_len}
        return RequestOutput(self.request_id, self.prompt, list(self.search.prompt_token_ids), comps, True,
                             self.num_cached_tokens, metrics)

