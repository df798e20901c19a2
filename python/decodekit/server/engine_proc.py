"""The engine in its own process (the default of `decodekit serve`, like vLLM v1's engine core): the
server process keeps only the HTTP layer, so uvicorn's per-chunk Python no longer shares a GIL with
the engine loop.

EngineProcess offers AsyncEngine's interface (start, shutdown, alive, dead, busy, num_waiting,
heartbeat, add, abort) and an `engine` facade with what app.py / metrics.py read: the tokenizer,
model config and source (sent once by the child at startup), and scheduler / KV-cache / token
counters / speculative summary answered from the latest stats snapshot.

Protocol over one socketpair (multiprocessing.connection, pickled tuples):
  parent -> child: ("add", rid, prompt, params) | ("abort", rid) | ("stats",) | ("stop",)
  child -> parent: ("ready", info, snap) | ("error", type name, message) at startup, then
                   ("added", rid, error message or None, snap)   -- add_request's verdict
                   ("out", [RequestOutput], snap)                -- one per engine step
                   ("stats", snap)                               -- idle: heartbeat / after commands
                   ("dead", message)                             -- step() raised; the child exits
One reader thread in the parent dispatches a step's outputs with one call_soon_threadsafe per event
loop. The child exits when the pipe closes and is SIGKILLed when the parent dies (PR_SET_PDEATHSIG;
Linux: "the parent" is the thread that constructed the EngineProcess, so construct it in a thread
that outlives it, e.g. the main thread). If the child dies, every in-flight request gets
EngineDeadError and `alive` turns False. The child's OpenMP workers spin only briefly at barriers
(GOMP_SPINCOUNT=10000) unless the environment chooses (see child_omp_env).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Pipe

from .async_engine import EngineDeadError, RequestStream, _deliver, _post, _settle, needs_prepare, prepare_request

log = logging.getLogger("decodekit.server")

_IDLE_POLL_S = 0.5          # the idle child sends a stats snapshot (heartbeat) this often
_PREPARE_POLL_S = 0.005     # and looks this often for requests prepared meanwhile (_PrepareWorker)


# ---------------------------------------------------------------------------------------- the child
def _snapshot(eng) -> dict:
    kv, sch = eng.kv_manager, eng.scheduler
    return {"t": time.monotonic(), "running": sch.num_running, "waiting": sch.num_waiting + eng.num_held,
            "preemptions": sch.num_preemptions, "unfinished": eng.has_unfinished_requests(),
            "kv_usage": kv.usage, "kv_hit_rate": kv.prefix_cache_hit_rate, "kv_free": kv.num_free_blocks,
            "kv_blocks": kv.num_blocks, "kv_cached": kv.num_cached_blocks, "stats": dict(eng.stats),
            "spec": eng.spec.summary() if eng.spec is not None else None}


def _die_with_parent() -> None:
    try:  # Linux: SIGKILL this process when the server process (the thread that started it) dies
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class _PrepareWorker:
    """Compiles guided requests' guides and encodes bad_words in a daemon thread of the engine child
    (async_engine.prepare_request), one request at a time: a guide that takes seconds to build holds up neither the
    step loop nor the requests without one. The loop adds each request from `done` once it is prepared (or refuses
    it with the error)."""

    def __init__(self, eng):
        self.eng = eng
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: collections.deque = collections.deque()   # (rid, prompt, params, error message or None)
        self.pending: set[str] = set()      # submitted, not yet taken from `done` (the loop's)
        self.aborted: set[str] = set()      # of those, the ones aborted meanwhile
        self._thread = None

    def submit(self, rid, prompt, params) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decodekit-prepare", daemon=True)
            self._thread.start()
        self.pending.add(rid)
        self.jobs.put((rid, prompt, params))

    def _run(self) -> None:
        while True:
            rid, prompt, params = self.jobs.get()
            error = None
            try:
                prepare_request(self.eng, prompt, params)
            except Exception as e:  # noqa: BLE001 -- what add_request would raise: the request fails alone
                error = str(e) or repr(e)
            self.done.append((rid, prompt, params, error))


def child_main(fd: int) -> int:
    conn = Connection(fd)
    try:
        args = conn.recv()
    except EOFError:
        return 0
    try:
        from decodekit.engine.llm_engine import LLMEngine
        eng = LLMEngine(args)
    except BaseException as e:  # noqa: BLE001 -- the parent raises it with this text
        # subclasses (the loader's ModelLoadError) travel as their base: the parent re-raises the kinds
        # the CLI reports as one line, anything else is a RuntimeError
        kind = next((k.__name__ for k in (FileNotFoundError, ValueError) if isinstance(e, k)), type(e).__name__)
        conn.send(("error", kind, str(e) or repr(e)))
        return 1
    conn.send(("ready", {"tokenizer": eng.tokenizer, "model_config": eng.model_config,
                         "model_source": eng.model_source, "max_model_len": eng.max_model_len,
                         "default_sampling": eng.default_sampling, "pid": os.getpid()}, _snapshot(eng)))
    live: set[str] = set()
    guides = _PrepareWorker(eng)    # guides / bad words made off this loop (then added from `guides.done`)

    def add(rid, prompt, params, error: str | None = None) -> None:
        if error is None:
            try:
                eng.add_request(rid, prompt, params)
            except Exception as e:  # noqa: BLE001 -- a bad request fails alone
                error = str(e) or repr(e)
        if error is not None:
            conn.send(("added", rid, error, _snapshot(eng)))
            return
        live.add(rid)
        conn.send(("added", rid, None, _snapshot(eng)))

    def handle(cmd) -> bool:
        if cmd[0] == "add":
            _, rid, prompt, params = cmd
            if needs_prepare(params):
                guides.submit(rid, prompt, params)
            else:
                add(rid, prompt, params)
        elif cmd[0] == "abort":
            if cmd[1] in live:
                live.discard(cmd[1])
                eng.abort_request(cmd[1])
            elif cmd[1] in guides.pending:
                guides.aborted.add(cmd[1])   # (still being prepared: it is never added)
        elif cmd[0] == "stats":
            conn.send(("stats", _snapshot(eng)))
        elif cmd[0] == "stop":
            return False
        return True

    try:
        last_stats = 0.0
        while True:
            idle = not eng.has_unfinished_requests()
            wait = 0 if not idle else _PREPARE_POLL_S if guides.pending else _IDLE_POLL_S
            got = conn.poll(wait)
            handled = got
            while got:
                if not handle(conn.recv()):
                    return 0
                got = conn.poll(0)
            while guides.done:                  # prepared (or refused): add_request finds the work done
                rid, prompt, params, error = guides.done.popleft()
                guides.pending.discard(rid)
                handled = True
                if rid in guides.aborted:       # its caller went away meanwhile: never added
                    guides.aborted.discard(rid)
                    conn.send(("added", rid, "aborted before it was added", _snapshot(eng)))
                else:
                    add(rid, prompt, params, error)
            if eng.has_unfinished_requests():
                outs = []
                for out in eng.step():
                    if out.request_id in live:
                        outs.append(out)
                        if out.finished:
                            live.discard(out.request_id)
                conn.send(("out", outs, _snapshot(eng)))  # every step: the snapshot stays fresh
            elif idle and (handled or time.monotonic() - last_stats >= _IDLE_POLL_S):
                conn.send(("stats", _snapshot(eng)))      # heartbeat, and the state after commands
                last_stats = time.monotonic()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the server went away
    except BaseException as e:  # noqa: BLE001 -- fatal: the parent fails everything in flight
        log.exception("engine loop died")
        try:
            conn.send(("dead", repr(e)))
        except OSError:
            pass
        return 1
    finally:
        try:
            eng.shutdown()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------- the parent
_CHILD_SPINCOUNT = "10000"


def child_omp_env(env: dict) -> dict:
    """OpenMP settings for the engine child, unless `env` already chooses (OMP_WAIT_POLICY or
    GOMP_SPINCOUNT set: those win). libgomp's default (spin 300k times at each barrier before
    sleeping) was measured 10-30x slower under load here: the child's spinning workers and the HTTP
    process share the cores, so a worker preempted inside a parallel region holds up the barrier.
    Fully passive (sleep at once) costs a futex wake per parallel region (~13% of a decode step on a
    2-core VM). A short spin (~10k iterations, tens of microseconds) covers the gaps between one
    step's parallel regions and gives the core back within microseconds when the step ends."""
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return {}
    return {"GOMP_SPINCOUNT": _CHILD_SPINCOUNT}


class _Scheduler:
    def __init__(self, p: "EngineProcess"):
        self._p = p

    num_running = property(lambda self: self._p._snap["running"])
    num_waiting = property(lambda self: self._p._snap["waiting"])
    num_preemptions = property(lambda self: self._p._snap["preemptions"])

    def has_unfinished_requests(self) -> bool:
        return self._p._snap["unfinished"]


class _KVManager:
    def __init__(self, p: "EngineProcess"):
        self._p = p

    usage = property(lambda self: self._p._snap["kv_usage"])
    prefix_cache_hit_rate = property(lambda self: self._p._snap["kv_hit_rate"])
    num_free_blocks = property(lambda self: self._p._snap["kv_free"])
    num_blocks = property(lambda self: self._p._snap["kv_blocks"])
    num_cached_blocks = property(lambda self: self._p._snap["kv_cached"])


class _Spec:
    def __init__(self, p: "EngineProcess"):
        self._p = p

    def summary(self) -> dict:
        return dict(self._p._snap["spec"] or {})


class EngineFacade:
    """What the server reads of the LLMEngine, answered in the parent (state: latest snapshot)."""

    def __init__(self, p: "EngineProcess", info: dict):
        self._p = p
        self.args = p.args
        self.tokenizer = info["tokenizer"]
        self.model_config = info["model_config"]
        self.model_source = info["model_source"]
        self.max_model_len = info["max_model_len"]
        self.default_sampling = info["default_sampling"]
        self.scheduler, self.kv_manager = _Scheduler(p), _KVManager(p)
        self.spec = _Spec(p) if p._snap.get("spec") is not None else None

    @property
    def stats(self) -> dict:
        return self._p._snap["stats"]


class EngineProcess:
    """An LLMEngine in a child process, with AsyncEngine's interface. The constructor starts the
    child and waits until the model is loaded (raising the child's startup error: ValueError stays
    ValueError); start() starts receiving outputs."""

    def __init__(self, args, startup_timeout: float | None = None):
        self.args = args
        self.dead: BaseException | None = None
        self.heartbeat = time.monotonic()
        self.num_pending = 0
        self._lock = threading.Lock()          # _sinks, _pending, num_pending
        self._send_lock = threading.Lock()
        self._sinks: dict[str, tuple] = {}     # rid -> (loop, asyncio.Queue)
        self._pending: dict[str, concurrent.futures.Future] = {}
        self._stats_seq, self._stats_cv = 0, threading.Condition()
        self._closing = False
        parent, child = Pipe(duplex=True)
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env.update(child_omp_env(env))
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc = subprocess.Popen([sys.executable, "-m", "decodekit.server.engine_proc", str(child.fileno())],
                                     pass_fds=(child.fileno(),), env=env)
        child.close()
        self._conn = parent
        try:
            parent.send(args)
            if startup_timeout is not None and not parent.poll(startup_timeout):
                raise RuntimeError(f"the engine process did not start within {startup_timeout} s")
            msg = parent.recv()
        except (EOFError, OSError) as e:
            self._kill()
            raise RuntimeError(f"the engine process died while starting (exit code {self.proc.poll()}): "
                               f"{e!r}") from None
        except BaseException:
            self._kill()
            raise
        if msg[0] == "error":
            self._kill()
            _, kind, text = msg
            if kind == "ValueError":
                raise ValueError(text)
            if kind == "FileNotFoundError":
                raise FileNotFoundError(text)
            raise RuntimeError(f"the engine failed to start: {kind}: {text}")
        _, info, self._snap = msg
        self.pid = info["pid"]
        self.engine = EngineFacade(self, info)
        self._thread = threading.Thread(target=self._read, name="decodekit-engine-reader", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closing = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        try:
            self._conn.close()
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_all(EngineDeadError("the server is shutting down"))

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # ------------------------------------------------------------------ state (any thread)
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.dead is None and self.proc.poll() is None

    def busy(self) -> bool:
        return bool(self._sinks) or self.num_pending > 0

    def num_waiting(self) -> int:
        return self._snap["waiting"] + self.num_pending

    def refresh_stats(self, timeout: float = 5.0) -> bool:
        """Ask the child for a snapshot and wait for it (or any newer one)."""
        with self._stats_cv:
            seq = self._stats_seq
        self._send(("stats",))
        with self._stats_cv:
            return self._stats_cv.wait_for(lambda: self._stats_seq > seq, timeout)

    # ------------------------------------------------------------------ requests (event loop)
    async def add(self, request_id: str, prompt, params) -> RequestStream:
        """Queue a request; raises ValueError with the engine's message if add_request rejects it."""
        if not self.alive:
            raise EngineDeadError(f"the engine process is not running ({self.dead!r})")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        added: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self.num_pending += 1
            self._sinks[request_id] = (loop, q)
            self._pending[request_id] = added
        try:
            self._send(("add", request_id, prompt, params))
        except OSError as e:
            with self._lock:
                self.num_pending -= 1
                self._sinks.pop(request_id, None)
                self._pending.pop(request_id, None)
            raise EngineDeadError(f"the engine process is not running ({e!r})") from None
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:  # the caller went away before the verdict: free the request
            self.abort(request_id)
            raise
        return RequestStream(self, request_id, q)

    def abort(self, request_id: str) -> None:
        with self._lock:
            had = self._sinks.pop(request_id, None) is not None
        if had:
            try:
                self._send(("abort", request_id))
            except OSError:
                pass

    def _send(self, msg) -> None:
        with self._send_lock:
            self._conn.send(msg)

    # ------------------------------------------------------------------ the reader thread
    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            sinks, self._sinks = self._sinks, {}
            pending, self._pending = self._pending, {}
            self.num_pending = 0
        for fut in pending.values():
            if not fut.done():
                _settle(fut, err)
        for loop, q in sinks.values():
            _post(loop, q.put_nowait, err)

    def _set_snap(self, snap: dict) -> None:
        self._snap = snap
        with self._stats_cv:
            self._stats_seq += 1
            self._stats_cv.notify_all()

    def _read(self) -> None:
        conn = self._conn
        try:
            while True:
                msg = conn.recv()
                self.heartbeat = time.monotonic()
                kind = msg[0]
                if kind == "out":
                    batch: dict = {}
                    with self._lock:
                        for out in msg[1]:
                            sink = self._sinks.get(out.request_id)
                            if sink is not None:
                                batch.setdefault(sink[0], []).append((sink[1], out))
                                if out.finished:
                                    del self._sinks[out.request_id]
                    self._set_snap(msg[2])
                    for loop, items in batch.items():  # one wake-up of each event loop per step
                        if not _post(loop, _deliver, items):  # its loop is closed: nobody reads these
                            for _, out in items:
                                self.abort(out.request_id)  # (a no-op for the finished ones)
                elif kind == "added":
                    _, rid, err, snap = msg
                    self._set_snap(snap)
                    with self._lock:
                        self.num_pending -= 1
                        fut = self._pending.pop(rid, None)
                        if err is not None:
                            self._sinks.pop(rid, None)
                    told = fut is not None and _settle(fut, None if err is None else ValueError(err))
                    if not told and err is None:  # nobody waits any more (its add was cancelled): free it
                        self.abort(rid)
                elif kind == "stats":
                    self._set_snap(msg[1])
                elif kind == "dead":
                    raise RuntimeError(msg[1])
        except BaseException as e:  # noqa: BLE001 -- the child died or went away
            if self._closing:
                self._fail_all(EngineDeadError("the server is shutting down"))
                return
            try:
                code = self.proc.wait(2)
            except subprocess.TimeoutExpired:
                code = None
            what = f"engine loop died: {e}" if isinstance(e, RuntimeError) else \
                f"the engine process died (exit code {code})"
            log.error("%s", what)
            self.dead = EngineDeadError(what)
            self._fail_all(EngineDeadError(what))
            self._kill()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    sys.exit(child_main(int(sys.argv[1])))
