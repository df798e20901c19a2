"""n-gram (prompt-lookup) drafter: if the last n tokens of a request (prompt + generated) occurred
earlier in it, propose the k tokens that followed their most recent earlier occurrence; n is tried
from max_n down to min_n (the longest match wins). Deterministic (a one-hot draft: the verifier's
draft_probs is None).

Incremental: an index per n maps each n-gram to the end of its latest occurrence; a step costs
O(max_n - min_n + 1) dictionary operations per appended token, whatever the context length. The
index lags one position behind the sequence, so the current suffix never matches itself and every
match has at least one following token.
"""
from __future__ import annotations


class NgramProposer:
    def __init__(self, k: int = 4, min_n: int = 1, max_n: int = 4):
        for name, v in (("k", k), ("min_n", min_n), ("max_n", max_n)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"NgramProposer.{name} must be an int >= 1, got {v!r}")
        if min_n > max_n:
            raise ValueError(f"NgramProposer: min_n ({min_n}) must be <= max_n ({max_n})")
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self.tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at positions <= _indexed are in the index

    def extend(self, tokens) -> None:
        """Appends tokens (the prompt, then each step's accepted tokens)."""
        self.tokens.extend(int(t) for t in tokens)
        end = len(self.tokens) - 1  # index every n-gram ending before the last position
        for e in range(self._indexed + 1, end + 1):
            for n, idx in self._index.items():
                if e >= n:
                    idx[tuple(self.tokens[e - n:e])] = e
        self._indexed = max(self._indexed, end)

    def propose(self, k: int | None = None) -> list[int]:
        """Up to k (default self.k) draft tokens continuing the sequence; [] when no n-gram matches."""
        k = self.k if k is None else k
        L = len(self.tokens)
        for n in range(self.max_n, self.min_n - 1, -1):
            if L < n:
                continue
            e = self._index[n].get(tuple(self.tokens[L - n:]))
            if e is not None:
                return self.tokens[e:e + k]
        return []
