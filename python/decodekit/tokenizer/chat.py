"""Chat templates: Jinja2 rendered in an immutable sandbox, as transformers renders them
(same environment options, filters and globals), plus the message validation and the default
templates used when a model ships none."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize + ': ' + message['content'] + '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def default_chat_template(vocab: dict[str, int]) -> str:
    """A template for a model that ships none, chosen from the special tokens it has:
    ChatML when it has <|im_start|>/<|im_end|>, the Llama 3 headers when it has those,
    else a plain 'Role: content' transcript."""
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return CHATML_TEMPLATE
    if "<|start_header_id|>" in vocab and "<|eot_id|>" in vocab:
        return LLAMA3_TEMPLATE
    return PLAIN_TEMPLATE


def validate_messages(messages: Any) -> list[dict]:
    """Checks a conversation: a non-empty list of dicts, each with a string 'role' and a 'content' that is a
    string or a list of OpenAI text parts ({"type": "text", "text": str}). Returns plain-dict copies without the
    keys whose value is None (as transformers' apply_chat_template: templates test whether a key is there, e.g.
    `'tool_calls' in message`); raises ValueError naming the bad field."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role': str, 'content': str}} dicts, "
                         f"got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m:
                raise ValueError(f"messages[{i}] has no '{key}' field")
        if not isinstance(m["role"], str):
            raise ValueError(f"messages[{i}]['role'] must be a string, got {type(m['role']).__name__}")
        if not m["role"]:
            raise ValueError(f"messages[{i}]['role'] must not be empty")
        content = _checked_content(i, m["content"])
        out.append(_plain({**{k: v for k, v in m.items() if v is not None}, "content": content}))
    return out


def _checked_content(i: int, content: Any) -> str | list[dict]:
    """A message's content: a string, or a list of text parts (copied with just their "type" and "text")."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ValueError(f"messages[{i}]['content'] must be a string, got list (a list must hold "
                                 f"{{'type': 'text', 'text': str}} parts; item {j} is not one)")
            parts.append({"type": "text", "text": p["text"]})
        return parts
    raise ValueError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}")


def content_text(content: str | list[dict]) -> str:
    """A message's content as one string: text parts joined with newlines (as vLLM hands them to a template
    that takes the content as a string)."""
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


@lru_cache(maxsize=32)
def template_content_format(template: str) -> str:
    """How the template takes a message's content, as vLLM's --chat-template-content-format auto detects it:
    "openai" (a list of {"type": "text", "text": ...} parts) when the template loops over a message's content
    (`{% for part in message['content'] %}`, `message` a loop variable over `messages` or over a variable set
    from it, e.g. `loop_messages = messages[1:]`), else "string"."""
    import jinja2.nodes as N
    try:
        root = _environment().parse(template)
    except Exception:  # noqa: BLE001 -- (compile_checked reports the error)
        return "string"

    def refers(node, names, key=None) -> bool:
        # through filters, tests and slices: `messages | selectattr(...)`, `messages[1:]`, `m['content'] | list`
        while True:
            if isinstance(node, (N.Filter, N.Test)) and node.node is not None:
                node = node.node
            elif isinstance(node, N.Getitem) and isinstance(node.arg, N.Slice):
                node = node.node
            else:
                break
        if key is not None:
            if isinstance(node, N.Getitem) and isinstance(node.arg, N.Const) and node.arg.value == key:
                node = node.node
            elif isinstance(node, N.Getattr) and node.attr == key:
                node = node.node
            else:
                return False
        return isinstance(node, N.Name) and node.name in names

    lists, grew = {"messages"}, True
    while grew:     # the variables set from `messages`, and from those
        before = len(lists)
        lists |= {a.target.name for a in root.find_all(N.Assign)
                  if isinstance(a.target, N.Name) and refers(a.node, lists)}
        grew = len(lists) > before
    loops = list(root.find_all(N.For))
    items = {f.target.name for f in loops if isinstance(f.target, N.Name) and refers(f.iter, lists)}
    return "openai" if any(refers(f.iter, items, "content") for f in loops) else "string"


def _for_template(message: dict, fmt: str) -> dict:
    """A validated message as the template takes it: its content as a string or as a list of text parts (fmt,
    template_content_format), and its reasoning under each name templates read (transformers'
    _alias_reasoning_fields: reasoning_content, thinking, reasoning)."""
    c = message["content"]
    if fmt == "openai" and isinstance(c, str):
        message = {**message, "content": [{"type": "text", "text": c}]}
    elif fmt == "string" and not isinstance(c, str):
        message = {**message, "content": content_text(c)}
    reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning")
                      if message.get(k) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


MAX_RENDERED_CHARS = 64 << 20     # a rendered prompt's characters at most, whatever the caller's limit


class RenderedTooLongError(ValueError):
    """The template's output passed the caller's limit (rendering stopped there: a template's loops cannot
    exhaust memory)."""


RESERVED_TEMPLATE_KWARGS = ("messages", "add_generation_prompt", "continue_final_message", "chat_template", "tools")
INTERNAL_TEMPLATE_KWARGS = ("max_chars", "special_tokens", "template")   # the renderer's own parameters
MAX_TEMPLATE_CHARS = 200_000


def check_template_kwargs(kwargs: Any) -> dict:
    """chat_template_kwargs (vLLM's: extra variables for the template, e.g. {"enable_thinking": false} for Qwen3):
    a dict of JSON values with identifier keys; the variables that have their own parameter are refused.
    Returns a plain copy; ValueError naming the field otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"chat_template_kwargs must be an object (dict) of template variables, got "
                         f"{type(kwargs).__name__}")
    for k in kwargs:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"chat_template_kwargs: keys must be identifiers (template variable names), got {k!r}")
        if k in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs: {k!r} has its own parameter; give it there")
        if k in INTERNAL_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs: {k!r} cannot be a template variable here (it names one of "
                             f"the renderer's own parameters)")
    return _plain(kwargs)


def check_template(template: Any) -> str | None:
    """A chat_template given with a request / to the server: None, or Jinja text of at most MAX_TEMPLATE_CHARS
    characters that compiles; ValueError naming the field otherwise."""
    if template is None:
        return None
    if not isinstance(template, str) or not template.strip() or len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"chat_template must be a non-empty Jinja template (str) of at most {MAX_TEMPLATE_CHARS} "
                         f"characters, got {type(template).__name__}"
                         + (f" of {len(template)} characters" if isinstance(template, str) else ""))
    compile_checked(template)
    return template


def compile_checked(template: str):
    """compile_template, a syntax error as ValueError naming chat_template and the line."""
    import jinja2
    try:
        return compile_template(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"chat template error: the chat_template is not valid Jinja (line {e.lineno}: "
                         f"{e.message})") from None


def _plain(value: Any) -> Any:
    """Rebuilds template inputs from plain JSON types (as transformers does), so no object
    with methods the sandbox does not know about reaches the template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


@lru_cache(maxsize=16)
def compile_template(template: str):
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Generation(jinja2.ext.Extension):
        """transformers' {% generation %} ... {% endgeneration %} (it marks the assistant's tokens for training
        masks): the body renders as it is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Sandbox(ImmutableSandboxedEnvironment):
        """transformers' environment, plus a bound on the two operators that can build a huge value in one step
        (`'x' * 10**9`, `9 ** 10**8`): they would exhaust memory or the CPU before any output-size check."""
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and \
                    abs(right) * max(abs(left), 2).bit_length() > 1 << 16:
                raise jinja2.exceptions.SecurityError(f"chat template: {left} ** {right} is too large")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                            len(seq) * n > MAX_RENDERED_CHARS:
                        raise jinja2.exceptions.SecurityError(f"chat template: a {type(seq).__name__} of "
                                                              f"{len(seq)} times {n} is too large")
            return super().call_binop(context, operator, left, right)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_chat_template(template: str, messages: list[dict], *, add_generation_prompt: bool,
                         special_tokens: dict[str, str | None], max_chars: int | None = None, **kwargs) -> str:
    """Renders a validated conversation. `special_tokens` (bos_token, eos_token, ...) are visible
    to the template; keyword arguments override them and are passed through (tools, documents,
    enable_thinking, ...). Each message's content reaches the template as it takes it (template_content_format:
    text parts joined with newlines, or a string as one text part). The output is collected as the template
    streams it and refused (RenderedTooLongError) once it passes max_chars (at most MAX_RENDERED_CHARS). Any
    failure of the template (raise_exception, a type error in its expressions, ...) is a ValueError."""
    import jinja2
    variables = {k: v for k, v in special_tokens.items() if v is not None}
    variables.update(kwargs)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    variables = _plain(variables)
    compiled = compile_checked(template)
    fmt = template_content_format(template)
    messages = [_for_template(m, fmt) for m in messages]
    try:
        limit = min(MAX_RENDERED_CHARS, max_chars if max_chars is not None else MAX_RENDERED_CHARS)
        parts, n = [], 0
        for part in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt, **variables):
            n += len(part)
            if n > limit:
                raise RenderedTooLongError(f"chat template error: the rendered prompt passes {limit} characters "
                                           f"(more than fits in the context)")
            parts.append(part)
        return "".join(parts)
    except RenderedTooLongError:
        raise
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat template error: {e}") from e
    except Exception as e:  # noqa: BLE001 -- e.g. `'text' + a_dict`: the template cannot render these inputs
        raise ValueError(f"chat template error: {type(e).__name__}: {e}") from e
