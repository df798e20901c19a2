"""Admission, found by the input-robustness audit: a request that can never fit the queue gets a 400 naming `n` or
`prompt` (not a 503 a retrying client loops on), a prompt over max_model_len names `prompt`, and an add whose caller
is cancelled before the engine's verdict (a client gone while waiting) is aborted and never takes the engine down,
with the engine in a thread (--engine-in-thread) or in its own process."""
from __future__ import annotations

import asyncio
import time

import pytest

from decodekit.sampling import SamplingParams
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


# ------------------------------------------------------------------ cancelled admission
def _args():
    from decodekit.engine.args import EngineArgs
    return EngineArgs(model="random:tiny", kv_cache_memory="16MiB", max_model_len=2048, seed=0)


@pytest.fixture(params=["thread", "process"])
def own_aeng(request):
    if request.param == "thread":
        from decodekit.engine.llm_engine import LLMEngine
        from decodekit.server.async_engine import AsyncEngine
        a = AsyncEngine(LLMEngine(_args()))
    else:
        from decodekit.server.engine_proc import EngineProcess
        a = EngineProcess(_args())
    a.start()
    yield a
    a.shutdown()


LONG = SamplingParams(max_tokens=2000, ignore_eos=True, temperature=0)


def _spy_aborts(a) -> list:
    """The request ids the engine is told to abort (thread: abort_request; process: the abort message)."""
    seen = []
    if hasattr(a, "_send"):
        send = a._send
        a._send = lambda msg: (seen.append(msg[1]) if msg[0] == "abort" else None, send(msg))[1]
    else:
        abort = a.engine.abort_request
        a.engine.abort_request = lambda rid: (seen.append(rid), abort(rid))[1]
    return seen


def _generated(a) -> int:
    if hasattr(a, "refresh_stats"):
        assert a.refresh_stats()
    return a.engine.stats["generation_tokens"]


def test_add_cancelled_before_the_verdict_leaves_the_engine_up(own_aeng):
    """Was: the engine loop (thread) or the reader (process) set the verdict on the future the cancellation had
    cancelled: InvalidStateError, the engine marked dead (process mode: the child killed), every request lost."""
    a = own_aeng

    async def main():
        t = asyncio.ensure_future(a.add("gone", "hello", LONG))
        await asyncio.sleep(0)            # the add is queued and awaits its verdict
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await asyncio.sleep(0.5)
        assert a.alive and a.dead is None
        out = await (await a.add("next", "hello", SamplingParams(max_tokens=3, temperature=0))).final()
        assert out.finished and len(out.outputs[0].token_ids) == 3
    asyncio.run(main())
    assert wait_idle(a, 10) and a.num_pending == 0
    assert _generated(a) < 1000                              # "gone" never ran its 2000 tokens


def test_add_cancelled_after_the_verdict_is_aborted(own_aeng):
    """Was (thread mode): the engine had already added the request, nobody aborted it, it ran all its tokens."""
    a = own_aeng
    aborted = _spy_aborts(a)

    async def main():
        t = asyncio.ensure_future(a.add("gone", "hello", LONG))
        await asyncio.sleep(0)
        time.sleep(0.05)                  # blocks the event loop: the engine takes the request meanwhile
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await asyncio.sleep(0.5)          # (outputs of a step begun before the abort still find an open loop)
    asyncio.run(main())
    assert wait_idle(a, 10) and a.alive and a.num_pending == 0
    assert aborted == ["gone"] and _generated(a) < 1000


def test_a_closed_event_loop_does_not_take_the_engine_down(own_aeng):
    """A request whose caller's event loop closed while it ran (asyncio.run returned): delivering its next
    outputs raised 'Event loop is closed' in the engine thread / reader thread and killed the engine. Now
    the request is aborted (nobody can read it) and the engine serves the next one."""
    a = own_aeng
    aborted = _spy_aborts(a)

    async def start():
        await a.add("orphan", "hello", LONG)   # added; this loop closes while it generates
    asyncio.run(start())
    time.sleep(0.5)                            # steps try to deliver to the closed loop
    assert a.alive and a.dead is None

    async def main():
        out = await (await a.add("next", "hello", SamplingParams(max_tokens=3, temperature=0))).final()
        assert out.finished and len(out.outputs[0].token_ids) == 3
    asyncio.run(main())
    assert wait_idle(a, 10) and a.num_pending == 0
    assert aborted == ["orphan"] and _generated(a) < 1000
