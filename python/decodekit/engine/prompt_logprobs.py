"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's): per prompt token after the first, its
logprob given the tokens before it (from the raw logits, as generated tokens' logprobs), its rank and the
top-N. The scheduler computes such a prompt from position 0 (no prefix-cache hit) in chunks of at most
PROMPT_LOGPROBS_CHUNK tokens and marks the first rows of each chunk (ScheduledRequest.num_prompt_logits);
the model runner returns their logits ahead of the request's sampling rows; split_prompt_rows takes them
out of the step's logits and fills each request's list."""
from __future__ import annotations

import torch

from .outputs import Logprob


def split_prompt_rows(scheduled: list, logits: torch.Tensor,      # [rows, V] float32
                      table_of, decode) -> torch.Tensor:
    """Fills table_of(request_id) (a list of len(prompt): None, then one {token id: Logprob} per position)
    from the prompt rows of `logits`, clears the requests' prompt_logprobs_pending once their last prompt
    row is in, and returns the sampling rows ([rows - prompt rows, V], in order). decode(id) -> str."""
    keep, parts = [], []                 # sampling rows; (scheduled request, first row)
    r = 0
    for sr in scheduled:
        m = sr.num_prompt_logits
        if m:
            parts.append((sr, r))
        r += m
        n = 1 + sr.num_spec if sr.will_sample else 0
        keep.extend(range(r, r + n))
        r += n
    if r != logits.shape[0]:
        raise AssertionError(f"logits hold {logits.shape[0]} rows, the step asked for {r}")
    for sr, r0 in parts:
        req = sr.request
        m, start = sr.num_prompt_logits, sr.start_pos
        table = table_of(req.request_id)
        if table is not None:
            k = req.sampling_params.prompt_logprobs or 0
            lp = torch.log_softmax(logits[r0:r0 + m].float(), dim=-1)
            target = torch.tensor(req.prompt_token_ids[start + 1:start + 1 + m], dtype=torch.int64,
                                  device=lp.device)
            tok_lp = lp.gather(1, target[:, None])
            ranks = ((lp > tok_lp).sum(dim=-1) + 1).tolist()
            top_lp, top_ids = torch.topk(lp, k, dim=-1) if k else (None, None)
            tok_lp, tids = tok_lp[:, 0].tolist(), target.tolist()
            top_lp = top_lp.tolist() if k else None
            top_ids = top_ids.tolist() if k else None
            for j in range(m):
                entry = {}
                if k:
                    for i, (t, v) in enumerate(zip(top_ids[j], top_lp[j])):
                        entry[t] = Logprob(v, i + 1, decode(t))
                entry[tids[j]] = Logprob(tok_lp[j], ranks[j], decode(tids[j]))
                table[start + 1 + j] = entry
        if start + m >= req.num_prompt_tokens - 1:
            req.prompt_logprobs_pending = False
    if len(keep) == logits.shape[0]:
        return logits
    return logits.index_select(0, torch.tensor(keep, dtype=torch.int64, device=logits.device))
