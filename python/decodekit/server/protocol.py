"""OpenAI request parsing and response shapes for /v1/completions and /v1/chat/completions.

Every invalid request raises APIError naming the offending field (`param`) with the allowed range;
the app turns it into {"error": {"message", "type", "param", "code"}} and a 4xx status. Unknown
fields are ignored (as the OpenAI API does); `model` must name the served model when given.
"""
from __future__ import annotations

import codecs
import json
import re
import math
import time
import uuid

from decodekit.sampling import SamplingParams
from decodekit.sampling.params import GUIDED_FIELDS, MAX_TOP_K, SamplingParamsError, _show

MAX_LOGPROBS = 20


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def is_json_media_type(content_type: str) -> bool:
    """application/json (any parameters, e.g. charset) or a +json type, as a JSON API takes bodies."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object (strict UTF-8, no NaN / Infinity)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if _SURROGATE_ESCAPE.search(text):      # (only a \\uD800-\\uDFFF escape can put one in: find where it is alone)
        path = _lone_surrogate(body)
        if path is not None:
            shown = path.encode("utf-8", "backslashreplace").decode("utf-8")
            raise APIError(400, f"'{shown}' holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair): "
                                f"text must be valid Unicode", re.split(r"[.\[]", shown)[0])
    return body


_SURROGATE_ESCAPE = re.compile(r"\\[uU][dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(body: dict) -> str | None:
    """The path (field.sub[2].key) of the first string or key of `body` holding a lone surrogate, or None."""
    stack = [(k, k, v) for k, v in reversed(list(body.items()))]     # (path, own key or "", value)
    while stack:
        path, key, v = stack.pop()
        if _SURROGATE.search(key) or (isinstance(v, str) and _SURROGATE.search(v)):
            return path
        if isinstance(v, dict):
            stack += [(f"{path}.{k}", k, x) for k, x in reversed(list(v.items()))]
        elif isinstance(v, list):
            stack += [(f"{path}[{i}]", "", x) for i, x in reversed(list(enumerate(v)))]
    return None


# --------------------------------------------------------------------------- field checks
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_list(body: dict, name: str, what: str = "ints") -> list[int] | None:
    """body[name] as a list of ints (None when absent); a 400 naming it otherwise."""
    v = body.get(name)
    if v is not None and (not isinstance(v, list) or not all(_is_int(t) for t in v)):
        raise APIError(400, f"'{name}' must be a list of {what}", name)
    return v


def str_list(v, name: str, param: str | None = None) -> list[str] | None:
    """v (a request value named `name`) as a list of strings (None stays None); a 400 naming `param` otherwise."""
    if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
        raise APIError(400, f"'{name}' must be a list of strings", param or name)
    return v


def field(body: dict, name: str, kind: str, default=None, lo=None, hi=None, lo_open: bool = False):
    """body[name] checked: kind int / number / bool / str, in [lo, hi] ((lo, hi] with lo_open); None (or
    absent) gives the default."""
    v = body.get(name)
    if v is None:
        return default
    rng = "" if lo is None and hi is None else \
        f" in {'(' if lo_open else '['}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    ok = {"int": _is_int(v), "number": (_is_int(v) or isinstance(v, float)), "bool": isinstance(v, bool),
          "str": isinstance(v, str)}[kind]
    if not ok:
        raise APIError(400, f"'{name}' must be {'an' if kind == 'int' else 'a'} {kind}{rng}, got {json.dumps(v)[:80]}",
                       name)
    if kind in ("int", "number"):
        if isinstance(v, float) and not math.isfinite(v):
            raise APIError(400, f"'{name}' must be finite", name)
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise APIError(400, f"'{name}' must be{rng}, got {_show(v)}", name)
    return v


def truncate_field(body: dict) -> int | None:
    """truncate_prompt_tokens: None, -1 or an int >= 1."""
    v = body.get("truncate_prompt_tokens")
    if v is not None and (not _is_int(v) or not (v == -1 or v >= 1)):
        raise APIError(400, f"'truncate_prompt_tokens' must be -1 or an int >= 1, got {json.dumps(v)[:80]}",
                       "truncate_prompt_tokens")
    return v


def _stop(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s) or len(s) > 16:
        raise APIError(400, "'stop' must be a string or a list of at most 16 strings", "stop")
    if any(x == "" for x in s):
        raise APIError(400, "'stop' strings must not be empty", "stop")
    return s


def _guides(body: dict) -> dict:
    """The guide of a request, in SamplingParams' fields, from OpenAI's response_format ({"type":
    "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}) or vLLM's guided_choice /
    guided_regex / guided_json / guided_whitespace_pattern or structured_outputs (handed to SamplingParams,
    which spreads and checks it); more than one guide is a 400. "_source" names the request field the guide
    came from (errors from SamplingParams are reported against it)."""
    found: list[tuple[str, dict]] = []
    if body.get("guided_json") is False:
        raise APIError(400, "'guided_json' false matches nothing (give a schema, or leave the field out)", "guided_json")
    for k in ("guided_choice", "guided_regex", "guided_json", "guided_grammar"):
        v = body.get(k)
        if v is not None:
            found.append((k, {k: str_list(v, k) if k == "guided_choice" else v}))
    so = body.get("structured_outputs")
    if so is not None and so != {}:
        found.append(("structured_outputs", {"structured_outputs": so}))
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        if not isinstance(rf, dict):
            raise APIError(400, f"'response_format' must be an object such as {{\"type\": \"json_object\"}}, got "
                                f"{type(rf).__name__} {json.dumps(rf)[:40]}", "response_format")
        t = rf.get("type")
        if t == "json_object":
            found.append(("response_format", {"guided_json_object": True}))
        elif t == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", js.get("json_schema")), (dict, bool)):
                raise APIError(400, "'response_format' of type json_schema needs json_schema: {\"name\": ..., "
                                    "\"schema\": {...}} with the schema an object", "response_format")
            schema = js.get("schema", js.get("json_schema"))
            if schema is False:
                raise APIError(400, "'response_format.json_schema.schema' false matches nothing", "response_format")
            found.append(("response_format", {"guided_json": schema}))
        elif t != "text":
            raise APIError(400, f"'response_format.type' must be text, json_object or json_schema, got "
                                f"{json.dumps(t)[:40]}", "response_format")
    if len(found) > 1:
        raise APIError(400, f"give one guide at most, got {found[0][0]} and {found[1][0]}", found[1][0])
    ws = body.get("guided_whitespace_pattern")
    kw = dict(found[0][1]) if found else {}
    if ws is not None:
        kw["guided_whitespace_pattern"] = ws
    if found:
        kw["_source"] = found[0][0]
    return kw


def guide_source(body: dict) -> str | None:
    """The request field a guide comes from (response_format, guided_*, structured_outputs), or None."""
    return _guides(body).get("_source")


def _token_controls(body: dict) -> dict:
    """logit_bias ({"token id": bias}, OpenAI's JSON form), allowed_token_ids, bad_words and the guide
    (_guides), in SamplingParams' types; their ranges are checked by SamplingParams (errors name the field)."""
    kw = {}
    lb = body.get("logit_bias")
    if lb is not None:
        if not isinstance(lb, dict):
            raise APIError(400, "'logit_bias' must be an object mapping token ids to biases in [-100, 100]",
                           "logit_bias")
        bias = {}
        for k, v in lb.items():
            if not (k.isascii() and k.isdigit() and len(k) <= 12):
                raise APIError(400, f"'logit_bias' keys must be token ids (decimal strings), got {json.dumps(k)[:40]}",
                               "logit_bias")
            if not (_is_int(v) or isinstance(v, float)):
                raise APIError(400, f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(v)[:40]}",
                               "logit_bias")
            bias[int(k)] = v
        kw["logit_bias"] = bias
    kw["allowed_token_ids"] = int_list(body, "allowed_token_ids")
    kw.update(_guides(body))
    kw["bad_words"] = str_list(body.get("bad_words"), "bad_words")
    return kw


def sampling_params(body: dict, max_tokens: int, logprobs: int | None, vocab_size: int | None = None,
                    defaults: dict | None = None) -> SamplingParams:
    """The SamplingParams of a request body (OpenAI fields incl. logit_bias, plus vLLM's top_k, min_p,
    repetition_penalty, ignore_eos, min_tokens, stop_token_ids, skip_special_tokens, allowed_token_ids,
    bad_words); `vocab_size` (when given) bounds
    stop_token_ids here, so those errors name their field too. defaults: the engine's default_sampling
    (the model's generation config) for the temperature, top_p, top_k, min_p and repetition_penalty a
    request leaves out (max_tokens: the caller's, see capped_max_tokens)."""
    d = defaults or {}
    field(body, "user", "str")      # (OpenAI's end-user id: only typed, as vLLM)
    kw = dict(
        n=field(body, "n", "int", 1, 1), temperature=field(body, "temperature", "number", d.get("temperature", 1.0), 0, 2),
        top_p=field(body, "top_p", "number", d.get("top_p", 1.0), 0, 1, lo_open=True),
        top_k=field(body, "top_k", "int", d.get("top_k", -1), -1, MAX_TOP_K),
        min_p=field(body, "min_p", "number", d.get("min_p", 0.0), 0, 1),
        presence_penalty=field(body, "presence_penalty", "number", 0.0, -2, 2),
        frequency_penalty=field(body, "frequency_penalty", "number", 0.0, -2, 2),
        repetition_penalty=field(body, "repetition_penalty", "number", d.get("repetition_penalty", 1.0)),
        seed=field(body, "seed", "int", None), stop=_stop(body),
        ignore_eos=field(body, "ignore_eos", "bool", False), min_tokens=field(body, "min_tokens", "int", 0, 0),
        skip_special_tokens=field(body, "skip_special_tokens", "bool", True),
        include_stop_str_in_output=field(body, "include_stop_str_in_output", "bool", False),
        truncate_prompt_tokens=truncate_field(body), max_tokens=max_tokens, logprobs=logprobs)
    kw["stop_token_ids"] = int_list(body, "stop_token_ids")
    kw.update(_token_controls(body))
    if kw["seed"] is not None and not 0 <= kw["seed"] < 2 ** 63:
        raise APIError(400, f"'seed' must be in [0, 2^63), got {_show(kw['seed'])}", "seed")
    source = kw.pop("_source", None)
    try:
        return SamplingParams(**kw).validate(vocab_size=vocab_size, max_logprobs=MAX_LOGPROBS)
    except SamplingParamsError as e:
        raise APIError(400, str(e), source if source and e.field in GUIDED_FIELDS else e.field) from None
    except ValueError as e:
        raise APIError(400, str(e)) from None


def request_defaults(body: dict, defaults: dict | None) -> dict:
    """The generation-config defaults a request takes: a beam search only its temperature (as vLLM: top-p /
    penalties recommended for sampling would make a search that cannot honour them refuse the request)."""
    d = defaults or {}
    return {k: v for k, v in d.items() if k == "temperature"} if body.get("use_beam_search") is True else d


def capped_max_tokens(max_tokens: int, defaults: dict | None) -> int:
    """max_tokens, at most the generation config's max_new_tokens (vLLM takes the smallest of the request's,
    the context's room and the config's)."""
    cap = (defaults or {}).get("max_tokens")
    return max_tokens if cap is None else min(max_tokens, cap)


def stream_options(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage: a last chunk with the usage, continuous: usage on every chunk as well, vLLM's
    continuous_usage_stats, which needs include_usage)."""
    stream = field(body, "stream", "bool", False)
    so = body.get("stream_options")
    if so is None:
        return stream, False, False
    if not isinstance(so, dict):
        raise APIError(400, "'stream_options' must be an object", "stream_options")
    if not stream:
        raise APIError(400, "'stream_options' is only allowed with stream=true", "stream_options")
    try:
        usage = field(so, "include_usage", "bool", False)
        return stream, usage, usage and field(so, "continuous_usage_stats", "bool", False)
    except APIError as e:       # (the request's field is stream_options)
        raise APIError(400, f"'stream_options.{e.param}' must be a bool, got {json.dumps(so.get(e.param))[:80]}",
                       "stream_options") from None


def completion_prompts(body: dict, vocab_size: int) -> list:
    """The prompt(s): a string, a list of token ids, or a list of either (a batch)."""
    p = body.get("prompt")
    if p is None:
        raise APIError(400, "'prompt' is required", "prompt")

    def one(x):
        if isinstance(x, str):
            if not x:
                raise APIError(400, "'prompt' must not be empty", "prompt")
            return x
        if isinstance(x, list) and x and all(_is_int(t) for t in x):
            bad = next((t for t in x if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise APIError(400, f"'prompt' token ids must be in [0, {vocab_size}), got {_show(bad)}", "prompt")
            return {"prompt_token_ids": x}
        raise APIError(400, "'prompt' must be a non-empty string, a non-empty list of token ids, or a list of those",
                       "prompt")
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p) and not all(_is_int(t) for t in p):
        if len(p) > 64:
            raise APIError(400, f"'prompt' batches hold at most 64 prompts, got {len(p)}", "prompt")
        return [one(x) for x in p]
    return [one(p)]


# vLLM / OpenAI request fields this server does not implement: asked for (not null / false / empty / a no-op
# value), they get a 400 naming them rather than being ignored (a client asking for constrained JSON must not
# get free text back as if it were).
UNSUPPORTED_COMMON = ("logits_processors",)
UNSUPPORTED_CHAT = ("functions", "function_call", "echo", "modalities", "prediction",
                    "audio")


def reject_unsupported(body: dict, names: tuple[str, ...]) -> None:
    """A 400 naming the field for OpenAI features this server does not implement, when the request
    asks for them (present and not null / empty / the no-op value), instead of silently ignoring them."""
    noop = {"response_format": ({"type": "text"},), "tool_choice": ("none",), "suffix": ("",),
            "modalities": (["text"],)}
    for name in names:
        v = body.get(name)
        off = v is False                                        # false asks for nothing
        if v is None or off or v == {} or v == [] or v in noop.get(name, ()):
            continue
        raise APIError(400, f"'{name}' is not supported by this server", name)


def chat_render_options(body: dict, messages: list[dict]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message), vLLM's: the second needs the first false and a last
    message with text content (text parts are continued as their text joined with newlines: Tokenizer.
    apply_chat_template)."""
    agp = field(body, "add_generation_prompt", "bool", None)
    cont = field(body, "continue_final_message", "bool", False)
    if cont:
        if agp:
            raise APIError(400, "'continue_final_message' needs add_generation_prompt=false",
                           "continue_final_message")
        if not isinstance(messages[-1].get("content"), (str, list)):
            raise APIError(400, "'continue_final_message' needs a last message with text content",
                           "continue_final_message")
        return False, True
    return (True if agp is None else agp), False


def chat_template_fields(body: dict, trusted: bool) -> tuple[str | None, dict]:
    """(chat_template, chat_template_kwargs) of a request (vLLM's): a template of the request's own only when the
    server trusts them (--trust-request-chat-template); the kwargs are extra template variables."""
    from decodekit.tokenizer.chat import check_template, check_template_kwargs
    template = body.get("chat_template")
    if template is not None and not trusted:
        raise APIError(400, "'chat_template' given with the request, but the server does not take requests' "
                            "templates (start it with --trust-request-chat-template)", "chat_template")
    try:
        template = check_template(template)
    except ValueError as e:
        raise APIError(400, str(e), "chat_template") from None
    try:
        kwargs = check_template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as e:
        raise APIError(400, str(e), "chat_template_kwargs") from None
    return template, kwargs


def chat_messages(body: dict) -> list[dict]:
    """The conversation as the chat template gets it, as vLLM parses it: content a string or a list of
    {"type": "text", "text"} parts (the template gets them joined with newlines, or as the list when it loops over
    a message's content: tokenizer/chat.py template_content_format); a tool turn's parts as one text (joined with
    newlines); no content: "" (tool) or no parts (assistant, with tool_calls); assistant tool_calls with their
    arguments as a JSON value (text that is not JSON as {}), an empty tool_calls list dropped; tool_call_id, name
    and reasoning kept. A 400 naming the message's field otherwise."""
    from .tools import history_message
    m = body.get("messages")
    if not isinstance(m, list) or not m:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, msg in enumerate(m):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise APIError(400, f"'messages[{i}]' must be an object with a string 'role'", "messages")
        role = msg["role"]
        if not role:
            raise APIError(400, f"'messages[{i}].role' must not be empty", "messages")
        c = msg.get("content")
        if isinstance(c, list):  # content parts: text only
            parts = []
            for j, part in enumerate(c):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"'messages[{i}].content' parts must be {{type: text, text: str}} (part {j} "
                                        f"is not)", "messages")
                parts.append({"type": "text", "text": part["text"]})
            c = "\n".join(p["text"] for p in parts) if role == "tool" else parts
        if c is None:
            if role in ("user", "system"):  # only assistant / tool turns may come without content
                raise APIError(400, f"'messages[{i}].content' is required for role {role!r}", "messages")
            c = "" if role == "tool" else []
        if not isinstance(c, (str, list)):
            raise APIError(400, f"'messages[{i}].content' must be a string or a list of text parts, got "
                                f"{_json_type(c)}", "messages")
        out.append(history_message(i, msg, c))
    return out


def chat_documents(body: dict) -> list[dict] | None:
    """vLLM's `documents` (for retrieval-augmented templates): a list of objects of strings, e.g. {"title",
    "text"}, handed to the chat template; None when absent."""
    docs = body.get("documents")
    if docs is None:
        return None
    if not isinstance(docs, list) or not all(isinstance(d, dict) and all(isinstance(v, str) for v in d.values())
                                             for d in docs):
        raise APIError(400, "'documents' must be a list of objects with string values (e.g. {\"title\": str, "
                            "\"text\": str})", "documents")
    return docs


def message_chars(messages: list[dict]) -> int:
    """The characters of a conversation's roles and contents (text parts counted by their text)."""
    from decodekit.tokenizer.chat import content_text
    return sum(len(m.get("role") or "") + len(content_text(m.get("content") or "")) for m in messages)


def _json_type(v) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}.get(type(v), type(v).__name__)


# --------------------------------------------------------------------------- responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def _lp(v: float | None) -> float | None:
    """A logprob as JSON can carry it: -inf (a token the model's logits rule out) as -9999.0, as vLLM."""
    return v if v is None or v >= -9999.0 else -9999.0


def token_bytes_of(tokenizer, tid: int, skip_special_tokens: bool = False) -> bytes:
    """The bytes token `tid` stands for in text (a byte-level token's raw bytes, which may be part of a UTF-8
    character; a special / added token's text, none when skip_special_tokens drops it from text)."""
    table = tokenizer.token_bytes()[0]
    b = table[tid] if 0 <= tid < len(table) else None
    return b if b is not None else tokenizer.decode([tid], skip_special_tokens=skip_special_tokens).encode("utf-8")


class OffsetCursor:
    """Where each token begins in the text of a token stream (characters), as OpenAI's text_offset: the characters
    decoded from the bytes before it (a token inside a multi-byte character begins at that character). Fed in
    order (offsets(ids) with the ids so far: only the new ones are decoded, so a stream's offsets cost O(new
    tokens) a chunk). Tokenizers whose text is not their tokens' bytes joined (SentencePiece's stripped leading
    space), found on the first tokens, count the lengths of the tokens decoded alone instead."""

    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.offs: list[int] = []
        self.chars = 0
        self.by_bytes: bool | None = None      # decided on the first tokens

    def offsets(self, ids) -> list[int]:
        """The offsets of ids (from 0; the cursor's own list, which may run past ids when the caller's ids were
        longer before); ids extends the ids of earlier calls."""
        new = ids[len(self.offs):]
        if self.by_bytes is None and new:
            self.by_bytes = self._bytes_rebuild(new)
        for t in new:
            self.offs.append(self.chars)
            if self.by_bytes:
                self.chars += len(self.dec.decode(token_bytes_of(self.tok, t, self.skip)))
            else:
                self.chars += len(self.tok.decode([t], skip_special_tokens=False))
        return self.offs

    def _bytes_rebuild(self, ids) -> bool:
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        joined = "".join(dec.decode(token_bytes_of(self.tok, t, self.skip)) for t in ids) + dec.decode(b"", True)
        return joined == self.tok.decode(ids, skip_special_tokens=self.skip)


def text_offsets(tokenizer, ids, offset0: int = 0, skip_special_tokens: bool = False) -> list[int]:
    """Where each token of `ids` begins in their text (characters, after offset0): OffsetCursor over all of them."""
    return [offset0 + o for o in OffsetCursor(tokenizer, skip_special_tokens).offsets(ids)[:len(ids)]]


def _legacy_logprobs(tokenizer, ids, entries, offset0: int = 0, n: int | None = None, start: int = 0,
                     skip_special_tokens: bool = False, cursor: OffsetCursor | None = None) -> dict:
    """Legacy completions logprobs (tokens, token_logprobs, top_logprobs, text_offset) of token ids[start:] and
    their {id: Logprob} entries (None: no logprob, as a prompt's first token); text_offset counts from offset0 at
    ids[0] (the tokens before start place the rest; a stream passes its choice's cursor); n: keep the top-n ranks
    (and the token itself) of entries that hold more."""
    toks, lps, tops = [], [], []
    for tid, entry in zip(ids[start:], entries[start:]):
        toks.append(tokenizer.decode([tid], skip_special_tokens=False))
        lps.append(_lp(entry[tid].logprob) if entry is not None and tid in entry else None)
        tops.append(None if entry is None else {(e.decoded_token or ""): _lp(e.logprob) for t, e in entry.items()
                                                if n is None or t == tid or (e.rank is not None and e.rank <= n)})
    cursor = cursor or OffsetCursor(tokenizer, skip_special_tokens)
    offs = [offset0 + o for o in cursor.offsets(ids)[start:len(ids)]]
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


def completion_logprobs(tokenizer, out, start: int = 0, offset0: int = 0,
                        skip_special_tokens: bool = True, cursor: OffsetCursor | None = None) -> dict | None:
    """Legacy completions logprobs of out.token_ids[start:]; offset0: where the completion's text begins in the
    choice's text (after an echoed prompt); cursor: the choice's OffsetCursor in a stream."""
    if out.logprobs is None:
        return None
    return _legacy_logprobs(tokenizer, out.token_ids, out.logprobs, offset0, None, start, skip_special_tokens,
                            cursor)


def prompt_logprobs_json(table, ids: list[int], n: int) -> list | None:
    """RequestOutput.prompt_logprobs as vLLM serialises it: None for the first token, then per token
    {"<id>": {"logprob", "rank", "decoded_token"}} of the top-n ranks and the token itself (the table may
    hold more when echo asked for more)."""
    if table is None:
        return None
    return [None if e is None else {str(t): {"logprob": _lp(v.logprob), "rank": v.rank,
                                             "decoded_token": v.decoded_token}
                                    for t, v in e.items() if t == tid or v.rank <= n}
            for e, tid in zip(table, ids)]


def echo_logprobs(tokenizer, prompt_ids: list[int], table, n: int) -> dict:
    """Legacy completions logprobs of the prompt tokens (echo with logprobs): the first token has none;
    top_logprobs keeps the n best of each position (table: RequestOutput.prompt_logprobs)."""
    return _legacy_logprobs(tokenizer, prompt_ids, table if table is not None else [None] * len(prompt_ids), 0, n)


def prompt_logprobs_field(body: dict, stream: bool) -> int | None:
    """vLLM's prompt_logprobs (top-N per prompt token); not with stream=true."""
    plp = field(body, "prompt_logprobs", "int", None, 0, MAX_LOGPROBS)
    if plp is not None and stream:
        raise APIError(400, "'prompt_logprobs' is not supported with stream=true", "prompt_logprobs")
    return plp


def join_logprobs(a: dict | None, b: dict | None) -> dict | None:
    if a is None or b is None:
        return a or b
    return {k: a[k] + b[k] for k in a}


def chat_logprobs(out, start: int, top: int, tokenizer) -> dict | None:
    """Chat logprobs of out.token_ids[start:]: {"content": [{token, logprob, bytes, top_logprobs}]}; bytes are the
    token's own bytes (a token holding part of a UTF-8 character gives those bytes, not its U+FFFD's), so a client
    joining them gets the reply's text."""
    if out.logprobs is None:
        return None
    content = []
    for tid, entry in zip(out.token_ids[start:], out.logprobs[start:]):
        e = entry.get(tid)
        s = e.decoded_token if e is not None and e.decoded_token is not None else ""
        ranked = sorted(((t, x) for t, x in entry.items() if x.rank is not None and x.rank <= top),
                        key=lambda kv: kv[1].rank)[:top]
        content.append({"token": s, "logprob": _lp(e.logprob) if e is not None else None,
                        "bytes": list(token_bytes_of(tokenizer, tid)),
                        "top_logprobs": [{"token": x.decoded_token or "", "logprob": _lp(x.logprob),
                                          "bytes": list(token_bytes_of(tokenizer, t))} for t, x in ranked]})
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
