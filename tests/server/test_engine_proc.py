"""The engine in its own process (EngineProcess, the default of `decodekit serve`): a dead or stuck
child fails in-flight requests cleanly and turns /health red, startup errors surface with their
text, add_request's verdict comes back from the child, the stats snapshot is fresh after the last
step; and the thread mode (--engine-in-thread) still serves the same outputs."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from server_harness import LiveServer, wait_idle

httpx = pytest.importorskip("httpx")


def _args(**kw):
    from decodekit.engine.args import EngineArgs
    return EngineArgs(**{"kv_cache_memory": "64MiB", "max_model_len": 1024, "seed": 0, **kw})


@pytest.fixture
def own_engine():
    """A private EngineProcess + server (these tests kill or stop the child)."""
    from dk_testing import embedded_model_or_skip
    from decodekit.server.engine_proc import EngineProcess
    embedded_model_or_skip()
    a = EngineProcess(_args())
    a.start()
    s = LiveServer(a, stuck_after_s=1.0)
    yield a, s
    s.stop()
    a.shutdown(2)


def test_child_death_fails_in_flight_requests(own_engine):
    a, s = own_engine
    body = {"prompt": "Count: 1, 2,", "max_tokens": 900, "ignore_eos": True}
    plain: dict = {}

    def post():
        plain["r"] = httpx.post(s.url + "/v1/completions", json=body, timeout=60)

    t = threading.Thread(target=post)
    t.start()
    events = []
    with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                os.kill(a.proc.pid, signal.SIGKILL)
    t.join(60)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and "died" in err["message"]
    assert plain["r"].status_code == 503 and "died" in plain["r"].json()["error"]["message"]
    assert not a.alive and a.dead is not None
    h = httpx.get(s.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "dead"
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert "decodekit:engine_alive" in httpx.get(s.url + "/metrics").text


def test_stuck_child_health_and_shutdown_kills_it(own_engine):
    """A child that stops turning (SIGSTOP) with work in flight: health says stuck (heartbeat as seen
    by the parent); shutdown() does not wait for it past its timeout."""
    a, s = own_engine

    async def go():
        from decodekit.sampling.params import SamplingParams
        st = await a.add("slow", "Count: 1, 2,", SamplingParams(max_tokens=900, ignore_eos=True))
        async for _ in st:
            break
        return st

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(go())
        os.kill(a.proc.pid, signal.SIGSTOP)
        time.sleep(1.6)
        h = httpx.get(s.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "stuck"
        t = time.monotonic()
        a.shutdown(1.0)
        assert time.monotonic() - t < 10 and a.proc.poll() is not None and not a.alive
    finally:
        loop.close()


def test_startup_failure_is_clear(tmp_path):
    from decodekit.server.engine_proc import EngineProcess
    with pytest.raises((ValueError, FileNotFoundError), match="no/such.gguf"):
        EngineProcess(_args(model="/no/such.gguf"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-m", "decodekit.cli", "serve", "--model", "/no/such.gguf", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "decodekit: error:" in p.stderr and "/no/such.gguf" in p.stderr
    assert "Traceback" not in p.stderr
    # a file the loader refuses (ModelLoadError, a ValueError subclass) was a RuntimeError traceback
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(ValueError, match="bad.gguf: truncated or corrupt GGUF file"):
        EngineProcess(_args(model=str(bad)))
    p = subprocess.run([sys.executable, "-m", "decodekit.cli", "serve", "--model", str(bad), "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "decodekit: error:" in p.stderr and "bad.gguf" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_add_rejected_by_the_child(server, aeng):
    """The child's add_request validates: its message comes back (400, the field named) and nothing
    stays pending."""
    from decodekit.sampling.params import SamplingParams
    ids = [100] * 1100                                            # over max_model_len 1024
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert "max_model_len" in err["message"] and err["param"] in ("prompt", "max_tokens")

    async def direct():
        with pytest.raises(ValueError, match="exceeds max_model_len"):
            await aeng.add("too-long", {"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
    asyncio.run(direct())
    assert aeng.num_pending == 0 and wait_idle(aeng)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_stats_snapshot_after_requests(server, aeng):
    """KV blocks all free once requests finish, the prefix cache hits on a repeated prompt, and the
    token / step counters in /metrics count exactly what was generated."""
    before = httpx.get(server.url + "/metrics").text
    prompt = "The history of the printing press in Europe began " * 6     # several full KV blocks
    for _ in range(2):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 5, "ignore_eos": True,
                                                             "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    assert wait_idle(aeng)
    eng = aeng.engine
    assert eng.kv_manager.num_free_blocks == eng.kv_manager.num_blocks and eng.kv_manager.usage == 0
    assert not eng.scheduler.has_unfinished_requests() and eng.scheduler.num_running == 0
    after = httpx.get(server.url + "/metrics").text
    assert _metric(after, "decodekit:generation_tokens_total") - _metric(before, "decodekit:generation_tokens_total") \
        == 10
    assert _metric(after, "decodekit:engine_steps_total") > _metric(before, "decodekit:engine_steps_total")
    assert _metric(after, "decodekit:prefix_cache_hit_rate") > 0 and eng.kv_manager.prefix_cache_hit_rate > 0
    assert _metric(after, "decodekit:kv_cache_usage_perc") == 0
    assert aeng.refresh_stats() and eng.stats["generation_tokens"] >= 10


def test_thread_mode_serves_the_same(thread_aeng, server):
    """--engine-in-thread: the AsyncEngine in this process answers like the engine process."""
    s = LiveServer(thread_aeng)
    try:
        body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        a = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        b = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert a.status_code == b.status_code == 200
        assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]
        assert httpx.get(s.url + "/health").json() == {"status": "ok"}
        assert "decodekit:generation_tokens" in httpx.get(s.url + "/metrics").text
        assert wait_idle(thread_aeng)
    finally:
        s.stop()


def test_serve_engine_in_thread_flag():
    import argparse
    from decodekit import server
    p = argparse.ArgumentParser()
    server.add_args(p)
    assert p.parse_args([]).engine_in_thread is False
    assert p.parse_args(["--engine-in-thread"]).engine_in_thread is True


def test_child_dies_with_the_server():
    """SIGKILL the server process: its engine process goes too (PR_SET_PDEATHSIG)."""
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    code = ("import os, sys\n"
            "from decodekit.engine.args import EngineArgs\n"
            "from decodekit.server.engine_proc import EngineProcess\n"
            "a = EngineProcess(EngineArgs(kv_cache_memory='64MiB', max_model_len=256))\n"
            "print(a.proc.pid, flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    pid = int(p.stdout.split()[0])
    t = time.monotonic()
    while time.monotonic() - t < 10:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"engine process {pid} outlived the server")


def test_tensor_parallel_in_the_engine_process():
    """--tensor-parallel-size 2: the child is the TP driver and spawns its worker; same tokens as TP 1."""
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.sampling.params import SamplingParams
    from decodekit.server.engine_proc import EngineProcess
    kw = dict(model="random:tiny-gqa4", kv_cache_memory="16MiB", max_model_len=128, seed=0)
    ref = LLMEngine(_args(**kw))
    ref.add_request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=8, temperature=0))
    want = None
    while ref.has_unfinished_requests():
        for o in ref.step():
            if o.finished:
                want = o.outputs[0].token_ids
    a = EngineProcess(_args(tensor_parallel_size=2, **kw))
    a.start()
    try:
        async def go():
            st = await a.add("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=8, temperature=0))
            return (await st.final()).outputs[0].token_ids
        assert asyncio.run(go()) == want
    finally:
        a.shutdown(10)
    assert a.proc.returncode == 0


def test_child_openmp_policy_short_spin_unless_the_environment_chooses(aeng):
    from decodekit.server.engine_proc import child_omp_env
    assert child_omp_env({}) == {"GOMP_SPINCOUNT": "10000"}
    assert child_omp_env({"OMP_WAIT_POLICY": "active"}) == {}
    assert child_omp_env({"GOMP_SPINCOUNT": "0"}) == {}
    # the running child got it: its environment shows the short spin (the test environment sets neither)
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        with open(f"/proc/{aeng.proc.pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert env.get(b"GOMP_SPINCOUNT") == b"10000"
