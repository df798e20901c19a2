"""Admission, found by the input-robustness audit: a request that can never fit the queue gets a 400 naming `n` or
`prompt` (not a 503 a retrying client loops on), a prompt over max_model_len names `prompt`, and an add whose caller
is cancelled before the engine's verdict (a client gone while waiting) is aborted and never takes the engine down,
with the engine in a thread (--engine-in-thread) or in its own process."""
from __future__ import annotations

import pytest

from server_harness import LiveServer, wait_idle

httpx = pytest.importorskip("httpx")

BODY = {"prompt": "hi", "max_tokens": 2}


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {**BODY, "n": 3}, "n"),
    ("/v1/completions", {**BODY, "prompt": ["a", "b", "c"]}, "prompt"),
    ("/v1/completions", {**BODY, "prompt": ["a", "b"], "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 3}, "n"),
])
def test_a_request_that_can_never_fit_the_queue_is_a_400(aeng, path, body, param):
    """Was: 503 + Retry-After on an idle server, forever."""
    s = LiveServer(aeng, max_queue=2)
    try:
        r = _post(s, path, body)
        assert r.status_code == 400 and "retry-after" not in r.headers, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error", err
        assert "max_queue=2" in err["message"] and "never" in err["message"], err
        assert _post(s, "/v1/completions", {**BODY, "n": 2}).status_code == 200       # what fits is served
    finally:
        s.stop()
    assert wait_idle(aeng)


def test_a_temporarily_full_queue_is_still_a_503(aeng, monkeypatch):
    s = LiveServer(aeng, max_queue=2)
    try:
        monkeypatch.setattr(aeng, "num_waiting", lambda: 2, raising=False)
        r = _post(s, "/v1/completions", BODY)
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "queue_full"
        monkeypatch.undo()
        assert _post(s, "/v1/completions", BODY).status_code == 200
    finally:
        s.stop()


def test_completion_prompt_over_max_model_len_names_prompt(server):
    """Was: param "max_tokens" (even when the client sent none): the prompt alone does not fit."""
    for body in ({"prompt": [100] * 1100, "max_tokens": 1}, {"prompt": "hi " * 2000}, {"prompt": [100] * 1024}):
        r = _post(server, "/v1/completions", body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "prompt" and "max_model_len (1024)" in err["message"] and "1023" in err["message"], err
    # a prompt that fits, with too many max_tokens, still names max_tokens
    r = _post(server, "/v1/completions", {"prompt": [100] * 1000, "max_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert wait_idle(server.aeng)
