"""Byte-level GGUF pre-tokenizers by tokenizer.ggml.pre, against llama.cpp's rule: the regexes of a name split
the text in turn (each one splits every fragment the ones before left, isolating its matches and the text between
them). The oracle runs that rule with the `regex` package; decodekit builds it as a Sequence of Split
pre-tokenizers. Was: deepseek-v3 / deepseek-coder / falcon / bloom / chameleon / stablelm2 / chatglm / qwen35 and
other names llama.cpp knows fell back to the GPT-2 regex without a word."""
from __future__ import annotations

import logging
import random

import pytest

from decodekit.tokenizer import builders

regex = pytest.importorskip("regex")

SAMPLES = [
    "Hello, world! 12345 and 6.78e9",
    "日本語のテキスト、カタカナ。한국어 텍스트 中文字符",
    "def f(x):\n\treturn x**2  # note\r\n\n  ",
    "it's we'll THEY'RE don't <sentinel:12> IMGIMGABCZ tail",
    "…。，、।۔، Ελληνικά русский ١٢٣ 😀👍🏽 $+<=>^~|`",
    "    four spaces    then  two",
]


def _llama_cpp_split(text: str, exprs: tuple[str, ...]) -> list[str]:
    pieces = [text]
    for e in exprs:
        out = []
        for p in pieces:
            at = 0
            for m in regex.finditer(e, p):
                if m.start() == m.end():   # a zero-width match (superbpe's lookahead) splits at its position
                    if m.start() > at:
                        out.append(p[at:m.start()])
                        at = m.start()
                    continue
                if m.start() > at:
                    out.append(p[at:m.start()])
                out.append(m.group())
                at = m.end()
            if at < len(p):
                out.append(p[at:])
        pieces = out
    return pieces


def _ours(pre: str, text: str) -> list[str]:
    decode = {c: b for b, c in builders.bytes_to_unicode().items()}
    got = builders.byte_level_pre_tokenizer(pre).pre_tokenize_str(text)
    return [bytes(decode[c] for c in piece).decode("utf-8") for piece, _ in got]


def _random_text(rng: random.Random) -> str:
    alphabet = "aZ9 .,!?'\n\t日テ한é€😀-_/\\\"$+<>~|`…。，" + "".join(chr(c) for c in range(0x20, 0x7f))
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))


@pytest.mark.parametrize("pre", sorted(builders.PRE_SPLITS))
def test_pre_tokenizer_splits_as_llama_cpp(pre):
    exprs = builders.PRE_SPLITS[pre]
    exprs = exprs if isinstance(exprs, tuple) else (exprs,)
    rng = random.Random(hash(pre) % 1000)
    for text in SAMPLES + [_random_text(rng) for _ in range(200)]:
        assert _ours(pre, text) == _llama_cpp_split(text, exprs), (pre, text)


def test_deepseek_v3_splits_digits_and_cjk_first():
    assert _ours("deepseek-v3", "Hello, world! 12345 日本語テキスト x.y") == \
        ["Hello", ",", " world", "!", " ", "123", "45", " ", "日本語テキスト", " x", ".y"]
    assert _ours("deepseek-coder", "x = 12\nfoo, y") == ["x", " = ", "1", "2", "\n", "foo", ",", " y"]   # ("=" is \p{S})


def test_deepseek_llm_and_superbpe_splits():
    """Was: both fell back to the GPT-2 regex (deepseek-llm is the Llama-architecture DeepSeek-LLM 7B / 67B)."""
    assert _ours("deepseek-llm", "Hello, world! 12345 日本語 Ελληνικά\n  x") == \
        ["Hello", ",", " world", "!", " ", "12345", " ", "日本語", " Ελληνικά", "\n", " ", " x"]
    assert _ours("deepseek-llm", "ＡＢ（ｃ）  ") == ["ＡＢ", "（", "ｃ", "）", "  "]
    assert _ours("superbpe", "by the way 1234567 of 12 x") == ["by the way ", "1", "234", "567", " of ", "12", " x"]


def test_llama_cpp_names_are_not_the_gpt2_fallback():
    """The names llama.cpp gives its own split: a GPT-2 split would differ on these texts."""
    for pre, text in (("deepseek-v3", "a 12345"), ("falcon", "x+=1234"), ("bloom", "it's"),
                      ("stablelm2", "abc 123"), ("chatglm-bpe", "abc 1234"), ("qwen35", "a\u0301b 12"),
                      ("deepseek-llm", "a 12345"), ("superbpe", "to be")):
        assert _ours(pre, text) != _ours("gpt2", text), pre


def test_unknown_pre_tokenizer_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="decodekit.tokenizer"):
        builders.byte_level_pre_tokenizer("kimi-k2")
    assert "kimi-k2" in caplog.text and "GPT-2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="decodekit.tokenizer"):
        for pre in ("gpt2", "gpt-2", "mpt", "olmo", "default", None):
            builders.byte_level_pre_tokenizer(pre)
    assert caplog.text == ""
