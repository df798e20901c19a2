"""OpenAI tool calling on /v1/chat/completions, by guided decoding (as vLLM does without a model-specific
tool-call parser):

- ``tools``: [{"type": "function", "function": {"name", "description"?, "parameters"? (a JSON schema)}}]
  reach the chat template (templates that know tools render them; others ignore them);
- ``tool_choice`` {"type": "function", "function": {"name": N}}: the reply is constrained to N's parameters
  schema (an object schema; ``{}`` / absent: any object) and returned as one tool call whose ``arguments`` is
  that JSON text (finish_reason "stop", as OpenAI for a forced function);
- ``tool_choice`` "required": the reply is constrained to a JSON array of at least one
  {"name": one of the tools, "parameters": its schema} (one at most with ``parallel_tool_calls`` false) and
  returned as that many tool calls, their arguments as written (finish_reason "tool_calls");
- a reply cut short (max_tokens, a stop string) is no whole JSON value: it comes back as content (streamed,
  a named function's arguments go out as they come, so there they stay partial);
- ``tool_choice`` "none": tools are rendered, the reply is text;
- "auto" (the default with tools) reads tool calls out of the model's own syntax, with the parser the server
  was started with (vLLM's ``--enable-auto-tool-choice --tool-call-parser NAME``): ``hermes`` (Hermes, Qwen2.5:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, text around them is content) or
  ``llama3_json`` (Llama 3.1+: a reply that is ``{"name": ..., "parameters": {...}}`` objects, ``;``-separated,
  after an optional ``<|python_tag|>``), ``mistral`` (Mistral: ``[TOOL_CALLS]`` then a JSON array of
  ``{"name": ..., "arguments": {...}}``, or ``[TOOL_CALLS]name[ARGS]{...}`` (or ``name{...}``) per call (v11
  tokenizers); text before it is content; the request keeps special tokens in its text, as vLLM does, so the
  tag survives) or
  ``pythonic`` (Llama 3.2 / 4: a reply that is a Python list of calls with keyword literal arguments,
  ``[get_weather(city="Paris"), f(x=1)]``, read with ``ast``, never evaluated); calls must name one of the
  tools and parse, else the text stays content. Streamed, content goes out until a call may begin, the calls at the end. Without a parser "auto" is
  a 400 that says to use "required" or a named function (as vLLM without the flags).

Assistant messages with ``tool_calls`` (their ``arguments`` JSON text handed to the template as an object,
as vLLM does for Jinja templates) and ``tool`` messages with ``tool_call_id`` are accepted in the history.
"""
from __future__ import annotations

import ast
import json
import re
import uuid

from .protocol import APIError

MAX_TOOLS = 128
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")
MAX_PARAMETERS_DEPTH = 64        # JSON nesting of a tool's parameters schema (templates and guides recurse on it)


def _depth(value) -> int:
    """JSON nesting depth of `value` (iterative: any depth is measured)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def parse_tools(body: dict, parser: str | None = None) -> tuple[list[dict] | None, str | dict]:
    """(tools, tool_choice) of a chat request: tools validated (None when absent or empty), tool_choice one of
    "none", "required", "auto" (only with a tool-call `parser`) or the named tool's function dict. 400s name
    the field."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return None, "none"
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise APIError(400, f"'tools' must be a list of at most {MAX_TOOLS} function tools", "tools")
    out, names = [], set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(400, f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                           "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise APIError(400, f"'tools[{i}].function.name' must be 1 to 64 letters, digits, '_', '.' or '-', got "
                                f"{json.dumps(name)[:70]}", "tools")
        if name in names:
            raise APIError(400, f"'tools[{i}].function.name' {name!r} is given twice", "tools")
        names.add(name)
        params = fn.get("parameters", EMPTY_PARAMETERS)
        if params is None or params == {}:
            params = EMPTY_PARAMETERS
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise APIError(400, f"'tools[{i}].function.parameters' must be a JSON schema of an object (arguments are "
                                f"a JSON object)", "tools")
        if _depth(params) > MAX_PARAMETERS_DEPTH:
            raise APIError(400, f"'tools[{i}].function.parameters' nests more than {MAX_PARAMETERS_DEPTH} levels deep",
                           "tools")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise APIError(400, f"'tools[{i}].function.description' must be a string", "tools")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    if (choice is None or choice == "auto") and parser is not None:
        return out, "auto"
    if choice is None or choice == "auto":
        raise APIError(400, "tool_choice 'auto' (the default with tools) needs a parser for this model's tool-call "
                            "syntax, which this server does not have: set tool_choice to 'required' or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}} (the reply is then constrained "
                            "to the tools' schemas), or 'none'", "tool_choice")
    if choice in ("none", "required"):
        return out, choice
    fname = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(
        choice.get("function"), dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(fname, str):
        raise APIError(400, "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}", "tool_choice")
    named = next((t["function"] for t in out if t["function"]["name"] == fname), None)
    if named is None:
        raise APIError(400, f"'tool_choice' names {fname!r}, which is not one of 'tools'", "tool_choice")
    return out, named


def _rebase(schema, base: str):
    """`schema` with its local "$ref"s ("#", "#/...") pointing below `base` (a JSON pointer of where it is put
    in a larger document); literal values (enum, const, default, examples) are left alone."""
    if isinstance(schema, list):
        return [_rebase(x, base) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and v.startswith("#"):
            out[k] = base + v[1:]
        elif k in ("enum", "const", "default", "examples"):
            out[k] = v
        elif k == "properties" and isinstance(v, dict):     # its keys are names, its values schemas
            out[k] = {name: _rebase(sub, base) for name, sub in v.items()}
        else:
            out[k] = _rebase(v, base)
    return out


def tool_schema(tools: list[dict], choice: str | dict, parallel: bool = True) -> dict | None:
    """The JSON schema the reply is guided by (None for "none" and "auto"). For "required", each tool's
    parameters sit in the wrapper's $defs, their references rebased there (a tool's "#" and "#/$defs/X" stay
    its own)."""
    if choice in ("none", "auto"):
        return None
    if isinstance(choice, dict):
        return choice["parameters"]
    defs, branches = {}, []
    for i, t in enumerate(tools):
        try:
            defs[f"tool{i}"] = _rebase(t["function"]["parameters"], f"#/$defs/tool{i}")
        except RecursionError:
            raise APIError(400, f"'tools[{i}].function.parameters' nests too deeply", "tools") from None
        branches.append({"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                          "parameters": {"$ref": f"#/$defs/tool{i}"}},
                         "required": ["name", "parameters"]})
    return {"$defs": defs, "type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": {"anyOf": branches}}


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def _raw_parameters(text: str) -> list[str]:
    """The "parameters" values of a "required" reply ([{"name": ..., "parameters": {...}}, ...]) as they were
    written (a parse and re-dump could turn 1e999 into Infinity or round long numbers)."""
    dec, out = json.JSONDecoder(), []

    def ws(k):
        while k < len(text) and text[k] in " \t\r\n":
            k += 1
        return k
    i = ws(text.index("[") + 1)
    while text[i] == "{":
        i = ws(i + 1)
        while text[i] != "}":
            key, i = dec.raw_decode(text, i)
            i = ws(ws(i) + 1)                                 # past ':'
            end = dec.raw_decode(text, i)[1]                   # (only where the value ends)
            if key == "parameters":
                out.append(text[i:end])
            i = ws(end)
            if text[i] == ",":
                i = ws(i + 1)
        i = ws(i + 1)
        if text[i] == ",":
            i = ws(i + 1)
    return out


def tool_calls(choice: str | dict, text: str, finish_reason: str | None) -> tuple[list[dict] | None, str | None]:
    """(tool_calls, finish_reason) of a finished reply. A named function's call carries the text as its
    arguments, whole or cut short by max_tokens / a stop string (as vLLM, and as the stream sends them);
    "required" replies give their calls (finish_reason "tool_calls"), or (None, finish_reason) when the text is
    not a whole JSON value: it is then the reply's content."""
    if isinstance(choice, dict):
        return [{"id": new_call_id(), "type": "function",
                 "function": {"name": choice["name"], "arguments": text}}], finish_reason
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        return None, finish_reason
    raw = _raw_parameters(text)
    return [{"id": new_call_id(), "type": "function", "function": {"name": it["name"], "arguments": args}}
            for it, args in zip(items, raw)], "tool_calls"


def history_message(i: int, msg: dict, content: str | list[dict]) -> dict:
    """A chat message for the template, with the tool-calling fields an assistant or tool turn may carry (as
    vLLM: an empty tool_calls list is no calls; arguments as a JSON value, text that is not JSON as {}; the
    reasoning's other names: chat._for_template)."""
    out = {"role": msg["role"], "content": content}
    calls = msg.get("tool_calls")
    if calls is not None and msg["role"] == "assistant":
        if not isinstance(calls, list):
            raise APIError(400, f"'messages[{i}].tool_calls' must be a list", "messages")
        conv = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                    fn.get("arguments", "{}"), (str, dict)):
                raise APIError(400, f"'messages[{i}].tool_calls[{j}]' must be {{\"id\", \"type\": \"function\", "
                                    f"\"function\": {{\"name\": str, \"arguments\": JSON text}}}}", "messages")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    args = {}       # (vLLM's, e.g. for "")
            conv.append({"id": str(c.get("id", "")), "type": "function",
                         "function": {"name": fn["name"], "arguments": args}})
        if conv:                    # (vLLM) no calls: the template's plain assistant turn
            out["tool_calls"] = conv
    for key in ("tool_call_id", "name", "reasoning_content", "reasoning"):
        v = msg.get(key)
        if v is not None:
            if not isinstance(v, str):
                raise APIError(400, f"'messages[{i}].{key}' must be a string", "messages")
            out[key] = v
    return out


# --------------------------------------------------------------------------- "auto": the model's own syntax
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
PYTHONIC_TAGS = ("<|python_start|>", "<|python_end|>")     # Llama 4 wraps pythonic calls in them
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")       # (json.loads joins pairs: any left is alone)


def _call(obj, names: set[str], args_key: str) -> dict | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    try:                    # arguments must be JSON: no NaN / Infinity (nor 1e999, read as inf)
        text = json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):    # (pythonic literals: sets, bytes, complex, nan)
        return None
    # a lone surrogate (written as an escape, "\ud83d") stays one, escaped: the reply goes out as UTF-8
    text = _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": text}}


def _mistral_calls(body: str, names: set[str]) -> list[dict] | None:
    """The calls after a [TOOL_CALLS] tag: a JSON array of {name, arguments}, or name[ARGS]{...} (or name{...})
    parts (each after its own tag); None unless all of it parses into calls of known tools."""
    body = body.strip()
    dec = json.JSONDecoder()
    try:
        if body.startswith("["):
            objs, end = dec.raw_decode(body)
            if body[end:].strip() or not isinstance(objs, list) or not objs:
                return None
            calls = [_call(o, names, "arguments") for o in objs]
            return None if None in calls else calls
        calls, i = [], 0
        while True:         # the parts in order, each JSON read whole: a tag may be quoted in the arguments
            k, b = body.find(MISTRAL_ARGS, i), body.find("{", i)
            a = b if 0 <= b < k or k < 0 else k + len(MISTRAL_ARGS)    # (name{...}: vLLM's v11 text form)
            if b < 0:
                return None
            name = body[i:min(x for x in (k, b) if x >= 0)].strip()
            obj, i = dec.raw_decode(body, a + len(body[a:]) - len(body[a:].lstrip()))
            calls.append(_call({"name": name, "arguments": obj}, names, "arguments"))
            rest = body[i:].lstrip()
            if not rest:
                return None if None in calls else calls
            if not rest.startswith(MISTRAL_TAG):
                return None
            i = len(body) - len(rest) + len(MISTRAL_TAG)
    except (ValueError, RecursionError):
        return None


def _pythonic_calls(body: str, names: set[str]) -> list[dict] | None:
    """A reply that is a Python list of calls with keyword literal arguments, read with ast (never run)."""
    body = body.strip()
    if body.startswith(PYTHONIC_TAGS[0]):
        body = body[len(PYTHONIC_TAGS[0]):].strip().removesuffix(PYTHONIC_TAGS[1]).strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for e in tree.elts:
            if not isinstance(e, ast.Call) or not isinstance(e.func, ast.Name) or e.args \
                    or any(k.arg is None for k in e.keywords):
                return None
            calls.append(_call({"name": e.func.id, "arguments": {k.arg: ast.literal_eval(k.value)
                                                                 for k in e.keywords}}, names, "arguments"))
        return None if None in calls else calls
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def parse_auto(parser: str, text: str, tools: list[dict]) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a finished "auto" reply: calls read with `parser`, or (text, None) when it
    holds none (or one that does not parse / names no tool: the model's text is then returned as it is)."""
    names = {t["function"]["name"] for t in tools}
    dec = json.JSONDecoder()
    if parser == "mistral":
        j = text.find(MISTRAL_TAG)
        calls = _mistral_calls(text[j + len(MISTRAL_TAG):], names) if j >= 0 else None
        return (text, None) if calls is None else (text[:j].rstrip() if text[:j].strip() else None, calls)
    if parser == "pythonic":
        calls = _pythonic_calls(text, names)
        return (text, None) if calls is None else (None, calls)
    if parser == "hermes":
        calls, content, i = [], [], 0
        while True:
            j = text.find(HERMES_OPEN, i)
            if j < 0:
                content.append(text[i:])
                break
            content.append(text[i:j])
            # the JSON read first, then the closing tag (or the end): a tag may be quoted in its strings
            b = j + len(HERMES_OPEN)
            k = b + len(text[b:]) - len(text[b:].lstrip())
            try:
                obj, k = dec.raw_decode(text, k)
                call = _call(obj, names, "arguments")
            except (ValueError, RecursionError):
                call = None
            rest = text[k:].lstrip()
            if call is None or not (rest == "" or rest.startswith(HERMES_CLOSE)):
                return text, None
            calls.append(call)
            if not rest:
                break
            i = len(text) - len(rest) + len(HERMES_CLOSE)
        if not calls:
            return text, None
        # the text around the calls, as the stream sends it: what precedes the first call without its trailing
        # whitespace (AutoToolStream sends that much before the tag), then the rest
        rest = (content[0].rstrip() + "".join(content[1:])).rstrip()
        return (rest if rest.strip() else None), calls
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
        return text, None
    calls, i = [], 0
    try:
        while i < len(body):
            obj, i = dec.raw_decode(body, i)
            call = _call(obj, names, "parameters")
            if call is None:
                return text, None
            calls.append(call)
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
    except (ValueError, RecursionError):
        return text, None
    return None, calls


class AutoToolStream:
    """Streamed "auto" replies: feed(delta) gives the content that can go out now - all of it until a tool
    call may have begun (a tag, or for llama3_json / pythonic a reply opening with '{' / '['), never a tag's
    first characters (they wait for the next delta); finish(text) parses the whole reply for the final delta."""

    def __init__(self, parser: str):
        self.parser = parser
        self.sent = 0               # characters of the reply sent as content
        self.held = False           # a call may have begun: the rest waits for the end

    def feed(self, text: str) -> str:
        if self.held:
            return ""
        if self.parser in ("hermes", "mistral"):
            tag = HERMES_OPEN if self.parser == "hermes" else MISTRAL_TAG
            j = text.find(tag, self.sent)
            if j >= 0:              # the whitespace before the tag waits: parse_auto strips it off a call
                self.held = True
                k = max(self.sent, len(text[:j].rstrip()))
                out, self.sent = text[self.sent:k], k
                return out
            end = len(text)
            for n in range(min(len(tag) - 1, end - self.sent), 0, -1):
                if tag.startswith(text[end - n:]):
                    end -= n
                    break
            while end > self.sent and text[end - 1].isspace():     # it may precede a call: wait
                end -= 1
            if not text[:end].strip():
                return ""
        else:                       # llama3_json / pythonic: calls are the whole reply: its opening decides
            end = len(text)
            if self.sent == 0:
                head = text.lstrip()
                opens = ("{", PYTHON_TAG) if self.parser == "llama3_json" else ("[", PYTHONIC_TAGS[0])
                if head.startswith(opens):
                    self.held = True
                    return ""
                if not head or opens[1].startswith(head):
                    return ""       # too early to tell
        out, self.sent = text[self.sent:end], max(self.sent, end)
        return out

    def finish(self, text: str, tools: list[dict]) -> tuple[str | None, list[dict] | None]:
        """(content still to send, calls) at the end of the reply."""
        content, calls = parse_auto(self.parser, text, tools)
        if calls is None:
            return text[self.sent:], None
        sent = text[:self.sent]         # (a prefix of the content: what precedes the first call)
        return (content[len(sent):] or None) if content and content.startswith(sent) else None, calls
