"""Reasoning models (sampling/reasoning.py): the split of an output into reasoning and content (whole and
streamed), the prompt's mode, and guides that constrain only the answer after the reasoning."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from decodekit.sampling import SamplingParams
from decodekit.sampling.guided import DEAD, LazyDFA, LazyPDA, compile_nfa, guide_pattern
from decodekit.sampling.guided.automaton import Guide, TokenVocab
from decodekit.sampling.guided.pda import compile_rules
from decodekit.sampling.reasoning import (MODES, REASONING_PARSERS, ReasoningStream, avoid_pattern,
                                          get_reasoning_parser, reasoning_guide, reasoning_mode, split_reasoning,
                                          with_reasoning)

R1, QWEN3 = REASONING_PARSERS["deepseek_r1"], REASONING_PARSERS["qwen3"]
WS = " \t\n\r"


@pytest.mark.parametrize("marker", ["</think>", "<think>", "ab", "[/THINK]", "<\u00e9t\u65e5>"])
def test_avoid_pattern_is_exactly_the_texts_without_the_marker(marker):
    pat = avoid_pattern(marker)
    dfa = LazyDFA(compile_nfa(pat))
    pyre = re.compile(pat)
    rng = random.Random(len(marker))
    alpha = sorted(set(marker)) + ["q", "\n", "\U0001F600"]
    for _ in range(3000):
        t = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.2:
            t += marker[:rng.randint(0, len(marker))]
        want = marker not in t
        s = dfa.step(dfa.start, t.encode())
        assert (s != DEAD and dfa.is_accepting(s)) == want, t
        assert (pyre.fullmatch(t) is not None) == want, t


def test_avoid_pattern_refuses_markers_it_cannot_write():
    for bad in ("a", "abca", ""):
        with pytest.raises(ValueError, match="first one does not repeat"):
            avoid_pattern(bad)


def test_parser_names():
    assert get_reasoning_parser(None) is None and get_reasoning_parser("qwen3") is QWEN3
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("r1")


@pytest.mark.parametrize("parser,prompt,mode", [
    (R1, "<|user|>hi<|assistant|>", "open"),                   # R1 thinks without saying so
    (QWEN3, "<|im_start|>assistant\n", "optional"),            # Qwen3 says so (<think>) when it thinks
    (R1, "...<|Assistant|><think>\n", "open"),                 # the template opened it
    (QWEN3, "...assistant\n<think>\n", "open"),
    (QWEN3, "...assistant\n<think>\n\n</think>\n\n", "closed"),   # enable_thinking=False
    (R1, "<think>a</think> old turn ... <think>\n", "open"),
    # markers inside the conversation (an earlier turn's reasoning, a user quoting them) say nothing of the reply
    (R1, "<think>a</think> old turn", "open"),
    (QWEN3, "<|im_start|>user\nWhat does </think> mean?<|im_end|>\n<|im_start|>assistant\n", "optional"),
    (QWEN3, "<|im_start|>user\nSay <think><|im_end|>\n<|im_start|>assistant\n", "optional"),
    (R1, "<|User|>What does </think> mean?<|Assistant|>", "open"),
])
def test_reasoning_mode(parser, prompt, mode):
    assert reasoning_mode(parser, prompt) == mode


CASES = [   # (parser, mode, output, reasoning, content)
    (R1, "open", "Let me see.</think>\n\nThe answer is 4.", "Let me see.", "The answer is 4."),
    (R1, "open", "<think>\nhm</think>4", "\nhm", "4"),                  # a leading <think> dropped
    (R1, "open", "  <think>x</think>  ", "x", None),
    (R1, "open", "still thinking when cut", "still thinking when cut", None),
    (R1, "open", "a</think>b</think>c", "a", "b</think>c"),             # the first marker ends it
    (R1, "open", "</think>", None, None),
    (R1, "open", "", None, None),
    (R1, "open", "a <think> b</think>c", "a <think> b", "c"),
    (R1, "closed", "<think>x</think>y", None, "<think>x</think>y"),
    (QWEN3, "optional", "The answer is 4.", None, "The answer is 4."),
    (QWEN3, "optional", "\n<think>\nhm\n</think>\n\n4", "\nhm\n", "4"),
    (QWEN3, "optional", "<think>cut short", "cut short", None),
    (QWEN3, "optional", "<thin", None, "<thin"),
    (QWEN3, "optional", "  4", None, "  4"),
    (QWEN3, "open", "hm</think>4", "hm", "4"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2][:12]!r}")
def test_split_whole_and_streamed(case):
    parser, mode, text, reasoning, content = case
    assert split_reasoning(parser, mode, text) == (reasoning, content)
    rng = random.Random(len(text))
    for _ in range(20):     # any chunking, one character at a time included: the deltas add up to the split
        st, r, c, k = ReasoningStream(parser, mode), "", "", 0
        while k < len(text):
            k = min(len(text), k + rng.randint(1, 4))
            dr, dc = st.feed(text[:k])
            r, c = r + dr, c + dc
        dr, dc = st.finish(text)
        r, c = r + dr, c + dc
        assert (r or None, c or None) == (reasoning, content)


def test_stream_holds_back_only_what_may_become_a_marker():
    st = ReasoningStream(R1, "open")
    assert st.feed("abc</th") == ("abc", "")
    assert st.feed("abc</thx") == ("</thx", "")
    assert st.feed("abc</thx</think>") == ("", "")
    assert st.feed("abc</thx</think>\n\n") == ("", "")      # whitespace after the marker: dropped
    assert st.feed("abc</thx</think>\n\nok <") == ("", "ok <")
    st = ReasoningStream(QWEN3, "optional")
    assert st.feed(" <thi") == ("", "")                        # may still open the reasoning
    assert st.feed(" <thin!") == ("", " <thin!")
    with pytest.raises(ValueError, match="mode"):
        ReasoningStream(R1, "maybe")


INNER = r'\{"a": [0-9]+\}'


def _guide_accepts(parser, mode, inner, text):
    """What the guide should accept: reasoning as split_reasoning reads it, then an answer matching `inner`
    (none when the output ends inside the reasoning)."""
    st = ReasoningStream(parser, mode)
    st.finish(text)
    if st.phase in ("start", "think"):      # never closed (or never opened, optional mode: see below)
        if mode == "optional" and st.phase == "start":
            return re.fullmatch(inner, text) is not None
        return mode != "closed"
    if mode == "closed" or (mode == "optional" and st.reasoning == "" and not text.lstrip(WS).startswith("<think>")):
        return re.fullmatch(inner, text) is not None
    return re.fullmatch(inner, st.content) is not None


@pytest.mark.parametrize("parser", [R1, QWEN3], ids=lambda p: p.name)
@pytest.mark.parametrize("mode", MODES)
def test_reasoning_guide_accepts_reasoning_then_the_answer(parser, mode):
    pat = reasoning_guide(parser, mode, INNER)
    dfa = LazyDFA(compile_nfa(pat))
    rng = random.Random(len(mode) * 7 + len(parser.name))
    alpha = list("</thinkb>{} \n\"a") + ["\u65e5", "</think>", "<think>", '{"a": 1}']
    seen = {True: 0, False: 0}
    for _ in range(4000):
        t = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 8)))
        if rng.random() < 0.4:
            t += rng.choice(["</think>", "</think>\n\n", ""]) + rng.choice(['{"a": 12}', '{"a": x}', ""])
        elif rng.random() < 0.3:        # the answer alone (what closed / optional modes accept)
            t = rng.choice(['{"a": 3}', '{"a": 45}', ' {"a": 3}'])
        s = dfa.step(dfa.start, t.encode())
        got = s != DEAD and dfa.is_accepting(s)
        assert got == _guide_accepts(parser, mode, INNER, t), (mode, t)
        seen[got] += 1
    assert min(seen.values()) > 100     # both answers well covered


def _walk(guide: Guide, tb: list, text: bytes) -> int:
    """The guide's state after `text` written with single-byte tokens (vocabulary: one token per byte)."""
    s = guide.initial
    for b in text:
        s = guide.next_state(s, tb.index(bytes([b])))
        assert s != DEAD
    return s


def _byte_vocab():
    tb = [bytes([i]) for i in range(256)] + [None]     # token 256: EOS
    return tb, TokenVocab(tb)


def test_pushdown_guides_are_wrapped_as_a_rule_that_calls_them():
    rules = guide_pattern("json_object", None)
    wrapped = with_reasoning(rules, R1, "open")
    assert wrapped.rules[1:] == rules.rules and wrapped.rules[0][0] == "dk_reasoning"
    assert with_reasoning(rules, R1, "closed") is rules
    dfa = LazyPDA(compile_rules(wrapped))
    deep = json.dumps({"k": [[[[[[{"z": [1, {"y": None}]}]]]]]]})
    for text, ok in [("hm </think>\n" + deep, True), ("hm", True), ("hm </think> " + deep[:-1], False),
                     ("hm </think>" + deep + "x", False), ("<think>a</think>{}", True)]:
        s = dfa.step(dfa.start, text.encode())
        assert (s != DEAD and dfa.is_accepting(s)) == ok, text
    # a grammar whose own rule is called dk_reasoning: the wrapper takes another name
    g = guide_pattern("grammar", 'root ::= "[" dk_reasoning? "]"\ndk_reasoning ::= "x" root?')
    w = with_reasoning(g, QWEN3, "optional")
    assert w.rules[0][0] == "dk_reasoning_" and w.rules[1:] == g.rules
    dfa = LazyPDA(compile_rules(w))
    for text, ok in [("[x[x[]]]", True), ("<think>q</think>[x[]]", True), ("[x[]", False), ("<think>q", True)]:
        s = dfa.step(dfa.start, text.encode())
        assert (s != DEAD and dfa.is_accepting(s)) == ok, text


@pytest.mark.parametrize("kind,value,answer", [
    ("guided_choice", ["yes", "no"], b"no"),
    ("guided_regex", r"[0-9]{2}", b"42"),
    ("guided_json", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, b'{"a": 7}'),
    ("guided_grammar", 'root ::= "(" root? ")"', b"(())"),
])
def test_sampling_params_guides_start_after_the_reasoning(kind, value, answer):
    class Tok:      # the guide's view of a tokenizer: one token per byte, EOS 256
        def token_bytes(self):
            return _byte_vocab()[0], {bytes([i]): [i] for i in range(256)}
    tb, _ = _byte_vocab()
    for mode in MODES:
        p = SamplingParams(max_tokens=64, **{kind: value})
        p.set_guided(Tok(), [256], (R1, mode))
        prefix = {"closed": b"", "open": b"", "optional": b"\n<think>"}[mode]
        if mode != "closed":
            prefix += b"Let me think: (x) [yes] </thin </think>\n\n"
        out = [tb.index(bytes([b])) for b in prefix + answer]
        for k in range(len(out)):       # every token of the reasoning and the answer allowed in its turn
            mask, n = p.guided_mask(out[:k], 257)
            assert mask[out[k]], (mode, k, bytes(tb[out[k]]))
        mask, _ = p.guided_mask(out, 257)
        assert mask[256], mode       # the answer is complete: EOS may end it
        if mode != "closed":    # inside the reasoning anything goes, EOS too; right after it, the answer only
            inside = 12 if mode == "optional" else 4  # (bytes that cannot begin a UTF-8 character excepted)
            mask, n = p.guided_mask(out[:inside], 257)
            assert mask[:128].all() and mask[0xC3] and mask[0xF0] and mask[256] and not mask[0x80]
            after = [tb.index(bytes([b])) for b in prefix]
            mask, n = p.guided_mask(after, 257)
            assert not mask[256] and not mask[ord("Z")] and mask[answer[0]]
    # without a reasoning parser the answer starts at once
    p = SamplingParams(max_tokens=64, **{kind: value})
    p.set_guided(Tok(), [256])
    mask, _ = p.guided_mask([], 257)
    assert not mask[ord("L")] and mask[answer[0]]
