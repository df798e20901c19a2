"""Batched token sampler: penalties, min_tokens, temperature, top-k, top-p, min-p, then
greedy argmax or a Philox-seeded Gumbel-max draw, plus logprobs.

``SamplingMetadata.build`` turns the per-request state into tensors once per step (Python
loops allowed there). ``Sampler()(logits, md)`` is then a fixed sequence of tensor ops on
``logits``' device: no ``.item()``/``.cpu()``, no host sync, no data-dependent shapes, so
it can be captured in a CUDA graph for a fixed metadata "shape" (the Python flags and the
padded widths in the metadata).

Processing order (each step applies only when some row needs it):

0. token controls, in vLLM's order: ``allowed_token_ids`` or the guide's tokens (every
   other token -inf), ``bad_words``
   (a one-token word's token -inf; a longer word's last token -inf when the generated tokens end
   with the rest of it), ``logit_bias`` added;
1. repetition penalty (HF/vLLM): for every token in prompt + output,
   ``l = l / r if l > 0 else l * r``;
2. presence / frequency (OpenAI/vLLM), output tokens only: ``l -= f * count + p * (count > 0)``;
3. min_tokens: while fewer than ``min_tokens`` tokens were generated, EOS (unless
   ``ignore_eos``) and ``stop_token_ids`` are set to -inf;
4. greedy rows (temperature < 1e-5) take ``argmax`` here (first index on ties);
5. temperature: ``l / T``;
6. top-k (exactly k tokens survive; ties broken towards the lower token id), then top-p on
   the top-k-renormalised distribution (the smallest prefix of the sorted distribution
   whose probability reaches p, at least one token), then min-p (keep ``p_i >= min_p *
   p_max``); dropped tokens get -inf;
7. Gumbel-max: ``argmax(l + g)`` with ``g = -log(-log u)``, u from Philox keyed by the
   row's seed with counter (token id, position = tokens generated so far); the
   ``gumbel_argmax`` op draws only the keys that can win (the token of drawing every key with
   its own float arithmetic; torch's log may differ in the last ulp, which can split a key
   tie to ~1e-7 between the op, its torch fallback and the CUDA kernel). The noise of a
   row depends only on (seed, position, token id): a seeded request draws the same tokens
   whatever else is in the batch and in whatever order (batch invariance).

Logprobs are those of the raw model logits (``log_softmax(logits)``, before penalties,
temperature and filters), as vLLM returns by default. The rank of the sampled token is
``1 + #(tokens with a strictly larger logprob)``.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import ops
from .params import SamplingParams
from .philox import STREAM_SAMPLING, derive_seed


def _greedy(x: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B] int64
    """argmax over the vocabulary (first index on ties): on the CPU the argmax_rows kernel (torch's CPU
    argmax reads ~1 GB/s: 1.5 ms a step for 32 rows of a 49k vocabulary), on the GPU torch's."""
    return ops.argmax_rows(x) if x.device.type == "cpu" else x.argmax(dim=-1)

_NEG_INF = float("-inf")

# --------------------------------------------------------------------------- seeds
_seed_rng = random.Random(int.from_bytes(os.urandom(8), "little"))


def set_global_seed(seed: int) -> None:
    """Make the seeds drawn for unseeded requests reproducible."""
    _seed_rng.seed(seed)


def draw_seed() -> int:
    """A fresh seed in [0, 2**63) from the global generator (for an unseeded request)."""
    return _seed_rng.getrandbits(63)


def penalty_prompt(request) -> Sequence[int] | torch.Tensor:
    """What SamplingMetadata.build takes as a request's prompt ids: for a request with penalties its
    distinct prompt ids as a tensor, built once and kept on the request (Request.penalty_prompt; the
    prompt never changes); the prompt is not read otherwise."""
    if not request.sampling_params.has_penalties:
        return ()
    if request.penalty_prompt is None:
        request.penalty_prompt = torch.unique(torch.as_tensor(request.prompt_token_ids, dtype=torch.int64))
    return request.penalty_prompt


def request_seeds(params: SamplingParams) -> list[int]:
    """The per-sample seeds of a request, drawn once when it is added.

    Seeded: ``derive_seed(seed, i)`` for i in range(n) (sample 0 uses ``seed`` itself);
    unseeded: n fresh draws from the global generator.
    """
    if params.seed is None:
        return [draw_seed() for _ in range(params.n)]
    return [derive_seed(params.seed, i) for i in range(params.n)]


# --------------------------------------------------------------------------- metadata
@dataclass
class SamplingMetadata:
    """Per-step sampling tensors ([B] rows; all on the logits' device)."""
    vocab_size: int
    temperature: torch.Tensor            # [B] float32, 1.0 on greedy rows
    greedy: torch.Tensor                 # [B] bool
    all_greedy: bool
    any_greedy: bool
    seeds: torch.Tensor                  # [B] int64 in [0, 2**63)
    positions: torch.Tensor              # [B] int64, tokens generated so far
    top_k: torch.Tensor | None = None    # [B] int64, vocab_size where off
    top_p: torch.Tensor | None = None    # [B] float32, 1.0 where off
    min_p: torch.Tensor | None = None    # [B] float32, 0.0 where off
    prompt_token_ids: torch.Tensor | None = None   # [B, Lp] int64 padded with vocab_size
    output_token_ids: torch.Tensor | None = None   # [B, Lo] int64 padded with vocab_size
    repetition_penalty: torch.Tensor | None = None  # [B] float32
    presence_penalty: torch.Tensor | None = None    # [B] float32
    frequency_penalty: torch.Tensor | None = None   # [B] float32
    min_tokens_rows: torch.Tensor | None = None     # [M] int64 row of each (row, token) to mask
    min_tokens_ids: torch.Tensor | None = None      # [M] int64 token id to mask
    allowed_mask: torch.Tensor | None = None        # [B, V] bool, False: masked (True on rows without a list)
    bad_rows: torch.Tensor | None = None            # [Nb] int64 row of each (row, token) a bad word masks
    bad_ids: torch.Tensor | None = None             # [Nb] int64 token id it masks
    bias_rows: torch.Tensor | None = None           # [Nl] int64 row of each logit_bias entry
    bias_ids: torch.Tensor | None = None            # [Nl] int64 its token id
    bias_vals: torch.Tensor | None = None           # [Nl] float32 its bias
    max_num_logprobs: int | None = None  # None: no row wants logprobs

    @property
    def no_penalties(self) -> bool:
        return self.repetition_penalty is None

    @property
    def no_token_controls(self) -> bool:
        return self.allowed_mask is None and self.bad_rows is None and self.bias_rows is None

    @property
    def need_filter(self) -> bool:
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    @staticmethod
    def build(params_list: Sequence[SamplingParams],
              output_token_ids_list: Sequence[Sequence[int] | torch.Tensor],
              prompt_token_ids_list: Sequence[Sequence[int] | torch.Tensor],
              seeds: Sequence[int],
              steps: Sequence[int] | None,
              eos_token_ids: int | Sequence[int] | None,
              device: torch.device | str,
              vocab_size: int) -> "SamplingMetadata":
        """Tensors for one step of ``len(params_list)`` rows.

        ``seeds[b]``: the row's seed (from ``request_seeds``; always given). ``steps[b]``:
        tokens generated so far (the Philox position; None: ``len(output_token_ids)``).
        ``eos_token_ids``: the model's EOS id(s), masked during ``min_tokens``.
        """
        B = len(params_list)
        if not (len(output_token_ids_list) == len(prompt_token_ids_list) == len(seeds) == B):
            raise ValueError("params_list, output/prompt token id lists and seeds must have the same length")
        if steps is None:
            steps = [len(o) for o in output_token_ids_list]
        elif len(steps) != B:
            raise ValueError("steps must have one entry per row")
        if eos_token_ids is None:
            eos = []
        elif isinstance(eos_token_ids, int):
            eos = [eos_token_ids]
        else:
            eos = [int(e) for e in eos_token_ids]
        V = int(vocab_size)
        device = torch.device(device)

        def f32(vals):
            return torch.tensor(vals, dtype=torch.float32, device=device)

        def i64(vals):
            return torch.tensor(vals, dtype=torch.int64, device=device)

        greedy = [p.is_greedy for p in params_list]
        md = SamplingMetadata(
            vocab_size=V,
            temperature=f32([1.0 if g else p.temperature for p, g in zip(params_list, greedy)]),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy), any_greedy=any(greedy),
            seeds=i64([int(s) for s in seeds]),
            positions=i64([int(s) for s in steps]),
        )
        for s in seeds:
            if not 0 <= int(s) < (1 << 63):
                raise ValueError(f"seed {s} outside [0, 2**63)")

        # Filters only matter on random rows (they never change a greedy row's argmax).
        rnd = [p for p, g in zip(params_list, greedy) if not g]
        if any(p.top_k > 0 for p in rnd):
            md.top_k = i64([p.top_k if 0 < p.top_k < V else V for p in params_list])
        if any(p.top_p < 1.0 for p in rnd):
            md.top_p = f32([p.top_p for p in params_list])
        if any(p.min_p > 0.0 for p in rnd):
            md.min_p = f32([p.min_p for p in params_list])

        if any(p.has_penalties for p in params_list):
            empty = torch.empty(0, dtype=torch.int64)

            def padded(lists):
                rows = [torch.as_tensor(t, dtype=torch.int64).reshape(-1) if p.has_penalties else empty
                        for p, t in zip(params_list, lists)]
                width = max(1, max(r.numel() for r in rows))
                out = torch.full((B, width), V, dtype=torch.int64)
                for b, r in enumerate(rows):
                    out[b, :r.numel()] = r
                return out.to(device)

            md.prompt_token_ids = padded(prompt_token_ids_list)
            md.output_token_ids = padded(output_token_ids_list)
            md.repetition_penalty = f32([p.repetition_penalty for p in params_list])
            md.presence_penalty = f32([p.presence_penalty for p in params_list])
            md.frequency_penalty = f32([p.frequency_penalty for p in params_list])

        rows, cols = [], []
        for b, (p, step) in enumerate(zip(params_list, steps)):
            if step < p.min_tokens:
                for t in p.all_stop_token_ids(eos):
                    if 0 <= t < V:
                        rows.append(b)
                        cols.append(t)
        if any(p.masks_logits for p in params_list):
            rows, cols = _token_controls(md, params_list, output_token_ids_list, B, V, device, rows, cols)
        if rows:
            md.min_tokens_rows, md.min_tokens_ids = i64(rows), i64(cols)

        lp = [p.logprobs for p in params_list if p.logprobs is not None]
        md.max_num_logprobs = max(lp) if lp else None
        return md


def _cached(p, name: str, key, make):
    """make() stored on the SamplingParams object under `name` while `key` holds (the n samples of a
    request share one object, which the engine never changes once queued): token-control tensors are
    built once per request, not once per step (a full-vocabulary logit_bias took ~10 ms a row)."""
    hit = p.__dict__.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    val = make()
    object.__setattr__(p, name, (key, val))
    return val


def _allowed_of(p, V: int):
    """(frozenset of allowed ids, [V] bool mask) of p.allowed_token_ids."""
    ids = p.allowed_token_ids

    def make():
        mask = torch.zeros(V, dtype=torch.bool)
        mask[torch.tensor(ids, dtype=torch.int64)] = True
        return frozenset(ids), mask
    return _cached(p, "_dk_allowed", (id(ids), len(ids), V), make)


def _bias_of(p):
    """([n] int64 ids, [n] float32 biases) of p.logit_bias."""
    lb = p.logit_bias
    return _cached(p, "_dk_bias", (id(lb), len(lb)), lambda: (torch.tensor(list(lb.keys()), dtype=torch.int64),
                                                              torch.tensor(list(lb.values()), dtype=torch.float32)))


def _token_controls(md: SamplingMetadata, params_list, output_token_ids_list, B: int, V: int, device,
                    min_rows: list[int], min_cols: list[int]) -> tuple[list[int], list[int]]:
    """md's allowed_mask / bad_* / bias_* from the rows' allowed_token_ids, bad_words_token_ids (matched
    against each row's generated tokens) and logit_bias. A row whose allowed tokens the bad words and the
    min_tokens mask (min_rows / min_cols) would all hide gets the min_tokens mask lifted, then, if still
    empty, the bad words': allowed_token_ids always holds, and a token outside it is never drawn.
    Returns the min_tokens (rows, cols) left."""
    bad_rows, bad_cols = [], []
    for b, (p, out) in enumerate(zip(params_list, output_token_ids_list)):
        words = p.bad_words_token_ids
        if not words:
            continue
        tail = None
        for w in words:
            k = len(w) - 1
            if k:
                if tail is None:  # the generated tokens' last few, as a list (out may be a tensor)
                    m = max(len(q) for q in words) - 1
                    tail = [int(t) for t in out[max(len(out) - m, 0):]]
                if k > len(tail) or tail[len(tail) - k:] != w[:k]:
                    continue
            bad_rows.append(b)
            bad_cols.append(w[-1])
    if any(p.allowed_token_ids is not None or p.guided_kind is not None for p in params_list):
        rows_mask = []
        for b, p in enumerate(params_list):
            if p.guided_kind is not None:    # this step's tokens towards a match of the guide (or EOS)
                mask, count = p.guided_mask(output_token_ids_list[b], V)
                allowed = None
            elif p.allowed_token_ids is None:
                rows_mask.append(None)
                continue
            else:
                allowed, mask = _allowed_of(p, V)
                count = len(allowed)
            rows_mask.append(mask)
            bad = {c for r, c in zip(bad_rows, bad_cols) if r == b}
            held = {c for r, c in zip(min_rows, min_cols) if r == b}
            if len(bad) + len(held) >= count:
                if allowed is None:
                    allowed = frozenset(mask.nonzero().flatten().tolist())
                if allowed <= bad | held:   # nothing left: relieve
                    min_rows, min_cols = ([r for r, c in zip(min_rows, min_cols) if r != b],
                                          [c for r, c in zip(min_rows, min_cols) if r != b])
                    if allowed <= bad:
                        bad_rows, bad_cols = ([r for r, c in zip(bad_rows, bad_cols) if r != b],
                                              [c for r, c in zip(bad_rows, bad_cols) if r != b])
        ones = torch.ones(V, dtype=torch.bool)
        md.allowed_mask = torch.stack([ones if m is None else m for m in rows_mask]).to(device)
    if bad_rows:
        md.bad_rows = torch.tensor(bad_rows, dtype=torch.int64, device=device)
        md.bad_ids = torch.tensor(bad_cols, dtype=torch.int64, device=device)
    biased = [(b, _bias_of(p)) for b, p in enumerate(params_list) if p.logit_bias]
    if biased:
        md.bias_rows = torch.repeat_interleave(torch.tensor([b for b, _ in biased], dtype=torch.int64),
                                               torch.tensor([len(t[0]) for _, t in biased])).to(device)
        md.bias_ids = torch.cat([t[0] for _, t in biased]).to(device)
        md.bias_vals = torch.cat([t[1] for _, t in biased]).to(device)
    return min_rows, min_cols


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor                     # [B] int64
    logprobs: torch.Tensor | None = None        # [B] float32: raw logprob of the sampled token
    topk_ids: torch.Tensor | None = None        # [B, N] int64 (N = max requested; slice per row)
    topk_logprobs: torch.Tensor | None = None   # [B, N] float32, descending
    ranks: torch.Tensor | None = None           # [B] int64, 1 = the most likely token


# --------------------------------------------------------------------------- processing
def apply_penalties(logits: torch.Tensor, prompt_token_ids: torch.Tensor,
                    output_token_ids: torch.Tensor, repetition: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
    """Repetition (prompt + output), then frequency and presence (output); returns a new tensor.

    Token-id tensors are [B, L] padded with V (= logits.shape[1]); penalties are [B]. Only the
    tokens a row has seen change (a row without penalties: repetition 1, presence and frequency 0,
    keeps its logits bit for bit), so the work is a copy of the logits plus O(B x L log L) on the
    seen ids, gathered, penalised and scattered back -- not a dozen passes over [B, V] (64 rows of
    49152 logits, 4500 ids each, 2 cores: 23-36 -> 9 ms, tools/bench_penalties.py; the same values:
    the same float operations in the same order on each seen token):
        out[t] = (t seen ? (x > 0 ? x / r : x * r) : x) - f * count[t] - p * (count[t] > 0)
    """
    B, V = logits.shape
    ids = torch.cat([prompt_token_ids, output_token_ids], dim=1)          # [B, L]
    valid = ids < V
    # padding takes a seen id of its row (writing that id's own value again), or 0 in a row with
    # none, which is then neutral (repetition 1, no presence / frequency): its value is x exactly
    first = ids.gather(1, valid.to(torch.uint8).argmax(1, keepdim=True))   # [B, 1]
    some = first < V
    ids = torch.where(valid, ids, torch.where(some, first, torch.zeros_like(first)))
    srt = output_token_ids.sort(dim=1).values                             # pads (V) last
    counts = (torch.searchsorted(srt, ids, right=True) - torch.searchsorted(srt, ids)).to(logits.dtype)
    x = logits.gather(1, ids)
    r = torch.where(some, repetition[:, None], 1.0)
    f = torch.where(some, frequency[:, None], 0.0)
    p = torch.where(some, presence[:, None], 0.0)
    val = torch.where(x > 0, x / r, x * r)
    val = val - f * counts - p * (counts > 0).to(logits.dtype)
    return logits.clone().scatter_(1, ids, val)


def apply_penalties_dense(logits: torch.Tensor, prompt_token_ids: torch.Tensor,
                          output_token_ids: torch.Tensor, repetition: torch.Tensor,
                          presence: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
    """apply_penalties written over the whole vocabulary (the rule as masks; tests compare the two)."""
    B, V = logits.shape
    counts = torch.zeros(B, V + 1, dtype=logits.dtype, device=logits.device)
    counts.scatter_add_(1, output_token_ids, torch.ones_like(output_token_ids, dtype=logits.dtype))
    counts = counts[:, :V]
    in_prompt = torch.zeros(B, V + 1, dtype=torch.bool, device=logits.device)
    in_prompt.scatter_(1, prompt_token_ids, True)
    seen = in_prompt[:, :V] | (counts > 0)
    r = repetition[:, None]
    penalised = torch.where(logits > 0, logits / r, logits * r)
    out = torch.where(seen, penalised, logits)
    out = out - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(logits.dtype)
    return out


# Candidates the CPU path sorts instead of the whole vocabulary (top-k / top-p / min-p decided
# inside them whenever that is exact, row by row, else the next count, else the whole row): topk(128)
# ~0.1-0.2 ms on 2 cores, topk(1024) ~0.5, the whole 49152-logit row ~0.4 ms by the radix sort
# (ops.sort_desc_stable; torch's comparison sort took ~3.5-4.5 ms). (An 8192 level, taken by rows whose
# kept count a histogram bounded below 8192, paid against the comparison sort but not against the radix
# one: 49152 logits keeping ~3800 tokens 2.20 -> 1.32 ms without it, flatter rows 1.6 -> 1.3 ms.)
_FILTER_CANDIDATES = (128, 1024)


def apply_top_k_top_p_min_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                            top_p: torch.Tensor | None,
                            min_p: torch.Tensor | None) -> torch.Tensor:
    """Set the tokens dropped by top-k, top-p and min-p to -inf (a new tensor).

    ``logits`` [B, V] (already divided by the temperature); ``top_k`` [B] int64 in [1, V]
    (V = off), ``top_p`` [B] in (0, 1] (1 = off), ``min_p`` [B] in [0, 1] (0 = off); any of
    them may be None (off for all rows). The token of rank 0 (the first argmax) is always
    kept. Ties are ordered by token id (stable sort), so top-k keeps exactly k tokens. The
    probabilities top-p and min-p see are the softmax of the top-k-kept logits in token order
    (then summed in rank order for top-p).
    """
    B, V = logits.shape
    if logits.device.type != "cpu":
        sorted_l, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
        return _filter_sorted(logits, sorted_l, idx, top_k, top_p, min_p, None)[0]
    on = torch.zeros(B, dtype=torch.bool)
    for t, off in ((top_k, lambda t: t >= V), (top_p, lambda t: t >= 1.0), (min_p, lambda t: t <= 0.0)):
        if t is not None:
            on |= ~off(t)
    if min_p is not None:   # min_p = 0 still drops tokens of a row whose softmax is NaN (NaN or +inf logits)
        on |= ~(logits < float("inf")).all(dim=1)
    pending = on.clone()                   # rows still to filter (the others keep every logit)
    out = None
    tried = 0
    for level in (*_FILTER_CANDIDATES, V):
        left = pending.nonzero().flatten()
        if left.numel() == 0:
            break
        C = level
        if C < V and top_k is not None:   # at least the largest top-k + 1 candidates
            kk = top_k[left]
            C = max(C, int(torch.where(kk < V, kk, torch.zeros_like(kk)).max()) + 1)
        if 4 * C >= V:
            C = V
        if C < V and C <= tried:
            continue
        tried = C
        go = left
        x = logits if go.numel() == B else logits[go]
        if C < V:
            res, ok = _filter_candidates(x, *_rows(go, top_k, top_p, min_p), C)
        else:   # the whole row: a radix sort (torch.sort's order bit for bit; a comparison sort was 8x slower)
            sorted_l, idx = ops.sort_desc_stable(x)
            res, ok = _filter_sorted(x, sorted_l, idx, *_rows(go, top_k, top_p, min_p), None)
        if ok is None or bool(ok.all()):
            if out is None and go.numel() == B:
                return res
            done = go
        else:
            done = go[ok]
            res = res[ok]
        out = logits.clone() if out is None else out
        out[done] = res
        pending[done] = False
    return logits.clone() if out is None else out


def _rows(rows, *params):
    """The filter parameters ([B] tensors or None) of the given rows."""
    return [None if t is None else t[rows] for t in params]


def _filter_sorted(logits, sorted_l, idx, top_k, top_p, min_p, exact_upto):
    """The filters on a rank-ordered prefix (sorted_l, idx: [B, C] values and token ids in rank
    order, C <= V). exact_upto [B] (None: C = V, every rank exact): ranks below it are the global
    ranks. Returns (filtered logits [B, V], ok [B] bool: the rows whose kept prefix lies below
    exact_upto, the others need a wider sort; None when exact_upto is None)."""
    B, C = sorted_l.shape
    V = logits.shape[1]
    rank = torch.arange(C, device=logits.device)[None, :]
    keep = torch.ones(B, C, dtype=torch.bool, device=logits.device)
    k_on = None
    ok = None if exact_upto is None else torch.ones(B, dtype=torch.bool, device=logits.device)
    if top_k is not None:
        k_on = top_k < V                        # rows where top-k is on (V = off)
        keep = keep & ((rank < top_k[:, None]) | ~k_on[:, None])
        if ok is not None:
            ok &= ~(k_on & (top_k > exact_upto))
    if top_p is not None or min_p is not None:
        masked = logits
        if k_on is not None:  # the top-k-kept tokens in token order, for the softmax's normaliser
            kmask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, idx, keep) | ~k_on[:, None]
            masked = logits.masked_fill(~kmask, _NEG_INF)
        probs = torch.softmax(masked, dim=-1).gather(1, idx)   # rank order
        if top_p is not None:
            cum = probs.cumsum(dim=-1)
            before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)
            p = top_p[:, None]
            keep = keep & ((before < p) | (p >= 1.0))
        if min_p is not None:
            keep = keep & (probs >= min_p[:, None] * probs[:, :1])
    keep[:, 0] = True
    if ok is not None:
        last = torch.where(keep, rank, torch.zeros_like(rank)).amax(dim=-1)   # the last kept rank
        ok &= last < exact_upto
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, idx, keep)
    return logits.masked_fill(~mask, _NEG_INF), ok


def _filter_candidates(logits, top_k, top_p, min_p, C):
    """apply_top_k_top_p_min_p on the C best logits of each row (C > every top-k on; token order
    within equal values restored): (filtered [B, V], ok [B]), ok false on the rows whose kept prefix
    may reach past the tokens whose rank is exact (their result is not to be used)."""
    vals, ids = torch.topk(logits, C, dim=-1, sorted=False)
    ids, order = ids.sort(dim=-1)                                     # token order ...
    vals = vals.gather(1, order)
    sorted_l, pos = torch.sort(vals, dim=-1, descending=True, stable=True)   # ... then rank order
    idx = ids.gather(1, pos)
    # every token above the smallest candidate value is a candidate; those equal to it may not be
    exact_upto = (sorted_l > sorted_l[:, -1:]).sum(dim=-1)
    return _filter_sorted(logits, sorted_l, idx, top_k, top_p, min_p, exact_upto)


class Sampler:
    """``Sampler()(logits [B, V], md) -> SamplerOutput`` (see the module docstring)."""

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        return self.forward(logits, md)

    @staticmethod
    def _float_logits(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """logits [B, V] as float32, after checking the shape against md."""
        if logits.dim() != 2 or logits.shape[1] != md.vocab_size or logits.shape[0] != md.batch_size:
            raise ValueError(f"logits must be [B={md.batch_size}, V={md.vocab_size}], "
                             f"got {tuple(logits.shape)}")
        return logits if logits.dtype == torch.float32 else logits.float()

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        raw = self._float_logits(logits, md)
        token_ids = self._sample(raw, md)
        out = SamplerOutput(token_ids=token_ids)
        if md.max_num_logprobs is not None:
            self._logprobs(raw, token_ids, md.max_num_logprobs, out)
        return out

    def probs(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """[B, V] float32: the distribution each row's token is drawn from (steps 1-6 of the module
        docstring, then softmax; greedy rows: one-hot at the argmax). Speculative decoding verifies
        drafts against it (decodekit.ops.rejection_sample), so that path samples exactly what
        ``forward`` would, from another random stream."""
        return self._distribution(logits, md)[1]

    def sample_with_probs(self, logits: torch.Tensor, md: SamplingMetadata,
                          stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token_ids [B] int64, probs [B, V] float32): each row's distribution exactly as ``probs``
        builds it, and a draw from it by Gumbel-max on Philox stream ``stream`` (keyed by the rows'
        seeds and positions; greedy rows: the argmax, probs one-hot there). Speculative model
        drafters draw sampled drafts with it, on a stream the plain sampler and the verifier
        never use, and hand the probs to the verifier."""
        xs, p, top = self._distribution(logits, md)
        if xs is None:
            return top, p
        tok = ops.gumbel_argmax(xs, md.seeds, md.positions, stream)
        return (torch.where(md.greedy, top, tok) if md.any_greedy else tok), p

    def tokens(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """[B] int64: the tokens ``forward`` draws (greedy rows: the processed argmax; random rows:
        Gumbel-max on the sampling stream at ``md.positions``), without logprobs. Speculative
        decoding verifies drafts against them: a draft is accepted when it is the token plain
        sampling draws at its position, so the emitted tokens are plain sampling's."""
        return self._sample(self._float_logits(logits, md), md)

    def _distribution(self, logits: torch.Tensor, md: SamplingMetadata):
        """(xs, p, top): the scaled, filtered logits (None when every row is greedy), the rows'
        distributions (one-hot at the argmax on greedy rows) and the processed argmax (None
        unless some row is greedy)."""
        x = self._processed(self._float_logits(logits, md), md)
        top = _greedy(x) if md.any_greedy else None
        if md.all_greedy:
            return None, torch.zeros_like(x).scatter_(1, top[:, None], 1.0), top
        xs = self._scaled_filtered(x, md)
        p = torch.softmax(xs, dim=-1)
        if md.any_greedy:
            p = torch.where(md.greedy[:, None], torch.zeros_like(x).scatter_(1, top[:, None], 1.0), p)
        return xs, p, top

    @staticmethod
    def _processed(raw: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Token controls, penalties and the min_tokens mask (steps 0-3)."""
        x = raw
        if md.allowed_mask is not None:
            x = x.masked_fill(~md.allowed_mask, _NEG_INF)
        if md.bad_rows is not None:
            x = x.index_put((md.bad_rows, md.bad_ids), x.new_full((), _NEG_INF))
        if md.bias_rows is not None:
            x = x.index_put((md.bias_rows, md.bias_ids), md.bias_vals, accumulate=True)
        if not md.no_penalties:
            x = apply_penalties(x, md.prompt_token_ids, md.output_token_ids,
                                md.repetition_penalty, md.presence_penalty, md.frequency_penalty)
        if md.min_tokens_rows is not None:
            x = x.index_put((md.min_tokens_rows, md.min_tokens_ids), x.new_full((), _NEG_INF))
        return x

    @staticmethod
    def _scaled_filtered(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p (steps 5-6)."""
        x = x / md.temperature[:, None]
        if md.need_filter:
            x = apply_top_k_top_p_min_p(x, md.top_k, md.top_p, md.min_p)
        return x

    @classmethod
    def _sample(cls, raw: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.all_greedy and md.no_penalties and md.min_tokens_rows is None and md.no_token_controls:
            return _greedy(raw)                            # the common fast path
        x = cls._processed(raw, md)
        if md.all_greedy:
            return _greedy(x)
        x = cls._scaled_filtered(x, md)
        tok = ops.gumbel_argmax(x, md.seeds, md.positions, STREAM_SAMPLING)
        return torch.where(md.greedy, _greedy(x), tok) if md.any_greedy else tok

    @staticmethod
    def _logprobs(raw: torch.Tensor, token_ids: torch.Tensor, n: int, out: SamplerOutput) -> None:
        lp = torch.log_softmax(raw, dim=-1)
        tok = lp.gather(1, token_ids[:, None]).squeeze(1)
        out.logprobs = tok
        out.ranks = (lp > tok[:, None]).sum(dim=-1) + 1
        if n > 0:
            out.topk_logprobs, out.topk_ids = torch.topk(lp, n, dim=-1)
        else:
            out.topk_logprobs = lp.new_empty(lp.shape[0], 0)
            out.topk_ids = torch.empty(lp.shape[0], 0, dtype=torch.int64, device=lp.device)
