"""Drafters for speculative decoding, as the engine drives them.

Each step the engine asks `num_drafts(request, k)` for every running request that is decoding
(its KV covers all but its last token); before scheduling, so the scheduler counts the drafts in
the step's token budget and allocates their KV slots. Then `draft(scheduled, runner)` fills
`request.spec_token_ids` for the scheduled ones (the scheduler may have dropped trailing drafts).
The verifier (engine/spec_decode.py: coupled acceptance, or decodekit.ops.rejection_sample) makes
the output exact whatever the drafts are; a drafter only decides the speed.

- NgramDrafter: prompt lookup (spec.ngram.NgramProposer per request); knows its tokens before
  scheduling, may propose fewer than k or none.
- ModelDrafter: a model run autoregressively k times. Greedy requests draft the processed argmax;
  sampled requests with a seed draw each draft from the drafter's own distribution q, processed as
  the target's is (penalties over the drafts before it, min_tokens, temperature, top-k / top-p /
  min-p), by Gumbel-max with the very noise the target's token at that position is drawn with (the
  request's seed, the plain sampler's Philox stream, the draft's output position): the verifier
  accepts such a coupled draft when it equals the target's own draw there, so the emitted tokens
  are the seeded plain samples exactly, whatever k was (a drafter close to the target agrees with
  it nearly always). Unseeded sampled requests draw from q on Philox stream STREAM_SPEC_DRAFT and
  keep q for rejection sampling (acceptance min(1, p/q), i.e. sum_v min(p_v, q_v), the most any
  verifier can accept). Either way the output distribution is the target's exactly.
  * layer-skip self-drafting: the target's first L layers + its final norm and LM head, writing
    those layers' KV into the target's own cache at the draft positions (the verification pass
    rewrites the same slots for every layer), so it needs no state at all;
  * a separate draft model (same tokenizer / vocabulary) with its own paged KV cache addressed
    by the target's block tables (same block ids; its pool mirrors the target's). Its KV is valid
    for a prefix of each sequence (`computed`), caught up in the first draft pass of a step; a
    (re)admitted request starts again from position 0 (its blocks are new or shared prefix
    blocks, which it rewrites with the same tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from decodekit.sampling.philox import STREAM_SPEC_DRAFT
from decodekit.sampling.sampler import Sampler, SamplingMetadata, penalty_prompt

from .ngram import NgramProposer

_PLACEHOLDER = 0


class NgramDrafter:
    kind = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4):
        NgramProposer(1, min_n, max_n)  # validates
        self.min_n, self.max_n = min_n, max_n
        self._proposers: dict[str, NgramProposer] = {}

    def num_drafts(self, req, k: int) -> int:
        p = self._proposers.get(req.request_id)
        if p is None:
            p = self._proposers[req.request_id] = NgramProposer(max(k, 1), self.min_n, self.max_n)
        toks = req.all_token_ids
        if len(p.tokens) < len(toks):
            p.extend(toks[len(p.tokens):])
        req.spec_token_ids = p.propose(k) if k > 0 else []
        return len(req.spec_token_ids)

    def on_schedule(self, so) -> None:
        for rid in so.finished_req_ids:
            self._proposers.pop(rid, None)

    def draft(self, scheduled, runner, sampling=None) -> int:
        return 0  # the drafts were known before scheduling

    def copy_blocks(self, pairs) -> None:
        pass

    def draft_probs(self, request_id: str, n: int) -> torch.Tensor | None:
        return None  # deterministic drafts


@dataclass
class DraftSampling:
    """What a model drafter needs to sample drafts for sampled requests (the engine's)."""
    sampler: Sampler
    seed_of: Callable[[str], int]    # request id -> the seed its verification uses
    eos_token_ids: list[int]
    vocab_size: int


class ModelDrafter:
    def __init__(self, model, kind: str, num_layers: int | None = None, kv_caches=None, max_chunk: int = 2048):
        """kind "layerskip": `model` is the target and num_layers its first layers (kv_caches None:
        the runner's, i.e. the target's). kind "draft": `model` is a separate draft model with its
        own kv_caches (allocated like the target's: same num_blocks and block_size)."""
        if kind not in ("layerskip", "draft"):
            raise ValueError(f"ModelDrafter kind must be layerskip or draft, got {kind!r}")
        self.kind, self.model, self.num_layers, self.kv_caches = kind, model, num_layers, kv_caches
        self.max_chunk = max_chunk
        self._computed: dict[str, int] = {}   # draft model: KV valid for positions < computed
        self._probs: dict[str, list] = {}     # this step's q rows per unseeded sampled request ([V] each)

    def num_drafts(self, req, k: int) -> int:
        req.spec_token_ids = [_PLACEHOLDER] * k   # filled by draft() once scheduled
        return k

    def on_schedule(self, so) -> None:
        """Finished, preempted and (re)admitted requests (a fresh block table) start from position 0."""
        for rid in [*so.finished_req_ids, *so.preempted_req_ids, *(sr.request_id for sr in so.scheduled if sr.is_new)]:
            self._computed.pop(rid, None)

    def copy_blocks(self, pairs) -> None:
        if self.kind == "draft":  # its own pool mirrors the target's copy-on-write
            from decodekit.engine.model_runner import copy_kv_blocks
            copy_kv_blocks(self.kv_caches, pairs)

    def draft_probs(self, request_id: str, n: int) -> torch.Tensor | None:
        """[n, V] float32: the distributions this step's first n drafts of the request were drawn
        from (unseeded sampled requests, verified by rejection sampling); None for coupled drafts."""
        rows = self._probs.get(request_id)
        return None if rows is None else torch.stack(rows[:n])

    def _forward(self, runner, token_lists, starts, tables, reqs, index: int, sampling) -> list[int]:
        """Draft `index` of each request in reqs (one logits row per sequence)."""
        ids, md = runner.prepare_seqs(token_lists, starts, tables, [1] * len(token_lists),
                                      rope_long=[r.rope_long for r in reqs], model=self.model)
        kv = self.kv_caches if self.kind == "draft" else runner.kv_caches
        logits = self.model.forward(ids, md, kv, num_layers=self.num_layers)
        params = [r.sampling_params for r in reqs]
        if sampling is None:
            return logits.argmax(dim=-1).tolist()
        outs = [r.output_token_ids + r.spec_token_ids[:index] if index and p.reads_output_tokens else r.output_token_ids
                for r, p in zip(reqs, params)]
        dev = logits.device

        def metadata(js: list[int]) -> SamplingMetadata:
            return SamplingMetadata.build([params[j] for j in js], [outs[j] for j in js],
                                          [penalty_prompt(reqs[j]) for j in js],
                                          [sampling.seed_of(reqs[j].request_id) for j in js],
                                          [reqs[j].num_output_tokens + index for j in js], sampling.eos_token_ids,
                                          dev, sampling.vocab_size)

        # unseeded sampled requests: drawn from q on the drafter's own stream, q kept for rejection
        # sampling; the others coupled: drawn as the target's token at this position is (see the module
        # docstring; greedy rows: the argmax after penalties and the min_tokens mask, as the target's)
        free = [j for j, p in enumerate(params) if not p.is_greedy and p.seed is None]
        if not free:
            return sampling.sampler.tokens(logits, metadata(list(range(len(reqs))))).tolist()
        tok = [0] * len(reqs)
        coupled = [j for j, p in enumerate(params) if p.is_greedy or p.seed is not None]
        if coupled:
            x = logits.index_select(0, torch.tensor(coupled, device=dev))
            for j, t in zip(coupled, sampling.sampler.tokens(x, metadata(coupled)).tolist()):
                tok[j] = t
        x = logits if not coupled else logits.index_select(0, torch.tensor(free, device=dev))
        ftok, q = sampling.sampler.sample_with_probs(x, metadata(free), STREAM_SPEC_DRAFT)
        for i, (j, t) in enumerate(zip(free, ftok.tolist())):
            tok[j] = t
            self._probs.setdefault(reqs[j].request_id, []).append(q[i])
        return tok

    @torch.inference_mode()
    def draft(self, scheduled, runner, sampling: DraftSampling | None = None) -> int:
        """Fill the placeholders of the scheduled verifying requests; returns draft tokens made.
        sampling None: every draft is the drafter's argmax (one-hot)."""
        self._probs = {}
        todo = [sr for sr in scheduled if sr.num_spec > 0]
        if not todo:
            return 0
        reqs = [sr.request for sr in todo]
        ks = [sr.num_spec for sr in todo]
        last = [r.num_tokens - 1 for r in reqs]          # position of each request's last real token
        # pass 0: the last token (a draft model first catches up on what it has not seen)
        starts = []
        for r, n in zip(reqs, last):
            c = min(self._computed.get(r.request_id, 0), n) if self.kind == "draft" else n
            starts.append(c)
        if self.kind == "draft":  # long catch-ups (a fresh prompt) in chunks that end before the last token
            while True:
                chunked = [(i, s) for i, (s, n) in enumerate(zip(starts, last)) if n - s > self.max_chunk]
                if not chunked:
                    break
                toks = [reqs[i].all_token_ids[s:s + self.max_chunk] for i, s in chunked]
                ids, md = runner.prepare_seqs(toks, [s for _, s in chunked], [reqs[i].block_ids for i, _ in chunked],
                                              [0] * len(chunked), rope_long=[reqs[i].rope_long for i, _ in chunked],
                                              model=self.model)
                self.model.forward(ids, md, self.kv_caches)
                for i, s in chunked:
                    starts[i] = s + self.max_chunk
        toks = [r.all_token_ids[s:n + 1] for r, s, n in zip(reqs, starts, last)]
        out = self._forward(runner, toks, starts, [r.block_ids for r in reqs], reqs, 0, sampling)
        for r, tok in zip(reqs, out):
            r.spec_token_ids[0] = tok
        # passes 1 .. k-1: one draft token each
        for i in range(1, max(ks)):
            live = [j for j, k in enumerate(ks) if k > i]
            out = self._forward(runner, [[reqs[j].spec_token_ids[i - 1]] for j in live],
                                [last[j] + i for j in live], [reqs[j].block_ids for j in live],
                                [reqs[j] for j in live], i, sampling)
            for j, tok in zip(live, out):
                reqs[j].spec_token_ids[i] = tok
        if self.kind == "draft":
            for r, n, k in zip(reqs, last, ks):
                # KV now valid for positions < n + k; the verifier's result trims it on the next call
                self._computed[r.request_id] = n + k
        return sum(ks)
