"""Speculative decoding inside the engine: proposing drafts before a step is scheduled, filling
them once it is, verifying them exactly, and the statistics.

One step, for a request that is decoding (KV covers all but its last token):
  1. propose: the request's AdaptiveK picks k (capped so the step can never emit past
     max_tokens or max_model_len), the drafter sets request.spec_token_ids (n-gram: the tokens;
     model drafters: k placeholders). The scheduler schedules 1 + k tokens (counted in the token
     budget, trailing drafts dropped when it is short) and allocates their KV slots.
  2. draft: model drafters fill the placeholders (runs on the step's block tables).
  3. the target computes logits at the last token and at every draft (one forward pass).
  4. verify: each row's sampling distribution is built exactly as the plain sampler would
     (penalties see the drafts before it as generated tokens; min_tokens counts them) and each
     row draws the token plain sampling would draw there (argmax, or Gumbel-max on the sampling
     stream at the row's (seed, output position)); the drafts equal to their row's token are
     accepted, then the first row's token that differs (or the bonus row's) is emitted
     (greedy_accept). The emitted tokens are plain decoding's, for any k, drafts or batch. Drafts
     a model drafter drew from its own distribution q (unseeded sampled requests) go through
     rejection_sample instead (acceptance sum min(p, q)). The scheduler rolls num_computed_tokens
     back over rejected drafts.
Requests with and without drafts share the batch (the ones without go through the plain sampler).
"""
from __future__ import annotations

import time

import torch

from decodekit import ops
from decodekit.sampling.sampler import Sampler, SamplerOutput, SamplingMetadata, penalty_prompt
from decodekit.spec.adaptive import AdaptiveK, StepCostModel

SPEC_METHODS = ("ngram", "draft", "layerskip")


class SpecDecoder:
    def __init__(self, drafter, k: int, adaptive: bool = True, prior_cost: float = 0.1, sampling=None):
        """sampling: a spec.drafters.DraftSampling (model drafters then draw sampled requests'
        drafts from their own distribution; None: argmax drafts)."""
        self.drafter = drafter
        self.sampling = sampling
        self.k = k
        self.adaptive = adaptive
        self.cost = StepCostModel(prior_cost=prior_cost)
        self._k_of: dict[str, AdaptiveK] = {}
        self.stats = {"spec_draft_tokens": 0, "spec_accepted_tokens": 0, "spec_verify_steps": 0}

    @property
    def method(self) -> str:
        return self.drafter.kind

    # ------------------------------------------------------------------ 1. propose
    def propose(self, scheduler) -> None:
        running = scheduler.running
        cost = self.cost.draft_cost(len(running))
        max_len = scheduler.config.max_model_len
        for req in running:
            req.spec_token_ids = []
            if req.num_computed_tokens != req.num_tokens - 1 or req.no_spec:   # prefilling, in flight, beams
                continue
            room = min(scheduler.max_output_tokens(req) - req.num_output_tokens, max_len - req.num_tokens) - 1
            if room <= 0:
                continue
            ak = self._k_of.get(req.request_id)
            if ak is None:
                ak = self._k_of[req.request_id] = AdaptiveK(self.k, self.adaptive)
            k = min(ak.choose(cost), room)
            if k > 0:
                self.drafter.num_drafts(req, k)

    # ------------------------------------------------------------------ 2. draft
    def on_schedule(self, so) -> None:
        """Every step, right after schedule(): forget finished requests, reset re-admitted ones."""
        self.drafter.on_schedule(so)
        for rid in so.finished_req_ids:
            self._k_of.pop(rid, None)
        self.drafter.copy_blocks(so.blocks_to_copy)

    def draft(self, so, runner) -> None:
        t = time.perf_counter()
        n = self.drafter.draft(so.scheduled, runner, self.sampling)
        self.cost.observe_drafter(n, time.perf_counter() - t)

    # ------------------------------------------------------------------ 4. verify
    def verify(self, sampler: Sampler, logits: torch.Tensor, rows: list, seeds: list[int], eos_token_ids,
               vocab_size: int) -> tuple[list[list[int]], SamplerOutput | None, list[list[int]]]:
        """rows: the verifying ScheduledRequests, in order; logits: their 1 + num_spec rows each
        ([sum, V]). Returns per request the emitted tokens, the logprob output of the emitted
        rows (None unless a request wants logprobs) and per request the indices into it."""
        reqs = [sr.request for sr in rows]
        drafts = [list(r.spec_token_ids[:sr.num_spec]) for sr, r in zip(rows, reqs)]
        params, outs, prompts, sds, steps = [], [], [], [], []
        for r, d, seed in zip(reqs, drafts, seeds):
            pen = r.sampling_params.reads_output_tokens   # penalties, bad words: read the generated tokens
            for j in range(len(d) + 1):
                params.append(r.sampling_params)
                outs.append(r.output_token_ids + d[:j] if j and pen else r.output_token_ids)
                prompts.append(penalty_prompt(r))
                sds.append(seed)
                steps.append(r.num_output_tokens + j)
        dev = logits.device
        ks = [len(d) for d in drafts]
        starts = [0]                       # each request's first row
        for k in ks:
            starts.append(starts[-1] + k + 1)

        def rows_of(bs: list[int]) -> list[int]:
            return [starts[b] + j for b in bs for j in range(ks[b] + 1)]

        def metadata(ri: list[int]) -> SamplingMetadata:
            return SamplingMetadata.build([params[i] for i in ri], [outs[i] for i in ri], [prompts[i] for i in ri],
                                          [sds[i] for i in ri], [steps[i] for i in ri], eos_token_ids, dev, vocab_size)

        # Drafts drawn from a distribution q (unseeded sampled requests of a model drafter) go through
        # rejection sampling, which accepts sum_v min(p_v, q_v) on average, the most any exact verifier
        # can; every other request through coupled verification: each row's token is the one the plain
        # sampler draws there (the same distribution, Philox noise at the same (seed, position)) and a
        # draft is accepted when it equals it. The emitted tokens are then exactly plain sampling's
        # whatever k, the drafts and the batch were (seeded requests stay reproducible under the
        # adaptive, timing-driven k), and a one-hot draft is accepted with probability p(draft), as
        # rejection sampling would accept it.
        qs = [self.drafter.draft_probs(r.request_id, k) if k else None for r, k in zip(reqs, ks)]
        sel = [b for b, q in enumerate(qs) if q is not None]
        rest = [b for b, q in enumerate(qs) if q is None]
        tokens: list[list[int]] = [[] for _ in reqs]
        max_lp = []                        # each part's max_num_logprobs
        if rest:
            ri = rows_of(rest)
            md = metadata(ri)
            x = logits if not sel else logits.index_select(0, torch.tensor(ri, device=dev))  # (all rows: as is)
            for b, t in zip(rest, greedy_accept([drafts[b] for b in rest], sampler.tokens(x, md).tolist())):
                tokens[b] = t
            max_lp.append(md.max_num_logprobs)
        if sel:
            ri = rows_of(sel)
            sub = metadata(ri)
            max_lp.append(sub.max_num_logprobs)
            probs = sampler.probs(logits.index_select(0, torch.tensor(ri, device=dev)), sub)   # [len(ri), V]
            kmax = max(ks[b] for b in sel)
            target = probs.new_zeros(len(sel), kmax + 1, vocab_size)
            b_idx = torch.tensor([i for i, b in enumerate(sel) for _ in range(ks[b] + 1)], device=dev)
            j_idx = torch.tensor([j for b in sel for j in range(ks[b] + 1)], device=dev)
            target[b_idx, j_idx] = probs
            draft_t = torch.tensor([drafts[b] + [0] * (kmax - ks[b]) for b in sel], dtype=torch.int64, device=dev)
            draft_probs = torch.zeros(len(sel), kmax, vocab_size, dtype=torch.float32, device=dev)
            for i, b in enumerate(sel):
                draft_probs[i, :ks[b]] = qs[b]
            out, n = ops.rejection_sample(
                draft_t, torch.tensor([ks[b] for b in sel], dtype=torch.int32, device=dev), draft_probs, target,
                torch.tensor([seeds[b] for b in sel], dtype=torch.int64, device=dev),
                torch.tensor([reqs[b].num_output_tokens for b in sel], dtype=torch.int64, device=dev), greedy=False)
            for b, row in zip(sel, torch.cat([out, n[:, None].to(out.dtype)], 1).tolist()):  # one host sync
                tokens[b] = row[:row[-1]]
        wanted = [m for m in max_lp if m is not None]
        return (tokens, *self._logprobs(logits, max(wanted) if wanted else None, starts, tokens))

    @staticmethod
    def _logprobs(logits: torch.Tensor, max_num_logprobs: int | None, starts: list[int],
                  tokens: list[list[int]]) -> tuple[SamplerOutput | None, list[list[int]]]:
        """The logprob output of the emitted tokens' rows (None unless a request wants logprobs:
        max_num_logprobs) and per request the indices into it (starts: each request's first row)."""
        dev = logits.device
        lp_out, lp_index = None, [[] for _ in tokens]
        if max_num_logprobs is not None:
            sel = [starts[b] + j for b, t in enumerate(tokens) for j in range(len(t))]
            lp_out = SamplerOutput(token_ids=torch.tensor([x for t in tokens for x in t], device=dev))
            Sampler._logprobs(logits.index_select(0, torch.tensor(sel, device=dev)).float(), lp_out.token_ids,
                              max_num_logprobs, lp_out)
            i = 0
            for b, t in enumerate(tokens):
                lp_index[b] = list(range(i, i + len(t)))
                i += len(t)
        return lp_out, lp_index

    # ------------------------------------------------------------------ statistics
    def record(self, so, sampled: dict[str, list[int]], step_seconds: float) -> dict[str, tuple[int, int]]:
        """After update_from_output: per verifying request (drafts, accepted); feeds AdaptiveK
        and the cost model."""
        res = {}
        for sr in so.scheduled:
            if not sr.num_spec:
                continue
            toks = sampled.get(sr.request_id)
            if not toks:
                continue
            acc = min(len(toks) - 1, sr.num_spec)
            res[sr.request_id] = (sr.num_spec, acc)
            ak = self._k_of.get(sr.request_id)
            if ak is not None:
                ak.update(sr.num_spec, acc)
            self.stats["spec_draft_tokens"] += sr.num_spec
            self.stats["spec_accepted_tokens"] += acc
            self.stats["spec_verify_steps"] += 1
        if so.scheduled:
            self.cost.observe(so.num_scheduled_tokens, step_seconds)
        return res

    def summary(self) -> dict:
        s = dict(self.stats)
        d, a, v = s["spec_draft_tokens"], s["spec_accepted_tokens"], s["spec_verify_steps"]
        s["spec_acceptance_rate"] = a / d if d else 0.0
        s["spec_mean_accepted_length"] = (a + v) / v if v else 0.0  # tokens emitted per verification
        s["spec_method"] = self.method
        return s


def spec_metrics(drafts: int, accepted: int, steps: int) -> dict:
    """The per-request speculative-decoding figures in RequestOutput.metrics."""
    return {"spec_draft_tokens": drafts, "spec_accepted_tokens": accepted, "spec_verify_steps": steps,
            "spec_acceptance_rate": accepted / drafts if drafts else 0.0,
            "spec_mean_accepted_length": (accepted + steps) / steps if steps else 0.0}


def greedy_accept(drafts: list[list[int]], top: list[int]) -> list[list[int]]:
    """The verification rule (decodekit.ops.rejection_sample's greedy rule): per request the drafts
    that equal the target's token at their position, then the target's token at the first mismatch,
    or the bonus token after the last draft. top: the token the plain sampler draws at each of the
    request's 1 + len(drafts) rows (the argmax on greedy rows), requests in order."""
    tokens, i = [], 0
    for d in drafts:
        n = 0
        while n < len(d) and d[n] == top[i + n]:
            n += 1
        tokens.append(list(d[:n]) + [top[i + n]])
        i += len(d) + 1
    return tokens
