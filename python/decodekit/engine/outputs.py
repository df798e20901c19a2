"""What the engine returns: one RequestOutput per request (all n samples), vLLM-shaped."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None            # 1 = the most likely token
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int                          # which of the n samples
    text: str = ""                      # everything generated so far (stop string excluded)
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per token: top-N plus the sampled one
    finish_reason: str | None = None    # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    delta_text: str = ""                # new in this step (streaming)
    delta_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0          # prompt tokens served from the prefix cache
    metrics: dict = field(default_factory=dict)  # arrival, first_scheduled, first_token, finished (monotonic s),
                                                 # prompt_tokens; spec_* with speculative decoding
    # SamplingParams.prompt_logprobs: None for the first prompt token, then per token {id: Logprob} (its own and
    # the top-N), in the first output after the whole prompt is computed and in the final one (None in the
    # others, and without prompt_logprobs)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
