"""Beam search through the server (vLLM's use_beam_search with n beams and length_penalty): n choices best
first (scores from the returned logprobs), a beam of 1 is greedy, streamed the same as
not, per prompt of a batch, in chat; fields a beam search cannot honour get a 400 naming them; a client
that leaves mid-search frees everything."""
from __future__ import annotations

import json
import socket
import time

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")


def _post(server, path, body):
    return httpx.post(server.url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=120)


def _ok(server, path, body):
    r = _post(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def _score(choice, prompt_tokens: int, length_penalty: float) -> float:
    lps = choice["logprobs"]["token_logprobs"]
    n = prompt_tokens + len(lps) - (choice["finish_reason"] == "stop")
    return sum(lps) / n ** length_penalty


@pytest.mark.parametrize("lp", [1.0, 0.0])
def test_completions_beams_best_first(server, lp):
    body = {"prompt": "The capital of France is", "use_beam_search": True, "n": 3, "max_tokens": 8,
            "logprobs": 2, "length_penalty": lp, "temperature": 0.7}
    r = _ok(server, "/v1/completions", body)
    ch = r["choices"]
    assert [c["index"] for c in ch] == [0, 1, 2]
    assert len({c["text"] for c in ch}) == 3                 # distinct hypotheses
    p = r["usage"]["prompt_tokens"]
    scores = [_score(c, p, lp) for c in ch]
    assert scores == sorted(scores, reverse=True)
    for c in ch:
        assert c["finish_reason"] in ("stop", "length")
        assert len(c["logprobs"]["tokens"]) <= 8
        assert all(len(t) <= 3 for t in c["logprobs"]["top_logprobs"])  # the top 2 and the chosen token
    assert r["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in ch)
    # temperature does not change a beam search; streamed gives the same choices
    again = _ok(server, "/v1/completions", {**body, "temperature": 0})
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in ch]
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as s:
        assert s.status_code == 200
        lines = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    texts, finish = {}, {}
    for ln in lines[:-1]:
        for c in json.loads(ln)["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            finish[c["index"]] = c["finish_reason"] or finish.get(c["index"])
    assert [texts[i] for i in range(3)] == [c["text"] for c in ch]
    assert [finish[i] for i in range(3)] == [c["finish_reason"] for c in ch]
    assert wait_idle(server.aeng, 10)


def test_one_beam_is_greedy_and_batches(server):
    prompts = ["Once upon a time", "1, 2, 3,"]
    beam = _ok(server, "/v1/completions", {"prompt": prompts, "use_beam_search": True, "n": 1, "max_tokens": 10,
                                           "ignore_eos": True})
    greedy = _ok(server, "/v1/completions", {"prompt": prompts, "temperature": 0, "max_tokens": 10,
                                             "ignore_eos": True})
    assert [c["text"] for c in beam["choices"]] == [c["text"] for c in greedy["choices"]]
    two = _ok(server, "/v1/completions", {"prompt": prompts, "use_beam_search": True, "n": 2, "max_tokens": 6})
    assert [c["index"] for c in two["choices"]] == [0, 1, 2, 3]
    echo = _ok(server, "/v1/completions", {"prompt": prompts[0], "use_beam_search": True, "n": 2, "max_tokens": 4,
                                           "echo": True})
    assert all(c["text"].startswith(prompts[0]) for c in echo["choices"])


def test_chat_beams(server):
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "use_beam_search": True, "n": 2,
            "max_tokens": 12, "logprobs": True, "top_logprobs": 1}
    r = _ok(server, "/v1/chat/completions", body)
    assert [c["index"] for c in r["choices"]] == [0, 1]
    for c in r["choices"]:
        assert c["message"]["role"] == "assistant" and c["message"]["content"]
        assert c["logprobs"]["content"] and all(len(t["top_logprobs"]) <= 1 for t in c["logprobs"]["content"])
    sums = [sum(t["logprob"] for t in c["logprobs"]["content"]) for c in r["choices"]]
    assert r["choices"][0]["message"]["content"] != r["choices"][1]["message"]["content"]
    assert len(sums) == 2
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        got = {}
        for ln in s.iter_lines():
            if ln.startswith("data: {"):
                for c in json.loads(ln[6:])["choices"]:
                    got[c["index"]] = got.get(c["index"], "") + (c["delta"].get("content") or "")
    assert [got[i] for i in range(2)] == [c["message"]["content"] for c in r["choices"]]


CHAT = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/completions", dict(prompt="hi", n=11), "n"),
    ("/v1/completions", dict(prompt="hi", length_penalty="long"), "length_penalty"),
    ("/v1/completions", dict(prompt="hi", length_penalty=float("inf")), None),  # not JSON: 400 on the body
    ("/v1/completions", dict(prompt="hi", stop=["."]), "stop"),
    ("/v1/completions", dict(prompt="hi", presence_penalty=0.5), "presence_penalty"),
    ("/v1/completions", dict(prompt="hi", stop_token_ids=[5]), "stop_token_ids"),
    ("/v1/completions", dict(prompt="hi", min_tokens=2), "min_tokens"),
    ("/v1/completions", dict(prompt="hi", logit_bias={"5": 2}), "logit_bias"),
    ("/v1/completions", dict(prompt="hi", guided_regex="a+"), "guided_regex"),
    ("/v1/completions", dict(prompt="hi", prompt_logprobs=1), "prompt_logprobs"),
    ("/v1/completions", dict(prompt="hi", echo=True, logprobs=1), "echo"),
    ("/v1/completions", dict(prompt="hi", echo=True, max_tokens=0), "max_tokens"),
    ("/v1/completions", dict(prompt="hi", max_tokens=5000), "max_tokens"),
    ("/v1/chat/completions", dict(messages=CHAT, response_format={"type": "json_object"}), "response_format"),
    ("/v1/chat/completions", dict(messages=CHAT, tools=TOOLS, tool_choice="required"), "tool_choice"),
    ("/v1/chat/completions", dict(messages=CHAT, n=0), "n"),
])
def test_unsupported_with_beam_search(server, path, fields, param):
    body = {"use_beam_search": True, "n": 2, "max_tokens": 4, **fields}
    try:
        raw = json.dumps(body, allow_nan=param is None).encode()
    except ValueError:
        raw = b"{"
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param, r.text
    assert wait_idle(server.aeng, 10)


def test_disconnect_mid_search_frees_everything(server):
    body = json.dumps({"prompt": "Count: 1, 2,", "use_beam_search": True, "n": 4, "max_tokens": 400,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(1.5)
    assert server.aeng.engine.scheduler.has_unfinished_requests() or server.aeng.busy()
    s.close()
    assert wait_idle(server.aeng, 10)  # 400 steps of 4 beams would take far longer: it was stopped
    assert _ok(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2})["choices"]


def test_engine_in_thread(thread_aeng):
    """The same search over an AsyncEngine in this process (decodekit serve --engine-in-thread)."""
    from server_harness import LiveServer
    s = LiveServer(thread_aeng)
    try:
        r = _ok(s, "/v1/completions", {"prompt": "1, 2, 3,", "use_beam_search": True, "n": 2, "max_tokens": 5,
                                       "logprobs": 0})
        assert [c["index"] for c in r["choices"]] == [0, 1]
        p = r["usage"]["prompt_tokens"]
        assert _score(r["choices"][0], p, 1.0) >= _score(r["choices"][1], p, 1.0)
        assert wait_idle(thread_aeng, 10)
    finally:
        s.stop()
