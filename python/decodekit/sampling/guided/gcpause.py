"""gc_paused(): the cyclic garbage collector off while a guide is checked or compiled, on any thread."""
from __future__ import annotations

import contextlib
import gc
import threading

_gc_lock = threading.Lock()
_gc_pauses = 0                  # threads inside gc_paused()
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off while a guide is checked or compiled, back on (if it was) when the last
    thread inside leaves. Compiling a large guide builds hundreds of thousands of objects, and each full
    collection they set off walks the whole heap holding the GIL: a 20000-way regex compiled in 3.9 s with the
    collector on, 0.9 s paused (then one collection of its garbage when the collector is back on); in the server
    the step loop and the event loop, waiting on the GIL, stalled 0.1-0.2 s again and again meanwhile."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()
                gc.collect(0)   # the garbage of the pause now (its memory bounded), not at some later allocation
