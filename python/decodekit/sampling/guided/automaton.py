"""A lazily built DFA over bytes and the per-state token masks guided decoding samples with.

``LazyDFA`` runs the subset construction on demand: a DFA state is the epsilon-closed set of NFA states
(``regex.compile_nfa``), numbered as first reached; its 256-entry transition row is computed the first
time the state is left. State 0 is the dead state (the empty set: no match can follow). Because the NFA
is pruned to states that can reach its accepting state, every other state can still complete a match.

``TokenVocab`` holds the vocabulary's token bytes as a [V, L] matrix sorted by length; ``Guide.mask(s)``
walks every token's bytes from state ``s`` at once, one byte column at a time (vectorised over tokens),
and allows the tokens that do not die; EOS is allowed where ``s`` accepts. Masks are cached per (guide,
state) in one LRU of at most MASK_CACHE_BYTES.
A request's state after its generated tokens is ``Guide.state_after(tokens)``, with a per-guide cache of
recent token sequences (``GuideCursor``) so a step costs one token's bytes, not the whole output's.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

import numpy as np
import torch

from .regex import NFA

DEAD = 0
UNKNOWN = -1
MAX_DFA_STATES = 100_000          # per guide: ~100 MB of transition rows at most
MAX_DFA_ELEMENTS = 4_000_000      # NFA states held in a guide's DFA states, all together (~300 MB)
MASK_WORK = 500_000               # NFA states / edges one token mask may visit (~0.4 s of Python; JSON
                                  # schemas' masks take < 10k)
MASK_CACHE_BYTES = 256 << 20      # all guides' cached masks together (a mask is vocab_size bytes)


class _MaskCache:
    """The masks of (guide, state) pairs, least recently used dropped past MASK_CACHE_BYTES in all."""

    def __init__(self):
        self.entries: OrderedDict[tuple[int, int, int], tuple[torch.Tensor, int]] = OrderedDict()
        self.bytes = 0

    def get(self, key):
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
        return hit

    def put(self, key, value) -> None:
        self.entries[key] = value
        self.bytes += value[0].numel()
        while self.bytes > MASK_CACHE_BYTES and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old[0].numel()


_MASKS = _MaskCache()
_serials = itertools.count()


class GuideError(ValueError):
    """A guide that cannot be built (too many DFA states, a vocabulary without token bytes)."""


class LazyDFA:
    def __init__(self, nfa: NFA):
        self.nfa = nfa
        self.sets: list[frozenset] = []
        self.index: dict[frozenset, int] = {}
        self.accepting: list[bool] = []
        self.trans = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self.work = 0                                    # NFA states and edges visited (budgets)
        self.elements = 0                                # NFA states held in all DFA states' sets
        self._add(frozenset())                           # DEAD
        self.trans[DEAD, :] = DEAD
        self.start = self._add(self._initial())

    def _initial(self) -> frozenset:
        return self._closure([self.nfa.start])

    def _closure(self, states) -> frozenset:
        eps = self.nfa.eps
        seen = set(states)
        stack = list(states)
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        self.work += len(seen)
        # only states with byte edges (or the accepting one) tell DFA states apart
        edges, acc = self.nfa.edges, self.nfa.accept
        return frozenset(s for s in seen if edges[s] or s == acc)

    def _edges(self, x) -> list:
        """The byte-range edges (lo, hi, target element) out of one element of a state's set."""
        return self.nfa.edges[x]

    def _accepts(self, key: frozenset) -> bool:
        return self.nfa.accept in key

    def _too_big(self) -> str:
        return (f"the guide's automaton grew past {MAX_DFA_STATES} states (or {MAX_DFA_ELEMENTS} NFA states in "
                f"them): the pattern is too ambiguous for a DFA (nested or overlapping repetitions such as "
                f"(?:.{{0,100}}){{100}} or .*x.{{30}})")

    def _add(self, key: frozenset) -> int:
        sid = self.index.get(key)
        if sid is not None:
            return sid
        sid = len(self.sets)
        if sid >= MAX_DFA_STATES or self.elements + len(key) > MAX_DFA_ELEMENTS:
            raise GuideError(self._too_big())
        self.elements += len(key)
        if sid >= self.trans.shape[0]:
            grown = np.full((self.trans.shape[0] * 2, 256), UNKNOWN, dtype=np.int32)
            grown[:sid] = self.trans[:sid]
            self.trans = grown
        self.sets.append(key)
        self.index[key] = sid
        self.accepting.append(self._accepts(key))
        return sid

    def expand(self, sid: int) -> None:
        """Compute state `sid`'s transition row: a sweep over its byte-range edges' boundaries, keeping the
        targets of the ranges that cover each interval."""
        if self.trans[sid, 0] != UNKNOWN:
            return
        edges = [e for x in self.sets[sid] for e in self._edges(x)]
        events: dict[int, list] = {}
        for lo, hi, t in edges:
            events.setdefault(lo, []).append((1, t))
            events.setdefault(hi + 1, []).append((-1, t))
        self.work += len(edges)
        row = np.zeros(256, dtype=np.int32)
        active: dict[int, int] = {}
        cuts = sorted(events)
        for a, b in zip(cuts, cuts[1:] + [256]):
            for d, t in events[a]:
                k = active.get(t, 0) + d
                if k:
                    active[t] = k
                else:
                    del active[t]
            if active and a < 256:
                self.work += len(active)
                row[a:b] = self._add(self._closure(list(active)))
        self.trans[sid] = row

    def step(self, sid: int, data: bytes) -> int:
        for byte in data:
            if sid == DEAD:
                return DEAD
            self.expand(sid)
            sid = int(self.trans[sid, byte])
        return sid

    def is_accepting(self, sid: int) -> bool:
        return self.accepting[sid]


class TokenVocab:
    """The vocabulary's token bytes for the vectorised walk: tokens with bytes, sorted by length (longest
    first), their bytes in a [n, L] uint8 matrix, and how many are longer than j for each column j."""

    def __init__(self, token_bytes: list):
        self.token_bytes = token_bytes                  # per id: bytes, or None (special); masks pad past it
        ids = [i for i, b in enumerate(token_bytes) if b]
        if not ids:
            raise GuideError("the tokenizer has no token bytes to guide with")
        lens = np.array([len(token_bytes[i]) for i in ids], dtype=np.int64)
        order = np.argsort(-lens, kind="stable")
        self.ids = np.array(ids, dtype=np.int64)[order]
        self.lens = lens[order]
        L = int(self.lens[0])
        mat = np.zeros((len(ids), L), dtype=np.uint8)
        for r, i in enumerate(self.ids.tolist()):
            b = token_bytes[i]
            mat[r, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.mat = mat
        # longer[j] = number of tokens with more than j bytes (a prefix of the sorted rows)
        self.longer = len(ids) - np.cumsum(np.bincount(self.lens, minlength=L + 1))[:L]


def token_vocab(tokenizer) -> TokenVocab:
    """The tokenizer's TokenVocab, built once and kept on it."""
    tv = getattr(tokenizer, "_dk_token_vocab", None)
    if tv is None:
        tb, _ = tokenizer.token_bytes()
        tv = TokenVocab(tb)
        try:
            tokenizer._dk_token_vocab = tv
        except AttributeError:
            pass
    return tv


class Guide:
    """A compiled guide: a LazyDFA, the vocabulary and the EOS ids; shared by the requests that ask for
    the same pattern with the same tokenizer (``compile_guide`` caches them)."""

    def __init__(self, dfa: LazyDFA, vocab: TokenVocab, eos_token_ids):
        self.dfa = dfa
        self.vocab = vocab
        self.eos = sorted({int(e) for e in eos_token_ids})
        self._serial = next(_serials)      # the mask cache's key for this guide (ids may be reused)
        self._cursors: OrderedDict[int, list[GuideCursor]] = OrderedDict()   # first token -> cursors

    def __deepcopy__(self, memo):       # shared, as compile_guide's cache shares it (a request's copy of
        return self                     # its SamplingParams must not copy the automaton and its masks)

    @property
    def initial(self) -> int:
        return self.dfa.start

    def next_state(self, sid: int, token_id: int) -> int:
        """The state after `token_id`; DEAD for a token without bytes (EOS / special) or a rejected one."""
        tb = self.vocab.token_bytes
        b = tb[token_id] if 0 <= token_id < len(tb) else None
        return self.dfa.step(sid, b) if b else DEAD

    def allowed_rows(self, sid: int) -> np.ndarray:
        """Token ids (without EOS) whose bytes keep `sid` alive, as int64, ascending."""
        dfa, v = self.dfa, self.vocab
        if sid == DEAD:
            return np.zeros(0, dtype=np.int64)
        work0 = dfa.work
        rows = np.arange(len(v.ids), dtype=np.int64)      # alive rows of v.mat
        cur = np.full(len(rows), sid, dtype=np.int32)
        for j in range(v.mat.shape[1]):
            n = int(np.searchsorted(rows, v.longer[j]))   # alive rows longer than j (rows sorted)
            if n == 0:
                break
            r, c = rows[:n], cur[:n]
            t = dfa.trans
            if (t[c, 0] == UNKNOWN).any():
                for s in np.unique(c[t[c, 0] == UNKNOWN]).tolist():
                    dfa.expand(s)
                    if dfa.work - work0 > MASK_WORK:
                        raise GuideError(f"a token mask of this guide needs more than {MASK_WORK} automaton "
                                         f"steps: the pattern is too ambiguous (nested or overlapping "
                                         f"repetitions)")
                t = dfa.trans
            nxt = t[c, v.mat[r, j]]
            keep = nxt != DEAD
            # rows that ended before column j are kept as they are; live longer ones advance
            rows = np.concatenate([r[keep], rows[n:]])
            cur = np.concatenate([nxt[keep], cur[n:]])
        return np.sort(v.ids[rows])

    def mask(self, sid: int, vocab_size: int) -> tuple[torch.Tensor, int]:
        """(bool [vocab_size] mask of the tokens allowed in state `sid`, how many): the live tokens, plus
        EOS where `sid` accepts; EOS alone when nothing else is live (a state the vocabulary cannot leave)."""
        key = (self._serial, sid, vocab_size)
        hit = _MASKS.get(key)
        if hit is not None:
            return hit
        ids = self.allowed_rows(sid)
        ids = ids[ids < vocab_size]
        m = torch.zeros(vocab_size, dtype=torch.bool)
        m[torch.from_numpy(ids)] = True
        if self.dfa.is_accepting(sid) or not len(ids):
            eos = [e for e in self.eos if e < vocab_size]
            m[eos] = True
        out = (m, int(m.sum()))
        _MASKS.put(key, out)
        return out

    def state_after(self, tokens: list[int]) -> int:
        """The state after the generated `tokens` (from the initial state); DEAD once one is rejected.
        Cursors are kept per first token, a few each (n > 1 sequences, requests sharing the guide): the
        one whose tokens are a prefix of `tokens` (else the least recently used) walks on from there."""
        key = tokens[0] if tokens else -1
        group = self._cursors.get(key)
        if group is None:
            group = self._cursors[key] = []
            if len(self._cursors) > 256:
                self._cursors.popitem(last=False)
        else:
            self._cursors.move_to_end(key)
        best = None
        for c in group:
            k = len(c.tokens)
            if k <= len(tokens) and (k == 0 or c.tokens[-1] == tokens[k - 1]) and c.tokens == tokens[:k]:
                if best is None or k > len(best.tokens):
                    best = c
        if best is None:
            if len(group) >= 32:
                best = group.pop(0)
            else:
                best = GuideCursor(self)
        else:
            group.remove(best)
        group.append(best)                               # most recently used last
        return best.advance_to(tokens)


class GuideCursor:
    """The states along one token sequence; a query shares its longest common prefix with the last one."""

    def __init__(self, guide: Guide):
        self.guide = guide
        self.tokens: list[int] = []
        self.states: list[int] = [guide.initial]

    def advance_to(self, tokens: list[int]) -> int:
        k = min(len(tokens), len(self.tokens))
        if tokens[:k] != self.tokens[:k]:
            k = next(i for i in range(k) if tokens[i] != self.tokens[i])
        del self.tokens[k:]
        del self.states[k + 1:]
        s = self.states[-1]
        for t in tokens[k:]:
            s = self.guide.next_state(s, int(t)) if s != DEAD else DEAD
            self.tokens.append(int(t))
            self.states.append(s)
        return s
