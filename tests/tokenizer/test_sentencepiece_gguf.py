"""GGUF files with a SentencePiece-style vocabulary (tokenizer.ggml.model == "llama": Llama 2,
Mistral v0.1 ...) against transformers' GGUF tokenizer of the same file."""
from __future__ import annotations

import os
import warnings

import pytest

from decodekit.tokenizer import IncrementalDetokenizer, Tokenizer

WORDS = ("the quick brown fox jumps over lazy dog hello world this is a test of sentence piece tokenizer "
         "and numbers one two three café naïve").split()


def _vocab():
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["\u2581"] + sorted(set("".join(WORDS)) | set("abcdefghijklmnopqrstuvwxyz.,!?"))
    for w in WORDS:
        s = "\u2581" + w
        pieces += [s[:k] for k in range(2, len(s) + 1)] + [w[:k] for k in range(2, len(w) + 1)]
    for p in dict.fromkeys(pieces):
        tokens.append(p)
        types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, types, scores


def write_sp_gguf(path: str, add_space_prefix: bool | None = None) -> str:
    import gguf
    tokens, types, scores = _vocab()
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("sp-test")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


TEXTS = ["the quick brown fox", "Hello world!", "this is a test of sentence piece", "  two  spaces",
         "café naïve 🙂 unknown ☃ chars", "numbers 123", "new\nline", "", "<s>the</s>", "xyz"]


@pytest.fixture(scope="module")
def sp_pair(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = write_sp_gguf(str(tmp_path_factory.mktemp("sp") / "sp.gguf"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return Tokenizer.from_gguf(path), ref


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_equal_transformers(sp_pair, text):
    tok, ref = sp_pair
    for special in (True, False):
        assert tok.encode(text, add_special_tokens=special) == ref.encode(text, add_special_tokens=special)
    ids = ref.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_sentencepiece_basics(sp_pair):
    tok, _ = sp_pair
    assert tok.add_bos_token and tok.encode("the")[0] == 1
    assert tok.eos_token_ids == [2] and tok.vocab_size == len(_vocab()[0])
    assert tok.decode(tok.encode("café ☃")) == "café ☃"  # byte fallback round trip


@pytest.mark.parametrize("text", TEXTS[:6])
def test_sentencepiece_streaming(sp_pair, text):
    tok, _ = sp_pair
    prompt = tok.encode("hello world")
    ids = tok.encode(" " + text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, prompt)
    out = "".join(d.add([i]) for i in ids) + d.flush()
    full = tok.decode(prompt + ids)
    assert out == full[len(tok.decode(prompt)):]
    d = IncrementalDetokenizer(tok, [])
    ids = tok.encode(text, add_special_tokens=False)
    assert "".join(d.add([i]) for i in ids) + d.flush() == tok.decode(ids)


def test_sentencepiece_token_bytes(sp_pair):
    """Token bytes (guided_choice matches on them): '\u2581' is a space, <0xNN> its byte; the bytes of a text's
    tokens spell the text as decoded after a prompt (the Metaspace prefix space included)."""
    tok, _ = sp_pair
    tb, index = tok.token_bytes()
    for text in ("the café ☃", "hello world"):
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tb[i] for i in ids).decode() == " " + text
    assert all(tb[i] is None for i in tok.all_special_ids)
