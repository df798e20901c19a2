"""Guided decoding through the server: OpenAI's response_format (json_object, json_schema) and vLLM's
guided_regex / guided_json / structured_outputs give outputs that parse and validate (streamed too); bad
guides get a 400 naming the request field they came from; the server keeps serving."""
from __future__ import annotations

import functools
import json
import re

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")

CHAT = [{"role": "user", "content": "Give me a JSON description of a cat."}]
CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                        "lives": {"type": "integer", "minimum": 1, "maximum": 9}},
       "required": ["name", "lives"], "additionalProperties": False}


def _post(server, path, body):
    return httpx.post(server.url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=120)


def _chat(server, **kw):
    r = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 60, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_response_format_json_schema_and_object(server):
    jsonschema = pytest.importorskip("jsonschema")
    c = _chat(server, response_format={"type": "json_schema",
                                       "json_schema": {"name": "cat", "schema": CAT, "strict": True}})
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["message"]["content"]), CAT)
    c = _chat(server, response_format={"type": "json_object"}, temperature=0.7, seed=4)
    if c["finish_reason"] == "stop":
        assert isinstance(json.loads(c["message"]["content"]), dict)
    else:
        assert c["message"]["content"].startswith("{")
    c = _chat(server, structured_outputs={"json": CAT})
    jsonschema.validate(json.loads(c["message"]["content"]), CAT)
    assert wait_idle(server.aeng)


def test_guided_regex_completions_and_stream(server):
    pattern = r"[0-9]{3}-[0-9]{4}"
    r = _post(server, "/v1/completions", {"prompt": "Call me at", "max_tokens": 20, "temperature": 0.8, "seed": 1,
                                          "n": 2, "guided_regex": pattern})
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert re.fullmatch(pattern, c["text"]) and c["finish_reason"] == "stop", c
    r = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "Call me at", "max_tokens": 20, "temperature": 0, "stream": True,
        "structured_outputs": {"regex": pattern}})
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert re.fullmatch(pattern, text), text
    assert wait_idle(server.aeng)


def test_guided_grammar(server):
    """vLLM's guided_grammar (GBNF) and structured_outputs.grammar: the reply is a string of the grammar."""
    grammar = 'root ::= answer ", " reason "."\nanswer ::= "yes" | "no"\nreason ::= [a-z]+ (" " [a-z]+){0,6}'
    pattern = r"(?:yes|no), [a-z]+(?: [a-z]+){0,6}\."
    for extra in ({"guided_grammar": grammar}, {"structured_outputs": {"grammar": grammar}}):
        c = _chat(server, **extra)
        if c["finish_reason"] == "stop":
            assert re.fullmatch(pattern, c["message"]["content"]), c
        else:
            assert re.match(r"(?:yes|no)", c["message"]["content"]), c
    r = _post(server, "/v1/completions", {"prompt": "Is water wet?", "max_tokens": 30, "temperature": 0.8, "seed": 3,
                                          "n": 3, "guided_grammar": grammar})
    assert r.status_code == 200, r.text
    assert sum(re.fullmatch(pattern, c["text"]) is not None for c in r.json()["choices"]) >= 1, r.text
    assert wait_idle(server.aeng)


@pytest.mark.parametrize("body, param", [
    ({"guided_grammar": "root ::= undefined-rule"}, "guided_grammar"),
    ({"guided_grammar": 'root ::= ("a"'}, "guided_grammar"),
    ({"guided_grammar": ["root ::= x"]}, "guided_grammar"),
    ({"guided_grammar": 'root ::= "a"', "guided_regex": "a"}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "x ::= y"}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                         "if": {}}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"guided_json": {"type": "integer", "minimum": 5, "maximum": 1}}, "guided_json"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "response_format"),
    ({"structured_outputs": {"regex": "a(", "choice": None}}, "structured_outputs"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    ({"structured_outputs": {"json": False}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
    ({"guided_json": False}, "guided_json"),
    ({"guided_json": '[' * 3000 + ']' * 3000}, "guided_json"),
    ({"guided_json": functools.reduce(lambda s, _: {"type": "array", "items": s}, range(13), {})}, "guided_json"),
    ({"response_format": {"type": "json_object"}, "guided_whitespace_pattern": "(?!x)"}, "guided_whitespace_pattern"),
])
def test_bad_guides_get_a_400(server, body, param):
    r = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert len(err["message"]) < 600
    assert _chat(server, max_tokens=2)["finish_reason"] == "length"      # still serving
