"""Beam search (vLLM's ``LLM.beam_search`` / ``use_beam_search``): the search state and parameters.

Each step computes one token per live beam and its top ``2 * beam_width`` log-probabilities (the
engine runs the beams as requests; engine/beam_group.py). Every (beam, candidate token) pair is scored,
candidates that are an EOS token end their hypothesis (kept aside as finished), and the ``beam_width``
best of the others live on. After ``max_tokens`` steps (or when no beam is left) the finished hypotheses and the live beams
together are ranked and the ``beam_width`` best returned, best first.

Score (vLLM's ``get_beam_search_score``): ``cum_logprob / len ** length_penalty`` where ``len`` counts
the prompt and the generated tokens, less a final EOS. ``cum_logprob`` sums the model's raw
log-probabilities (``log_softmax(logits)``) of the generated tokens, so ``temperature`` does not change
the search (as with vLLM's default raw logprobs); ties keep the earlier beam and the better-ranked
candidate first (a stable sort).

This module holds the search state (``BeamSearch``) and the parameters, torch-free; the engine drives it
(``LLMEngine.add_request(id, prompt, BeamSearchParams)``, ``LLM.beam_search``, the server's
``use_beam_search``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from .params import DEFAULT_MAX_LOGPROBS, SamplingParams, SamplingParamsError, _show

MAX_LENGTH_PENALTY = 10.0


@dataclass
class BeamSearchParams:
    """beam_width: int in [1, max_logprobs // 2] (10 with the default max_logprobs=20);
    max_tokens: int >= 1 (the prompt plus max_tokens must fit in max_model_len);
    ignore_eos: bool (EOS is then an ordinary candidate); temperature: finite number in [0, 100]
    (accepted for vLLM compatibility; the scores are raw logprobs, so it does not change the result);
    length_penalty: finite number in [-10, 10] (the score's length exponent; larger favours longer
    hypotheses); include_stop_str_in_output: bool (the EOS token's text stays in `text`); logprobs: None or
    int in [0, max_logprobs]: per generated token its logprob and the step's top-N (RequestOutput's
    CompletionOutput.logprobs and BeamSearchSequence.logprobs; LLM.beam_search's default, None, gives the
    2 * beam_width candidates of each step); truncate_prompt_tokens: None, -1 or int >= 1 (SamplingParams':
    the search starts from the prompt's last k tokens)."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self):
        self.validate()
        self.beam_width, self.max_tokens = int(self.beam_width), int(self.max_tokens)
        self.temperature, self.length_penalty = float(self.temperature), float(self.length_penalty)

    def validate(self, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> "BeamSearchParams":
        def whole(name, lo, hi, rng):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
                raise SamplingParamsError(name, f"must be an int {rng}, got {_show(v)}", "BeamSearchParams")

        def real(name, lo, hi):
            v = getattr(self, name)
            ok = not isinstance(v, bool) and isinstance(v, numbers.Real)
            try:
                ok = ok and math.isfinite(v) and lo <= v <= hi
            except OverflowError:   # an int (or Fraction) beyond float's range: out of range, not a crash
                ok = False
            if not ok:
                raise SamplingParamsError(name, f"must be a finite number in [{lo:g}, {hi:g}], got {_show(v)}",
                                          "BeamSearchParams")
        top = max(1, max_logprobs // 2)
        whole("beam_width", 1, top, f"in [1, {top}] (each beam asks for its 2 * beam_width best tokens and "
                                    f"max_logprobs is {max_logprobs})")
        whole("max_tokens", 1, 1 << 40, ">= 1")
        real("temperature", 0.0, 100.0)
        real("length_penalty", -MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY)
        if self.logprobs is not None:
            whole("logprobs", 0, max_logprobs, f"in [0, {max_logprobs}] or None")
        if self.truncate_prompt_tokens is not None:
            v = self.truncate_prompt_tokens
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not (v == -1 or v >= 1):
                raise SamplingParamsError("truncate_prompt_tokens", f"must be -1 or an int >= 1 (or None), "
                                                                    f"got {_show(v)}", "BeamSearchParams")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(name, f"must be a bool, got {_show(getattr(self, name))}", "BeamSearchParams")
        return self

    @property
    def num_step_logprobs(self) -> int:
        """Logprobs each beam step asks for: its 2 * beam_width candidates, or the caller's top-N if more."""
        return max(2 * self.beam_width, self.logprobs or 0)

    def step_params(self, max_tokens: int) -> SamplingParams:
        """The SamplingParams of a beam's engine request: greedy, EOS allowed (an ordinary candidate),
        the step's logprobs."""
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                              logprobs=self.num_step_logprobs, skip_special_tokens=False)


# SamplingParams fields a beam search takes (the others must keep their defaults: a beam search has no stop
# strings, penalties, token controls nor guides, and never samples, so top_p / top_k / min_p / seed / temperature
# change nothing) -- the server's use_beam_search and the CLI's --beam-width check requests with it
BEAM_COMPATIBLE_FIELDS = frozenset({"n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                                    "ignore_eos", "logprobs", "prompt_logprobs", "include_stop_str_in_output",
                                    "truncate_prompt_tokens"})


def beam_conflicts(params: SamplingParams) -> list[str]:
    """The SamplingParams fields set (away from their defaults) that a beam search cannot honour."""
    default = SamplingParams()
    return [f.name for f in dataclasses.fields(SamplingParams)
            if f.name not in BEAM_COMPATIBLE_FIELDS and getattr(params, f.name) != getattr(default, f.name)]


@dataclass
class BeamSearchSequence:
    """One hypothesis. tokens: the prompt's and the generated ones; logprobs: per generated token a
    {token id: Logprob} table, the step's top-N (BeamSearchParams.logprobs; the 2 * beam_width candidates
    by default) and the chosen token, with ranks; text: the generated text (filled at
    the end); finish_reason: "stop" (ended with EOS) or "length"; stop_reason: that EOS id;
    prompt_len: how many of `tokens` are the prompt's."""
    tokens: list[int]
    logprobs: list[dict] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    prompt_len: int = 0

    @property
    def generated_token_ids(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclass
class BeamSearchOutput:
    """The beam_width best hypotheses of one prompt, best first (vLLM's)."""
    sequences: list[BeamSearchSequence]


def beam_score(seq: BeamSearchSequence, eos_token_ids, length_penalty: float) -> float:
    n = len(seq.tokens)
    if seq.finish_reason == "stop" and seq.tokens and seq.tokens[-1] in eos_token_ids:
        n -= 1
    return seq.cum_logprob / (max(n, 1) ** length_penalty)


class BeamSearch:
    """The search over one prompt. Drive it: while not done: run `beams` (their `tokens` as prompts)
    for one token each, then `advance` with each beam's step table {token id: Logprob}."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids,
                 max_model_len: int | None = None):
        if not prompt_token_ids:
            raise SamplingParamsError("prompt", "beam search needs a prompt of at least one token", "BeamSearchParams")
        if max_model_len is not None and len(prompt_token_ids) + params.max_tokens > max_model_len:
            raise SamplingParamsError("max_tokens", f"the prompt's {len(prompt_token_ids)} tokens plus max_tokens="
                                                    f"{params.max_tokens} exceed max_model_len={max_model_len}",
                                      "BeamSearchParams")
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.prompt_len = len(prompt_token_ids)
        self.eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self.beams = [BeamSearchSequence(tokens=list(prompt_token_ids), prompt_len=len(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.beams or self.steps >= self.params.max_tokens

    def _key(self, seq: BeamSearchSequence) -> float:
        return beam_score(seq, self.eos, self.params.length_penalty)

    def advance(self, tables: list[dict]) -> list[int]:
        """tables[i]: beam i's step logprobs {token id: Logprob with .logprob and .rank}; its candidates
        are the entries ranked within 2 * beam_width (a table may hold more, e.g. the caller's top-N).
        Returns, per new beam, the index of the beam it continues."""
        if len(tables) != len(self.beams):
            raise ValueError(f"advance needs one table per beam: {len(tables)} for {len(self.beams)} beams")
        k, pen = 2 * self.params.beam_width, self.params.length_penalty

        def grown(j, tid, lp):     # a hypothesis is copied out only when it survives the step
            beam = self.beams[j]
            return BeamSearchSequence(tokens=beam.tokens + [tid], logprobs=beam.logprobs + [tables[j]],
                                      cum_logprob=beam.cum_logprob + lp, prompt_len=self.prompt_len)
        live = []                  # (score, j, token, logprob): the beams' tokens are all one length here
        for j, (beam, table) in enumerate(zip(self.beams, tables)):
            n = max(len(beam.tokens) + 1, 1) ** pen
            for tid, lp in sorted(table.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30)):
                if lp.rank is None or lp.rank > k or not math.isfinite(lp.logprob):
                    continue
                if tid in self.eos:
                    seq = grown(j, tid, lp.logprob)
                    seq.finish_reason, seq.stop_reason = "stop", tid
                    self.finished.append(seq)
                else:
                    live.append(((beam.cum_logprob + lp.logprob) / n, j, tid, lp.logprob))
        live.sort(key=lambda c: c[0], reverse=True)  # stable: earlier beam, better rank first among equals
        live = live[:self.params.beam_width]
        self.beams = [grown(j, tid, lp) for _, j, tid, lp in live]
        self.steps += 1
        return [c[1] for c in live]

    def result(self, tokenizer=None) -> BeamSearchOutput:
        """The beam_width best of the finished and the live hypotheses, best first, with their text."""
        for b in self.beams:
            b.finish_reason = "length"
        best = sorted(self.finished + self.beams, key=self._key, reverse=True)[:self.params.beam_width]
        if tokenizer is not None:
            for s in best:
                gen = s.generated_token_ids
                if s.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    gen = gen[:-1]
                s.text = tokenizer.decode(gen, skip_special_tokens=not self.params.include_stop_str_in_output)
        return BeamSearchOutput(best)
