"""The tokenizer built from the embedded GGUF against transformers' AutoTokenizer of the same file."""
from __future__ import annotations

import pytest

TEXTS = [
    "Hello world",
    "Hello, how are you today? I'm fine, thanks!",
    "  leading spaces and trailing   ",
    "Café naïve résumé façade Ünïcödé ÀÉÎÕÜ",
    "日本語のテキストと中文文本",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم",
    "emoji 🙂🚀✨ and a family 👨‍👩‍👧‍👦 with ZWJ",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))",
    "\t\ttabs\n\n\nnewlines\r\n\r\nCRLF",
    "numbers 12345 3.14159 -7e-10 2024-11-30 $100",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>glued<|im_start|>to special tokens",
    "<repo_name>decodekit<file_sep>",
    "a" * 200,
    "can't won't I'm you'll they'd we've",
    "x = {'a': [1, 2, 3], \"b\": None}",
    "https://example.com/path?q=1&r=two#frag",
    "",
    " ",
    "\n",
    "The quick brown fox jumps over the lazy dog.",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "mixed 😀text日本ok",
]
# Whitespace runs before a digit: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's original
# tokenizer.json) isolate digits before the GPT-2 regex; transformers' GGUF converter does not.
DIGIT_TEXTS = ["  1", "a  12 b", "x   3.14159", "\n\n 42", "total:    1000"]


def _digits_first(hf_tok):
    """transformers' backend with Digits(individual) before its ByteLevel pre-tokenizer: the
    original SmolLM2 tokenizer / llama.cpp behaviour."""
    from tokenizers import Tokenizer, pre_tokenizers
    b = Tokenizer.from_str(hf_tok.backend_tokenizer.to_str())
    b.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return b


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(tok, hf_tok, text):
    for special in (True, False):
        assert tok.encode(text, add_special_tokens=special) == hf_tok.encode(text, add_special_tokens=special)


@pytest.mark.parametrize("text", TEXTS + DIGIT_TEXTS)
def test_ids_equal_llama_cpp_pre_tokenizer(tok, hf_tok, text):
    assert tok.encode(text) == _digits_first(hf_tok).encode(text).ids


def test_known_deviation_from_transformers(tok, hf_tok):
    # transformers: [216, 216, 33] ("Ġ", "Ġ", "1"); original SmolLM2 / llama.cpp: [256, 33] ("ĠĠ", "1")
    assert tok.encode("  1") == [256, 33]
    assert hf_tok.encode("  1") in ([216, 216, 33], [256, 33])


@pytest.mark.parametrize("text", TEXTS)
def test_decode_equal_transformers(tok, hf_tok, text):
    ids = hf_tok.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens(tok, hf_tok):
    assert tok.vocab_size == len(hf_tok) == 49152
    assert tok.bos_token_id == hf_tok.bos_token_id == 1
    assert tok.eos_token_id == hf_tok.eos_token_id == 2
    assert tok.eos_token_ids == [2, 0]  # <|im_end|>, and <|endoftext|> (llama.cpp's end-of-generation set)
    assert tok.pad_token_id == hf_tok.pad_token_id
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    assert set(tok.all_special_ids) == set(hf_tok.all_special_ids) | set(range(17))
    assert not tok.add_bos_token  # tokenizer.ggml.add_bos_token = false
    assert tok.encode("hi") == [6004]
    assert tok.id_to_token(6004) == "hi" and tok.token_to_id("hi") == 6004
    assert tok.decode([6004, 99999]) == "hi"  # out-of-vocabulary ids are dropped


def test_random_ids_decode_equal_transformers(tok, hf_tok):
    import random
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(49152) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)


def test_encode_rejects_non_str(tok):
    with pytest.raises(TypeError):
        tok.encode(["a"])


def test_lone_surrogate_is_a_clear_error(tok):
    """Text with a lone surrogate (what surrogateescape makes of bad bytes) is not Unicode: a ValueError that
    names the prompt and the position, not the tokenizers library's bare TypeError; valid text still encodes."""
    with pytest.raises(ValueError, match=r"prompt: not valid Unicode text: .* at character 3"):
        tok.encode("ok \udcff bad")
    with pytest.raises(ValueError, match="at character 0"):
        tok.encode_batch(["fine", "\ud800"])
    assert tok.encode("ok \u00e9 fine") == tok.encode_batch(["ok \u00e9 fine"])[0]


def test_long_texts_encode_without_holding_the_gil(tok):
    """Texts past _GIL_FREE_CHARS go through the batch call: the same ids, and other Python threads (the server's
    event loop) keep running meanwhile (the single call held the GIL: ~1 tick of the other thread per encode)."""
    import threading
    import time

    import decodekit.tokenizer as T
    text = "Hello world, this is some text. <|im_start|>user\n" * 20000   # ~1 MB, special tokens inside
    ids = tok.encode(text)
    assert ids == tok._tk.encode(text, add_special_tokens=True).ids
    short = text[: T._GIL_FREE_CHARS + 7]
    assert tok.encode(short, add_special_tokens=False) == tok._tk.encode(short, add_special_tokens=False).ids
    ticks = []
    th = threading.Thread(target=tok.encode, args=(text,))
    th.start()
    while th.is_alive():
        time.sleep(0.001)
        ticks.append(time.perf_counter())
    assert len(ticks) >= 20, f"the main thread ran {len(ticks)} times while a 1 MB text was encoded"


def test_max_prompt_chars_bounds_the_characters_of_max_tokens(tok):
    vocab = tok.get_vocab()
    longest = max(len(t) for t in vocab)
    assert tok.max_prompt_chars(100) == 4 * longest * 100
    assert len(tok.decode(tok.encode("word " * 50)[:100])) <= tok.max_prompt_chars(100)
