"""`decodekit serve`: the OpenAI-compatible server (FastAPI + uvicorn) over the engine.

    decodekit serve [--model ...] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [engine options]

The engine runs in its own process (engine_proc.EngineProcess: the HTTP layer's Python does not
share a GIL with the engine loop); --engine-in-thread runs it in a thread of the server process
instead (async_engine.AsyncEngine). protocol.py parses and validates OpenAI requests, app.py holds
the endpoints, metrics.py the Prometheus metrics. SIGTERM / Ctrl-C: stop accepting, let in-flight
requests finish for up to --shutdown-timeout seconds, then abort the rest and stop the engine.
"""
from __future__ import annotations


def add_args(p) -> None:
    from decodekit.engine.args import EngineArgs
    EngineArgs.add_cli_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    g.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY on every endpoint but /health")
    g.add_argument("--served-model-name", default=None, help="the model id clients send (default: the model's name)")
    g.add_argument("--max-queue", type=int, default=1024,
                   help="waiting sequences at most; beyond, new requests get 503 + Retry-After (a request of more "
                        "sequences than this, n x prompts, can never fit: 400) (default 1024)")
    g.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="tool_choice 'auto' (the default with tools): read tool calls out of the model's own syntax "
                        "(needs --tool-call-parser)")
    from .tools import TOOL_CALL_PARSERS
    g.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_PARSERS,
                   help="the model's tool-call syntax for 'auto': hermes (Hermes, Qwen2.5: <tool_call>{...}</tool_call>)"
                        " or llama3_json (Llama 3.1+: {\"name\": ..., \"parameters\": ...})")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file, or the template itself) instead of the model's")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="let requests give their own chat_template (rendered in a sandbox; off by default, as in vLLM)")
    g.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may take to finish on SIGTERM (default 10)")
    g.add_argument("--engine-in-thread", action="store_true",
                   help="run the engine in a thread of the server process (default: in its own process, so the "
                        "HTTP layer does not compete with it for the GIL)")


def read_chat_template(value: str | None) -> str | None:
    """--chat-template: a file holding the template, or the template itself (vLLM's); ValueError naming the flag."""
    import os

    from decodekit.tokenizer.chat import check_template
    if value is None:
        return None
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template: cannot read {value!r}: {e}") from None
    elif "{{" not in value and "{%" not in value:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    try:
        return check_template(value)
    except ValueError as e:
        raise ValueError(f"--chat-template: {e}") from None


def _server_class():
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGTERM / SIGINT that ended in a graceful shutdown exits 0 instead of
        being re-raised at the end, and requests still running `drain_after` seconds into the shutdown are
        ended by drain() (the engine stopped: each fails with a 503 JSON error, or its stream with an error
        event and [DONE]) before uvicorn's own deadline would cancel their tasks (a bare 500 page, a stream cut
        mid-body)."""

        def __init__(self, config, drain=None, drain_after: float = 0.0):
            super().__init__(config)
            self.drain, self.drain_after = drain, drain_after

        async def shutdown(self, sockets=None):
            import asyncio
            loop = asyncio.get_running_loop()
            timer = None
            if self.drain is not None:
                timer = loop.call_later(self.drain_after, lambda: loop.run_in_executor(None, self.drain))
            try:
                await super().shutdown(sockets)
            finally:
                if timer is not None:
                    timer.cancel()

        @contextlib.contextmanager
        def capture_signals(self):
            sigs = (signal.SIGINT, signal.SIGTERM)
            old = {s: signal.signal(s, self.handle_exit) for s in sigs}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
    return Server


def serve(args) -> int:
    import math
    import socket

    if args.max_queue < 1:
        raise ValueError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if not (math.isfinite(args.shutdown_timeout) and args.shutdown_timeout >= 0):
        raise ValueError(f"--shutdown-timeout must be a finite number of seconds >= 0, got {args.shutdown_timeout}")
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    try:  # the address first: a bad host or a port in use is a one-line error before the model loads
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
    except OSError as e:
        raise ValueError(f"--host / --port {args.host}:{args.port}: cannot listen there "
                         f"({e.strerror or e})") from None
    if args.enable_auto_tool_choice != (args.tool_call_parser is not None):
        raise ValueError("--enable-auto-tool-choice and --tool-call-parser go together (as in vLLM)")
    template = read_chat_template(args.chat_template)
    try:
        return _serve_on(args, sock, template)
    finally:
        sock.close()


def _serve_on(args, sock, template) -> int:
    import os
    import sys

    import uvicorn

    from decodekit.engine.args import EngineArgs

    from .app import ServerConfig, build_app
    _Server = _server_class()
    if getattr(args, "engine_in_thread", False):
        from decodekit.engine.llm_engine import LLMEngine

        from .async_engine import AsyncEngine
        aeng = AsyncEngine(LLMEngine(EngineArgs.from_cli(args)))
    else:
        from .engine_proc import EngineProcess
        aeng = EngineProcess(EngineArgs.from_cli(args))
    try:
        engine = aeng.engine
        name = args.served_model_name or args.model or os.path.splitext(os.path.basename(engine.model_source))[0]
        aeng.start()
        app = build_app(aeng, ServerConfig(model_name=name, api_key=args.api_key, max_queue=args.max_queue,
                                           max_body_bytes=args.max_body_bytes,
                                           tool_call_parser=args.tool_call_parser,
                                           reasoning_parser=args.reasoning_parser, chat_template=template,
                                           trust_request_chat_template=args.trust_request_chat_template))
        host, port = sock.getsockname()[:2]
        # (uvicorn's deadline a little past ours: the drained requests' error replies get written)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout + 5,
                                access_log=False)
        server = _Server(config, drain=aeng.shutdown, drain_after=args.shutdown_timeout)
        print(f"decodekit serving {name!r} at http://{host}:{port}/v1 (health: /health, metrics: /metrics)",
              file=sys.stderr, flush=True)
        server.run(sockets=[sock])
    finally:
        aeng.shutdown()
    return 0
