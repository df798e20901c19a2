"""OpenAI / vLLM protocol fidelity of valid requests, with the official `openai` client and raw SSE: response
shapes (ids, objects, indices, finish reasons, usage counted with the tokenizer), streams (role first, per-choice
finish chunks, deltas joining to the non-streamed text, usage null on all chunks but the last when
include_usage asks for it), logprobs (chat bytes are the token's own bytes; completions text_offset indexes
the text, multi-byte characters included), tool calls, and OpenAI error bodies for unknown routes."""
from __future__ import annotations

import json

import pytest

from server_harness import wait_idle

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

EMOJI_CHAT = [{"role": "user", "content": "Reply with only the emoji 🎉🎉🎉 repeated."}]
MULTIBYTE = "Emoji: 🎉🙂 and 日本語 text"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string", "maxLength": 12}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "required": ["tz"], "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}}}}]
WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tok(server):
    return server.aeng.engine.tokenizer


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def _sse(server, path, body) -> list:
    """The stream's events as parsed JSON (the last one "[DONE]"), checking the SSE framing."""
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


# ----------------------------------------------------------------------------------------------- bugs fixed
def test_chat_logprob_bytes_are_the_tokens_own_bytes(client, server, tok):
    """Each content entry's `bytes` are its token's bytes (an emoji spans several tokens: their bytes, not the
    UTF-8 of the U+FFFD each decodes to alone), so joined they give the reply's text, streamed or not."""
    table = tok.token_bytes()[0]
    kw = dict(model="smollm2", messages=EMOJI_CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert "🎉" in c.message.content and c.finish_reason == "length"
    content = c.logprobs.content
    # (max_tokens may cut a character: the text then ends in U+FFFD, the bytes in that character's first bytes)
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == c.message.content
    for e in content:
        assert e.top_logprobs[0].logprob == e.logprob and e.top_logprobs[0].bytes == e.bytes  # greedy: rank 1
    assert any(e.token == "\ufffd" for e in content)         # (the case: tokens holding part of a character)
    assert all(bytes(e.bytes) in table for e in content)
    streamed = [e for ch in client.chat.completions.create(stream=True, **kw) if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert wait_idle(server.aeng)


def test_completion_text_offset_indexes_multibyte_text(server):
    """text_offset is each token's character position in the choice's text (echoed prompt then completion):
    tokens inside an emoji / CJK character begin at that character, so later offsets stay right; streamed
    chunks give the same offsets."""
    body = {"prompt": MULTIBYTE, "max_tokens": 6, "temperature": 0, "logprobs": 1, "echo": True}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    text, lp = c["text"], c["logprobs"]
    assert text.startswith(MULTIBYTE)
    offs = lp["text_offset"]
    assert offs[0] == 0 and offs == sorted(offs) and offs[-1] < len(text)
    whole = [(t, o) for t, o in zip(lp["tokens"], offs) if "\ufffd" not in t]
    assert len(whole) >= 5
    for t, o in whole:      # every whole token is found where its offset says
        assert text[o:o + len(t)] == t, (t, o, text)
    assert offs[lp["tokens"].index(" and")] == MULTIBYTE.index(" and")
    events = _sse(server, "/v1/completions", {**body, "stream": True})
    st = [e["choices"][0]["logprobs"] for e in events[:-1] if e["choices"][0]["logprobs"]]
    assert sum((x["text_offset"] for x in st), []) == offs
    assert sum((x["tokens"] for x in st), []) == lp["tokens"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_include_usage_null_on_other_chunks(server, path):
    """stream_options.include_usage: a last chunk with empty choices and the usage; every other chunk carries
    "usage": null (OpenAI); with continuous_usage_stats every chunk has the running usage."""
    body = {"max_tokens": 3, "temperature": 0, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": EMOJI_CHAT} if "chat" in path else {"prompt": "The capital of France is"})
    events = _sse(server, path, body)
    *chunks, last, done = events
    assert done == "[DONE]" and last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all("usage" in ch and ch["usage"] is None for ch in chunks)
    body["stream_options"]["continuous_usage_stats"] = True
    body["n"] = 1
    *chunks, last, done = _sse(server, path, body)
    assert all(ch["usage"] is not None for ch in chunks)
    assert [ch["usage"]["completion_tokens"] for ch in chunks][-1] == last["usage"]["completion_tokens"] == 3
    assert chunks[0]["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"]
    plain = _sse(server, path, {k: v for k, v in body.items() if k != "stream_options"})
    assert all("usage" not in ch for ch in plain[:-1])


def test_unknown_route_and_method_get_openai_errors(server):
    r = _post(server, "/v1/nope", {})
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------------------------- shapes
def test_completion_shapes_and_usage(client, server, tok):
    prompts = ["The capital of France is", "1, 2, 3,"]
    r = client.completions.create(model="smollm2", prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == "smollm2"
    assert isinstance(r.created, int) and r.created > 1_600_000_000
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text  # greedy
    assert all(c.finish_reason == "length" and c.logprobs is None for c in r.choices)
    ptoks = sum(len(tok.encode(p)) for p in prompts)        # each prompt counted once, whatever n
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (ptoks, 20, ptoks + 20)
    r = client.completions.create(model="smollm2", prompt=prompts[0], max_tokens=40, temperature=0, stop=["."])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == " Paris"
    assert r.usage.completion_tokens == 2           # " Paris" "." (the stop string's token counts)
    lp = client.completions.create(model="smollm2", prompt=prompts[0], max_tokens=0, echo=True, logprobs=0).choices[0]
    assert lp.text == prompts[0] and lp.finish_reason == "length"
    assert lp.logprobs.token_logprobs[0] is None and lp.logprobs.top_logprobs[0] is None
    assert all(len(t) == 1 for t in lp.logprobs.top_logprobs[1:])      # logprobs=0: the token itself
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="x", suffix="y", max_tokens=2)
    assert e.value.body["param"] == "suffix" and e.value.status_code == 400


def test_chat_shapes_stream_agrees_and_seeds(client, server, tok):
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12,
              temperature=0.9, seed=7, n=2, logprobs=True)
    r = client.chat.completions.create(**kw)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and isinstance(r.created, int)
    assert [c.index for c in r.choices] == [0, 1] and all(c.message.role == "assistant" for c in r.choices)
    assert r.choices[0].message.content != r.choices[1].message.content        # n samples differ ...
    assert [c.message.content for c in client.chat.completions.create(**kw).choices] == \
        [c.message.content for c in r.choices]                                 # ... and the seed reproduces them
    n_prompt = len(tok.encode(tok.apply_chat_template(kw["messages"], add_generation_prompt=True),
                              add_special_tokens=False))
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    assert sorted(c.index for c in chunks[0].choices) == [0, 1]
    assert all(c.delta.role == "assistant" for c in chunks[0].choices)
    for choice in r.choices:
        mine = [ch.choices[0] for ch in chunks[1:] if ch.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice.finish_reason]
        assert mine[-1].finish_reason and all(c.delta.role is None for c in mine)
    r = client.chat.completions.create(model="smollm2", messages=kw["messages"], max_completion_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)


def test_tool_call_shapes(client, server):
    kw = dict(model="smollm2", messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=60)
    r = client.chat.completions.create(tool_choice="required", **kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(tool_choice=named, **kw)
    assert r.choices[0].finish_reason == "stop"           # (OpenAI's for a forced function)
    args = r.choices[0].message.tool_calls[0].function.arguments
    assert json.loads(args)["tz"] in ("UTC", "CET")
    chunks = list(client.chat.completions.create(tool_choice=named, stream=True, **kw))
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_time"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == args
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["stop"]
    r = client.chat.completions.create(tool_choice="none", **{**kw, "max_tokens": 4})
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert wait_idle(server.aeng)


def test_side_endpoints(server, tok):
    r = httpx.get(server.url + "/v1/models").json()
    assert r["object"] == "list" and r["data"][0]["id"] == "smollm2" and r["data"][0]["object"] == "model"
    t = _post(server, "/tokenize", {"prompt": MULTIBYTE}).json()
    assert t["tokens"] == tok.encode(MULTIBYTE) and t["count"] == len(t["tokens"]) and t["max_model_len"] == 1024
    assert _post(server, "/detokenize", {"tokens": t["tokens"]}).json() == {"prompt": MULTIBYTE}
    assert httpx.get(server.url + "/health").status_code == 200
    assert "decodekit:generation_tokens_total" in httpx.get(server.url + "/metrics").text


def test_minus_inf_logprobs_serialise_as_vllm(tok):
    """A logprob of -inf (a token the model's logits rule out) goes out as -9999.0 (vLLM's clamp): the replies are
    written with allow_nan=False, so an -inf used to turn a valid request into a 500 (and a stream into invalid
    JSON)."""
    from types import SimpleNamespace
    from decodekit.engine.outputs import Logprob
    from decodekit.server import protocol as P
    a, b = tok.encode("Hi there", add_special_tokens=False)
    out = SimpleNamespace(token_ids=[a, b], logprobs=[{a: Logprob(-0.5, 1, "Hi")},
                                                      {b: Logprob(float("-inf"), 2, " there"), a: Logprob(0.0, 1, "Hi")}])
    for body in (P.chat_logprobs(out, 0, 2, tok), P.completion_logprobs(tok, out),
                 P.prompt_logprobs_json([None, out.logprobs[1]], [a, b], 1)):
        text = json.dumps(body, allow_nan=False)
        assert "-9999.0" in text and "Infinity" not in text
    assert P.completion_logprobs(tok, out)["token_logprobs"] == [-0.5, -9999.0]


def test_offset_cursor_streams_the_offsets_of_the_whole_text(tok):
    """A stream's text_offset comes from its choice's OffsetCursor, fed chunk by chunk: the same offsets as over
    all the tokens at once, in O(new tokens) a chunk (was: every chunk decoded all the tokens so far, ~12 s of
    event-loop time over a 6800-token stream)."""
    from decodekit.server import protocol as P
    ids = tok.encode("Emoji 🎉🙂 and 日本語 text, then more. " * 20, add_special_tokens=False)
    full = P.text_offsets(tok, ids)
    cur, k = P.OffsetCursor(tok), 0
    for step in (1, 3, 2, 7, 1, 5) * 40:
        k = min(k + step, len(ids))
        assert cur.offsets(ids[:k]) == full[:k]
    assert len(cur.offs) == len(ids)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stop_reason_names_the_stop_string_or_token(server, path, tok):
    """vLLM's choice field stop_reason: the stop string or stop token id that ended the choice, null for
    EOS / length; streamed, on the finishing chunk (null before)."""
    body = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    body.update({"messages": WEATHER} if "chat" in path else {"prompt": "The capital of France is"})
    key = "message" if "chat" in path else None

    def text_of(choice):
        return choice["message"]["content"] if key else choice["text"]
    free = _post(server, path, body).json()["choices"][0]
    assert free["finish_reason"] == "length" and free["stop_reason"] is None
    words = text_of(free).split()
    stop = words[1][:3]
    ids = tok.encode(text_of(free), add_special_tokens=False)
    for extra, want in (({"stop": ["\u2603", stop]}, stop), ({"stop_token_ids": [ids[2]]}, ids[2])):
        ch = _post(server, path, {**body, **extra}).json()["choices"][0]
        assert ch["finish_reason"] == "stop" and ch["stop_reason"] == want, ch
        chunks = [c for c in _sse(server, path, {**body, **extra, "stream": True})[:-1] if c["choices"]]
        fin = [c["choices"][0] for c in chunks if c["choices"][0].get("finish_reason")]
        assert len(fin) == 1 and fin[0]["finish_reason"] == "stop" and fin[0]["stop_reason"] == want
        assert all(c["choices"][0].get("stop_reason") is None for c in chunks if not c["choices"][0].get("finish_reason"))
