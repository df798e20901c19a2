"""Malformed and hostile requests found by the input-robustness audit: each gets a 4xx whose error names
the field (never a 500), and the server keeps serving (health, metrics, a correct answer, no KV block
left in use)."""
from __future__ import annotations

import json

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")

HUGE_INT = "1" + "0" * 400        # a JSON integer literal Python parses exactly; float() of it overflows
CHAT = [{"role": "user", "content": "hi"}]


def _post(server, path, raw: bytes):
    return httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)


def _body(**fields) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize("path, raw, param", [
    # was 500 "internal error: OverflowError: int too large to convert to float"
    ("/v1/completions", b'{"prompt": "hi", "repetition_penalty": ' + HUGE_INT.encode() + b"}", "repetition_penalty"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
                             b'"repetition_penalty": -' + HUGE_INT.encode() + b"}", "repetition_penalty"),
    # was 400 with param null (checked against the vocabulary only inside the engine)
    ("/v1/completions", _body(prompt="hi", top_k=2 ** 63), "top_k"),
    ("/v1/completions", _body(prompt="hi", stop_token_ids=[10 ** 9]), "stop_token_ids"),
    ("/v1/chat/completions", _body(messages=CHAT, max_tokens=2, top_k=-2), "top_k"),
    ("/v1/chat/completions", _body(messages=CHAT, max_tokens=2, stop_token_ids=[49152]), "stop_token_ids"),
    # was 500 "internal error: ValueError: prompt: not valid Unicode text" (a JSON "\ud800" escape)
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}',
     "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "\\udfff", "content": "hi"}], "max_tokens": 2}', "messages"),
    # was param "max_tokens" (which the client never sent): the conversation alone is over max_model_len
    ("/v1/chat/completions", _body(messages=[{"role": "user", "content": "hi " * 2000}]), "messages"),
])
def test_bad_requests_name_the_field(server, path, raw, param):
    r = _post(server, path, raw)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert len(err["message"]) < 400, err["message"]


def test_server_still_serves_after_the_bad_requests(server):
    for raw in (b'{"prompt": "hi", "temperature": ' + HUGE_INT.encode() + b"}",
                b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'):
        path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
        assert _post(server, path, raw).status_code == 400
    r = _post(server, "/v1/completions", _body(prompt="The capital of France is", max_tokens=4, temperature=0))
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"], r.text
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    assert wait_idle(server.aeng)


def test_stop_ids_that_leave_min_tokens_nothing_to_sample(server):
    """Was: accepted; every token was masked during min_tokens and token 0 came out. The stop ids plus the model's
    EOS ids cover the vocabulary: the engine refuses it, and the 400 names stop_token_ids."""
    eng = server.aeng.engine
    eos = set(eng.model_config.eos_token_ids) | set(eng.tokenizer.eos_token_ids or [])
    ids = [t for t in range(eng.model_config.vocab_size) if t not in eos]
    r = _post(server, "/v1/completions", _body(prompt="hi", max_tokens=4, min_tokens=2, stop_token_ids=ids))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stop_token_ids" and "min_tokens=2" in err["message"], err
    assert len(err["message"]) < 400 and wait_idle(server.aeng)


@pytest.mark.parametrize("path, fields, param", [
    # were 200 with the field ignored (a client asking for constrained output got free text)
    ("/v1/completions", dict(prompt="hi", guided_json={"type": "object", "patternProperties": {}}), "guided_json"),
    ("/v1/completions", dict(prompt="hi", guided_regex="(?<=a)b"), "guided_regex"),
    ("/v1/completions", dict(prompt="hi", guided_regex="a", guided_choice=["a"]), "guided_regex"),
    ("/v1/completions", dict(prompt="hi", guided_choice=[]), "guided_choice"),
    ("/v1/completions", dict(prompt="hi", prompt_logprobs=21), "prompt_logprobs"),
    ("/v1/completions", dict(prompt="hi", use_beam_search="yes"), "use_beam_search"),
    ("/v1/completions", dict(prompt="hi", use_beam_search=True, n=11), "n"),
    ("/v1/completions", dict(prompt="hi", use_beam_search=True, stop=["x"]), "stop"),
    ("/v1/completions", dict(prompt="hi", allowed_token_ids=[1, 99999999]), "allowed_token_ids"),
    ("/v1/chat/completions", dict(messages=CHAT, structured_outputs={"grammar": "root ::= x"}), "structured_outputs"),
    ("/v1/chat/completions", dict(messages=CHAT, add_generation_prompt="no"), "add_generation_prompt"),
    ("/v1/chat/completions", dict(messages=CHAT, continue_final_message=True, add_generation_prompt=True),
     "continue_final_message"),
    ("/v1/chat/completions", dict(messages=CHAT, echo=True), "echo"),
    ("/v1/chat/completions", dict(messages=CHAT, modalities=["audio"]), "modalities"),
    ("/v1/chat/completions", dict(messages=CHAT, bad_words=[""]), "bad_words"),
    # was "must be in [0, 1]", then 0 refused as "(0, 1]"
    ("/v1/completions", dict(prompt="hi", top_p=0), "top_p"),
])
def test_unsupported_or_out_of_range_fields_are_refused(server, path, fields, param):
    r = _post(server, path, _body(max_tokens=2, **fields))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if param == "top_p":
        assert "(0, 1]" in err["message"], err


def test_no_op_values_of_unsupported_fields_are_accepted(server):
    r = _post(server, "/v1/chat/completions", _body(messages=CHAT, max_tokens=2, add_generation_prompt=True,
                                                    modalities=["text"], echo=False, use_beam_search=False))
    assert r.status_code == 200, r.text


def test_top_k_past_the_vocabulary_keeps_every_token(server):
    # vLLM and transformers clamp top_k to the vocabulary: 10**9 is "off", the same draws as top_k -1
    texts = []
    for k in (10 ** 9, -1):
        r = _post(server, "/v1/completions", _body(prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                                   seed=7, top_k=k, ignore_eos=True))
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    assert texts[0] == texts[1]


def test_max_completion_tokens_wins_over_max_tokens(server):
    r = _post(server, "/v1/chat/completions", _body(messages=CHAT, max_tokens=2, max_completion_tokens=5,
                                                    temperature=0, ignore_eos=True))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text


def test_huge_prompts_are_refused_before_encoding(server):
    """Was: a ~4 MB prompt took ~1.6 s to encode before its 400, stalling every other request meanwhile."""
    import time
    limit = server.aeng.engine.tokenizer.max_prompt_chars(server.aeng.engine.max_model_len)
    text = "a" * (limit + 1)
    for path, fields, param in (("/v1/completions", dict(prompt=text), "prompt"),
                                ("/v1/chat/completions", dict(messages=[{"role": "user", "content": text}]),
                                 "messages")):
        t = time.perf_counter()
        r = _post(server, path, _body(max_tokens=2, **fields))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text[:300]
        assert "cannot fit" in r.json()["error"]["message"]
        assert time.perf_counter() - t < 30
    assert wait_idle(server.aeng)


def test_too_large_max_completion_tokens_and_a_string_response_format_are_named(server):
    """Second server audit: a too-large max_completion_tokens was reported as max_tokens; response_format as a
    string said "'response_format.type' ... got null"."""
    r = _post(server, "/v1/chat/completions", _body(messages=CHAT, max_completion_tokens=10**9))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_completion_tokens", err
    assert "max_completion_tokens" in err["message"] and "max_tokens (" not in err["message"], err
    r = _post(server, "/v1/chat/completions", _body(messages=CHAT, max_tokens=10**9))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    for path, extra in (("/v1/completions", dict(prompt="hi")), ("/v1/chat/completions", dict(messages=CHAT))):
        r = _post(server, path, _body(max_tokens=2, response_format="json", **extra))
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "response_format", err
        assert "must be an object" in err["message"] and "null" not in err["message"], err


@pytest.mark.parametrize("body,path", [
    ({"prompt": "x", "guided_regex": "\ud800"}, "guided_regex"),
    ({"prompt": "x", "guided_json": {"enum": ["a", "\udfff"]}}, "guided_json.enum[1]"),
    ({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["\udc00"]}}}},
     "response_format.json_schema.schema.enum[0]"),
    ({"tools": [{"function": {"parameters": {"properties": {"a\ud800": {}}}}}]},
     "tools[0].function.parameters.properties.a\\ud800"),
    ({"prompt": "x", "guided_json": {}, "guided_whitespace_pattern": "\ud800"}, "guided_whitespace_pattern"),
])
def test_lone_surrogates_named_by_path(body, path):
    """A lone surrogate (a JSON \\ud800 escape without its pair) anywhere in a body: a 400 naming where it is
    (the top-level field as param), never a codec error from deep inside a guide compiler; pairs are text."""
    from decodekit.server import protocol as P
    with pytest.raises(P.APIError) as e:
        P.parse_json_body(json.dumps(body).encode())
    assert e.value.status == 400 and e.value.message.startswith(f"'{path}' holds a lone surrogate")
    assert e.value.param == path.split(".")[0].split("[")[0]
    json.dumps(e.value.body()).encode("utf-8")         # the error itself is valid text
    assert P.parse_json_body(json.dumps({"prompt": "\ud83d\ude00 \\ud800"}).encode())["prompt"] == "😀 \\ud800"


def test_json_content_type_only(server):
    """Bodies are JSON: text/plain, forms and multipart (which a browser page may send to another origin without
    a preflight) are a 415 naming Content-Type, as vLLM refuses them; application/json with a charset, a +json
    type, or no Content-Type at all are read."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": ctype}, timeout=60)
        assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type", r.text
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json", None):
        headers = {"content-type": ctype} if ctype else {}
        r = httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=60)
        assert r.status_code == 200, (ctype, r.text)


HUGE = int("9" * 4000)            # a 4000-digit int: under Python's 4300-digit str limit, so JSON carries it
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "number", "maximum": -10 ** 400}}}}}]


@pytest.mark.parametrize("path, raw, param", [
    # was 500 "OverflowError: int too large to convert to float" (BeamSearchParams' math.isfinite)
    ("/v1/completions", b'{"prompt": "hi", "use_beam_search": true, "n": 2, "max_tokens": 2, "length_penalty": '
                        + HUGE_INT.encode() + b"}", "length_penalty"),
    ("/v1/chat/completions", _body(messages=CHAT, use_beam_search=True, n=2, max_tokens=2, length_penalty=11),
     "length_penalty"),
    # were 200 with the guide forced on ("no" is truthy) or silently read
    ("/v1/completions", _body(prompt="hi", max_tokens=4, structured_outputs={"json_object": "no"}),
     "structured_outputs"),
    ("/v1/completions", _body(prompt="hi", max_tokens=4, structured_outputs={"json": {"type": "object"},
                                                                              "disable_any_whitespace": "yes"}),
     "structured_outputs"),
    # was 200 ("user" untyped) / param "include_usage" (not a request field)
    ("/v1/completions", _body(prompt="hi", max_tokens=2, user=5), "user"),
    ("/v1/chat/completions", _body(messages=CHAT, max_tokens=2, user=["a"]), "user"),
    ("/v1/completions", _body(prompt="hi", max_tokens=2, stream=True, stream_options={"include_usage": "y"}),
     "stream_options"),
    ("/v1/chat/completions", _body(messages=CHAT, max_tokens=2, stream=True,
                                   stream_options={"include_usage": True, "continuous_usage_stats": 1}),
     "stream_options"),
])
def test_audit_round_two_fields_are_named(server, path, raw, param):
    r = _post(server, path, raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert len(err["message"]) < 400, err["message"]


def test_structured_outputs_flag_error_names_the_key(server):
    r = _post(server, "/v1/completions", _body(prompt="hi", max_tokens=4, structured_outputs={"json_object": "no"}))
    assert "'json_object' must be a bool" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("path, raw", [
    # were 500 "OverflowError" (math.isfinite of an int in the schema translator): huge int bounds are exact
    *[("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "response_format": '
       b'{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "' + kw + b'": '
       + HUGE_INT.encode() + b"}}}}") for kw in (b"minimum", b"maximum", b"exclusiveMinimum", b"exclusiveMaximum")],
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 3, "guided_json": {"type": "number", "minimum": -'
     + HUGE_INT.encode() + b"}}"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 3, "structured_outputs": {"json": {"type": "integer", '
                        b'"maximum": ' + HUGE_INT.encode() + b"}}}"),
    ("/v1/chat/completions", _body(messages=CHAT, max_tokens=3, tool_choice="required", tools=TOOLS)),
])
def test_huge_integer_schema_bounds_work_or_are_refused_cleanly(server, path, raw):
    r = _post(server, path, raw)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] in (
            "response_format", "guided_json", "structured_outputs", "tools"), err
        assert len(err["message"]) < 400, err["message"]


def test_schema_properties_not_an_object_says_so(server):
    """Was "'required' [] must list names in 'properties' (an object)" for "properties": [1]."""
    r = _post(server, "/v1/completions", _body(prompt="hi", guided_json={"type": "object", "properties": [1]}))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "guided_json", r.text
    assert "'properties' must be an object" in err["message"] and "'required'" not in err["message"], err


@pytest.mark.parametrize("path, fields, param", [
    # the 400s named the field but repeated all 4000 digits (the engine's max_model_len message: 8000+ characters)
    *[("/v1/completions", {"prompt": "hi", f: v}, f) for f in ("max_tokens", "top_k", "seed", "logprobs",
                                                             "temperature", "n", "truncate_prompt_tokens",
                                                             "prompt_logprobs", "min_tokens")
      for v in (HUGE, -HUGE)],
    *[("/v1/chat/completions", {"messages": CHAT, f: HUGE}, f) for f in ("max_tokens", "max_completion_tokens",
                                                                         "top_logprobs", "truncate_prompt_tokens",
                                                                         "seed", "n")],
    ("/v1/completions", {"prompt": [1, HUGE]}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], [-HUGE]]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "use_beam_search": True, "n": 2, "max_tokens": 2, "length_penalty": -HUGE},
     "length_penalty"),
    ("/detokenize", {"tokens": [1, HUGE]}, "tokens"),
])
def test_huge_values_are_not_echoed_in_full(server, path, fields, param):
    r = _post(server, path, json.dumps(fields).encode())
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param, err["message"][:300]
    assert len(err["message"]) < 400, err["message"][:300] + f"... ({len(err['message'])} characters)"


def test_server_serves_after_the_round_two_requests(server):
    assert httpx.get(server.url + "/health").status_code == 200
    r = _post(server, "/v1/completions", _body(prompt="The capital of France is", max_tokens=4, temperature=0))
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"], r.text
    assert wait_idle(server.aeng)
