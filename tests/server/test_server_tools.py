"""OpenAI tool calling on /v1/chat/completions (by guided decoding): a named tool_choice gives one call whose
arguments validate against the tool's schema (streamed: id and name first, then argument deltas that add up
to the same text); "required" gives calls of the given tools with valid arguments; "none" answers in text;
"auto" and malformed tools get a 400 naming the field; tool turns in the history are accepted."""
from __future__ import annotations

import json

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _post(server, body):
    return httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=120)


def _stream_args(server, body):
    """(the streamed tool call's arguments joined, the last finish_reason) of a named-function request."""
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={**body, "stream": True})
    chunks = [json.loads(line[6:])["choices"] for line in r.text.splitlines() if line.startswith("data: {")]
    args = "".join(c[0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks
                   if c and "tool_calls" in c[0]["delta"])
    return args, [c[0]["finish_reason"] for c in chunks if c][-1]


def test_named_tool_choice(server):
    r = _post(server, {"messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0,
                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop" and c["message"]["content"] is None, c
    lp = _post(server, {"messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0, "logprobs": True,
                        "tool_choice": "required"}).json()["choices"][0]
    r2 = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0, "logprobs": True, "stream": True,
        "tool_choice": "required"})
    streamed = [e for line in r2.text.splitlines() if line.startswith("data: {")
                for ch in json.loads(line[6:])["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert len(streamed) == len(lp["logprobs"]["content"]) > 0     # the calls' logprobs come whole too
    (call,) = c["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather" and call["id"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    # streamed: the same arguments, id and name in the first tool-call delta only
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0, "stream": True,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    deltas = [json.loads(line[6:])["choices"] for line in r.text.splitlines() if line.startswith("data: {")]
    calls = [d[0]["delta"]["tool_calls"][0] for d in deltas if d and "tool_calls" in d[0]["delta"]]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in x and "name" not in x["function"] for x in calls[1:])
    assert "".join(x["function"]["arguments"] for x in calls) == call["function"]["arguments"]
    assert deltas[-1][0]["finish_reason"] == "stop"
    assert wait_idle(server.aeng)


def test_required_tool_choice(server):
    for stream in (False, True):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": ASK, "tools": TOOLS, "max_tokens": 120, "temperature": 0.7, "seed": 3, "stream": stream,
            "tool_choice": "required"})
        assert r.status_code == 200, r.text
        if stream:
            chunks = [json.loads(line[6:])["choices"] for line in r.text.splitlines() if line.startswith("data: {")]
            last = [c[0] for c in chunks if c and c[0]["finish_reason"]][0]
            calls, finish = last["delta"].get("tool_calls"), last["finish_reason"]
        else:
            c = r.json()["choices"][0]
            calls, finish = c["message"].get("tool_calls"), c["finish_reason"]
        if finish == "length":
            continue
        assert finish == "tool_calls" and calls, r.text
        for call in calls:
            schema = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    assert wait_idle(server.aeng)


def test_required_with_defs_recursion_and_parallel_off(server):
    """Tools' own $defs and "#" references keep meaning their own schema inside the "required" wrapper
    (pydantic / OpenAI SDK tools); parallel_tool_calls false gives one call at most."""
    addr = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    person = {"$defs": {"Addr": addr}, "type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}, "home": {"$ref": "#/$defs/Addr"}},
        "required": ["name", "home"], "x-origin": "openapi"}
    tree = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "child": {"$ref": "#"}}, "required": ["name"]}
    tools = [{"type": "function", "function": {"name": "save_person", "parameters": person}},
             {"type": "function", "function": {"name": "plant", "parameters": tree}}]
    seen = set()
    for seed in range(4):
        r = _post(server, {"messages": ASK, "tools": tools, "tool_choice": "required", "max_tokens": 150,
                           "temperature": 1.0, "seed": seed, "parallel_tool_calls": seed % 2 == 0})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        if c["finish_reason"] != "tool_calls":
            assert c["finish_reason"] == "length" and c["message"]["content"], c
            continue
        calls = c["message"]["tool_calls"]
        assert seed % 2 == 0 or len(calls) == 1
        for call in calls:
            schema = {"save_person": person, "plant": tree}[call["function"]["name"]]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
            seen.add(call["function"]["name"])
    assert seen
    # a named function's reply cut by a stop string / max_tokens is still its call, arguments as far as they go
    # (as vLLM, and as the stream sends them)
    for cut in (dict(stop=["Paris"], max_tokens=60), dict(max_tokens=5)):
        body = {"messages": ASK, "tools": TOOLS, "temperature": 0, **cut,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        c = _post(server, body).json()["choices"][0]
        (call,) = c["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and c["message"]["content"] is None
        args = call["function"]["arguments"]
        try:
            jsonschema.validate(json.loads(args), WEATHER)
        except ValueError:
            assert c["finish_reason"] in ("stop", "length"), c
        streamed = _stream_args(server, body)
        assert streamed == (args, c["finish_reason"])


def test_none_and_history_with_tool_turns(server):
    hist = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    r = _post(server, {"messages": hist, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert isinstance(c["message"]["content"], str) and "tool_calls" not in c["message"]
    r = httpx.post(server.url + "/tokenize", json={"messages": hist, "tools": TOOLS})
    assert r.status_code == 200 and r.json()["count"] > 10, r.text


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS}, "tool_choice"),                                           # auto
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS + TOOLS[:1], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": "get_weather", "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_whitespace_pattern": "(?=x)"}, "guided_whitespace_pattern"),
    ({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": json.loads('{"anyOf": [' * 300 + '{}' + ']}' * 300)}}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tool_requests_get_a_400(server, body, param):
    r = _post(server, {"messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    bad_hist = [{"role": "assistant", "content": None, "tool_calls": "x"}] + ASK
    r = _post(server, {"messages": bad_hist, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    deep = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "a", "arguments": "[" * 5000}}]}]
    r = _post(server, {"messages": deep, "max_tokens": 2})
    assert r.status_code in (200, 400), r.text                    # the text reaches the template as it is


# --------------------------------------------------------------------------- "auto" with a tool-call parser
@pytest.fixture(scope="module", params=["hermes", "llama3_json", "mistral", "pythonic"])
def auto_server(request, aeng):
    from server_harness import LiveServer
    s = LiveServer(aeng, tool_call_parser=request.param)
    s.parser = request.param
    yield s
    s.stop()


FORCED = {  # the model's own tool-call syntax, forced with a guided regex so the tiny model writes it
    "hermes": r'Let me check\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", '
              r'"unit": "celsius"\}\}</tool_call>',
    "llama3_json": r'\{"name": "get_weather", "parameters": \{"city": "[A-Z][a-z]{2,8}", "unit": "celsius"\}\}',
    "mistral": r'Let me check\. \[TOOL_CALLS\] \[\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", '
               r'"unit": "celsius"\}\}\]',
    "pythonic": r'\[get_weather\(city="[A-Z][a-z]{2,8}", unit="celsius"\)\]',
}


def test_auto_reads_the_models_tool_calls(auto_server):
    s = auto_server
    base = {"messages": ASK, "tools": TOOLS, "max_tokens": 200, "temperature": 0}
    want_content = "Let me check." if s.parser in ("hermes", "mistral") else None
    for stream in (False, True):
        r = httpx.post(s.url + "/v1/chat/completions", timeout=120,
                       json={**base, "guided_regex": FORCED[s.parser], "stream": stream})
        assert r.status_code == 200, r.text
        if stream:
            chunks = [json.loads(line[6:])["choices"][0] for line in r.text.splitlines()
                      if line.startswith("data: {") and json.loads(line[6:])["choices"]]
            content = "".join(c["delta"].get("content") or "" for c in chunks) or None
            calls = [t for c in chunks for t in c["delta"].get("tool_calls", [])]
            finish = chunks[-1]["finish_reason"]
        else:
            c = r.json()["choices"][0]
            content, calls, finish = c["message"]["content"], c["message"].get("tool_calls"), c["finish_reason"]
        assert finish == "tool_calls" and content == want_content, r.text
        (call,) = calls
        assert call["function"]["name"] == "get_weather" and call["id"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    # no call in the reply: plain content, streamed as it comes
    for stream in (False, True):
        r = httpx.post(s.url + "/v1/chat/completions", timeout=120,
                       json={**base, "guided_regex": r"It is sunny in Paris\.", "stream": stream})
        text = r.json()["choices"][0]["message"]["content"] if not stream else "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in r.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"])
        assert text == "It is sunny in Paris.", r.text
    assert wait_idle(s.aeng)


def test_auto_parsers_on_text():
    from decodekit.server.tools import AutoToolStream, parse_auto
    tools = [{"function": {"name": "a"}}, {"function": {"name": "b"}}]
    cases = [
        ("hermes", 'x <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call> <tool_call>{"name": "b", '
                   '"arguments": "{\\"z\\": [1]}"}</tool_call>', "x", ["a", "b"]),
        ("hermes", '<tool_call>{"name": "a", "arguments": {}}', None, ["a"]),                      # unclosed at EOS
        # text after the calls (and a leading space) stays the content, streamed the same
        ("hermes", ' Sure. <tool_call>{"name": "a", "arguments": {}}</tool_call>\n\nA: done.\n', " Sure.\n\nA: done.",
         ["a"]),
        ("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", '
                   '"arguments": {}}</tool_call>', " then", ["a", "b"]),
        ("hermes", '<tool_call>{"name": "zzz", "arguments": {}}</tool_call>', "same", None),       # unknown tool
        ("hermes", '<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "same", None),        # not an object
        ("hermes", "plain <tool text", "same", None),
        ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {"k": 1}}; {"name": "b", "parameters": {}}',
         None, ["a", "b"]),
        ("llama3_json", '{"name": "a", "parameters": {"k": 1}} and more', "same", None),
        ("llama3_json", 'I think {"name": "a", "parameters": {}}', "same", None),
        ("mistral", 'ok [TOOL_CALLS] [{"name": "a", "arguments": {"k": 1}}, {"name": "b", "arguments": {}}]', "ok",
         ["a", "b"]),
        ("mistral", '[TOOL_CALLS]a[ARGS]{"k": [2]}[TOOL_CALLS]b[ARGS]{}', None, ["a", "b"]),   # v11 tokenizers
        ("mistral", '  ok [TOOL_CALLS] [{"name": "a", "arguments": {}}]', "  ok", ["a"]),
        ("mistral", '[TOOL_CALLS] [{"name": "zz", "arguments": {}}]', "same", None),
        ("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {}}] trailing', "same", None),
        ("mistral", "no [TOOL_ calls here", "same", None),
        ("pythonic", '[a(k=1, s="x", l=[1, (2, 3)], d={"q": None, "t": True}), b()]', None, ["a", "b"]),
        ("pythonic", '<|python_start|>[a(k=-1.5)]<|python_end|>', None, ["a"]),
        ("pythonic", '[a(k={1, 2})]', "same", None),                    # a set: no JSON for it
        ("pythonic", '[a(1)]', "same", None),                           # positional: no parameter name
        ("pythonic", '[a(k=open("x"))]', "same", None),                 # not a literal: never evaluated
        ("pythonic", '[zz()]', "same", None), ("pythonic", 'text [a()]', "same", None),
        # a tag that starts no call: the text as it is, the space before the tag too (streamed as well)
        ("mistral", "I think [TOOL_CALLS] is neat", "same", None),
        ("mistral", 'Sure! [TOOL_CALLS][{"name": "a", "arguments": {"city": "Par', "same", None),  # cut short
        ("hermes", "Use the <tool_call> tag like this", "same", None),
        # arguments that are no JSON (NaN, Infinity, 1e999 read as inf): not a call
        ("hermes", '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>', "same", None),
        ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1e999}}]', "same", None),
        ("llama3_json", '{"name": "a", "parameters": {"x": -Infinity}}', "same", None),
        ("pythonic", '[a(x=1e999)]', "same", None),
    ]
    for parser, text, content, names in cases:
        got_content, calls = parse_auto(parser, text, tools)
        assert got_content == (text if content == "same" else content), (parser, text)
        assert (calls is None) == (names is None) and [c["function"]["name"] for c in calls or []] == (names or [])
        for c in calls or []:
            assert isinstance(json.loads(c["function"]["arguments"]), dict)
        # streamed one character at a time: what goes out plus the end equals the parse
        st, sent = AutoToolStream(parser), ""
        for k in range(1, len(text) + 1):
            sent += st.feed(text[:k])
        tail, scalls = st.finish(text, tools)
        assert (scalls is None) == (calls is None)
        assert sent + (tail or "") == (text if calls is None else got_content or "")
        if calls is not None:
            assert _no_call_text(sent)


def _no_call_text(sent):
    return "<tool_call" not in sent and "{" not in sent and "[TOOL_CALLS" not in sent and "[" not in sent


def test_auto_without_a_parser_and_flag_pairing(server):
    r = _post(server, {"messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "decodekit.cli", "serve", "--enable-auto-tool-choice"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "--tool-call-parser" in p.stderr and "Traceback" not in p.stderr, p.stderr
