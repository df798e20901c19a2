"""Guided decoding's regex engine and token masks: the lazily built byte-level DFA accepts exactly what
Python's re.fullmatch (ASCII classes) accepts, on strings drawn from each pattern's own automaton and on
random near-misses, multi-byte characters included; UTF-8 range compilation against the codec; token
masks against a brute-force walk of every token's bytes; random walks over the masks end in full matches;
errors name the position."""
import random
import re
import zlib

import numpy as np
import pytest
import torch

from decodekit.sampling.guided import DEAD, Guide, LazyDFA, RegexError, compile_nfa, escape
from decodekit.sampling.guided.automaton import TokenVocab
from decodekit.sampling.guided.regex import MAX_CODEPOINT, utf8_sequences

PATTERNS = [
    r"a|b|",
    r"(?:ab|a)*c?",
    r"\d{2,4}-\d{3}",
    r"[^a-c\n]{1,3}",
    r".{3}",
    r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
    r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"',
    r"[\w.+-]+@[\w-]+\.(?:com|org|de)",
    r"(?P<y>\d{4})-(?:0[1-9]|1[0-2])-\d\d",
    r"(?:é|ü+|日本語?|😀{2})x?",
    r"[\u00e0-\u00ff\u4e00-\u4e05\U0001F600-\U0001F64F]+",
    r"\s*\S\W?",
    r"a{3}b{,2}c{2,}",
    r"^(?:yes|no)$",
    r"^(?:ab)+$|^c$|d",
    r"[-a]+[]a]?[a\-z]",
    r"x\{1}\.\*",
    r"ab{0}c",
    r"(?:a|b)+?c*?",
]
ALPHABET = "abcxyz019-.@_ \n\"\\/eE+é日本😀üàxc{}*"


def _accepts(dfa: LazyDFA, text: str) -> bool:
    s = dfa.step(dfa.start, text.encode("utf-8"))
    return s != DEAD and dfa.is_accepting(s)


def _sample_match(dfa: LazyDFA, rng: random.Random, max_len: int = 40) -> bytes | None:
    """A random byte string the DFA accepts (a random walk that stops at accepting states sometimes)."""
    s, out = dfa.start, bytearray()
    for _ in range(max_len):
        if dfa.is_accepting(s) and rng.random() < 0.3:
            return bytes(out)
        dfa.expand(s)
        live = np.nonzero(dfa.trans[s] != DEAD)[0]
        if not len(live):
            return bytes(out) if dfa.is_accepting(s) else None
        b = int(rng.choice(live.tolist()))
        out.append(b)
        s = int(dfa.trans[s, b])
    return bytes(out) if dfa.is_accepting(s) else None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_equals_python_re(pattern):
    rng = random.Random(zlib.crc32(pattern.encode()))
    dfa = LazyDFA(compile_nfa(pattern))
    oracle = re.compile(pattern, re.ASCII)
    positives = 0
    for _ in range(300):
        m = _sample_match(dfa, rng)
        if m is None:
            continue
        text = m.decode("utf-8")            # every accepted byte string is valid UTF-8
        assert oracle.fullmatch(text), (pattern, text)
        positives += 1
        # near misses: drop / insert / replace one character
        if text:
            i = rng.randrange(len(text))
            for mut in (text[:i] + text[i + 1:], text[:i] + rng.choice(ALPHABET) + text[i:],
                        text[:i] + rng.choice(ALPHABET) + text[i + 1:], text + rng.choice(ALPHABET)):
                assert _accepts(dfa, mut) == bool(oracle.fullmatch(mut)), (pattern, mut)
    for _ in range(300):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 6)))
        assert _accepts(dfa, text) == bool(oracle.fullmatch(text)), (pattern, text)
    assert positives > 20


def test_invalid_utf8_is_never_accepted():
    dfa = LazyDFA(compile_nfa(r".*"))
    for bad in (b"\xff", b"\xc3", b"a\xe6\x97", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"):
        s = dfa.step(dfa.start, bad)
        assert s == DEAD or not dfa.is_accepting(s), bad
    assert _accepts(dfa, "日本😀\x7f")


@pytest.mark.parametrize("seed", range(4))
def test_utf8_sequences_cover_exactly_the_range(seed):
    rng = random.Random(seed)
    for _ in range(40):
        lo = rng.choice([0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000]) + rng.randrange(0, 3000)
        hi = min(lo + rng.choice([0, 1, 63, 64, 4095, 70000, 1 << 20]), MAX_CODEPOINT)
        if 0xD800 <= lo <= 0xDFFF or 0xD800 <= hi <= 0xDFFF or (lo < 0xD800 and hi > 0xDFFF):
            continue
        seqs = utf8_sequences(lo, hi)

        def hits(cp):
            b = chr(cp).encode("utf-8")
            return sum(len(q) == len(b) and all(a <= x <= z for x, (a, z) in zip(b, q)) for q in seqs)
        for cp in [lo, hi] + [rng.randint(lo, hi) for _ in range(50)]:
            assert hits(cp) == 1, (lo, hi, cp)
        for cp in (lo - 1, hi + 1, lo - 64, hi + 64):
            if 0 <= cp <= MAX_CODEPOINT and not 0xD800 <= cp <= 0xDFFF:
                assert hits(cp) == 0, (lo, hi, cp)


@pytest.mark.parametrize("pattern, where", [
    (r"(?=a)b", "lookarounds"), (r"(a)\1", "backreferences"), (r"(ab", "missing ')'"), (r"ab)", "unbalanced"),
    (r"[ab", "unterminated"), (r"a**", "multiple repeat"), (r"*a", "nothing to repeat"), (r"\q", "escape"),
    (r"(?i)a", "inline flags"), (r"a^b", "anchors"), (r"a{3,2}", "min > max"), (r"\b", "escape"),
    (r"[z-a]", "bad character range"), (r"a{20000}", "repetition count"), (r"\xZZ", "hex digits"),
])
def test_errors_name_the_problem_and_position(pattern, where):
    with pytest.raises(RegexError, match="position") as e:
        compile_nfa(pattern)
    assert where in str(e.value)


def test_too_large_patterns_are_refused():
    with pytest.raises(RegexError, match="too large"):
        compile_nfa(r"(?:[^a]{10000}){1000}")


def test_escape_round_trips():
    text = r"a.b*c+d?(e)[f]{g}|h\i^j$k/l-m"
    assert re.fullmatch(escape(text), text)
    assert _accepts(LazyDFA(compile_nfa(escape(text))), text)


# --------------------------------------------------------------------------- token masks
def _vocab(seed: int):
    rng = random.Random(seed)
    alphabet = ["a", "b", "1", "2", "-", ".", "\"", " ", "é", "日", "{", "}", ":", ","]
    pieces = [None]                                   # id 0: a special token (EOS here)
    for _ in range(300):
        pieces.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 5))).encode("utf-8"))
    pieces += [bytes([b]) for b in range(256)]        # every byte: any text can be spelled
    for s in ("é", "日"):                              # and broken multi-byte pieces
        e = s.encode("utf-8")
        pieces += [e[:1], e[1:], e[:2]]
    pieces.append(b"")                                # an empty piece is never allowed
    return pieces


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("pattern", [r'\{"a": (?:-?\d{1,3}|"[ab é日]*")\}', r"(?:ab|é日)+\.?", r"1{2,5}|2-2"])
def test_masks_equal_brute_force_and_walks_end_in_matches(seed, pattern):
    pieces = _vocab(seed)
    vocab = TokenVocab(pieces)
    guide = Guide(LazyDFA(compile_nfa(pattern)), vocab, [0])
    V = len(pieces) + 5                               # the model's vocabulary may be padded
    rng = random.Random(seed)
    for walk in range(12):
        s, out = guide.initial, []
        for _ in range(60):
            mask, count = guide.mask(s, V)
            assert mask.shape == (V,) and count == int(mask.sum())
            brute = {t for t, b in enumerate(pieces) if b and guide.dfa.step(s, b) != DEAD}
            if guide.dfa.is_accepting(s) or not brute:
                brute.add(0)
            assert set(mask.nonzero().flatten().tolist()) == brute
            assert guide.state_after(out) == s
            t = rng.choice(sorted(brute))
            if t == 0:
                break
            out.append(t)
            s = guide.next_state(s, t)
            assert s != DEAD
        text = b"".join(pieces[t] for t in out)
        if t == 0:
            assert re.fullmatch(pattern, text.decode("utf-8"), re.ASCII), text


def test_cursor_follows_diverging_sequences():
    pieces = _vocab(7)
    guide = Guide(LazyDFA(compile_nfa(r"[ab12 .-]*")), TokenVocab(pieces), [0])
    rng = random.Random(0)
    ok = [t for t, b in enumerate(pieces) if b and all(c in b"ab12 .-" for c in b)]
    seqs = [[rng.choice(ok) for _ in range(rng.randrange(0, 30))] for _ in range(20)]
    for _ in range(200):                             # interleaved queries: n > 1, speculative rollbacks
        q = rng.choice(seqs)[:rng.randrange(0, 31)]
        fresh = guide.initial
        for t in q:
            fresh = guide.next_state(fresh, t)
        assert guide.state_after(q) == fresh
    bad = [t for t, b in enumerate(pieces) if b == b"{"][0]
    assert guide.state_after([ok[0], bad, ok[1]]) == DEAD


def test_dead_state_allows_eos_only():
    pieces = _vocab(1)
    guide = Guide(LazyDFA(compile_nfa("ab")), TokenVocab(pieces), [0])
    m, c = guide.mask(DEAD, len(pieces))
    assert c == 1 and bool(m[0])
    assert isinstance(m, torch.Tensor)
