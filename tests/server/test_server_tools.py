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
    # a reply cut by a stop string is no whole JSON value: content, not a broken call
    r = _post(server, {"messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0, "stop": ["Paris"],
                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    c = r.json()["choices"][0]
    if c["message"].get("tool_calls"):
        jsonschema.validate(json.loads(c["message"]["tool_calls"][0]["function"]["arguments"]), WEATHER)
    else:
        assert isinstance(c["message"]["content"], str)


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
