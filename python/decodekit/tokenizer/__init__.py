"""Tokenizer: text <-> token ids and chat templates, built on the `tokenizers` library.

Three ways to build one:
  Tokenizer.from_gguf(path) / from_gguf_metadata(meta)   llama.cpp's tokenizer.ggml.* keys
  Tokenizer.from_pretrained_dir(path)                     tokenizer.json (+ tokenizer_config.json,
                                                          generation_config.json, config.json)
  Tokenizer.synthetic(vocab_size)                         the random:* models' byte-level BPE
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from tokenizers import Tokenizer as _Backend
from tokenizers import processors

from . import builders
from .chat import content_text, default_chat_template, render_chat_template, validate_messages

__all__ = ["Tokenizer", "IncrementalDetokenizer"]


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any, what: str = "token id") -> list[int]:
    from ..loader._common import token_ids
    return token_ids(value, what)


def _read_json(path: str) -> dict:
    """An optional JSON object file ({} when absent); ModelLoadError naming it when it is not one."""
    from ..loader._common import read_json_object
    return read_json_object(path) if os.path.isfile(path) else {}


# Texts longer than this are encoded through the tokenizers library's batch call, which releases the GIL (its
# single-text encode holds it: a 1 MB prompt froze every other Python thread, the server's event loop included,
# for ~0.6 s on 2 EPYC cores; with the batch call that loop kept ticking every ~1 ms). Short texts keep the
# cheaper single call.
_GIL_FREE_CHARS = 16384

def _byte_token_value(s: str) -> int | None:
    """The byte a SentencePiece byte-fallback token "<0xNN>" stands for (None for any other token)."""
    if len(s) == 6 and s.startswith("<0x") and s.endswith(">") and all(c in "0123456789ABCDEFabcdef" for c in s[3:5]):
        return int(s[3:5], 16)
    return None


# continue_final_message: transformers' marker (render_jinja_template), appended to the last message's content
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class Tokenizer:
    """A `tokenizers.Tokenizer` plus what generation needs: bos/eos/pad ids, the end-of-generation
    ids (eos and chat end tokens such as <|im_end|>), whether BOS is prepended, and the chat
    template."""

    def __init__(self, backend: _Backend, *, bos_token_id: int | None = None,
                 eos_token_ids: Iterable[int] = (), pad_token_id: int | None = None,
                 unk_token_id: int | None = None, chat_template: str | None = None,
                 add_bos_token: bool | None = None, add_eos_token: bool | None = None, name: str = ""):
        self._tk = backend
        self.name = name
        self.bos_token_id = bos_token_id
        self.eos_token_ids: list[int] = list(dict.fromkeys(int(i) for i in eos_token_ids))
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self._chat_template = chat_template
        if add_bos_token is not None or add_eos_token is not None or backend.post_processor is None:
            self._set_post_processor(bool(add_bos_token), bool(add_eos_token))

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """Prepend BOS / append EOS on encode(add_special_tokens=True), as transformers'
        update_post_processor does."""
        bos = self.id_to_token(self.bos_token_id) if add_bos and self.bos_token_id is not None else None
        eos_id = self.eos_token_id
        eos = self.id_to_token(eos_id) if add_eos and eos_id is not None else None
        single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
        pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
        special = []
        if bos:
            special.append((bos, self.bos_token_id))
        if eos and eos != bos:
            special.append((eos, eos_id))
        self._tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
        self.add_bos_token, self.add_eos_token = bos is not None, eos is not None

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], name: str = "", source: str = "") -> "Tokenizer":
        """From the metadata of a GGUF file as a {key: python value} mapping. A missing or inconsistent
        tokenizer.ggml.* entry is a ModelLoadError naming `source` (the file) and the key."""
        from ..loader._common import ModelLoadError
        try:
            return cls._from_gguf_metadata(meta, name)
        except ModelLoadError:
            raise
        except Exception as e:  # NotImplementedError, and the bare Exception `tokenizers` raises on a bad vocabulary
            raise ModelLoadError(f"{source or name or 'GGUF file'}: cannot build the tokenizer from its "
                                 f"tokenizer.ggml.* metadata: {e}") from e

    @classmethod
    def _from_gguf_metadata(cls, meta: Mapping[str, Any], name: str = "") -> "Tokenizer":
        backend = builders.backend_from_gguf(meta)
        tokens = meta["tokenizer.ggml.tokens"]
        types = list(meta.get("tokenizer.ggml.token_type") or ())
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eog = [eos] + [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        # llama.cpp's end-of-generation set: eos, eot, eom, and the known chat end tokens
        # when the vocabulary marks them CONTROL.
        control = {tokens[i]: i for i, t in enumerate(types) if t == builders.CONTROL}
        eog += [control[t] for t in builders.END_OF_GENERATION_TOKENS if t in control]
        return cls(backend,
                   bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
                   eos_token_ids=[i for i in eog if i is not None],
                   pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
                   unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"),
                   add_bos_token=builders.default_add_bos(meta),
                   add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                   name=name or str(meta.get("general.name", "")))

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        from ..loader.gguf import read_gguf_metadata
        return cls.from_gguf_metadata(read_gguf_metadata(path), name=os.path.basename(path), source=path)

    @classmethod
    def from_pretrained_dir(cls, path: str) -> "Tokenizer":
        """From a Hugging Face model directory: tokenizer.json (required), tokenizer_config.json
        (special tokens, add_bos/eos_token, chat_template), chat_template.jinja,
        generation_config.json and config.json (bos/eos ids; eos may be a list)."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(
                f"{path}: no tokenizer.json (decodekit reads the fast-tokenizer file; a "
                f"SentencePiece tokenizer.model alone can be converted by saving the tokenizer with "
                f"transformers' AutoTokenizer.save_pretrained)")
        from ..loader._common import ModelLoadError
        try:
            backend = _Backend.from_file(tj)
        except Exception as e:  # `tokenizers` raises a bare Exception for a file it cannot parse
            raise ModelLoadError(f"{tj}: not a readable tokenizer.json ({e})") from e
        tcfg_path = os.path.join(path, "tokenizer_config.json")
        tcfg = _read_json(tcfg_path)
        gcfg_path = os.path.join(path, "generation_config.json")
        gcfg = _read_json(gcfg_path)
        mcfg = _read_json(os.path.join(path, "config.json"))
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if template is not None and not isinstance(template, str):
            raise ModelLoadError(f"{tcfg_path}: chat_template must be a string (a Jinja template) or a list of "
                                 f"{{\"name\", \"template\"}} objects, got {template!r:.80}")
        if not template and os.path.isfile(os.path.join(path, "chat_template.jinja")):
            with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as f:
                template = f.read()
        if not template:
            template = _read_json(os.path.join(path, "chat_template.json")).get("chat_template")
            if template is not None and not isinstance(template, str):
                raise ModelLoadError(f"{os.path.join(path, 'chat_template.json')}: chat_template must be a string "
                                     f"(a Jinja template), got {template!r:.80}")

        def tid(key: str) -> int | None:
            text = _token_text(tcfg.get(key))
            return backend.token_to_id(text) if text is not None else None

        bos = tid("bos_token")
        if bos is None:
            bos = next(iter(_ids(gcfg.get("bos_token_id"), f"{gcfg_path}: bos_token_id")
                            + _ids(mcfg.get("bos_token_id"), f"{path}/config.json: bos_token_id")), None)
        eos = ([tid("eos_token")] + _ids(gcfg.get("eos_token_id"), f"{gcfg_path}: eos_token_id")
               + _ids(mcfg.get("eos_token_id"), f"{path}/config.json: eos_token_id"))
        # chat end tokens the template writes (e.g. <|im_end|>) end a reply as well
        if template:
            for t in builders.END_OF_GENERATION_TOKENS:
                if t in template and backend.token_to_id(t) is not None:
                    eos.append(backend.token_to_id(t))
        pad = tid("pad_token")
        if pad is None:
            pad = next(iter(_ids(gcfg.get("pad_token_id"), f"{gcfg_path}: pad_token_id")
                            + _ids(mcfg.get("pad_token_id"), f"{path}/config.json: pad_token_id")), None)
        explicit = "add_bos_token" in tcfg or "add_eos_token" in tcfg
        return cls(backend, bos_token_id=bos, eos_token_ids=[i for i in eos if i is not None],
                   pad_token_id=pad, unk_token_id=tid("unk_token"), chat_template=template,
                   add_bos_token=bool(tcfg.get("add_bos_token", False)) if explicit else None,
                   add_eos_token=bool(tcfg.get("add_eos_token", False)) if explicit else None,
                   name=os.path.basename(os.path.abspath(path)))

    @classmethod
    def synthetic(cls, vocab_size: int) -> "Tokenizer":
        """The deterministic byte-level BPE of the random:* models (see builders.synthetic_backend):
        ChatML template, bos <|im_start|> (not prepended), eos <|im_end|> and <|endoftext|>."""
        return cls(builders.synthetic_backend(vocab_size), bos_token_id=1, eos_token_ids=[2, 0],
                   pad_token_id=0, chat_template=None, add_bos_token=False, name=f"synthetic-{vocab_size}")

    # -- vocabulary -----------------------------------------------------------------------------

    @property
    def backend(self) -> _Backend:
        return self._tk

    @property
    def vocab_size(self) -> int:
        """Number of ids, added and special tokens included (len(tokenizer) in transformers)."""
        return self._tk.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self._tk.get_vocab(with_added_tokens=True)

    def token_bytes(self) -> tuple[list[bytes | None], dict[bytes, list[int]]]:
        """(the bytes each id stands for in generated text, None for special / added tokens; bytes -> ids),
        built once: byte-level vocabularies (GPT-2's byte-to-unicode map) are mapped back to bytes,
        SentencePiece ones read '▁' as a space and <0xNN> as that byte. Guided choice matches on them."""
        cached = getattr(self, "_token_bytes", None)
        if cached is not None:
            return cached
        inv = {c: b for b, c in builders.bytes_to_unicode().items()}
        byte_level = "ByteLevel" in repr(self._tk.decoder)
        special = set(self.all_special_ids) | set(self._tk.get_added_tokens_decoder())
        out: list[bytes | None] = []
        index: dict[bytes, list[int]] = {}
        for i in range(self.vocab_size):
            s = self._tk.id_to_token(i)
            if s is None or i in special:
                out.append(None)
                continue
            if byte_level and all(c in inv for c in s):
                b = bytes(inv[c] for c in s)
            elif _byte_token_value(s) is not None:
                b = bytes([_byte_token_value(s)])
            else:
                b = s.replace("\u2581", " ").encode("utf-8")
            out.append(b)
            if b:
                index.setdefault(b, []).append(i)
        self._token_bytes = (out, index)
        return self._token_bytes

    @property
    def byte_fallback_ids(self) -> frozenset[int]:
        """The <0xNN> tokens a ByteFallback decoder (SentencePiece) turns into raw bytes, built once (empty for
        byte-level vocabularies). That decoder decodes each run of them as one: a run that is not valid UTF-8
        becomes one U+FFFD per token, valid characters inside it included, so streamed text holds a run back
        until it ends."""
        cached = getattr(self, "_byte_fallback_ids", None)
        if cached is None:
            cached = frozenset()
            if "ByteFallback" in repr(self._tk.decoder):
                added = set(self._tk.get_added_tokens_decoder())
                cached = frozenset(i for t, i in self._tk.get_vocab(with_added_tokens=False).items()
                                   if _byte_token_value(t) is not None and i not in added)
            self._byte_fallback_ids = cached
        return cached

    def max_prompt_chars(self, max_tokens: int) -> int:
        """An upper bound on the characters of a text that encodes to at most max_tokens tokens: 4 x the
        longest vocabulary string x max_tokens (a token's text has no more characters than its vocabulary
        string, byte-level or SentencePiece; the 4 covers normalizers that merge characters). Longer texts are
        refused before encoding them, which would hold the caller for seconds on megabytes of text."""
        if getattr(self, "_max_token_chars", None) is None:
            self._max_token_chars = max((len(t) for t in self.get_vocab()), default=1)
        return 4 * max(self._max_token_chars, 1) * max(int(max_tokens), 1)

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def id_to_token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self._tk.id_to_token(int(token_id))

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self.id_to_token(i) for i in ids]

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def bos_token(self) -> str | None:
        return self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_id)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(i for i, t in self._tk.get_added_tokens_decoder().items() if t.special)

    @property
    def special_tokens_map(self) -> dict[str, str | None]:
        return {"bos_token": self.bos_token, "eos_token": self.eos_token,
                "unk_token": self.id_to_token(self.unk_token_id), "pad_token": self.id_to_token(self.pad_token_id)}

    # -- encode / decode ------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (e.g. "<|im_start|>") are
        recognised as such; add_special_tokens adds BOS/EOS when the model wants them."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        _check_unicode(text)
        if len(text) > _GIL_FREE_CHARS:  # the same ids; the batch call encodes without holding the GIL
            return self._tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        for t in texts:
            _check_unicode(t)
        return [e.ids for e in self._tk.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD; ids outside the vocabulary are dropped."""
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # -- chat -----------------------------------------------------------------------------------

    @property
    def chat_template(self) -> str:
        """The model's template, or a default chosen from its special tokens (see chat.py)."""
        return self._chat_template or default_chat_template(self.get_vocab())

    @property
    def has_chat_template(self) -> bool:
        return bool(self._chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            chat_template: str | None = None, continue_final_message: bool = False,
                            max_chars: int | None = None, **kwargs) -> str:
        """Renders a conversation (a list of {"role": str, "content": str} dicts) to the prompt
        text, in a sandboxed Jinja2 environment; keyword arguments reach the template.
        continue_final_message (transformers' / vLLM's): the text ends right after the last message's
        content, without its end-of-turn, so the model goes on with it (e.g. an assistant reply begun
        with "{"); needs add_generation_prompt False (say so: it defaults to True) and a last message whose
        content the template writes verbatim (text parts are continued as their text joined with newlines, as
        vLLM renders them for a template that takes a string); ValueError otherwise."""
        msgs = validate_messages(messages)
        template = chat_template or self.chat_template
        tag = _CONTINUE_TAG
        if continue_final_message:  # as transformers: a tag after the content, the text cut there
            if add_generation_prompt:
                raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
            last = content_text(msgs[-1]["content"])
            msgs = msgs[:-1] + [{**msgs[-1], "content": last + tag}]
        text = render_chat_template(template, msgs, add_generation_prompt=add_generation_prompt,
                                    special_tokens=self.special_tokens_map, max_chars=max_chars, **kwargs)
        if not continue_final_message:
            return text
        # transformers' rule: cut at the (last) tag; a template that trims the content (`| trim`) also trims the
        # tag's trailing space, and then the text before the tag loses its trailing whitespace as well
        if last.strip() not in text or tag.strip() not in text:
            raise ValueError("continue_final_message: the chat template does not write the last message's "
                             "content verbatim")
        at = text.rindex(tag.strip())
        return text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()

    def __repr__(self) -> str:
        return (f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={self.eos_token_ids})")


from .detokenizer import IncrementalDetokenizer  # noqa: E402


def _check_unicode(text: str) -> None:
    """Text the tokenizer can take: a lone surrogate (e.g. from surrogateescape-decoded bytes) is not
    Unicode text; say where it is instead of the tokenizers library's bare TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt: not valid Unicode text: {e.reason} at character {e.start} "
                         f"({text[e.start:e.end]!r}); send UTF-8 text or token ids") from None
