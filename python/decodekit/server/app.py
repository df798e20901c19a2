"""The OpenAI-compatible HTTP API (FastAPI): /v1/completions, /v1/chat/completions (streaming with
server-sent events ending in `data: [DONE]`), /v1/models, /health, /metrics, and vLLM's /tokenize,
/detokenize and /version.

Requests go to the engine (engine_proc.EngineProcess: its own process; or async_engine.AsyncEngine:
a thread); a client that disconnects has its requests aborted
(streaming: the response generator is cancelled; non-streaming: the handler polls the connection).
Invalid input gets a 4xx OpenAI error body naming the field; a full queue 503 with Retry-After (a request
of more sequences than max_queue, which could never be admitted, a 400 naming `n` or `prompt`).
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.prompts import encode_prompt, truncate_prompt
from ..sampling.reasoning import ReasoningStream, get_reasoning_parser, prompt_mode, split_reasoning
from ..tokenizer.chat import RenderedTooLongError
from . import protocol as P
from decodekit.sampling.guided.gcpause import gc_paused

from .async_engine import AsyncEngine, EngineDeadError
from .beam import beam_params
from .metrics import ServerMetrics
from .tools import AutoToolStream, new_call_id, parse_auto, parse_tools, tool_calls, tool_schema


@dataclass
class ContentView:
    """A reply's content alone (a reasoning reply's text after its reasoning), as the tool-call code reads a choice."""
    index: int
    text: str
    delta_text: str
    finish_reason: str | None


@dataclass
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_queue: int = 1024            # waiting sequences before new requests get 503
    max_body_bytes: int = 4 << 20
    stuck_after_s: float = 60.0      # health fails when the loop has work but has not turned for this long
    tool_call_parser: str | None = None  # tool_choice "auto": the model's tool-call syntax (server/tools.py)
    reasoning_parser: str | None = None  # the reply's <think> part as reasoning_content (sampling/reasoning.py)
    chat_template: str | None = None     # instead of the model's (--chat-template)
    trust_request_chat_template: bool = False  # requests may give their own chat_template


def build_app(aeng: AsyncEngine, cfg: ServerConfig) -> FastAPI:
    app = FastAPI(title="decodekit", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(aeng, cfg.model_name)
    app.state.aeng, app.state.cfg, app.state.metrics = aeng, cfg, metrics
    eng = aeng.engine
    tok = eng.tokenizer
    tok.token_bytes()       # (built once, ~0.2 s, now: logprobs' bytes / text_offset read it on the event loop)
    vocab = eng.model_config.vocab_size
    defaults = eng.default_sampling     # the model's generation config: fields a request leaves out

    @app.exception_handler(P.APIError)
    async def _api_error(_req, e: P.APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req, e: StarletteHTTPException):  # unknown path / method: OpenAI's error body too
        msg = f"Invalid URL ({req.method} {req.url.path})" if e.status_code == 404 else \
            f"method {req.method} is not allowed on {req.url.path}" if e.status_code == 405 else str(e.detail)
        return JSONResponse(P.APIError(e.status_code, msg).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_req, e: Exception):  # never a bare 500 page; the engine keeps running
        return JSONResponse(P.APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error").body(),
                            status_code=500)

    def auth(request: Request) -> None:
        if cfg.api_key is None:
            return
        h = request.headers.get("authorization", "")
        given = h[7:] if h.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), cfg.api_key.encode()):
            raise P.APIError(401, "invalid or missing API key (Authorization: Bearer KEY)", type="authentication_error",
                             code="invalid_api_key")

    async def json_reply(build) -> Response:
        """build()'s dict as a JSON reply, built and serialized off the event loop: the logprobs of n x max_tokens
        x top_logprobs (or of a long echoed prompt) take seconds to write out, which would stall every other
        stream and /health meanwhile."""
        def run() -> bytes:
            return json.dumps(build(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        return Response(await asyncio.to_thread(run), media_type="application/json")

    async def body_of(request: Request) -> dict:
        ctype = request.headers.get("content-type")
        if ctype is not None and not P.is_json_media_type(ctype):
            # (a browser page may POST text/plain or a form to another origin without asking first: never run it)
            raise P.APIError(415, f"Content-Type {ctype[:80]!r} is not supported: send the JSON body as "
                                  f"application/json", "Content-Type")
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > cfg.max_body_bytes:
            raise P.APIError(413, f"request body over {cfg.max_body_bytes} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cfg.max_body_bytes:
                    raise P.APIError(413, f"request body over {cfg.max_body_bytes} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to log
            raise P.APIError(499, "client disconnected") from None
        body = P.parse_json_body(b"".join(chunks))
        m = body.get("model")
        if m is not None and m != cfg.model_name:
            raise P.APIError(404, f"model {json.dumps(m)[:100]} is not served here (serving {cfg.model_name!r})",
                             "model", code="model_not_found")
        return body

    def admit(num_prompts: int, n: int) -> None:
        num_seqs = num_prompts * n
        if num_seqs > cfg.max_queue:  # never fits, even on an idle server: not worth a retry
            what = (f"'prompt' holds {num_prompts} prompts" if n == 1 else
                    f"'n'={P._show(n)}" + (f" x {num_prompts} prompts" if num_prompts > 1 else ""))
            raise P.APIError(400, f"this request needs {P._show(num_seqs)} sequences ({what}) but at most max_queue="
                                  f"{cfg.max_queue} can wait at once: it can never be admitted",
                             "n" if n > 1 else "prompt")
        if not aeng.alive:
            raise P.APIError(503, "the engine is not running", type="server_error", headers={"Retry-After": "5"})
        if aeng.num_waiting() + num_seqs > cfg.max_queue:
            raise P.APIError(503, f"server busy: {aeng.num_waiting()} sequences waiting (max_queue={cfg.max_queue})",
                             type="server_error", code="queue_full", headers={"Retry-After": "1"})

    async def encoded(prompt):
        """A text prompt as token ids (engine.prompts.encode_prompt) in a worker thread (the tokenizer releases the GIL
        on long texts), so neither this event loop nor the engine's step loop waits on a long prompt."""
        if not isinstance(prompt, str):
            return prompt
        try:
            return {"prompt_token_ids": await asyncio.to_thread(encode_prompt, tok, prompt, eng.max_model_len, vocab)}
        except ValueError as e:
            raise P.APIError(400, str(e), "prompt") from None

    async def render_chat(messages: list[dict], add_generation_prompt: bool = True,
                          add_special_tokens: bool = False, continue_final_message: bool = False,
                          tools: list[dict] | None = None, template: str | None = None,
                          template_kwargs: dict | None = None) -> list[int]:
        """The conversation through the chat template, as token ids, in a worker thread (other requests keep
        streaming); refused before rendering when its characters alone cannot fit in max_model_len."""
        chars = P.message_chars(messages)
        limit = tok.max_prompt_chars(eng.max_model_len)
        if chars > limit:
            raise P.APIError(400, f"'messages' hold {chars} characters: they cannot fit in max_model_len="
                                  f"{eng.max_model_len} tokens (at most {limit} characters could)", "messages")

        def render() -> list[int]:
            try:
                text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                               continue_final_message=continue_final_message,
                                               chat_template=template or cfg.chat_template, max_chars=limit,
                                               **({"tools": tools} if tools else {}), **(template_kwargs or {}))
            except RenderedTooLongError as e:   # (a request's own template, or the model's on its messages)
                raise P.APIError(400, str(e), "chat_template" if template else "messages") from None
            except Exception as e:  # noqa: BLE001 -- the template rejected the conversation
                raise P.APIError(400, f"the chat template cannot render these messages: {e}", "messages") from None
            try:
                return tok.encode(text, add_special_tokens=add_special_tokens)
            except ValueError as e:  # e.g. a lone surrogate (a JSON "\ud800" escape) in a role or content
                raise P.APIError(400, f"'messages' must be valid Unicode text: {e}", "messages") from None
        return await asyncio.to_thread(render)

    async def request_params(body: dict, max_tokens: int, logprobs: int | None):
        """P.sampling_params in a worker thread: a guide's pattern (a JSON schema's translation, a long regex's
        parse) can take seconds to check, which would stall every other stream and /health meanwhile (the guide
        itself is compiled by the engine's add, also off its loop: AsyncEngine.add / engine_proc._PrepareWorker)."""
        def run():
            with gc_paused() if P.guide_source(body) is not None else contextlib.nullcontext():
                return P.sampling_params(body, max_tokens, logprobs, vocab, P.request_defaults(body, defaults))
        return await asyncio.to_thread(run)

    async def start(prompts: list, params, prefix: str, beam=None, max_tokens_field: str = "max_tokens") -> list:
        """The prompts' request streams (beam: a BeamSearchParams, each prompt's beam search instead);
        max_tokens_field: the request's name for max_tokens, named in errors (max_completion_tokens)."""
        admit(len(prompts), params.n)
        streams = []
        try:
            for i, p in enumerate(prompts):
                streams.append(await aeng.add(f"{prefix}-{i}", p, params if beam is None else beam))
        except ValueError as e:
            for s in streams:
                s.abort()
            msg = str(e)
            named = re.match(r"(?:Sampling|BeamSearch)Params\.(\w+):", msg)  # SamplingParamsError: its field
            param = named.group(1) if named else \
                "max_tokens" if "max_tokens" in msg else ("prompt" if "prompt" in msg else None)
            if param == "max_tokens" and max_tokens_field != "max_tokens":
                param, msg = max_tokens_field, re.sub(r"\bmax_tokens\b", max_tokens_field, msg)
            raise P.APIError(400, msg, param) from None
        except EngineDeadError as e:
            raise P.APIError(503, str(e), type="server_error") from None
        return streams

    async def finals(request: Request, streams: list) -> list:
        """The finished outputs, aborting everything if the client goes away first."""
        task = asyncio.ensure_future(asyncio.gather(*(s.final() for s in streams)))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    task.cancel()
                    # a stream failing after the cancel would otherwise be logged as never retrieved
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
                    for s in streams:
                        s.abort()
                    raise P.APIError(499, "client disconnected")
        except EngineDeadError as e:
            raise P.APIError(503, str(e), type="server_error") from None
        finally:
            if not task.done():
                task.cancel()

    async def merged(streams: list):
        """(prompt index, output) from all streams as they come."""
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i, s):
            try:
                async for out in s:
                    await q.put((i, out, None))
            except BaseException as e:  # noqa: BLE001
                await q.put((i, None, e))
            await q.put((i, None, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        left = len(streams)
        try:
            while left:
                i, out, err = await q.get()
                if err is not None:
                    raise err
                if out is None:
                    left -= 1
                    continue
                yield i, out
        finally:
            for t in tasks:
                t.cancel()
            for s in streams:
                s.abort()

    def observe(out) -> None:
        metrics.observe_request(out.metrics, sum(len(c.token_ids) for c in out.outputs))

    def itl(last: dict, idx: int, c) -> None:
        """Inter-token latency: time between deliveries of new tokens to one choice (per token when a
        delivery carries several, as speculative steps do)."""
        if not c.delta_token_ids:
            return
        t = time.monotonic()
        if idx in last:
            gap = (t - last[idx]) / len(c.delta_token_ids)
            for _ in c.delta_token_ids:
                metrics.itl.observe(gap)
        last[idx] = t

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    # ------------------------------------------------------------------ endpoints
    @app.get("/health")
    async def health():
        if not aeng.alive:
            return JSONResponse({"status": "dead", "error": repr(aeng.dead)}, status_code=503)
        lag = time.monotonic() - aeng.heartbeat
        if aeng.busy() and lag > cfg.stuck_after_s:
            return JSONResponse({"status": "stuck", "seconds_since_last_step": lag}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request):
        auth(request)
        return {"object": "list", "data": [{"id": cfg.model_name, "object": "model", "created": P.now(),
                                            "owned_by": "decodekit", "max_model_len": eng.max_model_len}]}

    @app.get("/version")
    async def version():
        from .. import __version__
        return {"version": __version__}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's: {"prompt": str, "add_special_tokens": true} or {"messages": [...], "add_generation_prompt":
        true, "add_special_tokens": false} -> {"count", "max_model_len", "tokens"[, "token_strs"]}; token_strs
        are the vocabulary's token strings (convert_ids_to_tokens). Encoding and the JSON run in a worker
        thread: a 4 MB prompt does not hold up other requests."""
        auth(request)
        body = await body_of(request)
        strs = P.field(body, "return_token_strs", "bool", False)
        if body.get("messages") is not None:
            if body.get("prompt") is not None:
                raise P.APIError(400, "give either 'prompt' or 'messages', not both", "prompt")
            messages = P.chat_messages(body)
            agp, cont = P.chat_render_options(body, messages)
            template, tkw = P.chat_template_fields(body, cfg.trust_request_chat_template)
            docs = P.chat_documents(body)
            if docs is not None:    # (vLLM: chat_template_kwargs override the request's fields)
                tkw = {"documents": docs, **tkw}
            tools, _ = parse_tools({"tools": body.get("tools"), "tool_choice": "none"})
            ids = await render_chat(messages, agp, P.field(body, "add_special_tokens", "bool", False), cont, tools,
                                    template, tkw)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise P.APIError(400, "'prompt' (a string) or 'messages' is required", "prompt")
            special = P.field(body, "add_special_tokens", "bool", True)
            try:
                ids = await asyncio.to_thread(tok.encode, prompt, special)
            except ValueError:  # a lone surrogate
                raise P.APIError(400, "'prompt' must be valid Unicode text (it holds a lone surrogate)",
                                 "prompt") from None

        def answer() -> bytes:
            out = {"count": len(ids), "max_model_len": eng.max_model_len, "tokens": ids}
            if strs:
                out["token_strs"] = tok.convert_ids_to_tokens(ids)
            return json.dumps(out, ensure_ascii=False).encode()
        return Response(await asyncio.to_thread(answer), media_type="application/json")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's: {"tokens": [ids]} -> {"prompt": text} (special tokens kept)."""
        auth(request)
        body = await body_of(request)
        ids = P.int_list(body, "tokens", "token ids")
        if ids is None:
            raise P.APIError(400, "'tokens' must be a list of token ids", "tokens")
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise P.APIError(400, f"'tokens' must be token ids in [0, {vocab}), got {P._show(bad)}", "tokens")
        return {"prompt": await asyncio.to_thread(tok.decode, ids, False)}

    @app.get("/metrics")
    async def prom(request: Request):
        auth(request)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request):
        auth(request)
        body = await body_of(request)
        stream, include_usage, each_usage = P.stream_options(body)
        echo = P.field(body, "echo", "bool", False)
        P.reject_unsupported(body, ("suffix",) + P.UNSUPPORTED_COMMON)
        best_of = P.field(body, "best_of", "int", None, 1)
        lp = P.field(body, "logprobs", "int", None, 0, P.MAX_LOGPROBS)
        plp = P.prompt_logprobs_field(body, stream)
        prompts = P.completion_prompts(body, vocab)
        # echo with max_tokens=0 (lm-eval's loglikelihood requests): the prompt (and its logprobs) only
        max_tokens = P.capped_max_tokens(P.field(body, "max_tokens", "int", 16, 0 if echo else 1), defaults)
        params = await request_params(body, max(max_tokens, 1), lp)
        if max_tokens == 0 and params.min_tokens:
            raise P.APIError(400, f"'min_tokens' must be in [0, max_tokens=0], got {params.min_tokens}", "min_tokens")
        n = params.n
        gen_tokens = max_tokens > 0
        if not gen_tokens:  # the n choices of an echo-only request are the same: one sequence computes them
            params.n = 1
        want_plp = max(plp if plp is not None else -1, lp if echo and lp is not None else -1)
        params.prompt_logprobs = want_plp if want_plp >= 0 else None
        # echo: the prompt's text as given (decoded from the ids the engine kept when it truncates)
        texts = [p if isinstance(p, str) and params.truncate_prompt_tokens is None else None for p in prompts]
        prompts = [await encoded(p) for p in prompts]
        if best_of is not None and best_of != params.n:
            raise P.APIError(400, "'best_of' different from 'n' is not supported", "best_of")
        beam = beam_params(body, params)
        if beam is not None and (not gen_tokens or params.prompt_logprobs is not None):
            name = "max_tokens" if not gen_tokens else "prompt_logprobs" if plp is not None else "echo"
            raise P.APIError(400, f"'{name}' is not supported with use_beam_search" +
                             (" (it needs max_tokens >= 1)" if not gen_tokens else
                              "" if plp is not None else " and logprobs (no prompt logprobs)"), name)
        rid = P.new_id("cmpl")
        streams = await start(prompts, params, rid, beam)
        created = P.now()

        def indices(i: int, c) -> range:  # the choice indices an output sequence answers
            return range(i * n + c.index, i * n + c.index + 1) if gen_tokens else range(i * n, i * n + n)

        def echoed(i: int, out) -> tuple[str, dict | None]:
            """The prompt's text and (with logprobs) its legacy logprobs, for echo."""
            text = texts[i] if texts[i] is not None else tok.decode(out.prompt_token_ids, skip_special_tokens=False)
            lps = P.echo_logprobs(tok, out.prompt_token_ids, out.prompt_logprobs, lp) if lp is not None else None
            return text, lps

        def completion_reply(outs) -> dict:
            choices, ptoks, ctoks = [], 0, 0
            for i, out in enumerate(outs):
                ptoks += len(out.prompt_token_ids)
                head, head_lp = echoed(i, out) if echo else ("", None)
                plp_json = P.prompt_logprobs_json(out.prompt_logprobs, out.prompt_token_ids, plp) \
                    if plp is not None else None
                for c in out.outputs:
                    text, lps = (c.text, P.completion_logprobs(tok, c, 0, len(head), params.skip_special_tokens)) \
                        if gen_tokens else ("", None)
                    ctoks += len(c.token_ids) if gen_tokens else 0
                    for idx in indices(i, c):
                        choice = {"index": idx, "text": head + text,
                                  "finish_reason": c.finish_reason if gen_tokens else "length",
                                  "stop_reason": c.stop_reason if gen_tokens else None,   # (vLLM's field)
                                  "logprobs": P.join_logprobs(head_lp, lps) if echo and lp is not None else lps}
                        if plp is not None:
                            choice["prompt_logprobs"] = plp_json
                        choices.append(choice)
            return {"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                    "choices": choices, "usage": P.usage(ptoks, ctoks)}

        if not stream:
            outs = await finals(request, streams)
            for out in outs:
                observe(out)
            return await json_reply(lambda: completion_reply(outs))

        def chunk(choices, **extra):
            if include_usage:   # (OpenAI: every chunk has usage, null but on the last / continuous_usage_stats')
                extra.setdefault("usage", None)
            return sse({"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                        "choices": choices, **extra})

        async def gen():
            ptoks, ctoks, done = {}, {}, set()
            heads: dict[int, int] = {}            # echo: the prompt's length in characters, once sent
            sent: dict[int, tuple[int, int]] = {}  # tokens and characters of the completion sent so far
            cursors: dict[int, P.OffsetCursor] = {}    # logprobs' text_offset, token by token
            last: dict[int, float] = {}
            try:
                async for i, out in merged(streams):
                    ptoks[i] = len(out.prompt_token_ids)
                    for c in out.outputs:
                        for idx in indices(i, c):
                            if idx in done:
                                continue
                            if echo and idx not in heads:
                                # the prompt first; its logprobs come with the first output after the whole
                                # prompt ran (with n > 1 another sample may have tokens before: they follow)
                                if lp is not None and out.prompt_logprobs is None:
                                    continue
                                head, head_lp = echoed(i, out)
                                heads[idx] = len(head)
                                yield chunk([{"index": idx, "text": head, "logprobs": head_lp, "finish_reason": None,
                                              "stop_reason": None}],
                                            **({"usage": P.usage(ptoks[i], 0)} if each_usage else {}))
                            if not gen_tokens:            # echo only: the computed token is not shown
                                if c.finish_reason:
                                    done.add(idx)
                                    yield chunk([{"index": idx, "text": "", "logprobs": None,
                                                  "finish_reason": "length", "stop_reason": None}],
                                                **({"usage": P.usage(ptoks[i], 0)} if each_usage else {}))
                                continue
                            ntok, nchr = sent.get(idx, (0, 0))
                            text = c.text[nchr:]
                            if len(c.token_ids) == ntok and not text and not c.finish_reason:
                                continue
                            if c.logprobs is not None and idx not in cursors:
                                cursors[idx] = P.OffsetCursor(tok, params.skip_special_tokens)
                            lps = P.completion_logprobs(tok, c, ntok, heads.get(idx, 0), params.skip_special_tokens,
                                                        cursors.get(idx))
                            sent[idx] = (len(c.token_ids), len(c.text))
                            ctoks[idx] = len(c.token_ids)
                            itl(last, idx, c)
                            if c.finish_reason:
                                done.add(idx)
                            yield chunk([{"index": idx, "text": text, "logprobs": lps, "finish_reason": c.finish_reason,
                                          "stop_reason": c.stop_reason if c.finish_reason else None}],
                                        **({"usage": P.usage(ptoks[i], len(c.token_ids))} if each_usage else {}))
                    if out.finished:
                        observe(out)
                if include_usage:
                    yield chunk([], usage=P.usage(sum(ptoks.values()), sum(ctoks.values())))
            except EngineDeadError as e:
                yield sse(P.APIError(503, str(e), type="server_error").body())
            yield "data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        auth(request)
        body = await body_of(request)
        stream, include_usage, each_usage = P.stream_options(body)
        P.reject_unsupported(body, P.UNSUPPORTED_COMMON + P.UNSUPPORTED_CHAT)
        messages = P.chat_messages(body)
        want_lp = P.field(body, "logprobs", "bool", False)
        top = P.field(body, "top_logprobs", "int", None, 0, P.MAX_LOGPROBS)
        if top is not None and not want_lp:
            raise P.APIError(400, "'top_logprobs' needs logprobs=true", "top_logprobs")
        plp = P.prompt_logprobs_field(body, stream)
        agp, cont = P.chat_render_options(body, messages)
        template, tkw = P.chat_template_fields(body, cfg.trust_request_chat_template)
        docs = P.chat_documents(body)
        if docs is not None:    # (vLLM: chat_template_kwargs override the request's fields)
            tkw = {"documents": docs, **tkw}
        tools, tchoice = parse_tools(body, cfg.tool_call_parser)
        ids = await render_chat(messages, agp, False, cont, tools, template, tkw)
        if not ids:
            raise P.APIError(400, "the rendered conversation is empty", "messages")
        # max_completion_tokens (OpenAI's current name) first, then the deprecated max_tokens, as vLLM / SGLang
        mt = P.field(body, "max_completion_tokens", "int", P.field(body, "max_tokens", "int", None, 1), 1)
        trunc = P.truncate_field(body)
        if trunc is not None:   # (vLLM's) keep the conversation's last tokens (before the length check below)
            try:
                ids = truncate_prompt(ids, trunc, eng.max_model_len, mt)
            except ValueError as e:
                raise P.APIError(400, str(e), "truncate_prompt_tokens") from None
        if len(ids) >= eng.max_model_len:
            raise P.APIError(400, f"'messages' render to {len(ids)} tokens: at most max_model_len - 1 = "
                                  f"{eng.max_model_len - 1} fit (one token of output at least)", "messages")
        if mt is None:
            mt = eng.max_model_len - len(ids)
        mt = P.capped_max_tokens(mt, defaults)
        parallel = P.field(body, "parallel_tool_calls", "bool", True)
        schema = tool_schema(tools, tchoice, parallel) if tools else None
        if schema is not None:      # the reply is constrained to the tool(s)' schema
            other = P.guide_source(body)
            if other is not None:
                raise P.APIError(400, f"give tool_choice 'required' / a named function or another guide ({other}), "
                                      f"not both", "tool_choice")
            body = {**body, "guided_json": schema}
        try:
            params = await request_params(body, mt, (top or 0) if want_lp else None)
        except P.APIError as e:
            if schema is None or e.param != "guided_json":
                raise
            raise P.APIError(400, f"the tools' parameters schemas: {e.message}", "tools") from None
        params.prompt_logprobs = plp
        beam = beam_params(body, params)
        if beam is not None and plp is not None:
            raise P.APIError(400, "'prompt_logprobs' is not supported with use_beam_search", "prompt_logprobs")
        if beam is None and tchoice == "auto" and tools and cfg.tool_call_parser == "mistral":
            params.skip_special_tokens = False      # [TOOL_CALLS] is a special token: keep it in the text (vLLM)
        rid = P.new_id("chatcmpl")
        thinker = get_reasoning_parser(cfg.reasoning_parser)
        # where the reply's reasoning starts and ends: from the prompt as the engine reads it (its guides agree)
        mode = await asyncio.to_thread(prompt_mode, thinker, tok, ids) if thinker else None
        mt_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        streams = await start([{"prompt_token_ids": ids}], params, rid, beam, mt_field)
        created = P.now()

        def chat_reply(out) -> dict:
            choices = []
            for c in out.outputs:
                reasoning, text = split_reasoning(thinker, mode, c.text) if thinker else (None, c.text)
                msg, finish = {"role": "assistant", "content": text}, c.finish_reason
                if schema is not None:
                    calls, finish = tool_calls(tchoice, text or "", c.finish_reason)
                    if calls is not None:
                        msg = {"role": "assistant", "content": None, "tool_calls": calls}
                elif tchoice == "auto":
                    content, calls = parse_auto(cfg.tool_call_parser, text or "", tools)
                    if calls is not None:
                        msg = {"role": "assistant", "content": content, "tool_calls": calls}
                        finish = "tool_calls" if finish == "stop" else finish
                if thinker:     # (vLLM's newer name "reasoning" too)
                    msg["reasoning_content"] = msg["reasoning"] = reasoning
                choices.append({"index": c.index, "message": msg,
                                "logprobs": P.chat_logprobs(c, 0, top or 0, tok) if want_lp else None,
                                "finish_reason": finish, "stop_reason": c.stop_reason})
            resp = {"id": rid, "object": "chat.completion", "created": created, "model": cfg.model_name,
                    "choices": choices,
                    "usage": P.usage(len(ids), sum(len(c.token_ids) for c in out.outputs))}
            if plp is not None:
                resp["prompt_logprobs"] = P.prompt_logprobs_json(out.prompt_logprobs, out.prompt_token_ids, plp)
            return resp

        if not stream:
            (out,) = await finals(request, streams)
            observe(out)
            return await json_reply(lambda: chat_reply(out))

        def chunk(choices, **extra):
            if include_usage:   # (OpenAI: every chunk has usage, null but on the last / continuous_usage_stats')
                extra.setdefault("usage", None)
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": cfg.model_name,
                        "choices": choices, **extra})

        call_ids: dict[int, str] = {}

        def tool_delta(c, delta: dict, ids: dict) -> tuple[dict | None, str | None]:
            """A tool-calling reply's delta: a named function's arguments as they come (id and name first);
            "required" calls whole at the end (their text when it does not parse)."""
            if isinstance(tchoice, dict):
                if "content" not in delta:
                    return delta, c.finish_reason
                call = {"index": 0, "function": {"arguments": delta["content"]}}
                if c.index not in ids:
                    ids[c.index] = new_call_id()
                    call = {"index": 0, "id": ids[c.index], "type": "function",
                            "function": {"name": tchoice["name"], "arguments": delta["content"]}}
                return {"tool_calls": [call]}, c.finish_reason
            if not c.finish_reason:
                return None, None
            calls, finish = tool_calls(tchoice, c.text, c.finish_reason)
            if calls is None:
                return {"content": c.text}, finish
            return {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}, finish

        auto_streams: dict[int, AutoToolStream] = {}
        think_streams: dict[int, ReasoningStream] = {}

        def think_delta(c) -> tuple[str, ContentView]:
            """A reasoning reply's new reasoning text, and the output as its content alone (text, delta_text)."""
            st = think_streams.setdefault(c.index, ReasoningStream(thinker, mode))
            thought, new = st.finish(c.text) if c.finish_reason else st.feed(c.text)
            return thought, ContentView(c.index, st.content, new, c.finish_reason)

        def auto_delta(c) -> tuple[dict, str | None]:
            """An "auto" reply's delta: content until a call may begin, the calls (and any content held
            back that turned out not to be one) at the end."""
            st = auto_streams.setdefault(c.index, AutoToolStream(cfg.tool_call_parser))
            text = st.feed(c.text)
            if not c.finish_reason:
                return {"content": text}, None
            tail, calls = st.finish(c.text, tools)
            delta = {"content": text + (tail or "")} if text or tail else {}
            if calls is None:
                return delta, c.finish_reason
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
            return delta, "tool_calls" if c.finish_reason == "stop" else c.finish_reason

        async def gen():
            ctoks, done = {}, set()
            last: dict[int, float] = {}
            try:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": "" if schema is None else None},
                              "logprobs": None,
                              "finish_reason": None} for i in range(params.n)],
                            **({"usage": P.usage(len(ids), 0)} if each_usage else {}))
                async for _, out in merged(streams):
                    for c in out.outputs:
                        if c.index in done or (not c.delta_token_ids and not c.delta_text and not c.finish_reason):
                            continue
                        start_tok = len(c.token_ids) - len(c.delta_token_ids)
                        ctoks[c.index] = len(c.token_ids)
                        itl(last, c.index, c)
                        thought, cc = "", c
                        if thinker:     # the reasoning goes out apart; the rest below sees the content only
                            thought, cc = think_delta(c)
                        delta = {"content": cc.delta_text} if cc.delta_text or not (c.finish_reason or thought) else {}
                        finish = c.finish_reason
                        if tchoice == "auto":
                            delta, finish = auto_delta(cc)
                            if thought and delta == {"content": ""}:
                                delta = {}
                        if schema is not None:
                            delta, finish = tool_delta(cc, delta, call_ids)
                            if not isinstance(tchoice, dict):
                                start_tok = 0       # "required": the calls and their logprobs come whole at the end
                            if delta is None:       # ... when they are done
                                if not thought:
                                    continue
                                delta, start_tok = {}, len(c.token_ids)
                        if thought:
                            delta = {"reasoning_content": thought, "reasoning": thought, **delta}
                        if delta == {"content": ""} and not finish and not want_lp:
                            continue        # (text held back, e.g. a tool call that may have begun: nothing new)
                        if c.finish_reason:
                            done.add(c.index)
                        yield chunk([{"index": c.index, "delta": delta,
                                      "logprobs": P.chat_logprobs(c, start_tok, top or 0, tok) if want_lp else None,
                                      "finish_reason": finish,
                                      "stop_reason": c.stop_reason if c.finish_reason else None}],
                                    **({"usage": P.usage(len(ids), len(c.token_ids))} if each_usage else {}))
                    if out.finished:
                        observe(out)
                if include_usage:
                    yield chunk([], usage=P.usage(len(ids), sum(ctoks.values())))
            except EngineDeadError as e:
                yield sse(P.APIError(503, str(e), type="server_error").body())
            yield "data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    return app
