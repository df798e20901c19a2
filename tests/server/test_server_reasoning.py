"""Reasoning models on /v1/chat/completions (--reasoning-parser): the <think> part as reasoning_content, the
answer as content (streamed deltas add up to the same), structured outputs and tool calls on the answer only;
chat_template_kwargs, request templates (--trust-request-chat-template) and --chat-template."""
from __future__ import annotations

import json

import httpx
import pytest

from server_harness import LiveServer, wait_idle

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
ASK = [{"role": "user", "content": "What is 2+2? Answer in JSON."}]
# the reply continues an assistant turn that opened its reasoning (as DeepSeek-R1's template does)
THINKING = ASK + [{"role": "assistant", "content": "<think>\nThe user wants"}]
CLOSED = ASK + [{"role": "assistant", "content": "<think>\nsimple\n</think>\n\n"}]
CONT = {"add_generation_prompt": False, "continue_final_message": True}


@pytest.fixture(scope="module")
def rserver():
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.server.async_engine import AsyncEngine
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    a = AsyncEngine(LLMEngine(EngineArgs(kv_cache_memory="64MiB", max_model_len=1024, seed=0,
                                         reasoning_parser="deepseek_r1")))
    a.start()
    s = LiveServer(a, reasoning_parser="deepseek_r1", trust_request_chat_template=True,
                   tool_call_parser="hermes")
    # the embedded model does not think by itself: a bias on "</" makes it close its reasoning ("</" "think" ">")
    s.close_bias = {str(a.engine.tokenizer.encode("</think>", add_special_tokens=False)[0]): 8}
    yield s
    s.stop()
    a.shutdown()


def _post(s, body, stream=False):
    r = httpx.post(s.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=300)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def _joined(chunks, key, index=0):
    parts = [c["choices"][0]["delta"].get(key) for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
    return "".join(p for p in parts if p) or None


def _both_ways(s, body):
    """(message, finish_reason) of the request, after checking its stream adds up to the same."""
    whole = _post(s, body)["choices"][0]
    chunks = _post(s, body, stream=True)
    msg = whole["message"]
    assert _joined(chunks, "reasoning_content") == msg["reasoning_content"] == msg["reasoning"]
    assert _joined(chunks, "reasoning") == msg["reasoning"]
    if msg.get("tool_calls") is None:
        assert _joined(chunks, "content") == msg["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == whole["finish_reason"]
    return msg, whole["finish_reason"]


def test_reasoning_then_a_json_answer(rserver):
    s = rserver
    body = {"messages": THINKING, **CONT, "max_tokens": 60, "temperature": 0, "logit_bias": s.close_bias,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}
    msg, finish = _both_ways(s, body)
    assert msg["reasoning_content"] and "</think>" not in msg["reasoning_content"]
    assert isinstance(json.loads(msg["content"])["answer"], int), msg
    assert finish == "stop"
    # the raw text, through /v1/completions on the same prompt: reasoning </think> whitespace answer
    ids = httpx.post(s.url + "/tokenize", json={"messages": THINKING, **CONT}).json()["tokens"]
    raw = httpx.post(s.url + "/v1/completions", json={"prompt": ids, "max_tokens": 60, "temperature": 0,
                                                       "logit_bias": s.close_bias, "guided_json": SCHEMA},
                     timeout=300).json()["choices"][0]["text"]
    head, sep, tail = raw.partition("</think>")
    assert sep and head == msg["reasoning_content"] and tail.lstrip() == msg["content"]
    wait_idle(s.aeng)


def test_reasoning_cut_short_and_switched_off(rserver):
    s = rserver
    msg, finish = _both_ways(s, {"messages": THINKING, **CONT, "max_tokens": 8, "temperature": 0,
                                 "guided_json": SCHEMA})
    assert finish == "length" and msg["reasoning_content"] and msg["content"] is None
    # the prompt closed the reasoning: the answer starts at once, guided from its first token
    msg, finish = _both_ways(s, {"messages": CLOSED, **CONT, "max_tokens": 30, "temperature": 0,
                                 "guided_json": SCHEMA})
    assert msg["reasoning_content"] is None and json.loads(msg["content"]).keys() == {"answer"}


def test_choice_regex_and_seeded_sampling_after_the_reasoning(rserver):
    s = rserver
    base = {"messages": THINKING, **CONT, "max_tokens": 60, "logit_bias": s.close_bias}
    msg, _ = _both_ways(s, {**base, "temperature": 0, "guided_choice": ["four", "five"]})
    assert msg["content"] in ("four", "five") and msg["reasoning_content"]
    msg, _ = _both_ways(s, {**base, "temperature": 0, "guided_regex": "[0-9]+"})
    assert msg["content"].isdigit()
    r = _post(s, {**base, "temperature": 0.8, "seed": 3, "n": 3, "guided_json": SCHEMA})
    for c in r["choices"]:      # whatever the sampled reasoning, an answer that follows it is the schema's
        m = c["message"]
        if m["content"] is not None:
            assert json.loads(m["content"]).keys() == {"answer"}
        assert m["reasoning_content"] is None or "</think>" not in m["reasoning_content"]
    again = _post(s, {**base, "temperature": 0.8, "seed": 3, "n": 3, "guided_json": SCHEMA})
    assert [c["message"] for c in again["choices"]] == [c["message"] for c in r["choices"]]


def test_tool_calls_come_from_the_answer(rserver):
    s = rserver
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
    base = {"messages": THINKING, **CONT, "max_tokens": 80, "temperature": 0, "logit_bias": s.close_bias,
            "tools": tools}
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        r = _post(s, {**base, "tool_choice": choice})["choices"][0]
        calls = r["message"]["tool_calls"]
        assert calls and r["message"]["reasoning_content"] and r["message"]["content"] is None
        for call in calls:
            assert call["function"]["name"] == "add"
            assert json.loads(call["function"]["arguments"]).keys() == {"a", "b"}
        chunks = _post(s, {**base, "tool_choice": choice}, stream=True)
        assert _joined(chunks, "reasoning_content") == r["message"]["reasoning_content"]
        args: dict[int, str] = {}
        for c in chunks:
            for t in c["choices"][0]["delta"].get("tool_calls", []) if c["choices"] else []:
                args[t["index"]] = args.get(t["index"], "") + (t["function"].get("arguments") or "")
        assert [json.loads(a) for _, a in sorted(args.items())] == [json.loads(c["function"]["arguments"])
                                                                   for c in calls]
    # "auto" (hermes): a <tool_call> inside the reasoning is thinking, not a call
    forced = r'<tool_call>\{"name": "add", "arguments": \{"a": 1, "b": 2\}\}</tool_call>'
    r = _post(s, {**base, "tool_choice": "auto", "guided_regex": forced})["choices"][0]
    assert r["finish_reason"] == "tool_calls" and r["message"]["tool_calls"][0]["function"]["name"] == "add"
    thought = [{"role": "user", "content": "Add 1 and 2."},
               {"role": "assistant", "content": '<think>\nI could write <tool_call>{"name": "add", "arguments": '
                                                '{"a": 1, "b": 2}}</tool_call> but'}]
    r = _post(s, {**base, "messages": thought, "tool_choice": "auto", "max_tokens": 5})["choices"][0]
    assert r["message"].get("tool_calls") is None and r["finish_reason"] == "length"


TEMPLATE = ("{% for m in messages %}[{{ m.role }}{% if m.reasoning_content %} thought={{ m.reasoning_content }}"
            "{% endif %}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]"
            "{% if greeting is defined %} {{ greeting }}{% endif %}{% endif %}")


def _render(s, body):
    r = httpx.post(s.url + "/tokenize", json=body, timeout=60)
    return r, (httpx.post(s.url + "/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
               if r.status_code == 200 else None)


def test_chat_template_kwargs_and_request_templates(rserver, server):
    s = rserver
    hist = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "reasoning_content": "be nice"},
            {"role": "user", "content": "bye"}]
    r, text = _render(s, {"messages": hist, "chat_template": TEMPLATE, "chat_template_kwargs": {"greeting": "Ahoy"}})
    assert r.status_code == 200 and text == "[user] hi\n[assistant thought=be nice] hello\n[user] bye\n[assistant] Ahoy"
    # the kwargs reach the model's own template too (an unknown variable is just unused)
    r = httpx.post(s.url + "/v1/chat/completions", timeout=120, json={
        "messages": ASK, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    r = httpx.post(s.url + "/v1/chat/completions", timeout=120, json={
        "messages": ASK, "max_tokens": 3, "temperature": 0, "chat_template": TEMPLATE + " Sure:"})
    assert r.status_code == 200, r.text
    bad = [({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
           ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
           ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs"),
           ({"chat_template": "{% for %}"}, "chat_template"),
           ({"chat_template": 7}, "chat_template"),
           ({"chat_template": TEMPLATE + "{{ raise_exception('no') }}"}, "messages"),
           # (audit: a trusted template's nested loops rendered 17 GB and the kernel killed the server)
           ({"chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"},
            "chat_template")]
    for extra, param in bad:
        for path in ("/v1/chat/completions", "/tokenize"):
            r = httpx.post(s.url + path, json={"messages": ASK, "max_tokens": 2, **extra}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, extra, r.text)
    # a server that does not trust requests' templates refuses them, naming the field and the flag
    for path in ("/v1/chat/completions", "/tokenize"):
        r = httpx.post(server.url + path, json={"messages": ASK, "max_tokens": 2, "chat_template": TEMPLATE})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
        assert "--trust-request-chat-template" in r.json()["error"]["message"]
    # no reasoning parser there: no reasoning fields
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}, timeout=120)
    assert "reasoning_content" not in r.json()["choices"][0]["message"]
    wait_idle(s.aeng)


def test_server_chat_template_flag(tmp_path):
    from decodekit.server import read_chat_template
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    assert read_chat_template(str(f)) == TEMPLATE and read_chat_template(TEMPLATE) == TEMPLATE
    assert read_chat_template(None) is None
    for bad, why in [(str(tmp_path / "missing.jinja"), "neither a file nor"), ("{% if %}", "not valid Jinja")]:
        with pytest.raises(ValueError, match=why) as e:
            read_chat_template(bad)
        assert str(e.value).startswith("--chat-template")
