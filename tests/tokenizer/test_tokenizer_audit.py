"""Audit of the tokenizer layer: differential (random and adversarial text) against transformers and the
tokenizers library on the GGUF tokenizers decodekit builds, the incremental detokenizer against decode(all
ids), stop strings, chat templates; plus the regressions the audit found."""
from __future__ import annotations

import os
import random
import sys
import warnings

import pytest

from decodekit.tokenizer import IncrementalDetokenizer, Tokenizer
from decodekit.tokenizer import builders
from decodekit.tokenizer.chat import CHATML_TEMPLATE, LLAMA3_TEMPLATE, PLAIN_TEMPLATE

sys.path.insert(0, os.path.dirname(__file__))
from test_detokenizer import stream as _stream  # noqa: E402
from test_sentencepiece_gguf import write_sp_gguf  # noqa: E402

# adversarial pieces: CJK, emoji (ZWJ, flags, skin tones), combining marks, RTL and bidi controls, CRLF, tabs,
# space runs, digits of several scripts, special-token text (whole and cut), byte-alphabet look-alikes, ...
PIECES = ["a", "the", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "1", "23", "456", "日本", "語", "中文", "한국어",
          "🙂", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "👍🏽", "e\u0301", "a\u0308\u0323", "مرحبا", "שלום",
          "\u200f", "\u202e", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_start", "im_end|>",
          "<", "|", ">", "'s", "'ll", "'S", "don't", "ʼ", "\u00a0", "\u3000", "\u2009", "\u200b", "\ufeff", "\x00",
          "\x7f", "\x1b", "𝔘", "𓀀", "Ⅻ", "½", "²", "٣", "१२", "$", "...", "!!", "--", "==", "://", "\\", "\"", "{",
          "}", "Hello", " World", "ÀÉ", "ß", "İ", "ǅ", "\ufffd", "\U0010ffff", "\ue000", "Ĝ", "Ġ", "Ċ", "▁", "<0x41>",
          "<s>", "</s>", "<unk>"]


def rand_text(rng: random.Random, n: int | None = None) -> str:
    n = rng.randrange(0, 25) if n is None else n
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.7:
            out.append(rng.choice(PIECES))
        elif r < 0.85:
            out.append(chr(rng.randrange(0x20, 0x3000)))
        else:
            c = rng.randrange(0x110000)
            out.append(chr(0x41 if 0xD800 <= c < 0xE000 else c))
    return "".join(out)


def stream(tok, ids, prompt=(), rng=None, **kw):
    """test_detokenizer's streaming, in chunks of 1..7 (1 when rng is None)."""
    return _stream(tok, ids, prompt, rng=rng, sizes=(1, 1, 1, 2, 3, 7), **kw)


@pytest.fixture(scope="module")
def digits_first(hf_tok):
    """The original SmolLM2 tokenizer.json / llama.cpp "smollm" pre-tokenizer on transformers' backend."""
    from tokenizers import Tokenizer as T
    from tokenizers import pre_tokenizers
    b = T.from_str(hf_tok.backend_tokenizer.to_str())
    b.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return b


@pytest.fixture(scope="module")
def sp_pairs(tmp_path_factory):
    """(decodekit, transformers) tokenizers of synthetic SentencePiece GGUFs: add_space_prefix absent / true,
    and decodekit's alone for add_space_prefix false (transformers ignores that key)."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("sp_audit")
    out = {}
    for asp in (None, True, False):
        path = write_sp_gguf(str(d / f"sp_{asp}.gguf"), add_space_prefix=asp)
        ref = None
        if asp is not False:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = transformers.AutoTokenizer.from_pretrained(str(d), gguf_file=os.path.basename(path))
        out[asp] = (Tokenizer.from_gguf(path), ref)
    return out


# -- encode / decode, differential ------------------------------------------------------------------------------

def test_encode_fuzz_equals_transformers_and_llama_cpp_pre_tokenizer(tok, hf_tok, digits_first):
    rng = random.Random(1234)
    for _ in range(1500):
        s = rand_text(rng)
        for special in (True, False):
            ids = tok.encode(s, add_special_tokens=special)
            assert ids == digits_first.encode(s, add_special_tokens=special).ids, repr(s)
            if not any(c.isnumeric() for c in s):  # transformers' GGUF converter does not isolate digits
                assert ids == hf_tok.encode(s, add_special_tokens=special), repr(s)
        assert tok.encode_batch([s, s], add_special_tokens=False) == [tok.encode(s, add_special_tokens=False)] * 2


def test_decode_fuzz_equals_transformers(tok, hf_tok):
    rng = random.Random(99)
    specials = tok.all_special_ids
    for _ in range(400):
        ids = [rng.choice([rng.randrange(tok.vocab_size), rng.choice(specials), rng.randrange(256)])
               for _ in range(rng.randrange(0, 30))]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip), ids


def test_sentencepiece_fuzz_equals_transformers(sp_pairs):
    rng = random.Random(5)
    words = PIECES + ["the", " quick", "brown", "fox ", "  hello", "world", "▁the", "café", "naïve", " "]
    for asp in (None, True):
        tok, ref = sp_pairs[asp]
        for _ in range(600):
            s = "".join(rng.choice(words) for _ in range(rng.randrange(0, 12)))
            for special in (True, False):
                assert tok.encode(s, add_special_tokens=special) == ref.encode(s, add_special_tokens=special), repr(s)
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(0, 20))]
            for skip in (True, False):
                assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids


def test_sentencepiece_without_space_prefix(sp_pairs):
    """tokenizer.ggml.add_space_prefix = false (llama.cpp honours it; transformers' GGUF converter ignores it):
    no '▁' prepended, nothing stripped when decoding."""
    tok, _ = sp_pairs[False]
    ids = tok.encode("the fox", add_special_tokens=False)
    assert tok.id_to_token(ids[0]) == "the" and tok.decode(ids) == "the fox"
    assert tok.decode(tok.encode(" the")) == " the"


# -- incremental detokenizer --------------------------------------------------------------------------------------

def _detok_fuzz(tok, seed, n_iter, prompts=("Hello", "a b", "x<|im_start|>", "the", "")):
    rng = random.Random(seed)
    V = tok.vocab_size
    specials = tok.all_special_ids
    short = [i for i in range(V) if len(tok.decode([i], skip_special_tokens=False)) <= 2
             or "\ufffd" in tok.decode([i])]
    for _ in range(n_iter):
        ids = [rng.choice([rng.randrange(V), rng.choice(short), rng.choice(short), rng.choice(specials)])
               for _ in range(rng.randrange(0, 30))]
        prompt = [] if rng.random() < 0.5 else tok.encode(rng.choice(prompts), add_special_tokens=rng.random() < 0.5)
        for skip in (True, False):
            d, deltas = stream(tok, ids, prompt, rng, skip_special_tokens=skip)
            if prompt:
                full, pt = tok.decode(prompt + ids, skip_special_tokens=skip), tok.decode(prompt, skip_special_tokens=skip)
                want = full[len(pt):]
            else:
                want = tok.decode(ids, skip_special_tokens=skip)
            assert d.text == want, (prompt, ids, skip)
            assert d.token_ids == ids


def test_detokenizer_fuzz_smollm(tok):
    _detok_fuzz(tok, 42, 300)


def test_detokenizer_fuzz_synthetic():
    _detok_fuzz(Tokenizer.synthetic(512), 43, 300)


@pytest.mark.parametrize("asp", [None, False])
def test_detokenizer_fuzz_sentencepiece(sp_pairs, asp):
    """Random ids, byte-fallback tokens among them: the streamed text is decode(all ids)."""
    _detok_fuzz(sp_pairs[asp][0], 44, 400, prompts=("the quick", "hello world", "café", ""))


def test_sentencepiece_byte_run_streamed_as_decoded(sp_pairs):
    """Regression: transformers' ByteFallback decoder decodes a run of <0xNN> tokens as one: valid UTF-8 -> the
    characters, otherwise one U+FFFD per byte token, valid characters inside the run included. The streamed text
    emitted 'é' as soon as its two byte tokens were out and then only the U+FFFD of a following bad byte
    ('é\ufffd the' where decode(all) is '\ufffd\ufffd\ufffd the'). A run is now held back until it ends."""
    tok, ref = sp_pairs[None]
    b = {x: tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    the = tok.token_to_id("\u2581the")
    cases = [
        [the, b[0xC3], b[0xA9], b[0xFF], the],            # é, then a byte that can start nothing
        [the, b[0xC3], b[0xA9], b[0xC3], the],            # é, then an incomplete character
        [b[0xE2], b[0x98], b[0x83], b[0x80]],             # ☃ then a stray continuation byte, at the end
        [the, b[0xC3], b[0xA9], 2, b[0xA9], the],         # </s> between: skipped, the run goes on
        [the, b[0xC3], b[0xA9], the, b[0xFF]],            # ended by a text token: é is final
        [b[0x61], b[0x62], 0, b[0xF0], b[0x9F], b[0x99], b[0x82], the],
    ]
    for ids in cases:
        for skip in (True, False):
            want = ref.decode(ids, skip_special_tokens=skip)
            assert tok.decode(ids, skip_special_tokens=skip) == want
            d, deltas = stream(tok, ids, skip_special_tokens=skip)
            assert d.text == want, (ids, skip, deltas)
    # valid characters still stream as soon as the run ends
    d = IncrementalDetokenizer(tok, [])
    assert d.add([the]) == "the"
    assert d.add([b[0xC3], b[0xA9]]) == ""
    assert d.add([the]) == "é the"


def test_byte_fallback_ids(tok, sp_pairs):
    sp = sp_pairs[None][0]
    assert sp.byte_fallback_ids == frozenset(sp.token_to_id(f"<0x{x:02X}>") for x in range(256))
    assert tok.byte_fallback_ids == frozenset() and Tokenizer.synthetic(512).byte_fallback_ids == frozenset()


# -- stop strings ---------------------------------------------------------------------------------------------------

def _occurrences(text, s):
    i = text.find(s)
    while i >= 0:
        yield i
        i = text.find(s, i + 1)


@pytest.mark.parametrize("seed", range(4))
def test_stop_strings_fuzz(tok, seed):
    """Stop strings that span tokens, are prefixes of each other, sit inside multi-byte characters' token runs,
    with include_stop_str_in_output on and off: the output is decode(all ids) cut at a stop string (nothing
    before it missed), or all of it (held-back text released by flush) when none occurs."""
    rng = random.Random(1000 + seed)
    for _ in range(400):
        ids = tok.encode(rand_text(rng, rng.randrange(1, 15)), add_special_tokens=False)
        if rng.random() < 0.3:
            ids += [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 8))]
        skip = rng.random() < 0.7
        full = tok.decode(ids, skip_special_tokens=skip)
        stops = []
        for _ in range(rng.randrange(1, 4)):
            if full and rng.random() < 0.8:
                a = rng.randrange(len(full))
                s = full[a:a + rng.randrange(1, 6)]
            else:
                s = rand_text(rng, rng.randrange(1, 3))
            stops.append(s)
            if len(s) > 1 and rng.random() < 0.3:
                stops.append(s[:rng.randrange(1, len(s))])
        inc = rng.random() < 0.5
        d, _ = stream(tok, ids, (), rng, skip_special_tokens=skip, stop=stops, include_stop_str_in_output=inc)
        matches = [(j, s) for s in stops if s for j in _occurrences(full, s)]
        if not d.stopped:
            assert d.text == full and not matches, (ids, stops)
            continue
        s = d.stop_reason
        start = len(d.text) - (len(s) if inc else 0)
        assert full[start:start + len(s)] == s and d.text == full[:start + (len(s) if inc else 0)], (ids, stops)
        assert not [m for m in matches if m[0] + len(m[1]) <= start], (ids, stops)  # none missed before it


def test_stop_string_edges(tok):
    ids = tok.encode("Hello world, hello there", add_special_tokens=False)
    for stops, inc, want, reason in ((["lo w", "lo"], False, "Hel", "lo"), (["d, h"], True, "Hello world, h", "d, h"),
                                     (["xyz"], False, "Hello world, hello there", None),
                                     (["there!"], False, "Hello world, hello there", None)):
        d, deltas = stream(tok, ids, stop=stops, include_stop_str_in_output=inc)
        assert (d.text, d.stop_reason) == (want, reason)
    # a stop string inside a character split over byte tokens matches only once the character is whole
    ids = tok.encode("a🙂b", add_special_tokens=False)
    assert len(ids) > 3
    d, deltas = stream(tok, ids, stop=["🙂"])
    assert d.text == "a" and d.stopped and "\ufffd" not in "".join(deltas)
    # a tail that may begin a stop string is held, then released when the stream ends
    d = IncrementalDetokenizer(tok, [], stop=["wor", "world!"])
    assert d.add(tok.encode(" hello wo", add_special_tokens=False)) == " hello "
    assert d.flush() == "wo" and d.text == " hello wo" and not d.stopped


# -- chat templates ---------------------------------------------------------------------------------------------

QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\n<tools>\" }}{%- for tool in tools %}"
    "{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools><|im_end|>\\n\" }}{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <|im_end|> é",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _both(tok, hf_tok, msgs, **kw):
    try:
        ours = tok.apply_chat_template(msgs, **kw)
    except ValueError:
        ours = ValueError
    try:
        theirs = hf_tok.apply_chat_template(msgs, tokenize=False, **kw)
    except ValueError:
        theirs = ValueError
    return ours, theirs


def test_chat_template_fuzz_equals_transformers(tok, hf_tok):
    rng = random.Random(77)
    for _ in range(150):
        msgs = [{"role": "system", "content": rand_text(rng, rng.randrange(0, 5))}] if rng.random() < 0.5 else []
        for _ in range(rng.randrange(1, 4)):
            msgs.append({"role": "user", "content": rand_text(rng, rng.randrange(0, 6))})
            if rng.random() < 0.7:
                msgs.append({"role": "assistant", "content": rand_text(rng, rng.randrange(0, 6))})
        tmpl = rng.choice([None, LLAMA3_TEMPLATE, CHATML_TEMPLATE, PLAIN_TEMPLATE, QWEN_TOOLS_TEMPLATE])
        tools = TOOLS if rng.random() < 0.5 else None
        for gen, cont in ((True, False), (False, False), (False, True)):
            ours, theirs = _both(tok, hf_tok, msgs, add_generation_prompt=gen, continue_final_message=cont,
                                 chat_template=tmpl, tools=tools)
            assert ours == theirs, (tmpl, gen, cont, msgs)


@pytest.mark.parametrize("template", [LLAMA3_TEMPLATE, QWEN_TOOLS_TEMPLATE], ids=["llama3", "qwen2.5"])
@pytest.mark.parametrize("last", ["", "Sure ", "  {\"a\": ", "a\r", "x\n\n", "   "],
                         ids=["empty", "trailing-space", "leading-space", "cr", "newlines", "spaces"])
def test_continue_final_message_trimming_template_equals_transformers(tok, hf_tok, template, last):
    """Regression: with a template that trims the content (`| trim`: Llama 3, Qwen 2.5), transformers' marker
    loses its trailing space and the text before it is right-stripped too; decodekit's marker kept the
    trailing whitespace the template would have trimmed ('...<|end_header_id|>\\n\\n' for an empty message) and
    refused leading whitespace ('does not write the content verbatim')."""
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": last}]
    ours, theirs = _both(tok, hf_tok, conv, add_generation_prompt=False, continue_final_message=True,
                         chat_template=template)
    assert ours == theirs


def test_chat_prompt_encodes_without_extra_bos(tok):
    """The template writes the special tokens itself; the prompt is encoded with add_special_tokens=False
    (engine/llm.py, server) and SmolLM2 adds no BOS either way: <|im_start|> appears exactly where written."""
    text = tok.apply_chat_template([{"role": "user", "content": "<|im_start|>hi"}])
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == tok.encode(text) and ids.count(tok.bos_token_id) == text.count("<|im_start|>") == 4


# -- GGUF metadata: tokens outside the byte alphabet, pre-tokenizer tables ------------------------------------------

@pytest.fixture(scope="module")
def smollm_meta(gguf_path):
    from decodekit.loader.gguf import read_gguf_metadata
    return dict(read_gguf_metadata(gguf_path))


def test_byte_level_control_tokens_written_as_text(smollm_meta):
    """Regression: a byte-level GGUF stores added tokens as their text ("<｜begin▁of▁sentence｜>", "<｜User｜>":
    DeepSeek-R1 distills; llama.cpp matches them whole). They were respelled into the byte alphabet and then left
    out of the special tokens: the chat template's bos_token rendered as mojibake ('<ï½ľbeginâĸģ...') cut into
    ~30 byte pieces, "<｜User｜>" in the template was cut into pieces, and skip_special_tokens kept them."""
    tokens = list(smollm_meta["tokenizer.ggml.tokens"])
    types = list(smollm_meta["tokenizer.ggml.token_type"])
    tokens[3:6] = ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"]   # CONTROL in the file
    tokens.append("  é\n")      # a user-defined token with characters outside the byte alphabet
    types.append(builders.USER_DEFINED)
    meta = dict(smollm_meta, **{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                                "tokenizer.ggml.bos_token_id": 3, "tokenizer.ggml.eos_token_id": 5,
                                "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}<｜User｜>"
                                                           "{{ m.content }}{% endfor %}"})
    t = Tokenizer.from_gguf_metadata(meta)
    assert t.vocab_size == len(tokens) and t.bos_token == "<｜begin▁of▁sentence｜>"
    text = t.apply_chat_template([{"role": "user", "content": "hi  é\n"}], add_generation_prompt=False)
    assert text == "<｜begin▁of▁sentence｜><｜User｜>hi  é\n"
    assert t.encode(text, add_special_tokens=False) == [3, 4, 6004, len(tokens) - 1]
    assert t.decode([3, 6004, 4, 5]) == "hi"
    assert t.decode([3, 6004, len(tokens) - 1, 5], skip_special_tokens=False) == \
        "<｜begin▁of▁sentence｜>hi  é\n<｜end▁of▁sentence｜>"
    assert 5 in t.eos_token_ids and {3, 4, 5} <= set(t.all_special_ids)
    # tokens in the byte alphabet are unchanged (the SmolLM2 vocabulary itself)
    assert t.encode("hello <|im_start|>") == Tokenizer.from_gguf_metadata(smollm_meta).encode("hello <|im_start|>")


def _tiny_byte_level(pre: str, extra: list[str], merges: list[str], **kw) -> Tokenizer:
    alphabet = list(builders.bytes_to_unicode().values())
    tokens = alphabet + extra
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [builders.NORMAL] * len(tokens), "tokenizer.ggml.merges": merges, **kw}
    return Tokenizer.from_gguf_metadata(meta)


def test_pre_tokenizer_names_follow_llama_cpp():
    """Regression: llama.cpp's names for the pre-tokenizer table: Minerva is "minerva-7b" (digits isolated, like
    smollm; "minerva" matched no file), and "midm-2.0" / "lfm2" are Llama 3 vocabularies with ignore_merges and
    BOS by default (as "pixtral"), which decodekit had only partly."""
    def ids_of(t, pieces):
        return [t.token_to_id(p) for p in pieces]
    for pre, digits in (("minerva-7b", True), ("smollm", True), ("gpt2", False)):
        t = _tiny_byte_level(pre, ["Ġ1"], ["Ġ 1"])
        assert t.encode(" 12") == (ids_of(t, ["Ġ", "1", "2"]) if digits else ids_of(t, ["Ġ1", "2"])), pre
    for pre in ("lfm2", "midm-2.0", "llama3", "pixtral"):
        t = _tiny_byte_level(pre, ["ab", "abc"], ["a b"], **{"tokenizer.ggml.bos_token_id": 0})
        assert t.encode("abc", add_special_tokens=False) == ids_of(t, ["abc"]), pre   # the word whole
        assert t.add_bos_token, pre
    t = _tiny_byte_level("gpt2", ["ab", "abc"], ["a b"], **{"tokenizer.ggml.bos_token_id": 0})
    assert t.encode("abc") == ids_of(t, ["ab", "c"]) and not t.add_bos_token
