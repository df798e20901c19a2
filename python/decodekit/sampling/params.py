"""Per-request sampling parameters and their validation.

Allowed ranges (vLLM / OpenAI-like; the engine rejects a request whose parameters fall
outside them with :class:`SamplingParamsError`, a ``ValueError`` that names the field):

==========================  ================================================================
field                       allowed
==========================  ================================================================
n                           int in [1, 128]
temperature                 finite number in [0, 100]; 0 means greedy. Values below
                            ``GREEDY_TEMPERATURE`` (1e-5) are also sampled greedily (as vLLM)
top_k                       int: -1 or 0 = off, else [1, 2**63); a value >= the vocabulary size keeps
                            every token (off), as vLLM and transformers clamp it
top_p                       finite number in (0, 1]; 1 = off
min_p                       finite number in [0, 1]; 0 = off
presence_penalty            finite number in [-2, 2]; 0 = off
frequency_penalty           finite number in [-2, 2]; 0 = off
repetition_penalty          finite number in (0, 2] and >= 1e-6 (``MIN_REPETITION_PENALTY``: a
                            smaller one overflows the float32 logits it divides to inf); 1 = off
seed                        None or int in [0, 2**63)
stop                        str or list of non-empty str (a single str becomes a 1-list)
stop_token_ids              list of int in [0, vocab_size)
ignore_eos                  bool
max_tokens                  int >= 1
min_tokens                  int in [0, max_tokens]
logprobs                    None or int in [0, max_logprobs] (0: only the sampled token's)
prompt_logprobs             None or int in [0, max_logprobs]: per prompt token (after the first) its
                            logprob given the tokens before it, plus the top-N (vLLM's)
include_stop_str_in_output  bool
skip_special_tokens         bool
truncate_prompt_tokens      None, -1 or int >= 1 (at most max_model_len, checked by the engine): keep only
                            the prompt's last k tokens (vLLM's); -1: as many as fit before max_tokens
logit_bias                  None or dict {token id in [0, vocab_size): finite number in [-100, 100]},
                            at most vocab_size entries; added to the logits (OpenAI / vLLM)
allowed_token_ids           None or a non-empty list of int in [0, vocab_size): every other token
                            is masked
bad_words                   None or a list of at most 1024 str, each with a non-space character
                            and at most 1024 characters: word token sequences that are never completed
guided_choice               None or a list of 1 to 256 non-empty str of at most 1024 characters:
                            the output is one of them, then EOS (vLLM's guided_choice); not with
                            ignore_eos, allowed_token_ids nor min_tokens (stop strings still apply,
                            as in vLLM: one inside a choice cuts the output there)
guided_regex                None or a str of at most 200000 characters: the output (its UTF-8 bytes)
                            fully matches this regular expression, then EOS (the pattern subset:
                            sampling/guided/regex.py; errors give the position)
guided_json                 None, a JSON schema (dict, JSON text, or True for any value): the output is
                            a JSON text valid under it (supported keywords: guided/json_schema.py)
guided_json_object          bool: the output is a JSON object (OpenAI's response_format json_object)
guided_grammar              None or a GBNF grammar (str of at most 200000 characters; llama.cpp's format, as
                            vLLM's xgrammar backend takes it): the output is a string of its root rule,
                            then EOS; recursion has no depth bound (a pushdown guide), except in rules
                            left-recursive through other rules, unrolled to a bounded depth
                            (guided/grammar.py)
guided_whitespace_pattern   None or a regular expression: where JSON allows whitespace (default one
                            optional space); only with guided_json / guided_json_object
structured_outputs          None or a StructuredOutputsParams / dict with one of json, regex, choice,
(or guided_decoding)        json_object (vLLM's): spread into the guided_* fields above
==========================  ================================================================

At most one of guided_choice, guided_regex, guided_json, guided_json_object and guided_grammar; none of them goes with
ignore_eos or allowed_token_ids (they set the allowed tokens and end the output with EOS). The guided
masks allow exactly the tokens whose bytes keep the output a prefix of some match, and EOS where it is a
match (EOS alone if the vocabulary cannot go on); min_tokens holds EOS back as long as another token fits.

``bad_words`` as vLLM: each word is encoded without special tokens twice, as written (leading
spaces stripped) and with one leading space (kept when that gives a different first token and the
same length); a sequence of one token is never sampled, a longer one's last token is masked when
the generated tokens end with the rest of it (``bad_words_token_ids``, set by the engine's
``add_request`` from the model's tokenizer). ``allowed_token_ids`` always holds: combinations that
would mask all of them at every step are refused; when a step's masks would (a multi-token bad word,
the min_tokens hold on stop tokens), the min_tokens hold is lifted for that step, then the bad words'.

``stop_token_ids`` (plus the EOS ids unless ``ignore_eos``) must leave a token to sample while
``min_tokens`` holds them back: when they cover the whole vocabulary, ``min_tokens`` must be 0.

"int" never accepts a bool (``True`` is rejected where an int is expected) nor a float
(``top_k=5.0`` is rejected); "number" accepts int or float (not bool, not str) and rejects
NaN and +-inf. Numpy scalars are accepted and converted to Python ``int``/``float``.

Values are checked when a SamplingParams is built and again by the engine's ``add_request``
(``validate``). Assigning a field later normalises ``stop`` / ``stop_token_ids`` as the constructor
does (a str becomes a 1-list, a tuple a list, None an empty list) but checks nothing else until then.
"""
from __future__ import annotations

import logging
import math
import numbers
import weakref
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from .guided import GuideError, RegexError, compile_guide, escape, guide_pattern, parse
from .reasoning import with_reasoning
from .shorten import show

MAX_N = 128
MAX_TOP_K = 2**63 - 1           # top_k beyond the vocabulary is off; beyond int64 is refused
MAX_TEMPERATURE = 100.0
GREEDY_TEMPERATURE = 1e-5      # temperature < this is sampled greedily
PENALTY_RANGE = 2.0            # presence / frequency in [-2, 2]
MAX_REPETITION_PENALTY = 2.0   # repetition in (0, 2]
MIN_REPETITION_PENALTY = 1e-6  # and >= this: the sampler divides float32 logits by it (1e-300 is 0 in float32)
SEED_LIMIT = 1 << 63           # seed in [0, 2**63)
DEFAULT_MAX_LOGPROBS = 20
LOGIT_BIAS_RANGE = 100.0       # logit_bias values in [-100, 100] (OpenAI)
MAX_BAD_WORDS = 1024           # bad_words: at most this many words
MAX_BAD_WORD_CHARS = 1024      # of at most this many characters each
MAX_GUIDED_CHOICES = 256       # guided_choice: at most this many choices (of MAX_BAD_WORD_CHARS characters)
MAX_GUIDED_PATTERN = 200_000   # guided_regex / guided_whitespace_pattern: at most this many characters
GUIDED_FIELDS = ("guided_choice", "guided_regex", "guided_json", "guided_json_object", "guided_grammar")


class SamplingParamsError(ValueError):
    """Invalid sampling parameter; ``.field`` is the offending field's name."""

    def __init__(self, field_name: str, message: str, owner: str = "SamplingParams"):
        super().__init__(f"{owner}.{field_name}: {message}")
        self.field, self.message = field_name, message


def _is_int(v) -> bool:
    # numbers.Integral covers Python and numpy ints; numpy's bool is not registered there.
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


_show = show  # (the name the engine and the server import)


def _check_int(name: str, v, lo: int | None, hi: int | None, what: str) -> None:
    if not _is_int(v):
        raise SamplingParamsError(name, f"must be an int {what}, got {_show(v)} ({type(v).__name__})")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise SamplingParamsError(name, f"must be an int {what}, got {_show(v)}")


def _check_number(name: str, v, lo: float, hi: float, lo_open: bool, hi_open: bool) -> None:
    rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if not _is_number(v):
        raise SamplingParamsError(name, f"must be a number in {rng}, got {_show(v)} ({type(v).__name__})")
    try:
        f = float(v)
    except OverflowError:  # an int (or Fraction) beyond float's range: out of range, not a crash
        raise SamplingParamsError(name, f"must be a number in {rng}, got {_show(v)}") from None
    if math.isnan(f) or math.isinf(f):
        raise SamplingParamsError(name, f"must be a finite number in {rng}, got {_show(v)}")
    if f < lo or f > hi or (lo_open and f == lo) or (hi_open and f == hi):
        raise SamplingParamsError(name, f"must be a number in {rng}, got {_show(v)}")


def _check_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise SamplingParamsError(name, f"must be a bool, got {_show(v)} ({type(v).__name__})")


class _WordsMemo:
    """bad_words encoded with one tokenizer (SamplingParams.encode_bad_words). A copy of the params shares it; a
    pickled one arrives empty (it matches no tokenizer: the words are encoded again where they land)."""
    __slots__ = ("tokenizer", "words", "seqs")

    def __init__(self, tokenizer=None, words=(), seqs=()):
        try:
            self.tokenizer = weakref.ref(tokenizer) if tokenizer is not None else None
        except TypeError:       # (a tokenizer without weak references: nothing remembered)
            self.tokenizer = None
        self.words, self.seqs = tuple(words), list(seqs)

    def matches(self, tokenizer, words) -> bool:
        return self.tokenizer is not None and self.tokenizer() is tokenizer and self.words == tuple(words)

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (_WordsMemo, ())


@dataclass
class SamplingParams:
    """Sampling parameters of one request (see the module docstring for the ranges)."""
    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    guided_choice: list[str] | None = None
    guided_regex: str | None = None
    guided_json: Any = None
    guided_json_object: bool = False
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: Any = None
    guided_decoding: Any = None

    def __setattr__(self, name, value):
        # the constructor's shorthands hold for assignments too (sp.stop = "###")
        if name == "stop" and isinstance(value, str):
            value = [value]
        if name in ("stop", "stop_token_ids"):
            value = [] if value is None else list(value) if isinstance(value, tuple) else value
        object.__setattr__(self, name, value)

    def __post_init__(self):
        self._spread_structured_outputs()
        self.validate()
        # Normalise numpy scalars to Python numbers (validated above).
        for name in ("n", "top_k", "max_tokens", "min_tokens"):
            setattr(self, name, int(getattr(self, name)))
        for name in ("temperature", "top_p", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty"):
            setattr(self, name, float(getattr(self, name)))
        if self.seed is not None:
            self.seed = int(self.seed)
        if self.logprobs is not None:
            self.logprobs = int(self.logprobs)
        if self.prompt_logprobs is not None:
            self.prompt_logprobs = int(self.prompt_logprobs)
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.bad_words is not None:
            self.bad_words = list(self.bad_words)
        if self.guided_choice is not None:
            self.guided_choice = list(self.guided_choice)

    # ------------------------------------------------------------------ validation
    def validate(self, vocab_size: int | None = None, max_logprobs: int = DEFAULT_MAX_LOGPROBS,
                 eos_token_ids=()) -> "SamplingParams":
        """Raise :class:`SamplingParamsError` for the first invalid field; returns self.

        ``vocab_size`` (when known) bounds ``stop_token_ids``, and with the model's
        ``eos_token_ids`` refuses stop ids that leave ``min_tokens`` nothing to sample.
        """
        if vocab_size is not None and (not _is_int(vocab_size) or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        _check_int("n", self.n, 1, MAX_N, f"in [1, {MAX_N}]")
        _check_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE, False, False)
        # (a top_k >= the vocabulary keeps every token: vLLM and transformers clamp it to V)
        _check_int("top_k", self.top_k, -1, MAX_TOP_K, f"-1 or 0 (off) or in [1, {MAX_TOP_K}]")
        _check_number("top_p", self.top_p, 0.0, 1.0, True, False)
        _check_number("min_p", self.min_p, 0.0, 1.0, False, False)
        _check_number("presence_penalty", self.presence_penalty,
                      -PENALTY_RANGE, PENALTY_RANGE, False, False)
        _check_number("frequency_penalty", self.frequency_penalty,
                      -PENALTY_RANGE, PENALTY_RANGE, False, False)
        _check_number("repetition_penalty", self.repetition_penalty,
                      0.0, MAX_REPETITION_PENALTY, True, False)
        if self.repetition_penalty < MIN_REPETITION_PENALTY:
            raise SamplingParamsError(
                "repetition_penalty",
                f"must be a number in (0, {MAX_REPETITION_PENALTY:g}] and >= {MIN_REPETITION_PENALTY:g} (the "
                f"sampler divides float32 logits by it: a smaller one makes them infinite), "
                f"got {_show(self.repetition_penalty)}")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, SEED_LIMIT - 1, "in [0, 2**63) or None")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError("stop", f"must be a str or a list of non-empty str, got {_show(self.stop)}")
        if not isinstance(self.stop_token_ids, list):
            raise SamplingParamsError("stop_token_ids", f"must be a list of int, got {_show(self.stop_token_ids)}")
        hi = None if vocab_size is None else vocab_size - 1
        what = "in [0, vocab_size" + (f"={vocab_size})" if vocab_size is not None else ")")
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0 or (hi is not None and t > hi):
                raise SamplingParamsError("stop_token_ids", f"must be a list of int {what}, got {_show(t)}")
        _check_bool("ignore_eos", self.ignore_eos)
        _check_int("max_tokens", self.max_tokens, 1, None, ">= 1")
        _check_int("min_tokens", self.min_tokens, 0, None, ">= 0")
        if self.truncate_prompt_tokens is not None:
            what = "equal to -1 or >= 1 (or None)"
            _check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, -1, None, what)
            if self.truncate_prompt_tokens == 0:
                raise SamplingParamsError("truncate_prompt_tokens", f"must be an int {what}, got 0")
        if self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens",
                f"must be an int in [0, max_tokens={_show(self.max_tokens)}], got {_show(self.min_tokens)}")
        if vocab_size is not None and self.min_tokens > 0:
            held = {t for t in self.all_stop_token_ids(eos_token_ids) if 0 <= t < vocab_size}
            if len(held) == vocab_size:
                eos = "" if self.ignore_eos or not eos_token_ids else " (with the EOS token ids)"
                raise SamplingParamsError(
                    "stop_token_ids",
                    f"must leave a token to sample while min_tokens={self.min_tokens} holds them back, but they"
                    f"{eos} cover the whole vocabulary ({vocab_size} tokens): leave one out or set min_tokens to 0")
        self._validate_token_controls(vocab_size)
        self._validate_guided()
        if vocab_size is not None and self.min_tokens > 0 and self.allowed_token_ids is not None:
            held = set(self.all_stop_token_ids(eos_token_ids))
            if held.issuperset(self.allowed_token_ids):
                raise SamplingParamsError(
                    "allowed_token_ids", f"must hold a token that min_tokens={self.min_tokens} does not hold back, "
                                         f"but all are stop_token_ids{'' if self.ignore_eos else ' or EOS'}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, max_logprobs, f"in [0, {max_logprobs}] or None")
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, 0, max_logprobs, f"in [0, {max_logprobs}] or None")
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        _check_bool("skip_special_tokens", self.skip_special_tokens)
        return self

    def _validate_token_controls(self, vocab_size: int | None) -> None:
        """logit_bias, allowed_token_ids, bad_words (see the module docstring for the ranges)."""
        ids = "in [0, vocab_size" + (f"={vocab_size})" if vocab_size is not None else ")")

        def token_id(name: str, t) -> None:
            if not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                raise SamplingParamsError(name, f"token ids must be ints {ids}, got {_show(t)}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise SamplingParamsError("logit_bias", f"must be a dict {{token id: bias}} or None, "
                                                        f"got {_show(self.logit_bias)}")
            if vocab_size is not None and len(self.logit_bias) > vocab_size:
                raise SamplingParamsError("logit_bias", f"holds {len(self.logit_bias)} entries, more than the "
                                                        f"vocabulary ({vocab_size} tokens)")
            for k, v in self.logit_bias.items():
                token_id("logit_bias", k)
                if not _is_number(v) or not -LOGIT_BIAS_RANGE <= v <= LOGIT_BIAS_RANGE:  # NaN fails too
                    raise SamplingParamsError("logit_bias", f"biases must be numbers in [-{LOGIT_BIAS_RANGE:g}, "
                                                            f"{LOGIT_BIAS_RANGE:g}], got {_show(v)} for token {k}")
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids:
                raise SamplingParamsError("allowed_token_ids", f"must be a non-empty list of token ids {ids} or "
                                                               f"None, got {_show(self.allowed_token_ids)}")
            for t in self.allowed_token_ids:
                token_id("allowed_token_ids", t)
        if self.bad_words is not None:
            words = self.bad_words
            if not isinstance(words, (list, tuple)) or len(words) > MAX_BAD_WORDS:
                raise SamplingParamsError("bad_words", f"must be a list of at most {MAX_BAD_WORDS} str or None, "
                                                       f"got {_show(words)}")
            for w in words:
                if not isinstance(w, str) or not w.strip() or len(w) > MAX_BAD_WORD_CHARS:
                    raise SamplingParamsError(
                        "bad_words", f"each word must be a str with a non-space character and at most "
                                     f"{MAX_BAD_WORD_CHARS} characters, got {_show(w)}")

    def _spread_structured_outputs(self) -> None:
        """structured_outputs / guided_decoding (vLLM's StructuredOutputsParams, or a dict of its fields)
        into the guided_* fields."""
        for name in ("structured_outputs", "guided_decoding"):
            so = getattr(self, name)
            if so is None:
                continue
            d = dict(so) if isinstance(so, dict) else getattr(so, "__dict__", None)
            if not isinstance(d, dict):
                raise SamplingParamsError(name, f"must be a StructuredOutputsParams or a dict, got {_show(so)}")
            known = {"json", "regex", "choice", "grammar", "json_object", "whitespace_pattern", "backend",
                     "disable_any_whitespace", "disable_fallback", "disable_additional_properties",
                     "structural_tag", "_backend", "_backend_was_auto"}
            unknown = sorted(set(d) - known, key=repr)
            if unknown:
                raise SamplingParamsError(name, f"unknown field {_show(unknown[0])} (known: json, regex, choice, "
                                                f"grammar, json_object, whitespace_pattern)")
            if d.get("structural_tag") is not None:
                raise SamplingParamsError(name, "structural_tag guides are not supported (json, regex, choice, "
                                                "grammar and json_object are)")
            for flag in ("json_object", "disable_any_whitespace", "disable_fallback", "disable_additional_properties"):
                if d.get(flag) is not None and not isinstance(d[flag], bool):     # ("no" is not false)
                    raise SamplingParamsError(name, f"{flag!r} must be a bool (true / false), got {_show(d[flag])}")
            if self._given_guides():
                raise SamplingParamsError(name, "give it or the guided_* fields, not both")
            self.guided_choice = d.get("choice")
            self.guided_regex = d.get("regex")
            self.guided_json = d.get("json")
            self.guided_json_object = d.get("json_object") or False
            self.guided_grammar = d.get("grammar")
            if not self._given_guides():
                raise SamplingParamsError(name, "needs one of choice, regex, json, grammar or json_object (json false "
                                                "matches nothing; a whitespace pattern alone guides nothing)")
            if d.get("whitespace_pattern") is not None:
                self.guided_whitespace_pattern = d["whitespace_pattern"]
            elif d.get("disable_any_whitespace"):
                self.guided_whitespace_pattern = ""
            setattr(self, name, None)

    @property
    def guide_error(self) -> str | None:
        """Why the guide gave up mid-request (its automaton outgrew its bounds; the request then ends with EOS
        and the engine reports finish_reason "error"), or None."""
        return self.__dict__.get("_guide_error")

    def _given_guides(self) -> list[str]:
        """The guided_* fields that are set (None and False are unset)."""
        return [f for f in GUIDED_FIELDS if getattr(self, f) is not None and getattr(self, f) is not False]

    @property
    def guided_kind(self) -> str | None:
        """Which guided_* field is set (None: none)."""
        given = self._given_guides()
        return given[0] if given else None

    def _validate_guided(self) -> None:
        if self.structured_outputs is not None or self.guided_decoding is not None:
            self._spread_structured_outputs()
        given = self._given_guides()
        if len(given) > 1:
            raise SamplingParamsError(given[1], f"give one guide at most, got {' and '.join(given)}")
        _check_bool("guided_json_object", self.guided_json_object)
        ws = self.guided_whitespace_pattern
        if ws is not None:
            if not isinstance(ws, str) or len(ws) > MAX_GUIDED_PATTERN:
                raise SamplingParamsError("guided_whitespace_pattern", f"must be a regular expression (str) of at most "
                                                                       f"{MAX_GUIDED_PATTERN} characters, got {_show(ws)}")
            if self.guided_kind not in ("guided_json", "guided_json_object"):
                raise SamplingParamsError("guided_whitespace_pattern", "only goes with guided_json or guided_json_object")
        if not given:
            return
        kind = given[0]
        if self.ignore_eos:
            raise SamplingParamsError(kind, "ends each output with EOS: it cannot go with ignore_eos")
        if self.allowed_token_ids is not None:
            raise SamplingParamsError(kind, "cannot go with allowed_token_ids (it sets the allowed tokens)")
        if kind == "guided_choice":
            g = self.guided_choice
            if not isinstance(g, (list, tuple)) or not 1 <= len(g) <= MAX_GUIDED_CHOICES or not all(
                    isinstance(c, str) and 0 < len(c) <= MAX_BAD_WORD_CHARS for c in g):
                raise SamplingParamsError("guided_choice", f"must be a list of 1 to {MAX_GUIDED_CHOICES} non-empty str "
                                                           f"of at most {MAX_BAD_WORD_CHARS} characters, got {_show(g)}")
            if self.min_tokens:
                raise SamplingParamsError("guided_choice", f"ends the output with EOS once it is a choice: min_tokens "
                                                           f"must be 0, got {self.min_tokens}")
            return
        self.guided_pattern()          # the pattern builds (syntax / schema errors name the field)

    def guided_pattern(self) -> str | None:
        """The regular expression guided_regex / guided_json / guided_json_object stands for (None for
        guided_choice or no guide); SamplingParamsError naming the field when it is unsupported."""
        kind, ws = self.guided_kind, self.guided_whitespace_pattern
        try:
            if ws is not None:
                parse(ws)
                parse(f"(?:{ws})")      # as the guide embeds it: anchors ("^", "$") have no place there
        except RegexError as e:
            raise SamplingParamsError("guided_whitespace_pattern", str(e)) from None
        if kind in ("guided_regex", "guided_grammar"):
            r = getattr(self, kind)
            if not isinstance(r, str) or len(r) > MAX_GUIDED_PATTERN:
                raise SamplingParamsError(kind, f"must be a str of at most {MAX_GUIDED_PATTERN} characters, "
                                                f"got {_show(r)}")
        elif kind == "guided_json":
            s = self.guided_json
            if not isinstance(s, (dict, str)) and s is not True:
                raise SamplingParamsError("guided_json", f"must be a JSON schema (a dict, its JSON text, or True), "
                                                         f"got {_show(s)}")
        elif kind != "guided_json_object":
            return None
        try:
            return guide_pattern(kind[len("guided_"):], getattr(self, kind) if kind != "guided_json_object" else None,
                                 ws)
        except ValueError as e:        # RegexError, JSONSchemaError, GrammarError
            raise SamplingParamsError(kind, str(e)) from None

    def set_guided(self, tokenizer, eos_token_ids, reasoning=None) -> None:
        """The guide against `tokenizer`'s token bytes (Tokenizer.token_bytes) and the model's EOS ids:
        guided_choice's prefix index, or the compiled automaton of the other guides. reasoning: None, or
        (ReasoningParser, mode) of a reasoning model's reply (sampling/reasoning.py): the guide then constrains the
        answer after the reasoning (any guide, guided_choice included, runs as an automaton)."""
        kind = self.guided_kind
        if kind is None:
            return
        eos = sorted({int(e) for e in eos_token_ids})
        if not eos:
            raise SamplingParamsError(kind, "needs a model with an EOS token")
        if kind == "guided_choice":
            try:
                choices = [c.encode("utf-8") for c in self.guided_choice]
            except UnicodeEncodeError:
                raise SamplingParamsError("guided_choice", "choices must be valid Unicode text") from None
        wrap = reasoning is not None and reasoning[1] != "closed"
        if kind != "guided_choice" or wrap:
            try:        # (a wrapped guided_choice: one of the choices, literally, as a regex)
                pattern = self.guided_pattern() if kind != "guided_choice" else \
                    "(?:" + "|".join(escape(c) for c in self.guided_choice) + ")"
                if wrap:
                    pattern = with_reasoning(pattern, *reasoning)
                object.__setattr__(self, "_guide", compile_guide(pattern, tokenizer, eos))
            except (RegexError, GuideError) as e:
                raise SamplingParamsError(kind, str(e)) from None
            return
        tb, index = tokenizer.token_bytes()
        longest = max((len(b) for b in index), default=0)   # no token spans more bytes: the lookups stop there
        object.__setattr__(self, "_guided", (choices, tb, index, eos, longest))

    def guided_mask(self, output_token_ids, vocab_size: int):
        """(bool [vocab_size] mask of the tokens the guide allows after `output_token_ids`, how many); the
        mask may be shared (cached per automaton state): do not modify it."""
        if self.guided_kind == "guided_choice" and "_guide" not in self.__dict__:
            if "_guided" not in self.__dict__:
                raise ValueError("SamplingParams.guided_choice: call set_guided(tokenizer, eos_token_ids) first "
                                 "(the engine's add_request does)")
            ids = [t for t in self.guided_allowed(output_token_ids) if t < vocab_size]
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[torch.tensor(ids, dtype=torch.int64)] = True
            return mask, len(ids)
        guide = self.__dict__.get("_guide")
        if guide is None:
            raise ValueError(f"SamplingParams.{self.guided_kind}: call set_guided(tokenizer, eos_token_ids) first "
                             f"(the engine's add_request does)")
        out = output_token_ids.tolist() if hasattr(output_token_ids, "tolist") else list(output_token_ids)
        try:
            return guide.mask(guide.state_after(out), vocab_size)
        except GuideError as e:     # the automaton outgrew its bounds mid-request: end this request (EOS, which
                                    # the engine finishes with reason "error" - guide_error), not the step
            logging.getLogger("decodekit").warning("%s: %s; the request ends here", self.guided_kind, e)
            object.__setattr__(self, "_guide_error", f"{self.guided_kind}: {e}")
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[[t for t in guide.eos if t < vocab_size]] = True
            return mask, int(mask.sum())

    def guided_allowed(self, output_token_ids) -> list[int]:
        """The tokens guided_choice allows after `output_token_ids`: those whose bytes extend the output
        towards a choice, EOS once it equals one (EOS alone when nothing else fits)."""
        choices, tb, index, eos, longest = self.__dict__["_guided"]
        out = b"".join(tb[int(t)] or b"" for t in output_token_ids)
        allowed: set[int] = set()
        seen: set[bytes] = set()     # remainders' heads already looked up (choices sharing a prefix)
        for c in choices:
            if not c.startswith(out):
                continue
            rest = c[len(out):len(out) + longest]
            if not rest:
                allowed.update(eos)
            if rest in seen:
                continue
            seen.add(rest)
            for k in range(1, len(rest) + 1):
                allowed.update(index.get(rest[:k], ()))
        return sorted(allowed) if allowed else list(eos)

    def encode_bad_words(self, tokenizer) -> list[list[int]]:
        """bad_words' token sequences with `tokenizer` (vLLM's rule: each word as written and after a space),
        remembered on these params for that tokenizer, so that set_bad_words_token_ids (the engine's add_request)
        finds them encoded: the server encodes them in a worker thread (1024 words of 1024 characters take ~0.5 s).
        Raises SamplingParamsError for a word that is not valid Unicode or encodes to nothing."""
        seqs: list[list[int]] = []
        for word in self.bad_words or []:
            try:
                plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
                spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            except ValueError:  # a lone surrogate
                raise SamplingParamsError("bad_words", f"{_show(word)} is not valid Unicode text") from None
            if not plain:
                raise SamplingParamsError("bad_words", f"{_show(word)} encodes to no tokens")
            seqs.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                seqs.append(spaced)
        object.__setattr__(self, "_bad_words_memo", _WordsMemo(tokenizer, self.bad_words, seqs))
        return seqs

    def set_bad_words_token_ids(self, tokenizer, vocab_size: int, eos_token_ids=()) -> None:
        """bad_words as token sequences (vLLM's rule, module docstring), with `tokenizer` (encode(text,
        add_special_tokens=False)); raises SamplingParamsError when a word is not valid Unicode, encodes to
        nothing or past the vocabulary, or when with allowed_token_ids nothing would ever be left to sample
        (every allowed token a one-token bad word, or one held back by min_tokens)."""
        memo = getattr(self, "_bad_words_memo", None)
        if memo is not None and memo.matches(tokenizer, self.bad_words):
            seqs = memo.seqs            # (encoded ahead by encode_bad_words, off the step loop)
        else:
            seqs = self.encode_bad_words(tokenizer)
        bad = next((t for q in seqs for t in q if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise SamplingParamsError("bad_words", f"encode to token id {bad}, outside the model's vocabulary "
                                                   f"[0, {vocab_size})")
        if self.allowed_token_ids is not None:
            banned = {q[0] for q in seqs if len(q) == 1}
            held = set(self.all_stop_token_ids(eos_token_ids)) if self.min_tokens else set()
            if (banned | held).issuperset(self.allowed_token_ids):
                what = "" if not held else f" (with the stop tokens min_tokens={self.min_tokens} holds back)"
                raise SamplingParamsError("bad_words", f"mask every one of allowed_token_ids{what}: nothing is "
                                                       f"left to sample")
        object.__setattr__(self, "_bad_words_token_ids", seqs)

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        """bad_words as token sequences (empty until set_bad_words_token_ids; always empty without bad_words)."""
        return getattr(self, "_bad_words_token_ids", []) if self.bad_words else []

    # ------------------------------------------------------------------ helpers
    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def reads_output_tokens(self) -> bool:
        """Whether the processed logits depend on the tokens generated so far (penalties, bad words of
        more than one token, guided_choice): speculative verification then hands each position its drafted
        prefix."""
        return (self.has_penalties or self.guided_kind is not None
                or any(len(q) > 1 for q in self.bad_words_token_ids))

    @property
    def masks_logits(self) -> bool:
        """Whether logit_bias, allowed_token_ids, bad_words or guided_choice change the logits."""
        return (bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words)
                or self.guided_kind is not None)

    def all_stop_token_ids(self, eos_token_ids) -> list[int]:
        """Token ids that end the request: ``stop_token_ids`` plus EOS unless ``ignore_eos``."""
        ids = list(self.stop_token_ids)
        if not self.ignore_eos:
            ids += [int(e) for e in eos_token_ids if int(e) not in ids]
        return ids

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
