"""IncrementalDetokenizer: streamed text equals decode(all), no half characters, stop strings."""
from __future__ import annotations

import random

import pytest

from decodekit.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello world! This is a test of streaming detokenization.",
    "Emoji 🙂🚀✨👨‍👩‍👧‍👦 and CJK 日本語のテキスト, Ελληνικά, русский, العربية.",
    "def f(x):\n    return {'a': x}  # ünïcödé\n\n\tend",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝒜𝒷𝒸 and rare 𓀀𓁐 hieroglyphs",
]


def stream(tok, ids, prompt=(), chunk=1, rng=None, sizes=(1, 2, 3, 4, 5), **kw):
    """Streams ids in chunks (of `chunk`, or of random `sizes` with rng); returns (detokenizer, deltas)."""
    d = IncrementalDetokenizer(tok, prompt, **kw)
    deltas, i = [], 0
    while i < len(ids):
        n = rng.choice(sizes) if rng else chunk
        deltas.append(d.add(ids[i:i + n]))
        i += n
        if d.stopped:
            break
    deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return d, deltas


@pytest.fixture(scope="module", params=["smollm", "synthetic"])
def any_tok(request, tok):
    return tok if request.param == "smollm" else Tokenizer.synthetic(512)


@pytest.mark.parametrize("text", TEXTS)
def test_text_roundtrip_no_half_characters(any_tok, text):
    ids = any_tok.encode(text)
    d, deltas = stream(any_tok, ids)
    assert d.text == text == any_tok.decode(ids)
    assert not any("\ufffd" in x for x in deltas), "emitted half a UTF-8 character"
    if not text.isascii():  # the case that matters: some character spans several tokens
        assert any("\ufffd" in any_tok.decode([i]) for i in ids)


@pytest.mark.parametrize("seed", range(20))
def test_random_ids_equal_decode_all(any_tok, seed):
    rng = random.Random(seed)
    n = any_tok.vocab_size
    ids = [rng.randrange(n) for _ in range(rng.randrange(1, 120))]
    for skip in (True, False):
        d, _ = stream(any_tok, ids, skip_special_tokens=skip)
        assert d.text == any_tok.decode(ids, skip_special_tokens=skip)
        d, _ = stream(any_tok, ids, rng=rng, skip_special_tokens=skip)
        assert d.text == any_tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("seed", range(10))
def test_byte_tokens_spliced_between_text(tok, seed):
    """Multi-byte characters cut into single-byte tokens, mixed with ordinary text tokens."""
    rng = random.Random(seed)
    byte_ids = [tok.token_to_id(t) for t in ("ð", "Ł", "Ļ", "Ĥ", "ã", "ģ", "ĥ")]  # bytes F0 9F 98 80 E3 81 82
    ids = []
    for _ in range(30):
        ids += rng.choice([tok.encode(" word"), tok.encode("🙂"), byte_ids[:4], byte_ids[4:], [rng.choice(byte_ids)]])
    d, deltas = stream(tok, ids, rng=rng)
    assert d.text == tok.decode(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_with_prompt(any_tok, text):
    prompt = any_tok.encode("A prompt that comes first: ")
    ids = any_tok.encode(text)
    d, _ = stream(any_tok, ids, prompt=prompt)
    full = any_tok.decode(prompt + ids)
    assert d.text == full[len(any_tok.decode(prompt)):]
    assert d.token_ids == ids


def test_special_tokens_skipped_or_kept(tok):
    ids = tok.encode("<|im_start|>assistant\nHello<|im_end|>")
    assert stream(tok, ids)[0].text == "assistant\nHello"
    assert stream(tok, ids, skip_special_tokens=False)[0].text == "<|im_start|>assistant\nHello<|im_end|>"


@pytest.mark.parametrize("text, stop, expected, reason", [
    ("Hello world. STOP here and more", ["STOP"], "Hello world. ", "STOP"),
    ("Hello world. STOP here", ["world. ST"], "Hello ", "world. ST"),
    ("one\n\ntwo", ["\n\n"], "one", "\n\n"),
    ("a S b ST c STOP d", ["STOP"], "a S b ST c ", "STOP"),
    ("no stop string in here", ["STOP", "xyz"], "no stop string in here", None),
    ("emoji 🙂 then 🚀 rocket", ["🚀"], "emoji 🙂 then ", "🚀"),
    ("first STOP or END", ["END", "STOP"], "first ", "STOP"),
    ("endswith ST", ["STOP"], "endswith ST", None),
])
@pytest.mark.parametrize("chunked", [False, True])
def test_stop_strings(any_tok, text, stop, expected, reason, chunked):
    ids = any_tok.encode(text)
    d, deltas = stream(any_tok, ids, stop=stop, rng=random.Random(1) if chunked else None)
    assert d.text == expected
    assert d.stopped == (reason is not None) and d.stop_reason == reason
    d2, _ = stream(any_tok, ids, stop=stop, include_stop_str_in_output=True)
    assert d2.text == expected + (reason or "")


def test_stop_prefix_is_held_back_then_released(tok):
    d = IncrementalDetokenizer(tok, stop=["STOP"])
    out = d.add(tok.encode("go ST"))
    assert "ST" not in out and d.text == out  # "ST" might begin "STOP": held
    out2 = d.add(tok.encode("ay"))
    assert out + out2 == "go STay" and not d.stopped
    assert d.add(tok.encode(" STOP now")) == " " and d.stopped
    assert d.add(tok.encode("more")) == "" and d.flush() == ""
    assert d.text == "go STay "


def test_work_per_call_is_bounded(tok):
    """Each add() decodes a short window, not the whole output (O(new tokens))."""
    calls = []

    class Spy:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode(" ".join(TEXTS) * 20)
    assert len(ids) > 1000
    d = IncrementalDetokenizer(Spy(), tok.encode("prompt " * 50), stop=["never appears"])
    for i in ids:
        d.add([i])
    d.flush()
    assert d.text == tok.decode(ids)
    assert max(calls) <= 12, f"decoded windows up to {max(calls)} tokens"


class _CharTok:
    """One token per character (id = code point); decode joins them."""
    vocab_size = 0x110000

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _stream(text, chunks=1, **kw):
    d = IncrementalDetokenizer(_CharTok(), [], **kw)
    ids = [ord(c) for c in text]
    out = "".join(d.add(ids[i:i + chunks]) for i in range(0, len(ids), chunks))
    if not d.stopped:
        out += d.flush()
    return out, d.stop_reason


@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
def test_min_tokens_stop_string_may_begin_inside_the_first_tokens(chunks):
    """vLLM's rule: a match must end past the first min_tokens tokens' text but may begin inside it. Was: only text
    after min_tokens was searched, so 's.' in ' Paris.' with min_tokens = 6 (the match ends at token 7) was missed."""
    assert _stream(" Paris. More", chunks, stop=["s."], min_tokens=6) == (" Pari", "s.")
    # a match ending inside min_tokens' text does not count; the next one past it does
    assert _stream("ab ab ab", chunks, stop=["ab"], min_tokens=2) == ("ab ", "ab")
    assert _stream("ab ab ab", chunks, stop=["ab"], min_tokens=5) == ("ab ab ", "ab")
    assert _stream("xyz", chunks, stop=["xyz"], min_tokens=3) == ("xyz", None)    # ends at token 3 exactly
    assert _stream("xyzxyz", chunks, stop=["xyz", "zx"], min_tokens=3) == ("xy", "zx")
    assert _stream("abc", chunks, stop=["c"], min_tokens=0) == ("ab", "c")
