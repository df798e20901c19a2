"""Guided (structured-output) decoding: a regular expression, a JSON schema or "any JSON object" compiled to
a byte-level automaton whose states give the tokens a request may sample next (vLLM's guided_regex /
guided_json / json_object; guided_choice has its own prefix rule in SamplingParams).

- ``regex.py``: the pattern subset and its compiler to a byte-level NFA (UTF-8 aware);
- ``automaton.py``: the lazily built DFA, the vocabulary walk that turns a state into a token mask, and the
  per-request state after the generated tokens;
- ``json_schema.py``: JSON schema -> pattern (the supported keywords and the deliberate deviations);
- ``grammar.py``: GBNF grammars -> rule sets; ``pda.py``: rule sets (regexes that call rules: recursion, as in
  nested JSON) run as a pushdown automaton with the DFA's interface, so masks and steps work the same.

``compile_guide`` caches compiled guides by (pattern, tokenizer, EOS ids): requests that share a schema
share its automaton and its per-state masks.
"""
from __future__ import annotations

import json as _json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .gcpause import gc_paused
from .automaton import DEAD, MAX_DFA_STATES, Guide, GuideError, LazyDFA, token_vocab
from .grammar import GrammarError, grammar_guide
from .json_schema import JSONSchemaError, json_object_guide, json_schema_guide
from .pda import LazyPDA, RuleSet, compile_rules
from .regex import RegexError, compile_nfa, escape, parse

MAX_PATTERN_CHARS = 200_000     # guided_regex / a schema's pattern: at most this many characters
GUIDE_CACHE = 64                # compiled guides kept (LRU)
GUIDE_CACHE_DFA_STATES = 200_000    # and their DFA states, all together (~200 MB of transition rows)

_guides: "OrderedDict[tuple, Guide]" = OrderedDict()
# The caches' lock: the server compiles guides in worker threads (server/async_engine.py prepare_request) while the
# step loop's add_request looks them up; held for the lookups and updates only, never while a guide compiles.
_cache_lock = threading.Lock()


@dataclass
class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams (GuidedDecodingParams before 0.10): give one of json (a schema: dict,
    JSON str or True), regex, choice or json_object=True; whitespace_pattern overrides the JSON whitespace.
    Passed to SamplingParams(structured_outputs=...) (or guided_decoding=...), which spreads it into its
    guided_* fields. grammar: a GBNF grammar (guided/grammar.py)."""
    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    backend: str | None = None                  # accepted and ignored (one backend here)
    disable_any_whitespace: bool = False
    disable_fallback: bool = False
    disable_additional_properties: bool = False


GuidedDecodingParams = StructuredOutputsParams


def compile_guide(pattern: "str | RuleSet", tokenizer, eos_token_ids) -> Guide:
    """The Guide of `pattern` (a regex, or a RuleSet) over `tokenizer`'s token bytes (cached); RegexError /
    GuideError when the pattern is unsupported or too large."""
    vocab = token_vocab(tokenizer)
    key = (pattern, id(vocab), tuple(sorted({int(e) for e in eos_token_ids})))
    with _cache_lock:
        g = _guides.get(key)
        if g is not None and g.vocab is vocab and len(g.dfa.sets) <= MAX_DFA_STATES // 2:
            _guides.move_to_end(key)
            return g
    # a new guide (or a fresh one for a guide whose DFA grew large: requests holding it keep it)
    with gc_paused():               # (hundreds of thousands of objects for a large pattern: gcpause.py)
        dfa = LazyPDA(compile_rules(pattern)) if isinstance(pattern, RuleSet) else LazyDFA(compile_nfa(pattern))
        g = Guide(dfa, vocab, key[2])
        if g.dfa.start == DEAD:
            raise GuideError("the pattern matches nothing")
        g.allowed_rows(g.initial)   # the first mask now: a pattern too ambiguous for it is refused here
    with _cache_lock:
        _guides[key] = g
        # at most GUIDE_CACHE guides, and the cached ones' DFAs (~1 KB a state) bounded together
        while len(_guides) > 1 and (len(_guides) > GUIDE_CACHE or sum(
                len(x.dfa.sets) for x in _guides.values()) > GUIDE_CACHE_DFA_STATES):
            _guides.popitem(last=False)
    return g


_patterns: "OrderedDict[tuple, str]" = OrderedDict()


def guide_pattern(kind: str, value, whitespace: str | None = None) -> "str | RuleSet":
    """The checked pattern (parsed once; cached) of a guide: kind "regex" (value: the pattern), "json"
    (value: a schema), "json_object" or "grammar" (value: GBNF text); a regex, or a RuleSet where the guide
    recurses (JSON containers, grammar rules). RegexError / JSONSchemaError / GrammarError when unsupported.
    `whitespace` (JSON guides' whitespace pattern) is the caller's to check (SamplingParams names its field)."""
    try:        # the key keeps the schema's key order: it is the generated properties' order
        text = value if isinstance(value, str) or value is None else _json.dumps(value)
    except RecursionError:
        raise JSONSchemaError("schema at /: nested too deeply") from None
    except (TypeError, ValueError) as e:
        raise JSONSchemaError(f"the schema must be JSON data (dicts, lists, str, numbers, bools, null): {e}") from None
    key = (kind, text, whitespace)
    with _cache_lock:
        hit = _patterns.get(key)
        if hit is not None:
            _patterns.move_to_end(key)
            return hit
    if kind == "regex":
        pattern = value
    elif kind == "json":
        pattern = json_schema_guide(value, whitespace=whitespace)
    elif kind == "json_object":
        pattern = json_object_guide(whitespace=whitespace)
    elif kind == "grammar":
        pattern = grammar_guide(value)
    else:
        raise ValueError(f"unknown guide kind {kind!r}")
    size = pattern.chars if isinstance(pattern, RuleSet) else len(pattern)
    if size > MAX_PATTERN_CHARS:
        raise (RegexError if kind == "regex" else GrammarError if kind == "grammar" else JSONSchemaError)(
            f"the pattern has {size} characters, more than {MAX_PATTERN_CHARS}")
    if not isinstance(pattern, RuleSet):     # (rule sets are compiled, so checked, by the functions above)
        parse(pattern)
    with _cache_lock:
        _patterns[key] = pattern
        if len(_patterns) > GUIDE_CACHE:
            _patterns.popitem(last=False)
    return pattern


__all__ = ["DEAD", "GrammarError", "Guide", "GuideError", "GuidedDecodingParams", "JSONSchemaError", "LazyDFA", "LazyPDA",
           "RegexError", "RuleSet", "StructuredOutputsParams", "compile_guide", "compile_nfa", "escape", "guide_pattern", "parse", "token_vocab"]
