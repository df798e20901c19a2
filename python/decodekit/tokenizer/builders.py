"""Builds `tokenizers.Tokenizer` backends: from GGUF metadata (llama.cpp's key names) and the
small synthetic byte-level BPE used by the random:* models.

GGUF byte-level BPE ("gpt2") follows transformers' GGUF converter (integrations/gguf/
gguf_tokenizer_mapping.py: vocabulary respelled in the byte alphabet, merges as stored, control
tokens special, user-defined tokens added) with two deliberate differences. CONTROL and USER_DEFINED
tokens keep their text when it is outside the byte alphabet (llama.cpp's convert writes added tokens such
as "<｜begin▁of▁sentence｜>" as text and llama.cpp matches them whole; transformers respells them and then
leaves them out, so the chat template's bos_token became mojibake cut into pieces). And the pre-tokenizer
follows llama.cpp's table for `tokenizer.ggml.pre`. For "smollm" (and the other StarCoder-style
vocabularies) llama.cpp isolates every digit (\\p{N}) before the GPT-2 regex, exactly as the
original Hugging Face tokenizer.json does (Digits(individual_digits) + ByteLevel); transformers'
GGUF converter has no entry for "smollm" and so differs on whitespace runs before a digit
("  1": transformers [216, 216, 33], llama.cpp / original [256, 33]).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import logging

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger("decodekit.tokenizer")

# token types in tokenizer.ggml.token_type (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SEED_CODER_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                     r"|\s+(?!\S)|\s+")
_BAILING_SPLIT = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)"
                  r"|\s+")
_GPT2_NO_WS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"          # llama.cpp's [一-龥ࠀ-一가-퟿]+
# deepseek-llm's letters (llama.cpp's list: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee... and fullwidth
# / astral ones; no CJK, which has a split of its own) and its ASCII / fullwidth punctuation
_DEEPSEEK_LLM_LETTERS = ("A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
                         "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
                         "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
                         "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
                         "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
                         "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
                         "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
                         "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
                         "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
                         "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
                         "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
                         "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
                         "\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_LLM_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_NO_PUNCT_RUN = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"   # bloom: ' ?[^(\s|.,!?…。，、।۔،)]+'

# tokenizer.ggml.pre -> the split regex applied before the byte-level mapping (as transformers'
# GGUF_PRE_TOKENIZER_SPLITS; these all match llama.cpp's regexes), or a tuple of them: llama.cpp splits with
# each in turn (every fragment the ones before left, matches and the text between them isolated), as the
# original tokenizer.json's Sequence of Split pre-tokenizers does.
PRE_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4"], _LLAMA3_SPLIT),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez", "kormo", "f2llmv2", "stablelm2", "hunyuan", "grok-2"],
                    _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2", "kanana2", "talkie"], _GPT4O_SPLIT),
    "seed-coder": _SEED_CODER_SPLIT,
    **dict.fromkeys(["bailingmoe", "bailingmoe2", "llada-moe"], _BAILING_SPLIT),
    **dict.fromkeys(["deepseek-v3", "hunyuan-dense"], (
        r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-llm": (r"[\r\n]", r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+", r"\s?[" + _DEEPSEEK_LLM_PUNCT + "]+", r"\s+$", _CJK,
                     r"\p{N}+"),
    # SuperBPE (superword tokens: no whitespace split at all): digit runs, then groups of three from the right
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_NO_WS, r"[0-9][0-9][0-9]"),
    **dict.fromkeys(["poro-chat", "bloom", "gpt3-finnish"], _NO_PUNCT_RUN),
    "viking": (_NO_PUNCT_RUN, r"\p{N}"),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", _GPT2_NO_WS),
}
# llama.cpp's names for the GPT-2 regex (ByteLevel's own): no split of their own.
GPT2_PRE = {"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
            "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"}
# llama.cpp: {"\p{N}", GPT-2 regex} -- digits isolated first, then the GPT-2 regex.
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
# llama.cpp sets tokenizer_ignore_merges for these (as the original tokenizer.json's "ignore_merges").
IGNORE_MERGES_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "tekken"}
# llama.cpp adds BOS by default for these when the file has no tokenizer.ggml.add_bos_token.
ADD_BOS_DEFAULT_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                       "jina-v5-nano", "tekken", "chameleon"}

# Tokens llama.cpp treats as end-of-generation when the vocabulary marks them CONTROL.
END_OF_GENERATION_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                            "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_level_pre_tokenizer(pre: str | None):
    """The pre-tokenizer for a byte-level vocabulary whose tokenizer.ggml.pre is `pre`."""
    if pre in PRE_SPLITS:
        splits = PRE_SPLITS[pre] if isinstance(PRE_SPLITS[pre], tuple) else (PRE_SPLITS[pre],)
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
                                       + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre not in GPT2_PRE and pre not in (None, "", "default"):
        log.warning("tokenizer.ggml.pre %r: no split of its own here (llama.cpp's kimi-k2 and afmoe "
                    "splits are code, not regexes; or a newer name); splitting with the GPT-2 regex, some texts may encode differently "
                    "from the original tokenizer", pre)
    # "gpt2" and its aliases, "default", no name and anything unknown: the GPT-2 regex (built into ByteLevel)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _special_added_tokens(tk: Tokenizer, tokens: list[str], types: list[int] | None, keys: list[str],
                          extra_special_ids: list[int]) -> None:
    """Registers CONTROL tokens (and bos/eos/unk/pad) as special and USER_DEFINED ones as added. `keys` are
    the tokens as the vocabulary spells them (a byte-level vocabulary respells a NORMAL token written in
    plain text into the byte alphabet; such a token is not registered: its text is not the token's)."""
    types = list(types or ())
    special_ids = [i for i, t in enumerate(types) if t == CONTROL]
    special_ids += [i for i in extra_special_ids if i is not None and 0 <= i < len(tokens) and i not in special_ids]
    special = [AddedToken(tokens[i], normalized=False, special=True) for i in special_ids if keys[i] == tokens[i]]
    if special:
        tk.add_special_tokens(special)
    vocab = tk.get_vocab()
    user = [AddedToken(tokens[i], normalized=False, special=False)
            for i, t in enumerate(types) if t == USER_DEFINED and keys[i] == tokens[i] and tokens[i] in vocab]
    if user:
        tk.add_tokens(user)


def _gguf_merges(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """tokenizer.ggml.merges as (left, right) pairs: each entry is "left right"."""
    merges = []
    for i, m in enumerate(meta["tokenizer.ggml.merges"]):
        pair = tuple(m.split(" ", 1)) if isinstance(m, str) else ()
        if len(pair) != 2:
            raise ValueError(f"tokenizer.ggml.merges[{i}] = {m!r} is not two tokens separated by a space")
        merges.append(pair)
    return merges


def byte_level_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or ())
    # CONTROL / USER_DEFINED tokens are written as their text (llama.cpp's convert writes an added token such as
    # "<｜end▁of▁sentence｜>" or "<｜User｜>" as is, and matches it whole in the text); they keep that spelling, as
    # the added tokens of the original tokenizer.json do (ByteLevel decodes a token with characters outside the
    # byte alphabet as its UTF-8). Any other token outside the byte alphabet is respelled in it.
    raw = {i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)}
    keys = [t if set(t) <= alphabet or i in raw else "".join(spelling[b] for b in t.encode("utf-8"))
            for i, t in enumerate(tokens)]
    vocab = {k: i for i, k in enumerate(keys)}
    if "tokenizer.ggml.merges" not in meta:
        raise NotImplementedError("GGUF byte-level BPE vocabulary without tokenizer.ggml.merges")
    merges = _gguf_merges(meta)
    pre = meta.get("tokenizer.ggml.pre")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False, ignore_merges=pre in IGNORE_MERGES_PRE))
    tk.pre_tokenizer = byte_level_pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    _special_added_tokens(tk, tokens, types, keys, _special_ids(meta))
    return tk


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary and its scores (transformers'
    tokenization_utils_base.generate_merges with vocab_scores given)."""
    merges = []
    for merge, score in scores.items():
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def sentencepiece_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """SentencePiece-style BPE (tokenizer.ggml.model == "llama": Llama 2, Mistral v0.1, ...) as
    transformers' LlamaTokenizer builds it: byte fallback, Metaspace with prefix on the first
    piece, merges from the file or derived from the scores."""
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        merges = _gguf_merges(meta)
    else:
        if "tokenizer.ggml.scores" not in meta:
            raise NotImplementedError("GGUF SentencePiece vocabulary with neither merges nor scores")
        merges = generate_merges(vocab, dict(zip(tokens, meta["tokenizer.ggml.scores"])))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None,
                              unk_token=unk))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first" if prefix else "never",
                                                split=False)
    seq = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        seq.append(decoders.Strip(content=" ", left=1, right=0))
    tk.decoder = decoders.Sequence(seq)
    _special_added_tokens(tk, tokens, meta.get("tokenizer.ggml.token_type"), tokens, _special_ids(meta))
    return tk


def _special_ids(meta: Mapping[str, Any]) -> list[int]:
    keys = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
    return [meta[f"tokenizer.ggml.{k}"] for k in keys if meta.get(f"tokenizer.ggml.{k}") is not None]


def backend_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in meta:
        raise NotImplementedError("this GGUF file has no tokenizer (no tokenizer.ggml.tokens)")
    if kind == "gpt2":
        return byte_level_from_gguf(meta)
    if kind == "llama":
        return sentencepiece_from_gguf(meta)
    raise NotImplementedError(f"GGUF tokenizer type tokenizer.ggml.model={kind!r} is not supported "
                              f"(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)")


def default_add_bos(meta: Mapping[str, Any]) -> bool:
    if "tokenizer.ggml.add_bos_token" in meta:
        return bool(meta["tokenizer.ggml.add_bos_token"])
    return meta.get("tokenizer.ggml.model") == "llama" or meta.get("tokenizer.ggml.pre") in ADD_BOS_DEFAULT_PRE


# ---------------------------------------------------------------------------------------------
# The synthetic tokenizer of the random:* models.

SYNTHETIC_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SYNTHETIC_MAX_MERGES = 768

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A language model predicts the next token from the
tokens before it; the tokenizer turns text into those tokens and back again. In the beginning
there were bytes, and the bytes were merged into pairs, and the pairs into words. What is the
capital of France? Paris is the capital of France. How many legs does a spider have? Eight.
Hello, world! Hello there, how are you today? I am fine, thank you, and you? Once upon a time,
in a small village by the sea, there lived an old fisherman and his daughter. They sailed out
every morning and came home every evening with the day's catch.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))
The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 are numbers. user assistant system
You are a helpful assistant. Please answer the question below in one short sentence.
Café, naïve, résumé, Straße, Ελληνικά, русский, 日本語, 中文, 한국어, emoji 🙂 🚀 ✨.
"""


def _learn_merges(words: dict[tuple[str, ...], int], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training with a deterministic tie-break (count, then the pair itself)."""
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        counts: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        merged = best[0] + best[1]
        new_words: dict[tuple[str, ...], int] = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


@lru_cache(maxsize=4)
def _synthetic_json(vocab_size: int) -> str:
    base = len(SYNTHETIC_SPECIALS) + 256
    if vocab_size < base:
        raise ValueError(f"a synthetic byte-level tokenizer needs vocab_size >= {base}, got {vocab_size}")
    spelling = bytes_to_unicode()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words: dict[tuple[str, ...], int] = {}
    for line in _CORPUS.splitlines(keepends=True):
        for piece, _ in pre.pre_tokenize_str(line):
            words[tuple(piece)] = words.get(tuple(piece), 0) + 1
    merges = _learn_merges(words, min(vocab_size - base, SYNTHETIC_MAX_MERGES))
    vocab = {t: i for i, t in enumerate(SYNTHETIC_SPECIALS)}
    for b in range(256):
        vocab[spelling[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = 0
    while len(vocab) < vocab_size:  # unreachable filler so ids cover the model's vocabulary
        vocab[f"<|reserved_{n}|>"] = len(vocab)
        n += 1
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False))
    tk.pre_tokenizer = pre
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SYNTHETIC_SPECIALS])
    return tk.to_str()


def synthetic_backend(vocab_size: int) -> Tokenizer:
    """A deterministic byte-level BPE with exactly `vocab_size` ids: <|endoftext|>,
    <|im_start|>, <|im_end|> (ids 0-2, special), the 256 byte tokens, up to 768 merges learned
    from a fixed built-in text, then unreachable <|reserved_N|> filler tokens."""
    return Tokenizer.from_str(_synthetic_json(vocab_size))
