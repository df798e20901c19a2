"""The engine loop beside the server's event loop: one thread owns the LLMEngine; requests and
aborts reach it through a queue, outputs go back to each request's asyncio queue.

The thread steps the engine while it has work and blocks on the command queue when idle. A guided
request's guide is compiled, and its bad_words encoded, in a worker thread before the request reaches it
(prepare_request). A bad
request fails alone (add_request raises ValueError, sent back to its caller); an exception out of
step() is fatal: every in-flight request gets it, the loop is marked dead and /health fails.
`heartbeat` is the monotonic time of the loop's last turn; a loop with work whose heartbeat is
old is stuck (health reports it).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import queue
import threading
import time
from typing import AsyncIterator

from decodekit.engine.llm_engine import LLMEngine
from decodekit.engine.outputs import RequestOutput
from decodekit.engine.prompts import truncate_prompt
from decodekit.sampling import SamplingParams
from decodekit.sampling.guided.gcpause import gc_paused

log = logging.getLogger("decodekit.server")


class EngineDeadError(RuntimeError):
    pass


def needs_prepare(params) -> bool:
    """Whether add_request would compile a guide (guided_* / structured_outputs) or encode bad_words for these
    params: work that prepare_request does first, in a worker thread."""
    return isinstance(params, SamplingParams) and (params.guided_kind is not None or bool(params.bad_words))


def prepare_request(engine: LLMEngine, prompt, params) -> None:
    """The checks, the guide and the bad_words encoding that engine.add_request(prompt, params) would compute, run
    here (a worker thread, never the step loop): compiling a large guide takes seconds, encoding 1024 long bad
    words half a second, and the engine's add_request then finds them done (SamplingParams.set_guided ->
    compile_guide's cache, keyed by the pattern, the tokenizer and the EOS ids; set_bad_words_token_ids -> the
    words remembered on `params` by encode_bad_words), so no other request's stream waits on them. Raises the
    ValueError add_request would (a guide too large, a schema it does not support, a word encoding to nothing...);
    params changes only by that remembered encoding."""
    if not needs_prepare(params):
        return
    with gc_paused():
        p = copy.deepcopy(params)
        p.validate(vocab_size=engine.model_config.vocab_size, eos_token_ids=engine.eos_token_ids)
        if p.bad_words:
            params.encode_bad_words(engine.tokenizer)
        if p.guided_kind is not None:
            _, ids = engine._prompt_ids(prompt)
            ids = truncate_prompt(ids, p.truncate_prompt_tokens, engine.max_model_len, p.max_tokens)
            p.set_guided(engine.tokenizer, engine.eos_token_ids, engine.reasoning_of(ids))


class RequestStream:
    """The outputs of one request as they change; the last one has finished=True. Iterating raises
    EngineDeadError if the loop dies. abort() (or leaving before the end) frees the request."""

    def __init__(self, aeng: "AsyncEngine", request_id: str, q: asyncio.Queue):
        self.aeng, self.request_id, self._q = aeng, request_id, q
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iter()

    async def _iter(self):
        try:
            while not self.finished:
                item = await self._q.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            self.abort()

    async def final(self) -> RequestOutput:
        last = None
        async for out in self:
            last = out
        return last

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.aeng.abort(self.request_id)


def _deliver(items) -> None:
    for q, item in items:
        q.put_nowait(item)


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """loop.call_soon_threadsafe(fn, *args); False when the loop is closed (whoever listened there is gone:
    a caller that ran its own event loop and left it; uvicorn's lives as long as the server)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


def _settle(fut: concurrent.futures.Future, error: BaseException | None = None) -> bool:
    """Give an add's caller its verdict; False (nothing set) if the caller was cancelled first: its
    awaiting cancels the future, and setting a cancelled future raises (which killed the loop)."""
    if not fut.set_running_or_notify_cancel():
        return False
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
    return True


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._cmds: queue.Queue = queue.Queue()
        self._sinks: dict[str, callable] = {}
        self._stop = threading.Event()
        self.dead: BaseException | None = None
        self.heartbeat = time.monotonic()
        self.num_pending = 0          # submitted, not yet added by the loop thread (under _lock)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="decodekit-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._cmds.put(("wake",))
        self._thread.join(timeout)

    # ------------------------------------------------------------------ state (any thread)
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.dead is None

    def busy(self) -> bool:
        return bool(self._sinks) or self.num_pending > 0

    def num_waiting(self) -> int:
        return self.engine.scheduler.num_waiting + self.engine.num_held + self.num_pending

    # ------------------------------------------------------------------ requests (event loop)
    async def add(self, request_id: str, prompt, params) -> "RequestStream":
        """Queue a request; raises ValueError if the engine rejects it (nothing else changes)."""
        if not self.alive:
            raise EngineDeadError(f"the engine loop is not running ({self.dead!r})")
        if needs_prepare(params):   # guide / bad words made in a worker thread: neither loop waits
            try:
                await asyncio.to_thread(prepare_request, self.engine, prompt, params)
            except Exception as e:  # noqa: BLE001 -- as add_request's errors: this request fails alone
                raise e if isinstance(e, ValueError) else ValueError(str(e)) from None
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        added: concurrent.futures.Future = concurrent.futures.Future()

        def sink(item) -> None:
            _post(loop, q.put_nowait, item)

        sink.loop, sink.queue = loop, q  # a step's outputs go to their loops in one batch (_deliver)

        with self._lock:
            self.num_pending += 1
        self._cmds.put(("add", request_id, prompt, params, sink, added))
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:  # the caller went away before the verdict: free the request
            self.abort(request_id)      # queued after the add, so the loop adds it first, then aborts it
            raise
        return RequestStream(self, request_id, q)

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    # ------------------------------------------------------------------ the loop (its thread)
    def _handle(self, cmd) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, sink, added = cmd
            with self._lock:
                self.num_pending -= 1
            if not added.set_running_or_notify_cancel():
                return  # the caller went away before the loop took the request: never added
            try:
                self.engine.add_request(rid, prompt, params)
            except Exception as e:  # noqa: BLE001 -- a bad request fails alone
                added.set_exception(e if isinstance(e, ValueError) else ValueError(str(e)))
                return
            self._sinks[rid] = sink
            added.set_result(None)  # a cancellation from now on is followed by an abort (see add)
        elif cmd[0] == "abort":
            if self._sinks.pop(cmd[1], None) is not None:
                self.engine.abort_request(cmd[1])
                # the engine reports the aborted request once more on its next step; nobody listens

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop.is_set():
                idle = not eng.has_unfinished_requests()
                try:
                    cmd = self._cmds.get(timeout=0.5) if idle else self._cmds.get_nowait()
                    self._handle(cmd)
                    while True:
                        self._handle(self._cmds.get_nowait())
                except queue.Empty:
                    pass
                self.heartbeat = time.monotonic()
                if eng.has_unfinished_requests():
                    batch: dict = {}
                    for out in eng.step():
                        sink = self._sinks.get(out.request_id)
                        if sink is not None:
                            batch.setdefault(sink.loop, []).append((sink.queue, out))
                            if out.finished:
                                del self._sinks[out.request_id]
                    for loop, items in batch.items():  # one wake-up of each event loop per step
                        if not _post(loop, _deliver, items):  # its loop is closed: nobody reads these
                            for _, out in items:
                                if self._sinks.pop(out.request_id, None) is not None:
                                    eng.abort_request(out.request_id)
                    self.heartbeat = time.monotonic()
        except BaseException as e:  # noqa: BLE001 -- fatal: tell everyone, health goes red
            log.exception("engine loop died")
            self.dead = e
            err = EngineDeadError(f"engine loop died: {e!r}")
            for sink in self._sinks.values():
                sink(err)
            self._sinks.clear()
        finally:
            # anything still queued (shutdown): fail it rather than leave a client waiting
            while True:
                try:
                    cmd = self._cmds.get_nowait()
                except queue.Empty:
                    break
                if cmd[0] == "add":
                    with self._lock:
                        self.num_pending -= 1
                    _settle(cmd[5], EngineDeadError("the server is shutting down"))
            for rid, sink in list(self._sinks.items()):
                eng.abort_request(rid)
                sink(EngineDeadError("the server is shutting down"))
            self._sinks.clear()
