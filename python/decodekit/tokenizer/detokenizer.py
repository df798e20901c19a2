"""Streaming detokenization with stop strings.

Text is finalised token by token the way vLLM does it: the ids are decoded in a short window
[prefix_offset, end) and only the text past the window's already-emitted prefix
[prefix_offset, read_offset) is new. Decoding a window instead of everything keeps each call
O(new tokens); starting the window a few tokens back (into the prompt at first) keeps the
context that decoders such as SentencePiece's leading-space strip depend on. Text whose last
character is U+FFFD (an incomplete UTF-8 sequence) is held back until a later token completes
it (or until flush()). With a SentencePiece ByteFallback decoder a trailing run of <0xNN> byte
tokens is held back until a token that is not one ends it: the decoder decodes each run as a
whole, one U+FFFD per byte when the run is not valid UTF-8, so characters complete so far could
still turn into U+FFFD (streamed text would then differ from decode(all ids)).

Stop strings are matched on the finalised text; the longest tail that could still begin a stop
string (at most max(len(stop)) - 1 characters) is held back until it is resolved. Only that
tail and the new text are searched, so stop handling is O(new text) too. With min_tokens, a match
must end in text past the first min_tokens tokens' (vLLM's rule: it may begin inside it), so the
tail is held back from the first token on.
"""
from __future__ import annotations

from typing import Iterable

# How many prompt tokens the first window reaches back (vLLM's
# INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
INITIAL_OFFSET = 5


class IncrementalDetokenizer:
    """Turns a stream of generated ids into text deltas.

        d = IncrementalDetokenizer(tok, prompt_ids, stop=["\\n\\n"])
        for ids in stream:
            print(d.add(ids), end="")
            if d.stopped:
                break
        print(d.flush())

    Attributes: text (everything returned so far), stopped, stop_reason (the stop string
    matched, or None), token_ids (the generated ids).
    """

    def __init__(self, tokenizer, prompt_ids: Iterable[int] = (), skip_special_tokens: bool = True,
                 stop: Iterable[str] | str | None = None, include_stop_str_in_output: bool = False,
                 min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        if isinstance(stop, str):
            stop = [stop]
        self.stop: list[str] = [s for s in (stop or ()) if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self._ids: list[int] = [int(i) for i in prompt_ids]
        self._byte_ids: frozenset[int] = getattr(tokenizer, "byte_fallback_ids", frozenset())
        self._skipped: frozenset[int] = (frozenset(getattr(tokenizer, "all_special_ids", ()))
                                         if skip_special_tokens and self._byte_ids else frozenset())
        self._n_prompt = len(self._ids)
        self._prefix_offset = max(self._n_prompt - INITIAL_OFFSET, 0)
        self._read_offset = self._n_prompt
        self._pending = ""     # finalised text (UTF-8 complete) not yet returned: a possible stop prefix
        self._chunks: list[str] = []  # the deltas returned so far (joined lazily by .text)
        self.stopped = False
        self.stop_reason: str | None = None
        self.finished = False
        self._min_tokens = max(int(min_tokens), 0)
        self._emitted = 0       # characters returned so far (len(text))
        # a stop string's match must end past this character offset: the end of the text of the first
        # min_tokens tokens, unknown (infinite) until they are out
        self._min_end: float = 0 if self._min_tokens == 0 else float("inf")

    @property
    def token_ids(self) -> list[int]:
        return self._ids[self._n_prompt:]

    @property
    def text(self) -> str:
        """All text returned so far (add() and flush() deltas, concatenated)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self._ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def _in_byte_run(self) -> bool:
        """Whether the last decoded token is a ByteFallback byte token (skipped special tokens and ids outside
        the vocabulary do not end a run: the decoder never sees them)."""
        n = len(self._ids) if self._byte_ids else 0
        vocab = getattr(self.tokenizer, "vocab_size", None)
        for k in range(n - 1, self._read_offset - 1, -1):
            i = self._ids[k]
            if i in self._byte_ids:
                return True
            if i not in self._skipped and (vocab is None or 0 <= i < vocab):
                return False
        return False

    def _finalise(self, final: bool) -> str:
        """The newly complete text of the token window ("" while a character is incomplete)."""
        if self._read_offset >= len(self._ids) or (not final and self._in_byte_run()):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""  # nothing yet, or a multi-byte character still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]

    def _take(self, new: str) -> None:
        """Appends finalised text to the pending tail and cuts it at the first stop string. A
        match can only start inside the pending tail (the held-back rule guarantees it), at or
        after len(old tail) - len(stop) + 1 (earlier positions were searched before)."""
        searched = len(self._pending)
        self._pending += new
        if not self.stop or not new:
            return
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self._pending.find(s, max(searched - len(s) + 1, 0))
            while i >= 0 and self._emitted + i + len(s) <= self._min_end:   # ends inside min_tokens' text
                i = self._pending.find(s, i + 1)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            self._pending = self._pending[:i + len(s) if self.include_stop_str_in_output else i]
            self.stopped, self.stop_reason = True, s

    def _held_back(self) -> int:
        """Length of the longest tail of the pending text that is a proper prefix of a stop string."""
        text = self._pending
        for k in range(min(self._max_stop - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0

    def _release(self, hold: int) -> str:
        cut = len(self._pending) - hold
        delta, self._pending = self._pending[:cut], self._pending[cut:]
        if delta:
            self._chunks.append(delta)
            self._emitted += len(delta)
        return delta

    def add(self, token_ids: Iterable[int] | int) -> str:
        """Appends generated ids; returns the text they finalised (possibly "")."""
        if self.stopped or self.finished:
            return ""
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        before = self._min_tokens - (len(self._ids) - self._n_prompt)   # tokens still inside min_tokens
        if 0 < before < len(ids):                           # (the boundary inside this batch of ids)
            head = self.add(ids[:before])
            return head + self.add(ids[before:])
        self._ids.extend(ids)
        self._take(self._finalise(final=False))
        if before > 0 and before == len(ids):               # the min_tokens-th token: matches may end past here
            self._min_end = self._emitted + len(self._pending)
        if self.stopped:
            return self._release(0)
        return self._release(self._held_back() if self.stop else 0)

    def flush(self) -> str:
        """Ends the stream: finalises what is held back (an incomplete character becomes
        U+FFFD, a partial stop string is released) and returns it."""
        if self.finished:
            return ""
        self.finished = True
        if not self.stopped:
            self._take(self._finalise(final=True))
        return self._release(0)
