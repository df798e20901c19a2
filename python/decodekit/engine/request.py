"""Per-request state tracked by the scheduler and the KV-cache manager (vLLM v1 style).

A Request is one token sequence: prompt + generated tokens. The scheduler never looks at
sampling settings beyond ``sampling_params.max_tokens`` (and ``.n``, see ``split_n``); the
sampling parameters object is opaque here (duck typing, no import of decodekit.sampling).

There is no prefill/decode phase: the only progress counter is ``num_computed_tokens``, the
number of leading tokens whose KV is (or, during an in-flight step, will be) in the cache.
Each step the scheduler hands out ``num_tokens_with_spec - num_computed_tokens`` tokens (one
for a decode, a prompt chunk otherwise).
"""
from __future__ import annotations

import enum
import time
from typing import Any, Hashable


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything from here on is a finished status.
    FINISHED_STOPPED = 3    # EOS / stop token / stop string (decided by the caller)
    FINISHED_LENGTH = 4     # max_tokens or max_model_len reached (or KV-cache capacity)
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status >= RequestStatus.FINISHED_STOPPED

    @staticmethod
    def finish_reason(status: "RequestStatus") -> str | None:
        """OpenAI-style finish_reason string for a finished status, else None."""
        return _FINISH_REASON.get(status)


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One sequence. Invariant (checked on every write): 0 <= num_computed_tokens <= num_tokens.

    Fields the scheduler / KV-cache manager own:
      block_ids          the block table: physical KV block of each logical block, in order
      block_hashes       chained hashes of the FULL blocks of all_token_ids (prefix caching);
                         they depend only on the tokens, so they stay valid across preemption
      num_cached_tokens  prefix-cache hit (tokens) when first scheduled; -1 before that
      num_preemptions    how many times this request was preempted (recompute-style)
      spec_token_ids     this step's draft tokens (speculative decoding: set before scheduling,
                         verified in the step, cleared by update_from_output / preemption)
    and ones the engine owns: prompt_logprobs_pending, paused, no_spec (see __init__).
    """

    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "arrival_time",
                 "output_token_ids", "_num_computed_tokens", "status", "block_ids",
                 "block_hashes", "num_cached_tokens", "num_preemptions", "spec_token_ids",
                 "extra_key", "parent_id", "child_index", "stop_reason", "_all_token_ids",
                 "prompt_logprobs_pending", "paused", "no_spec", "rope_long", "penalty_prompt")

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: Any,
                 arrival_time: float | None = None, *, extra_key: Hashable = None,
                 parent_id: str | None = None, child_index: int = 0):
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        for name in ("max_tokens", "n"):
            if not hasattr(sampling_params, name):
                raise ValueError(f"sampling_params must have a .{name} attribute "
                                 f"(got {type(sampling_params).__name__})")
        toks = [int(t) for t in prompt_token_ids]
        if any(t < 0 for t in toks):
            raise ValueError(f"request {request_id!r}: prompt token ids must be >= 0")
        self.request_id = request_id
        self.prompt_token_ids = toks
        self.sampling_params = sampling_params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.output_token_ids: list[int] = []
        # prompt + output in one list, so slicing all tokens never copies the prompt.
        self._all_token_ids: list[int] = list(toks)
        self._num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []
        self.block_hashes: list[Hashable] = []
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []
        self.extra_key = extra_key          # part of every block hash (LoRA id, cache salt, ...)
        self.parent_id = parent_id          # set on the children of an n > 1 request
        self.child_index = child_index
        self.stop_reason: str | int | None = None
        # the engine still wants the logits of prompt positions (prompt_logprobs): computed from position 0,
        # without prefix-cache hits, in chunks of at most PROMPT_LOGPROBS_CHUNK tokens; cleared once they are in
        self.prompt_logprobs_pending = False
        # beam search (engine/beam_group.py): a paused request is not scheduled (it waits, holding its KV,
        # for its group to pick its next token); no_spec: never drafted for
        self.paused = False
        self.no_spec = False
        # LongRoPE: it grew past the model's original context, so every position takes the long factors
        # (LlamaModel.rope_long_for; set by the scheduler, which recomputes its KV): its blocks hash apart
        self.rope_long = False
        # the engine's cache of the prompt's distinct ids for the sampler's penalties (a tensor, built on first
        # use: the prompt never changes, and converting it every step cost ~0.2 ms per 4000 tokens)
        self.penalty_prompt: Any = None

    # ---------------------------------------------------------------- token accounting
    @property
    def num_computed_tokens(self) -> int:
        return self._num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if not 0 <= value <= len(self._all_token_ids) + len(self.spec_token_ids):
            raise AssertionError(f"request {self.request_id!r}: num_computed_tokens={value} "
                                 f"outside [0, num_tokens={self.num_tokens}]")
        self._num_computed_tokens = value

    @property
    def block_key(self) -> Hashable:
        """The key every block hash of this request includes: extra_key (+ the rope rule when not the default)."""
        return ("rope_long", self.extra_key) if self.rope_long else self.extra_key

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens."""
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """num_tokens plus this step's draft tokens."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + output tokens. The returned list is internal: do not mutate it."""
        return self._all_token_ids

    def append_output_token(self, token_id: int) -> None:
        token_id = int(token_id)
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    # ---------------------------------------------------------------- status
    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return RequestStatus.finish_reason(self.status)

    def check_invariants(self) -> None:
        assert 0 <= self._num_computed_tokens <= self.num_tokens_with_spec, self
        assert self._all_token_ids == self.prompt_token_ids + self.output_token_ids, self
        if self.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or self.is_finished:
            assert not self.block_ids, f"{self}: holds blocks while not running"

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self._num_computed_tokens}, "
                f"blocks={len(self.block_ids)})")


def split_n(request: Request) -> list[Request]:
    """Expand a request whose ``sampling_params.n > 1`` into n independent child requests.

    This is how n > 1 is supported (the vLLM v1 design): each child is an ordinary one-sequence
    Request with id ``f"{request_id}/{i}"``, the same prompt and the same sampling_params object
    (``child_index`` tells the sampler which seed offset to use). The children share the KV
    blocks of their common full prompt blocks through automatic prefix caching; the last,
    partial prompt block (< block_size tokens) is recomputed per child. Children admitted in
    the same step as the first one do not hit yet (blocks become hittable once computed).
    Returns ``[request]`` unchanged when n <= 1.
    """
    n = request.sampling_params.n or 1
    if n <= 1:
        return [request]
    return [Request(f"{request.request_id}/{i}", request.prompt_token_ids, request.sampling_params,
                    request.arrival_time, extra_key=request.extra_key,
                    parent_id=request.request_id, child_index=i) for i in range(n)]
