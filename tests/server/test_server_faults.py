"""Bad input, faults and limits: malformed requests get a 4xx naming the field (never a 5xx; the
engine stays up), a fuzz of request bodies, auth, a full queue, client disconnects (streaming and
not) freeing every KV block, and 200 concurrent streaming clients with 20% walking away."""
from __future__ import annotations

import asyncio
import json
import random
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_harness import LiveServer, wait_idle

httpx = pytest.importorskip("httpx")


def _post(server, path, body=None, raw=None, headers=None):
    data = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=data, headers={"content-type": "application/json", **(headers or {})},
                      timeout=60)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "temperature": 5}, "temperature"),
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": "hi", "n": 1000}, "n"),
    ({"prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "hi", "top_p": 2}, "top_p"),
    ({"prompt": "hi", "top_k": -5}, "top_k"),
    ({"prompt": "hi", "stop": [1, 2]}, "stop"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 99999999]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "hi", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "hi", "model": "gpt-9"}, "model"),
    ({"prompt": "hi", "suffix": "tail"}, "suffix"),          # not implemented: refused, not ignored
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"-5": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"prompt": "hi", "allowed_token_ids": []}, "allowed_token_ids"),
    ({"prompt": "hi", "bad_words": "word"}, "bad_words"),
])
def test_bad_completion_requests(server, body, param):
    r = _post(server, "/v1/completions", body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "system", "content": None}, {"role": "user", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tool_choice"),                                    # "auto": no tool-call parser for the model
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "tool_choice": "none"},
     "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "tuple"}}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": "1"}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "bad_words": [" "]}, "bad_words"),
])
def test_bad_chat_requests(server, body, param):
    r = _post(server, "/v1/chat/completions", body)
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text


def test_noop_values_of_unsupported_fields_are_accepted(server):
    """Clients that send the 'off' value of a feature we lack (null, empty, text format, tool_choice none)
    and assistant turns without content get a normal answer."""
    r = _post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                     {"role": "user", "content": "again"}],
        "max_tokens": 2, "logit_bias": {}, "tools": [], "tool_choice": "none", "functions": None,
        "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text
    r = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "suffix": None, "logit_bias": None})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe{}", b'{"prompt": "x", "temperature": NaN}', b"[1, 2]",
                                 b'"just a string"', b"", b'{"prompt": "x", "max_tokens": Infinity}'])
def test_malformed_bodies(server, raw):
    r = _post(server, "/v1/completions", raw=raw)
    assert r.status_code == 400 and "error" in r.json(), r.text


def test_body_size_limit(server):
    r = _post(server, "/v1/completions", {"prompt": "x" * (5 << 20)})
    assert r.status_code == 413


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=False), st.text(max_size=8),
                    st.lists(st.integers(-2, 60000), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                  max_size=2))
_FIELDS = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "logprobs",
           "top_logprobs", "stream", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty",
           "ignore_eos", "min_tokens", "stream_options", "model", "best_of", "echo", "prompt_logprobs", "logit_bias",
           "bad_words", "allowed_token_ids"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       body=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=6),
       base=st.booleans())
def test_fuzzed_bodies_never_5xx(server, path, body, base):
    if base:  # half the cases start from a valid request, so the other fields are reached
        body = {**({"prompt": "hi"} if path == "/v1/completions" else
                   {"messages": [{"role": "user", "content": "hi"}]}), **body}
    if isinstance(body.get("max_tokens"), int) and not isinstance(body.get("max_tokens"), bool):
        body["max_tokens"] = min(body["max_tokens"], 3)
    body.pop("max_completion_tokens", None)
    if path.endswith("chat/completions") and "max_tokens" not in body:
        body["max_tokens"] = 2
    r = _post(server, path, body)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_engine_alive_after_abuse(server):
    r = _post(server, "/v1/completions", {"prompt": "2 + 2 =", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and httpx.get(server.url + "/health").status_code == 200
    assert wait_idle(server.aeng)


def test_api_key_and_queue_limit(aeng):
    s = LiveServer(aeng, api_key="sekret", max_queue=2)
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        assert _post(s, "/v1/completions", body).status_code == 401
        assert _post(s, "/v1/completions", body, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert httpx.get(s.url + "/health").status_code == 200          # health needs no key
        ok = {"authorization": "Bearer sekret"}
        assert _post(s, "/v1/completions", body, headers=ok).status_code == 200
        never = _post(s, "/v1/completions", {**body, "n": 3}, headers=ok)  # 3 sequences > max_queue 2: never fits
        assert never.status_code == 400 and "retry-after" not in never.headers and never.json()["error"]["param"] == "n"
        aeng.num_waiting = lambda: 1                                     # the queue holds 1 of 2: 2 more wait
        try:
            full = _post(s, "/v1/completions", {**body, "n": 2}, headers=ok)
        finally:
            del aeng.num_waiting
        assert full.status_code == 503 and full.headers["retry-after"] and full.json()["error"]["code"] == "queue_full"
        assert _post(s, "/v1/completions", {**body, "n": 2}, headers=ok).status_code == 200
    finally:
        s.stop()


def test_disconnects_abort_and_free_blocks(server):
    # streaming: read a little, then walk away
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "Count: 1, 2,", "max_tokens": 900,
                                                                     "ignore_eos": True, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
    assert wait_idle(server.aeng, 5)          # 900 tokens would take far longer: it was aborted
    # non-streaming: send the request and close the socket before the answer
    s = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "Count: 1, 2,", "max_tokens": 900, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    import time
    time.sleep(1.0)
    assert server.aeng.engine.scheduler.has_unfinished_requests()
    s.close()
    assert wait_idle(server.aeng, 5)


def test_200_concurrent_streams_with_disconnects(server):
    """200 streaming clients at once, 20% leaving at random points: the others get exactly the
    output the same request gets alone; afterwards no KV block is in use and health is OK."""
    prompts = [f"List {k} fruits:" for k in range(10)]
    want = {}
    for p in prompts:
        r = _post(server, "/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        want[p] = r.json()["choices"][0]["text"]
    rng = random.Random(0)
    plan = [(prompts[i % 10], rng.random() < 0.2, rng.randint(0, 6)) for i in range(200)]

    async def one(c, prompt, leave, after):
        text, n = "", 0
        async with c.stream("POST", server.url + "/v1/completions",
                            json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                  "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text += json.loads(line[6:])["choices"][0]["text"]
                n += 1
                if leave and n > after:
                    return None
        return text

    async def main():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, limits=limits) as c:
            return await asyncio.gather(*(one(c, *p) for p in plan))

    got = asyncio.run(main())
    done = [(p, g) for (p, leave, _), g in zip(plan, got) if g is not None]
    assert len(done) >= 150
    assert all(g == want[p] for p, g in done)
    assert wait_idle(server.aeng, 60)
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("mode", [[], ["--engine-in-thread"]])
def test_sigterm_shuts_down_gracefully(tmp_path, mode):
    """`decodekit serve` as a process (the engine in its own process, or in a thread): ready line, a
    request served, SIGTERM -> exits 0 promptly even with long requests in flight (ended after
    --shutdown-timeout: a 503 JSON error, a stream's error event then [DONE]; no traceback), leaving no engine
    process behind."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    num = port.getsockname()[1]
    port.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "decodekit.cli", "serve", "--port", str(num), "--kv-cache-memory",
                          "64MiB", "--max-model-len", "1024", "--shutdown-timeout", "2", *mode],
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        t = time.monotonic()
        line = ""
        while "serving" not in line and time.monotonic() - t < 120:
            line = p.stderr.readline()
        assert f"http://127.0.0.1:{num}/v1" in line
        url = f"http://127.0.0.1:{num}"
        assert httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        got = {}

        def long(stream: bool):
            got[stream] = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1000,
                                                                    "ignore_eos": True, "stream": stream}, timeout=60)
        threads = [threading.Thread(target=long, args=(s,), daemon=True) for s in (False, True)]
        for th in threads:
            th.start()
        time.sleep(0.5)
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        assert time.monotonic() - t < 15
        for th in threads:
            th.join(10)
        assert got[False].status_code == 503 and "shutting down" in got[False].json()["error"]["message"]
        events = [line[6:] for line in got[True].text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
        assert "Traceback" not in p.stderr.read()
        children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        assert not children
    finally:
        if p.poll() is None:
            p.kill()
