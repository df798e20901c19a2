"""Helpers for the server tests: a live decodekit server on a free loopback port (uvicorn in a
thread) and a wait for the engine to go idle with every KV block free."""
from __future__ import annotations

import socket
import threading
import time

class LiveServer:
    def __init__(self, aeng, **cfg):
        import uvicorn
        from decodekit.server.app import ServerConfig, build_app
        self.aeng = aeng
        self.app = build_app(aeng, ServerConfig(model_name="smollm2", **cfg))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.05)
        assert self.server.started

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def wait_idle(aeng, timeout=30.0):
    """Until the engine holds no request and every KV block is free."""
    eng = aeng.engine
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if not aeng.busy() and not eng.scheduler.has_unfinished_requests() \
                and eng.kv_manager.num_free_blocks == eng.kv_manager.num_blocks:
            return True
        time.sleep(0.05)
    return False
