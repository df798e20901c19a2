"""Fixtures: the embedded model's engine in its own process (EngineProcess, the production path of
`decodekit serve`), and a live server over it (session-wide); `thread_aeng`: the same engine in a
thread of this process (--engine-in-thread)."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="session")
def aeng():
    from decodekit.engine.args import EngineArgs
    from decodekit.server.engine_proc import EngineProcess
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    a = EngineProcess(EngineArgs(kv_cache_memory="192MiB", max_model_len=1024, seed=0))
    a.start()
    yield a
    a.shutdown()


@pytest.fixture(scope="session")
def server(aeng):
    from server_harness import LiveServer
    s = LiveServer(aeng)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def thread_aeng():
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.server.async_engine import AsyncEngine
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    a = AsyncEngine(LLMEngine(EngineArgs(kv_cache_memory="64MiB", max_model_len=1024, seed=0)))
    a.start()
    yield a
    a.shutdown()
