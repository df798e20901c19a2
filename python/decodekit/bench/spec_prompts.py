"""Built-in prompts for the speculative-decoding benchmark (no downloads): two classes.

grounded: the answer reuses text given in the prompt (edit a code snippet, extract or summarise a
          passage, repeat a passage with changes); drafters that copy from the context shine.
open:     open-ended questions; little to copy, a drafter must not slow these down.

Passages come from Python's own documentation (pydoc topics) and code from the standard library's
source, so every machine has them.
"""
from __future__ import annotations

import inspect
import textwrap


def _passage(topic: str, chars: int = 700) -> str:
    from pydoc_data.topics import topics
    text = topics[topic]
    body = text.split("\n", 2)[2] if text.count("\n") >= 2 else text  # drop the title lines
    cut = body[:chars]
    return cut[: cut.rfind("\n\n")] if "\n\n" in cut[200:] else cut


def _code(fn, lines: int = 30) -> str:
    src = textwrap.dedent(inspect.getsource(fn))
    return "\n".join(src.splitlines()[:lines])


def grounded_prompts() -> list[str]:
    import json.encoder
    import shlex
    import textwrap as tw
    return [
        "Here is a Python function:\n\n" + _code(tw.dedent) + "\n\nRewrite this function with a type-annotated "
        "signature and rename the variable `margin` to `common_prefix`. Output the complete function.",
        "Here is some code:\n\n" + _code(shlex.quote) + "\n\nAdd a docstring line to this function and output the "
        "whole function unchanged otherwise.",
        "Repeat the following passage exactly, word for word:\n\n" + _passage("assert"),
        "Copy the following text, replacing every occurrence of the word \"statement\" with \"instruction\":\n\n"
        + _passage("pass"),
        "Read the passage and list, one per line, every sentence that mentions an exception:\n\n"
        + _passage("raise"),
        "Here is a passage:\n\n" + _passage("while") + "\n\nQuote the first two sentences of the passage.",
        "Here is a Python function:\n\n" + _code(json.encoder.py_encode_basestring_ascii) + "\n\nRename the "
        "function to `encode_ascii` and output the full code.",
        "Summarise the following passage, reusing its own wording where possible:\n\n" + _passage("return"),
    ]


def open_prompts() -> list[str]:
    return [
        "Write a short poem about the sea at night.",
        "What are three good habits for staying healthy? Explain briefly.",
        "Tell me a short story about a robot who learns to paint.",
        "Why is the sky blue? Answer in a few sentences.",
        "Give me some ideas for a birthday party for a ten-year-old.",
        "Describe your ideal weekend.",
        "What is the difference between a virus and a bacterium?",
        "Invent a new board game and describe its rules.",
    ]


PROMPT_CLASSES = {"grounded": grounded_prompts, "open": open_prompts}
