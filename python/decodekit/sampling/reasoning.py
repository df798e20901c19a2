"""Reasoning ("thinking") models: their output as reasoning and content, and guides that start after the reasoning.

Models such as DeepSeek-R1 (and its Llama / Qwen2 distills), QwQ and Qwen3 think first, inside
``<think> ... </think>``, then answer. With a reasoning parser (vLLM's ``--reasoning-parser``; EngineArgs
``reasoning_parser``):

- the server returns the thinking as ``reasoning_content`` (and ``reasoning``, vLLM's newer name) and the answer
  as ``content`` (``split_reasoning``; ``ReasoningStream`` for streams: the deltas add up to the same split);
- a structured-output guide (guided_json / regex / choice / grammar, tools' schemas) constrains the answer only:
  the reasoning is free text up to the end marker (``reasoning_guide``), as vLLM applies structured outputs once
  the reasoning has ended.

Where the output starts (``reasoning_mode``, from the prompt's text):
- ``"open"``: the prompt ends with ``<think>`` (and whitespace: the template opened the reasoning: DeepSeek-R1's
  newer template), or (``deepseek_r1``, which thinks without saying so) it ends with no marker: the output is
  reasoning until ``</think>``; a leading ``<think>`` in it is dropped;
- ``"closed"``: the prompt ends with ``</think>`` (thinking switched off: Qwen3's ``enable_thinking=False``
  writes an empty ``<think>\\n\\n</think>``): the output is all content;
- ``"optional"`` (``qwen3``, no marker ending the prompt): reasoning when the output begins with ``<think>``
  (after whitespace), else all content.
Markers elsewhere in the prompt (a user quoting ``</think>``, earlier turns' reasoning) do not count.

Reasoning cut short (no ``</think>`` before the end) is all reasoning, content None. The content is the text
after ``</think>`` with its leading whitespace dropped; either part is None when empty. The split works on text,
so it does not need the markers to be single tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from .guided.regex import escape


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    implicit: bool = True       # a prompt without markers: the output is reasoning (deepseek_r1) or may open it


REASONING_PARSERS = {
    "deepseek_r1": ReasoningParser("deepseek_r1", implicit=True),      # DeepSeek-R1 and its distills, QwQ
    "qwen3": ReasoningParser("qwen3", implicit=False),                 # Qwen3 (thinking switchable per request)
}
MODES = ("open", "closed", "optional")
_WS = " \t\n\r"


def get_reasoning_parser(name: "str | ReasoningParser | None") -> "ReasoningParser | None":
    """The parser called `name` (None: none); ValueError naming the choices for an unknown one."""
    if name is None or isinstance(name, ReasoningParser):
        return name
    p = REASONING_PARSERS.get(name) if isinstance(name, str) else None
    if p is None:
        raise ValueError(f"reasoning_parser must be one of {', '.join(sorted(REASONING_PARSERS))} (or None), "
                         f"got {name!r}")
    return p


def reasoning_mode(parser: ReasoningParser, prompt_text: str) -> str:
    """Where a reply to `prompt_text` starts: "open", "closed" or "optional" (module doc). Only a marker that
    ends the prompt (the template's generation prompt) counts: markers in the conversation (a user quoting
    </think>, an earlier assistant turn's reasoning) say nothing about the reply."""
    tail = prompt_text.rstrip(_WS)
    if tail.endswith(parser.start):
        return "open"
    if tail.endswith(parser.end):
        return "closed"
    return "open" if parser.implicit else "optional"


def prompt_mode(parser: ReasoningParser, tokenizer, prompt_ids) -> str:
    """reasoning_mode of a prompt given as token ids (decoded with its special tokens: markers may be ones)."""
    return reasoning_mode(parser, tokenizer.decode(prompt_ids, skip_special_tokens=False))


def split_reasoning(parser: ReasoningParser, mode: str, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole output `text` (module doc); None for an empty part."""
    st = ReasoningStream(parser, mode)
    st.finish(text)
    return st.reasoning or None, st.content or None


class ReasoningStream:
    """The split of a growing output: feed(text so far) returns the new (reasoning, content) text to send;
    finish(whole text) the rest, with what was held back (a possible marker's beginning, whitespace after the end
    marker). What it sends adds up to split_reasoning's parts; `reasoning` / `content` hold the totals so far."""

    def __init__(self, parser: ReasoningParser, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.p = parser
        # phase: "start" (optional / open: a leading <think> may come), "think", "lead" (whitespace after the end
        # marker: dropped), "content"
        self.phase = "content" if mode == "closed" else "start"
        self.mode = mode
        self.pos = 0                # text[:pos] is decided
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        r0, c0 = len(self.reasoning), len(self.content)
        p = self.p
        while self.pos < len(text):
            rest = text[self.pos:]
            if self.phase == "start":
                body = rest.lstrip(_WS)
                if body.startswith(p.start):        # the reasoning opens: whitespace and marker dropped
                    self.pos += len(rest) - len(body) + len(p.start)
                    self.phase = "think"
                    continue
                if not final and (not body or p.start.startswith(body)):
                    break                           # may still become the marker: wait
                self.phase = "think" if self.mode == "open" else "content"
                continue
            if self.phase == "think":
                at = rest.find(p.end)
                if at >= 0:
                    self.reasoning += rest[:at]
                    self.pos += at + len(p.end)
                    self.phase = "lead"
                    continue
                keep = 0 if final else _partial_suffix(rest, p.end)
                self.reasoning += rest[:len(rest) - keep]
                self.pos += len(rest) - keep
                break
            if self.phase == "lead":
                body = rest.lstrip(_WS)
                self.pos += len(rest) - len(body)
                if not body:
                    break
                self.phase = "content"
                continue
            self.content += rest
            self.pos = len(text)
        return self.reasoning[r0:], self.content[c0:]

    def finish(self, text: str) -> tuple[str, str]:
        """What is left to send once the output `text` (the whole of it) is complete."""
        return self.feed(text, final=True)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back: it may become the marker)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def avoid_pattern(marker: str) -> str:
    """A regular expression (guided/regex.py's dialect) for the texts that do not contain `marker`, whose first
    character must not occur again in it (true of "</think>"): the KMP automaton of the marker written out."""
    if len(marker) < 2 or marker[0] in marker[1:]:
        raise ValueError(f"avoid_pattern needs a marker of 2+ characters whose first one does not repeat, "
                         f"got {marker!r}")

    def lit(s: str) -> str:
        return escape(s)

    def not_in(*cs: str) -> str:
        return "[^" + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in cs) + "]"

    c0, rest = marker[0], marker[1:]
    # after c0 (state 1): the marker's next characters then c0 again (back to state 1) ...
    again = "|".join(lit(rest[:j] + c0) for j in range(len(rest)))
    # ... or a character that breaks the match (back to state 0) ...
    leave = "|".join(lit(rest[:j]) + not_in(rest[j], c0) for j in range(len(rest)))
    # ... or the text ends part-way into the marker
    partial = "|".join(lit(rest[:j]) for j in range(1, len(rest)))
    head = f"{lit(c0)}(?:{again})*"
    return f"(?:{not_in(c0)}|{head}(?:{leave}))*(?:{head}(?:{partial})?)?"


def reasoning_guide(parser: ReasoningParser, mode: str, pattern: str) -> str:
    """The guide pattern for `pattern` (the answer's regex) after the reasoning a reply in `mode` may hold: free
    text up to the end marker (which may not appear in it), whitespace, then the answer. An output that ends while
    still reasoning is accepted (the reasoning was cut short: no answer, as without a guide)."""
    if mode == "closed":
        return pattern
    think = f"{avoid_pattern(parser.end)}(?:{escape(parser.end)}[ \\t\\n\\r]*(?:{pattern}))?"
    opening = f"[ \\t\\n\\r]*{escape(parser.start)}"
    if mode == "open":      # a leading <think> is free text to the guide (the split drops it)
        return think
    return f"(?:{opening}{think}|(?:{pattern}))"


def with_reasoning(pattern, parser: ReasoningParser, mode: str):
    """reasoning_guide for a guide's pattern: a regular expression, or a RuleSet (guided/pda.py), whose start rule
    then becomes a rule the new start rule calls."""
    from .guided.pda import RuleSet
    if not isinstance(pattern, RuleSet):
        return reasoning_guide(parser, mode, pattern)
    if mode == "closed":
        return pattern
    names = {name for name, _ in pattern.rules}
    top = "dk_reasoning"
    while top in names:
        top += "_"
    return RuleSet(((top, reasoning_guide(parser, mode, f"(?&{pattern.rules[0][0]})")), *pattern.rules))
