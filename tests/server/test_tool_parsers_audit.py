"""Audit of the "auto" tool-call parsers (server/tools.py: parse_auto, AutoToolStream) and the reasoning parsers
(sampling/reasoning.py: split_reasoning, ReasoningStream) on their own, against vLLM's parsers of the same names
(hermes, llama3_json, mistral, pythonic; deepseek_r1, qwen3):

- the whole reply: content and calls (names, arguments JSON) for edge-case model outputs;
- streamed, in any chunking (one character at a time, random sizes, cuts inside tags and next to multi-byte
  characters): the content deltas add up to exactly the whole reply's content and the calls are the same
  (they go out whole at the end: one id each, their arguments whole);
- the reasoning split likewise, with the prompt's mode (open / closed / optional) and the chain the server runs:
  the reasoning stream's content view fed to the tool-call stream.

Deliberate deviations from vLLM pinned here: text around and between hermes calls stays content (vLLM keeps only
the text before the first call); calls must name a given tool and have object arguments, else the whole reply is
content (vLLM returns unknown names and any arguments); "arguments" given as a JSON string are read as the
object it holds (vLLM would send a JSON string of it).
"""
from __future__ import annotations

import json
import random

import pytest

from decodekit.sampling.reasoning import REASONING_PARSERS, ReasoningStream, split_reasoning
from decodekit.server.tools import AutoToolStream, parse_auto

TOOLS = [{"type": "function", "function": {"name": n}} for n in ("get_weather", "get_time", "a", "b")]
R1, QWEN3 = REASONING_PARSERS["deepseek_r1"], REASONING_PARSERS["qwen3"]
SAME = object()     # the whole text comes back as content, no calls


def chunkings(text: str, n: int = 25, seed: int = 0):
    """Prefix lengths to feed: one character at a time, then random sizes (1 to 9)."""
    yield list(range(1, len(text) + 1))
    rng = random.Random(seed * 7919 + len(text))
    for _ in range(n):
        cuts, k = [], 0
        while k < len(text):
            k = min(len(text), k + rng.choice((1, 1, 2, 3, 4, 5, 9)))
            cuts.append(k)
        yield cuts


def streamed(parser: str, text: str, cuts: list[int]):
    """As the server streams an "auto" reply: feed() on every prefix, finish() on the whole text."""
    st, sent = AutoToolStream(parser), ""
    for k in cuts:
        sent += st.feed(text[:k])
    tail, calls = st.finish(text, TOOLS)
    return sent + (tail or ""), calls


def fn(calls):
    return None if calls is None else [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                       for c in calls]


def check(parser: str, text: str, content, calls):
    got_content, got = parse_auto(parser, text, TOOLS)
    want_content = text if content is SAME else content
    assert got_content == want_content, (parser, text)
    assert fn(got) == calls, (parser, text)
    for c in got or []:
        assert c["type"] == "function" and c["id"].startswith("chatcmpl-tool-")
        c["function"]["arguments"].encode("utf-8")         # the reply goes out as UTF-8
        assert isinstance(json.loads(c["function"]["arguments"]), dict)
    assert len({c["id"] for c in got or []}) == len(got or [])
    for cuts in chunkings(text):
        s, scalls = streamed(parser, text, cuts)
        assert s == (text if got is None else got_content or ""), (parser, text, cuts)
        assert fn(scalls) == fn(got), (parser, text, cuts)
        if got is not None:         # ids: one per call, given once (the calls go out whole)
            assert len({c["id"] for c in scalls}) == len(scalls)


W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {"zone": "UTC"}}'
WP = [("get_weather", {"city": "Paris"})]
TP = [("get_time", {"zone": "UTC"})]

HERMES = [
    (f"<tool_call>{W}</tool_call>", None, WP),
    (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>", None, WP + TP),
    (f"Let me check.\n\n<tool_call>\n{W}\n</tool_call>", "Let me check.", WP),
    (f"pre <tool_call>{W}</tool_call> mid <tool_call>{T}</tool_call> post\n", "pre mid  post", WP + TP),
    (f"  \n<tool_call>{W}</tool_call>\n\n", None, WP),
    ('<tool_call>{"name": "a", "arguments": {"q": "say \\"hi\\" \\u00e9 😀 naïve", "n": {"x": [1, {"y": null}]}}}'
     '</tool_call>', None, [("a", {"q": 'say "hi" é 😀 naïve', "n": {"x": [1, {"y": None}]}})]),
    ('<tool_call>{"name": "a", "arguments": "{\\"k\\": [1, 2]}"}</tool_call>', None, [("a", {"k": [1, 2]})]),
    ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', SAME, None),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', SAME, None),
    (f'<tool_call>{W}</tool_call><tool_call>{{"name": "nope", "arguments": {{}}}}</tool_call>', SAME, None),
    ('<tool_call>{"name": "a", "arguments": {"k": 1</tool_call>', SAME, None),            # malformed
    ('Sure <tool_call>{"name": "a", "arguments": {"k": ', SAME, None),                    # cut short
    (f"<tool_call>{W}", None, WP),                                                          # unclosed at EOS
    ('<tool_call>{"name": "a", "arguments": {}} junk</tool_call>', SAME, None),
    ("<tool_call></tool_call>", SAME, None),
    ('<tool_call>[{"name": "a", "arguments": {}}]</tool_call>', SAME, None),
    ("no calls here, just </tool_call> and <tool_", SAME, None),
    ("", SAME, None),
    # a tag quoted inside the arguments (bug: the first </tool_call> ended the JSON: the call was lost)
    ('<tool_call>{"name": "a", "arguments": {"s": "</tool_call>"}}</tool_call>', None, [("a", {"s": "</tool_call>"})]),
    ('x <tool_call>{"name": "a", "arguments": {"s": "<tool_call>{}</tool_call>"}}</tool_call> y',
     "x y", [("a", {"s": "<tool_call>{}</tool_call>"})]),
]

LLAMA = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, WP),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "get_time", "parameters": {"zone": "UTC"}}', None, WP + TP),
    ('\n {"name": "a", "parameters": {"k": {"deep": [[1], {"z": "é\\"😀"}]}}}\n', None,
     [("a", {"k": {"deep": [[1], {"z": 'é"😀'}]}})]),
    ('{"name": "a", "parameters": "{\\"k\\": 1}"}', None, [("a", {"k": 1})]),
    ('{"name": "a", "arguments": {"k": 1}}', None, [("a", {"k": 1})]),
    ('{"name": "a"}', None, [("a", {})]),
    ('{"name": "zz", "parameters": {}}', SAME, None),
    ('{"name": "a", "parameters": {"k": 1}} trailing words', SAME, None),
    ('Here: {"name": "a", "parameters": {}}', SAME, None),
    ('{"name": "a", "parameters": {"k": ', SAME, None),
    ("<|python_tag|>", SAME, None),
    ("<|python_ta", SAME, None),
    ('{"name": "a", "parameters": {"s": "<|python_tag|>{"}}', None, [("a", {"s": "<|python_tag|>{"})]),
    ("Hello {world}", SAME, None),
]

MISTRAL = [
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_time", "arguments": {"zone": "UTC"}}]', None, WP + TP),
    ('I will look.\n[TOOL_CALLS][{"name": "a", "arguments": {"u": "ü\\"😀"}}]', "I will look.",
     [("a", {"u": 'ü"😀'})]),
    ('[TOOL_CALLS]a[ARGS]{"k": {"n": [1, 2]}}[TOOL_CALLS]b[ARGS] {}', None, [("a", {"k": {"n": [1, 2]}}), ("b", {})]),
    ('[TOOL_CALLS][{"name": "a", "arguments": "{\\"k\\": 1}"}]', None, [("a", {"k": 1})]),
    ('[TOOL_CALLS][{"name": "a", "arguments": {"s": "[TOOL_CALLS]"}}]', None, [("a", {"s": "[TOOL_CALLS]"})]),
    ("[TOOL_CALLS][]", SAME, None),                                                       # an empty call list
    ('[TOOL_CALLS][{"name": "zz", "arguments": {}}]', SAME, None),
    ('[TOOL_CALLS][{"name": "a", "arguments": {"k": 1}', SAME, None),
    ('[TOOL_CALLS]a[ARGS]{"k": 1} extra', SAME, None),
    ("[TOOL_CALLS]", SAME, None),
    ("text with [TOOL and [brackets]", SAME, None),
    # a tag quoted in v11 arguments (bug: the text was split on every [TOOL_CALLS]: the call was lost)
    ('[TOOL_CALLS]a[ARGS]{"s": "[TOOL_CALLS]b[ARGS]{}"}', None, [("a", {"s": "[TOOL_CALLS]b[ARGS]{}"})]),
    # vLLM's v11 text form, without [ARGS] (as it reads it: the name ends at the "{")
    ('[TOOL_CALLS]a{"k": 1}[TOOL_CALLS]b{}', None, [("a", {"k": 1}), ("b", {})]),
]

PYTHONIC = [
    ('[get_weather(city="Paris"), get_time(zone="UTC")]', None, WP + TP),
    ("[a(t=True, f=False, n=None, l=[[1, 2], (3, 4)], d={'k': {'j': [None]}}, x=-1.5, e='é\\'😀')]", None,
     [("a", {"t": True, "f": False, "n": None, "l": [[1, 2], [3, 4]], "d": {"k": {"j": [None]}}, "x": -1.5,
             "e": "é'😀"})]),
    ("\n  [a()]\n", None, [("a", {})]),
    ("<|python_start|>[a(k='<|python_end|>')]<|python_end|>", None, [("a", {"k": "<|python_end|>"})]),
    ('[a(s="""two\nlines""", u="\\u00e9")]', None, [("a", {"s": "two\nlines", "u": "é"})]),
    ("[]", SAME, None),                                                                  # an empty call list
    ("[zz(k=1)]", SAME, None),
    ("[a(k=1)", SAME, None),
    ("[a(k=1)] and text", SAME, None),
    ("Calling [a(k=1)]", SAME, None),
    ("[a(k=f(1))]", SAME, None),
    ("[a(1)]", SAME, None),
    ("[a(**kw)]", SAME, None),
    ("[a.b(k=1)]", SAME, None),
    ("[1, 2, 3]", SAME, None),
    ("[a(k=1j)]", SAME, None),
    ("[a(k=float('nan'))]", SAME, None),
]


@pytest.mark.parametrize("parser,cases", [("hermes", HERMES), ("llama3_json", LLAMA), ("mistral", MISTRAL),
                                          ("pythonic", PYTHONIC)])
def test_auto_parsers_whole_and_streamed(parser, cases):
    for text, content, calls in cases:
        check(parser, text, content, calls)


@pytest.mark.parametrize("parser,text,args", [
    ("hermes", '<tool_call>{"name": "a", "arguments": {"s": "\\ud83d and \\udc00"}}</tool_call>',
     {"s": "\ud83d and \udc00"}),
    ("llama3_json", '{"name": "a", "parameters": {"\\ud800": 1}}', {"\ud800": 1}),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"s": "x\\udfff"}}]', {"s": "x\udfff"}),
    ("pythonic", '[a(s="\\ud83d")]', {"s": "\ud83d"}),
])
def test_lone_surrogates_in_arguments_go_out_escaped(parser, text, args):
    """A lone surrogate written as an escape (a model cut between the halves of a pair) was put in the arguments
    as a raw character: the reply could not be encoded as UTF-8 (json_reply / sse: a 500, or a stream broken
    off). It now stays an escape in the arguments' JSON text, which reads back as the same value."""
    _, calls = parse_auto(parser, text, TOOLS)
    (call,) = calls
    call["function"]["arguments"].encode("utf-8")
    assert json.loads(call["function"]["arguments"]) == args


def test_random_replies_stream_like_the_whole_parse():
    """Random concatenations of tags, calls, partial tags, whitespace (Unicode too) and multi-byte text: the
    streamed content and calls equal the whole parse for every chunking."""
    pieces = {
        "hermes": ["<tool_call>", "</tool_call>", W, T, '{"name": "zz", "arguments": {}}', " ", "\n", "hi", "é😀",
                   "<tool", "<", "{", "\u00a0", "\u3000"],
        "mistral": ["[TOOL_CALLS]", "[ARGS]", '[{"name": "a", "arguments": {"k": 1}}]', "a", '{"x": 2}', " ", "\n",
                    "hi", "[TOOL", "[", "]", "é😀", "\u00a0"],
        "llama3_json": ["<|python_tag|>", '{"name": "a", "parameters": {"k": 1}}', ";", " ", "\n", "hi", "<|", "{",
                        "é", "\u00a0"],
        "pythonic": ["<|python_start|>", "<|python_end|>", "[a(k=1)", ", b(x=None, y=[True, (1, 2)])", "]", " ", "\n",
                     "hi", "<|", "[", "é", "\u00a0"],
    }
    rng = random.Random(1234)
    for parser, ps in pieces.items():
        for _ in range(150):
            text = "".join(rng.choice(ps) for _ in range(rng.randint(1, 7)))
            content, calls = parse_auto(parser, text, TOOLS)
            for cuts in chunkings(text, n=4, seed=rng.randint(0, 10 ** 6)):
                s, scalls = streamed(parser, text, cuts)
                assert s == (text if calls is None else content or ""), (parser, text, cuts)
                assert fn(scalls) == fn(calls), (parser, text, cuts)


def test_content_goes_out_before_the_call_and_never_a_tag():
    """Streamed: the text before a call goes out as it comes (less what may be the tag's start or whitespace
    before it); no part of a tag or of the calls goes out as content."""
    text = f"Checking the weather…\n<tool_call>\n{W}\n</tool_call>"
    st, deltas = AutoToolStream("hermes"), []
    for k in range(1, len(text) + 1):
        deltas.append(st.feed(text[:k]))
    sent = "".join(deltas)
    assert sent == "Checking the weather…" and "<" not in sent
    assert st.feed(text[:text.index("<tool_call>") + 3]) == ""
    tail, calls = st.finish(text, TOOLS)
    assert tail is None and fn(calls) == WP
    st = AutoToolStream("mistral")
    assert st.feed("Hi [TOOL") == "Hi" and st.feed("Hi [TOOLS are") == " [TOOLS are"


# --------------------------------------------------------------------------- reasoning
REASONING = [   # (parser, mode, output, reasoning, content)
    # <think> present (R1-0528 / Qwen3 write it), absent (R1's older template: the prompt opened it)
    (R1, "open", "<think>\nstep 1\n</think>\n\nAnswer: 4", "\nstep 1\n", "Answer: 4"),
    (R1, "open", "step 1</think>Answer", "step 1", "Answer"),
    (QWEN3, "optional", "<think>\nhm\n</think>\n\n4", "\nhm\n", "4"),
    (QWEN3, "optional", "4", None, "4"),                          # Qwen3 that answered without thinking
    # unterminated: all reasoning, no content
    (R1, "open", "<think>cut sh", "cut sh", None),
    (QWEN3, "optional", "<think>\ncut </thi", "\ncut </thi", None),
    # the prompt already ends in <think> (Qwen3 thinking-2507, R1 newer templates): the output starts reasoning
    (QWEN3, "open", "hm</think>\n\n4", "hm", "4"),
    (QWEN3, "open", "no end marker", "no end marker", None),
    # enable_thinking false: the prompt ends in <think>\n\n</think>: all content, markers included
    (QWEN3, "closed", "\n\n4 </think> x", None, "\n\n4 </think> x"),
    (R1, "closed", "<think>a</think>b", None, "<think>a</think>b"),
    # text after </think>: leading whitespace dropped, the rest kept as written (markers included)
    (R1, "open", "a</think> \n b </think> <think>é😀", "a", "b </think> <think>é😀"),
    (R1, "open", "a</think>\n\n", "a", None),
    (R1, "open", "</think>only", None, "only"),
    (QWEN3, "optional", "  <thinking>x", None, "  <thinking>x"),
    (QWEN3, "optional", "<thi", None, "<thi"),
    (R1, "open", "<<think>x</think>y", "<<think>x", "y"),
    (R1, "open", "x</think</think>y", "x</think", "y"),
]


def _stream_reasoning(parser, mode, text, cuts):
    st, r, c = ReasoningStream(parser, mode), "", ""
    for k in cuts[:-1]:
        dr, dc = st.feed(text[:k])
        r, c = r + dr, c + dc
    dr, dc = st.finish(text)
    return r + dr, c + dc


@pytest.mark.parametrize("case", REASONING, ids=lambda c: f"{c[0].name}-{c[1]}-{c[2][:14]!r}")
def test_reasoning_whole_and_streamed(case):
    parser, mode, text, reasoning, content = case
    assert split_reasoning(parser, mode, text) == (reasoning, content)
    for cuts in chunkings(text):
        r, c = _stream_reasoning(parser, mode, text, cuts)
        assert (r or None, c or None) == (reasoning, content), cuts


def test_reasoning_never_streams_a_marker_part():
    text = "<think>ab</think>\n\ncd"
    st, out = ReasoningStream(QWEN3, "optional"), []
    for k in range(1, len(text) + 1):
        out.append(st.feed(text[:k]))
    assert all("<" not in r and "<" not in c for r, c in out)
    assert "".join(r for r, _ in out) == "ab" and "".join(c for _, c in out) == "cd"


def test_random_reasoning_outputs_stream_like_the_split():
    rng = random.Random(99)
    pieces = ["<think>", "</think>", "<thi", "</th", " ", "\n", "abc", "é😀", "<", "\u00a0"]
    for parser in (R1, QWEN3):
        for mode in ("open", "closed", "optional"):
            for _ in range(120):
                text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))
                want = split_reasoning(parser, mode, text)
                for cuts in chunkings(text, n=3, seed=rng.randint(0, 10 ** 6)):
                    r, c = _stream_reasoning(parser, mode, text, cuts)
                    assert (r or None, c or None) == want, (parser.name, mode, text, cuts)


@pytest.mark.parametrize("parser,mode,text,reasoning,content,calls", [
    ("hermes", "optional", f"<think>\nneed weather\n</think>\n\n<tool_call>\n{W}\n</tool_call>", "\nneed weather\n",
     None, WP),
    ("hermes", "open", f"hm <tool_call> is a tag</think>Sure.\n<tool_call>{W}</tool_call>", "hm <tool_call> is a tag",
     "Sure.", WP),
    ("llama3_json", "open", '</think>\n\n{"name": "a", "parameters": {"k": 1}}', None, None, [("a", {"k": 1})]),
    ("pythonic", "optional", "<think>x</think>[a(k='</think>')]", "x", None, [("a", {"k": "</think>"})]),
    ("mistral", "closed", 'ok [TOOL_CALLS][{"name": "a", "arguments": {}}]', None, "ok", [("a", {})]),
    ("hermes", "open", "<think>still thinking <tool_call>{", "still thinking <tool_call>{", None, None),
])
def test_reasoning_then_tool_calls_as_the_server_chains_them(parser, mode, text, reasoning, content, calls):
    """The server's stream: the reasoning stream's content view (its content so far) is what the tool-call
    stream reads; in every chunking the parts add up to the whole reply's."""
    thinker = QWEN3 if mode == "optional" else R1
    r_whole, c_whole = split_reasoning(thinker, mode, text)
    c_text, got = parse_auto(parser, c_whole or "", TOOLS) if c_whole else (None, None)
    if got is None:
        c_text = c_whole
    assert (r_whole, c_text, fn(got)) == (reasoning, content, calls)
    for cuts in chunkings(text, n=15):
        rs, ts, r, c = ReasoningStream(thinker, mode), AutoToolStream(parser), "", ""
        for k in cuts[:-1]:
            dr, _ = rs.feed(text[:k])
            r, c = r + dr, c + ts.feed(rs.content)
        dr, _ = rs.finish(text)
        r, c = r + dr, c + ts.feed(rs.content)
        tail, scalls = ts.finish(rs.content, TOOLS)
        c += tail or ""
        assert (r or None, c or None, fn(scalls)) == (reasoning, content, calls), cuts
