"""Differential audit of the regex guide (guided/regex.py's NFA -> automaton.py's lazy DFA and token masks)
against Python's ``re``.

The documented semantics (regex.py's docstring): a pattern is matched in full, as
``re.fullmatch(pattern, text, re.ASCII)`` -- ``\\d \\w \\s`` are the ASCII sets, ``.`` is any character but
``\\n``, no flags -- and the automaton runs on the text's UTF-8 bytes.

(a) random patterns of the supported subset (multi-byte and astral literals, escapes, classes with ranges
    across the UTF-8 length boundaries, groups, alternation with empty branches, every quantifier form, lazy
    variants, nested quantifiers, ``^`` / ``$`` at the ends): on strings drawn from the pattern itself, from
    the guide's own automaton and near-miss mutations, the guide accepts exactly re's full matches, every
    prefix of a match is alive, and every alive prefix can be completed to a match;
(b) token masks over a small synthetic vocabulary (multi-character tokens, partial UTF-8 sequences, tokens
    that are prefixes of each other, EOS) equal a brute-force walk of every token's bytes, and random walks
    over the masks end in full matches;
(c) unsupported or malformed syntax raises RegexError naming the problem and its position -- never another
    exception, a hang or a silently different language; the size limits give clear errors.
"""
import random
import re
import signal
import string
import time
import warnings
from collections import deque

import numpy as np
import pytest
import regex

from decodekit.sampling.guided import DEAD, Guide, GuideError, LazyDFA, RegexError, compile_nfa, escape, parse
from decodekit.sampling.guided import automaton
from decodekit.sampling.guided.automaton import TokenVocab

# --------------------------------------------------------------------------- the random pattern generator
# Code points worth testing: ASCII (metacharacters included), controls, and the last / first code point of
# each UTF-8 length (U+007F/0080, U+07FF/0800, U+FFFF/10000, U+10FFFF) and around the surrogates.
POOL = [ord(c) for c in "abcxyzAZ019_ -.,:;!\"'#%&@~<>=`/{}[]()|*+?^$\\"] + [
    0x00, 0x09, 0x0A, 0x0D, 0x7E, 0x7F, 0x80, 0xA0, 0xE9, 0xFF, 0x100, 0x7FF, 0x800, 0x65E5, 0xD7FF,
    0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF]
RANGES = [(0x61, 0x7A), (0x30, 0x39), (0x20, 0x7E), (0x70, 0x85), (0x7F, 0x80), (0x7F0, 0x810),
          (0x7FF, 0x800), (0xFFF0, 0x10010), (0xFFFF, 0x10000), (0xD7F0, 0xE010), (0x10FFF0, 0x10FFFF),
          (0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x4E00, 0x4E10), (0x1F600, 0x1F64F), (0x00, 0x10FFFF)]
CLASS_ESC = ["\\d", "\\w", "\\s", "\\D", "\\W", "\\S"]
CHAR_ESC = {"\\t": 9, "\\n": 10, "\\r": 13, "\\f": 12, "\\v": 11, "\\a": 7}
META = set(".^$*+?{}[]()|\\")


def _is_sur(cp):
    return 0xD800 <= cp <= 0xDFFF


def _lit(rng, cp, in_class=False):
    """Code point `cp` written as a pattern literal: raw, escaped punctuation, \\xHH, \\uHHHH or \\UHHHHHHHH."""
    c, r = chr(cp), rng.random()
    if c in META or (in_class and c in string.punctuation):
        return "\\" + c if r < 0.7 or cp > 0xFF else f"\\x{cp:02x}"
    if r < 0.15 and cp < 0x100:
        return f"\\x{cp:02x}"
    if r < 0.3 and cp < 0x10000:
        return f"\\u{cp:04x}"
    if r < 0.4:
        return f"\\U{cp:08x}"
    if r < 0.45 and c in string.punctuation:
        return "\\" + c
    return c


def _pick(rng, hints, test):
    """A character matching `test` (re.fullmatch of a one-character pattern), from hints or at random."""
    cands = list(hints) + rng.sample(POOL, 8) + [rng.randint(0, 0x10FFFF) for _ in range(4)]
    rng.shuffle(cands)
    for cp in cands:
        if not _is_sur(cp) and test(chr(cp)):
            return chr(cp)
    return None


def _set_node(rng, text, hints):
    rx = re.compile(text, re.ASCII)
    return text, lambda r: _pick(r, hints, rx.fullmatch)


def _gen_class(rng):
    items, hints = [], []
    for _ in range(rng.randint(1, 4)):
        k = rng.random()
        if k < 0.3:
            cp = rng.choice(POOL)
            items.append(_lit(rng, cp, True))
            hints.append(cp)
        elif k < 0.75:
            lo, hi = rng.choice(RANGES)
            if rng.random() < 0.5:             # a random sub-range
                lo = rng.randint(lo, hi)
                hi = rng.randint(lo, min(hi, lo + rng.choice([1, 64, 5000, 0x10FFFF])))
            if _is_sur(lo) or _is_sur(hi):
                lo, hi = 0x7F0, 0x810
            items.append(_lit(rng, lo, True) + "-" + _lit(rng, hi, True))
            hints += [lo, hi] + [rng.randint(lo, hi) for _ in range(3)]
        else:
            items.append(rng.choice(CLASS_ESC))
            hints += [ord(c) for c in "09aZ_ \t\n"] + [0xE9, 0x65E5, 0x1F600, 0x0663]
    neg = rng.random() < 0.25
    return _set_node(rng, "[" + "^" * neg + "".join(items) + "]", hints + POOL[:12])


def _gen_atom(rng, depth, names):
    k = rng.random()
    if k < 0.4:
        cp = rng.choice(POOL)
        return _lit(rng, cp), (lambda r, c=chr(cp): c)
    if k < 0.48:
        esc, cp = rng.choice(list(CHAR_ESC.items()))
        return esc, (lambda r, c=chr(cp): c)
    if k < 0.55:
        return _set_node(rng, ".", [])
    if k < 0.62:
        return _set_node(rng, rng.choice(CLASS_ESC), [ord(c) for c in "09aZ_ \t\n"] + [0xE9, 0x0663])
    if k < 0.8 or depth >= 3:
        return _gen_class(rng)
    inner, fn = _gen_alt(rng, depth + 1, names)
    kind = rng.choice(["(", "(?:", "(?:", "(?P<"])
    if kind == "(?P<":
        kind = f"(?P<g{len(names)}>"
        names.append(kind)
    return kind + inner + ")", fn


QUANTS = [("*", 0, None), ("+", 1, None), ("?", 0, 1), ("{2}", 2, 2), ("{0}", 0, 0), ("{1,}", 1, None),
          ("{2,}", 2, None), ("{0,2}", 0, 2), ("{1,3}", 1, 3), ("{,2}", 0, 2), ("{,}", 0, None)]


def _gen_quant(rng, depth, names):
    text, fn = _gen_atom(rng, depth, names)
    if rng.random() < 0.6:
        return text, fn
    q, lo, hi = rng.choice(QUANTS)
    if rng.random() < 0.3:
        q += "?"                                # lazy: the same full-match language

    def sample(r):
        out = []
        for _ in range(r.randint(lo, lo + 3 if hi is None else hi)):
            s = fn(r)
            if s is None:
                return None if len(out) < lo else "".join(out)
            out.append(s)
        return "".join(out)
    return text + q, sample


def _gen_cat(rng, depth, names):
    parts = [_gen_quant(rng, depth, names) for _ in range(rng.randint(0 if depth else 1, 4))]

    def sample(r):
        out = [fn(r) for _, fn in parts]
        return None if None in out else "".join(out)
    return "".join(t for t, _ in parts), sample


def _gen_alt(rng, depth, names, top=False):
    branches = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        text, fn = _gen_cat(rng, depth, names)
        if top and rng.random() < 0.2:
            text = "^" + text
        if top and rng.random() < 0.2:
            text += "$"
        branches.append((text, fn))
    if rng.random() < 0.15:
        branches.insert(rng.randrange(len(branches) + 1), ("", lambda r: ""))   # an empty alternative

    def sample(r):
        order = list(branches)
        r.shuffle(order)
        for _, fn in order:
            s = fn(r)
            if s is not None:
                return s
        return None
    return "|".join(t for t, _ in branches), sample


def random_pattern(rng):
    """(pattern, sampler of strings drawn from the pattern's own structure, possibly not matching it)."""
    return _gen_alt(rng, 0, [], top=True)


# --------------------------------------------------------------------------- the oracle
class _Slow(Exception):
    pass


def _alarm(*_):
    raise _Slow


class Oracle:
    """re.fullmatch(pattern, text, re.ASCII), or UNKNOWN (the text is not checked) where re backtracks for
    more than 0.2 s (nested quantifiers over empty-matching groups are exponential in re; after 3 such texts
    none of the pattern's is checked). The regex package is no fallback: its V0 mode matches "a" with
    ``[^\\w\\W]`` (2026.5.9, also without re.ASCII), so it is used only where re cannot parse the pattern
    (`regex_only`). strict: re's FutureWarnings (a possible nested set, say) are errors."""

    def __init__(self, pattern, regex_only=False, strict=True):
        self.pattern, self.unknown = pattern, 0
        with warnings.catch_warnings():
            warnings.simplefilter("error" if strict else "ignore")
            self.re = None if regex_only else re.compile(pattern, re.ASCII)
        self.other = regex.compile(pattern, regex.ASCII | regex.V0) if regex_only else None

    def fullmatch(self, text):
        if self.other is not None:
            return self.other.fullmatch(text)
        if self.unknown >= 3:
            return UNKNOWN
        # (an outer SIGALRM timer -- pytest-timeout's -- gets its handler and remaining time back)
        old, t0 = signal.signal(signal.SIGALRM, _alarm), time.monotonic()
        outer = signal.setitimer(signal.ITIMER_REAL, 0.2)
        try:
            return self.re.fullmatch(text)
        except _Slow:
            self.unknown += 1
            return UNKNOWN
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            if outer[0] > 0:
                signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - t0), 1e-3), outer[1])


UNKNOWN = object()


# --------------------------------------------------------------------------- the byte-level checks
def _completion(dfa, s):
    """The shortest bytes that take DFA state `s` to an accepting state (None: none): a descent along the NFA
    states' distances to the accepting state (its byte edges cost 1, epsilon edges 0)."""
    nfa = dfa.nfa
    dist = getattr(nfa, "_audit_dist", None)
    if dist is None:                            # 0-1 BFS backwards from the accepting state
        rev = [[] for _ in nfa.eps]
        for x, ts in enumerate(nfa.eps):
            for t in ts:
                rev[t].append((x, 0))
        for x, es in enumerate(nfa.edges):
            for _, _, t in es:
                rev[t].append((x, 1))
        dist = [None] * len(nfa.eps)
        dist[nfa.accept] = 0
        q = deque([nfa.accept])
        while q:
            t = q.popleft()
            for x, w in rev[t]:
                if dist[x] is None or dist[t] + w < dist[x]:
                    dist[x] = dist[t] + w
                    q.appendleft(x) if w == 0 else q.append(x)
        nfa._audit_dist = dist
    out = bytearray()
    while s != DEAD and not dfa.is_accepting(s):
        best = min(((dist[t], lo) for x in dfa.sets[s] for lo, _, t in nfa.edges[x] if dist[t] is not None),
                   default=None)
        if best is None:
            return None
        out.append(best[1])
        s = dfa.step(s, bytes([best[1]]))
    return bytes(out) if s != DEAD else None


def check_text(dfa, oracle, data, pattern):
    """The guide on byte string `data` against re.fullmatch: a match is accepted and each of its prefixes is
    alive; a non-match is not accepted; the longest alive prefix completes to a match; invalid UTF-8 is never
    accepted."""
    try:
        want = oracle.fullmatch(data.decode("utf-8"))
        if want is UNKNOWN:
            return
        want = want is not None
    except UnicodeDecodeError:
        want = False
    s, alive = dfa.start, 0
    if s != DEAD:
        for i in range(len(data)):
            t = dfa.step(s, data[i:i + 1])
            if t == DEAD:
                break
            s, alive = t, i + 1
    got = s != DEAD and alive == len(data) and dfa.is_accepting(s)
    assert got == want, (pattern, data, "accepted" if got else "rejected", "re.fullmatch", want)
    if s != DEAD:
        comp = _completion(dfa, s)
        assert comp is not None, (pattern, data[:alive], "alive but cannot complete")
        whole = (data[:alive] + comp).decode("utf-8")       # raises if the guide accepted invalid UTF-8
        assert oracle.fullmatch(whole) is not None, (pattern, data[:alive], comp, "completed to a non-match")


def dfa_sample(dfa, rng, max_len=30):
    """Bytes the DFA accepts: a random walk along its live edges, stopping at an accepting state sometimes,
    then the shortest completion."""
    s, out = dfa.start, bytearray()
    if s == DEAD:
        return None
    for _ in range(max_len):
        if dfa.is_accepting(s) and rng.random() < 0.25:
            break
        dfa.expand(s)
        live = np.nonzero(dfa.trans[s] != DEAD)[0]
        if not len(live):
            break
        b = int(rng.choice(live.tolist()))
        out.append(b)
        s = int(dfa.trans[s, b])
    return bytes(out) + _completion(dfa, s)


def mutations(rng, text):
    """Near misses of `text`: drop / insert / replace / duplicate a character, swap two, truncate, extend."""
    c = chr(rng.choice(POOL))
    out = [text + c, c + text, text[:-1]]
    if text:
        i = rng.randrange(len(text))
        out += [text[:i] + text[i + 1:], text[:i] + c + text[i:], text[:i] + c + text[i + 1:],
                text[:i] + text[i] + text[i:], text[:i] + text[i + 1:i + 2] + text[i] + text[i + 2:]]
    return out


def audit(pattern, sampler, rng, n=12):
    dfa = LazyDFA(compile_nfa(pattern))
    oracle = Oracle(pattern)
    texts = []
    for _ in range(n):
        t = sampler(rng) if sampler else None
        if t is not None:
            assert oracle.fullmatch(t) is not None, (pattern, t, "the generator's sample does not match")
            texts.append(t)
        d = dfa_sample(dfa, rng)
        if d is not None:
            check_text(dfa, oracle, d, pattern)
            texts.append(d.decode("utf-8"))
            if len(d) > 1:                       # a byte-level near miss (may cut a character)
                i = rng.randrange(len(d))
                check_text(dfa, oracle, d[:i] + d[i + 1:], pattern)
    matched = 0
    for t in texts:
        check_text(dfa, oracle, t.encode("utf-8"), pattern)
        matched += oracle.fullmatch(t) not in (None, UNKNOWN)
        for m in mutations(rng, t):
            check_text(dfa, oracle, m.encode("utf-8"), pattern)
    return matched


# --------------------------------------------------------------------------- (a) differential: language
@pytest.mark.parametrize("chunk", range(8))
def test_random_patterns_match_python_re(chunk):
    rng = random.Random(1000 + chunk)
    matched = 0
    for _ in range(30):
        pattern, sampler = random_pattern(rng)
        matched += audit(pattern, sampler, rng)
    assert matched > 200                         # the samplers do produce matches


@pytest.mark.parametrize("pattern", [
    r"[\x7f-\x80]+", r"[\u07ff-\u0800]{2}", r"[\uffff-\U00010000]*x", r"[\ud7ff-\ue000]",  # length boundaries
    r"[^\x00-\x7f]", r"[^\u0080-\U0010ffff]+", r"[\x00-\U0010ffff]", r"[^a]*é", r"[é-日]?😀+",
    r"(?:é|e\u0301)+", r"\U0001F600{2,3}|\U0010FFFF", r"[\w\s]+\W", r"\D\S?", r".*\n.*",
    r"(?:a*)*b", r"(?:a?){3}(?:a|)*", r"(?:(?:ab)+|c{2,}?)+?", r"a{,3}b{,}c{0}", r"(|a|)(b|)",
    r"^a|b$|^c$", r"^$", r"(?P<x>a)(?:(?P<y>b)|c)*", r"(?#note)a(?#)b", r"\\\.\*\{1\}",
    r"x{", r"x{}", r"x{a}", r"x{1,2,3}", r"x{ 1}", r"}{", r"[]a]", r"[^]a]",
    r"[a-]", r"[-a]", r"[\]\-\\]", r"[\b]", r"\x00\0", r"[\d-z]+",
])
def test_hand_picked_patterns_match_python_re(pattern):
    rng = random.Random(pattern)
    dfa = LazyDFA(compile_nfa(pattern))
    try:
        oracle = Oracle(pattern)
    except re.error:                            # [\d-z]: re refuses it, the regex package reads a '-'
        oracle = Oracle(pattern, regex_only=True)
    for _ in range(40):
        d = dfa_sample(dfa, rng)
        if d is not None:
            for m in [d.decode()] + mutations(rng, d.decode()):
                check_text(dfa, oracle, m.encode(), pattern)
    for _ in range(200):
        t = "".join(chr(rng.choice(POOL)) for _ in range(rng.randrange(5)))
        check_text(dfa, oracle, t.encode(), pattern)


def test_named_groups_in_both_spellings():
    """``(?<name>...)`` (the regex package's / PCRE's spelling; re has only ``(?P<name>...)``)."""
    for p in [r"(?<year>\d{4})-(?<m>\d\d)", r"(?<a>x|y)+(?P<b>z)?"]:
        dfa, oracle = LazyDFA(compile_nfa(p)), regex.compile(p, regex.ASCII)
        for t in ["2024-05", "2024-5", "xyxz", "z", "", "xyzz"]:
            check_text(dfa, oracle, t.encode(), p)


def test_documented_deviations_from_unicode_re():
    """\\d \\w \\s are ASCII (re.ASCII; xgrammar's regex converter too, but its \\s adds U+00A0); re's default
    and the Rust regex of llguidance / outlines-core read them as Unicode classes. '.' is any character but
    '\\n' (re, Rust regex; xgrammar's '.' takes '\\n' too)."""
    def acc(p, t):
        dfa = LazyDFA(compile_nfa(p))
        s = dfa.step(dfa.start, t.encode())
        return s != DEAD and dfa.is_accepting(s)
    for p, t in [(r"\d", "\u0663"), (r"\w", "é"), (r"\s", "\u00a0"), (r"\s", "\u2028")]:
        assert re.fullmatch(p, t) and not re.fullmatch(p, t, re.ASCII) and not acc(p, t)
    for p, t in [(r"\D", "\u0663"), (r"\W", "é"), (r"\S", "\u00a0"), (".", "\r"), (".", "\u2028")]:
        assert acc(p, t) and re.fullmatch(p, t, re.ASCII)
    assert not acc(".", "\n") and not acc("[^a]", "") and acc("[^a]", "\n")


# --------------------------------------------------------------------------- regressions (bugs fixed here)
def _accepts(pattern, text):
    dfa = LazyDFA(compile_nfa(pattern))
    s = dfa.step(dfa.start, text.encode("utf-8"))
    return s != DEAD and dfa.is_accepting(s)


def test_regression_empty_counted_repeat_is_star():
    """re reads ``x{,}`` as ``x{0,}`` (= ``x*``); the parser took it for the literal text "x{,}"."""
    assert re.fullmatch("a{,}", "aaa") and not re.fullmatch("a{,}", "a{,}")
    assert _accepts("a{,}", "aaa") and _accepts("a{,}", "") and not _accepts("a{,}", "a{,}")
    assert _accepts("(?:ab){,}?c", "ababc")
    with pytest.raises(RegexError, match="nothing to repeat"):
        parse("{,}")
    for p in ["a{}", "a{ 1}", "a{1,2,3}", "a{x}", "a{1"]:              # still literal braces, as in re
        assert _accepts(p, p) and re.fullmatch(p, p)


def test_regression_possessive_quantifiers_are_refused():
    """Possessive quantifiers (re since 3.11) give up backtracking: ``a*+a`` matches nothing, ``(?:a|ab)++b``
    not "abb". The parser took them for greedy ones ("the same language"): a silently wrong guide."""
    for p, text in [("a*+a", "aa"), ("(?:a|ab)++b", "abb"), ("a?+a", "a"), ("a{1,2}+a", "aa")]:
        assert not re.fullmatch(p, text) and re.fullmatch(p.replace("+", "", 1), text)
        with pytest.raises(RegexError, match=r"position \d+: possessive quantifiers"):
            compile_nfa(p)


def test_regression_surrogates_are_refused():
    """A lone surrogate cannot be UTF-8 encoded: as a literal or \\u escape it crashed the compiler with a
    UnicodeEncodeError; inside a class it was silently dropped (``[\\ud800]`` matched nothing, ``[\\ud800a]``
    only "a"). Ranges across the surrogate block are fine (the block is skipped, as UTF-8 has no encoding)."""
    for p, pos in [("a\ud800", 1), (r"\ud800", 0), (r"\udfff", 0), (r"[\ud800]", 1), ("[a\udc00]", 2),
                   (r"[a-\ud800]", 3), (r"[\udbff-\ue000]", 1), ("(?:\ud83d\ude00)", 3)]:
        with pytest.raises(RegexError, match=rf"position {pos}: .*surrogate"):
            compile_nfa(p)
    assert _accepts(r"[\ud7ff-\ue000]+", "\ud7ff\ue000") and not _accepts(r"[\ud7ff-\ue000]", "a")
    assert _accepts(r"[\u0000-\uffff]", "\uffff")
    with pytest.raises(RegexError, match="surrogate"):
        compile_nfa(escape("a\udc80b"))          # (escape writes the non-printable as \udc80)


def test_regression_huge_repeat_count_is_a_regex_error():
    """A count of more than 4300 digits made int() raise its own ValueError (Python's digit limit), not a
    RegexError with a position."""
    with pytest.raises(RegexError, match=r"position 1: repetition count above"):
        parse("a{" + "9" * 5000 + "}")
    with pytest.raises(RegexError, match=r"position 1: repetition count above"):
        parse("a{1," + "9" * 4400 + "}")


def test_regression_brace_scanning_is_linear():
    """Each '{' searched for the next '}' and split the text between: quadratic time, ~3 s for 100k '{'
    followed by a '}' (a 200k-character guided_regex: ~12 s in the server's compile thread; parsing 100k
    plain characters takes ~0.3 s)."""
    t = time.perf_counter()
    parse("a" * 100_000)
    base = time.perf_counter() - t
    for p in ["{" * 100_000 + "}", "a" + "{1," * 33_000, "x{" * 50_000 + "}"]:
        t = time.perf_counter()
        parse(p)
        assert time.perf_counter() - t < 4 * base + 0.5, p[:10]


def test_regression_bad_group_names_are_refused():
    """``(?P<a)b>c)`` took "a)b" for the name and compiled the pattern "c" (re: bad character in group
    name); empty and non-identifier names were accepted too."""
    for p, pos in [("(?P<a)b>c)", 4), ("(?P<>x)", 4), ("(?<1a>x)", 3), ("(?P<a-b>x)", 4)]:
        with pytest.raises(RegexError, match=rf"position {pos}: bad group name"):
            parse(p)
    assert _accepts("(?P<año>x)(?<_1>y)", "xy")


def test_regression_escaped_non_ascii_is_literal():
    """As in re, only an ASCII letter or digit after a backslash is an escape; ``\\é``, ``\\_``, ``\\·`` and
    ``\\٣`` are the characters themselves (they were refused)."""
    for p, t in [(r"\é+", "éé"), (r"\_", "_"), (r"[\é\_]", "_"), ("\\\u0663", "\u0663"), ("\\\u00b7", "\u00b7")]:
        assert re.fullmatch(p, t) and _accepts(p, t)


def test_regression_quantifier_after_a_comment_repeats_the_item_before():
    """re skips a comment entirely, so in ``0(?#x){0}=`` the {0} repeats the '0' (the language is {"="}), and
    a comment ends at its first unescaped ')'. The parser made the comment an empty item that took the
    quantifier ("0=" accepted, "=" refused; ``.(?#c){,}`` one character only) and ended it at any ')'."""
    for p, yes, no in [("0(?#x){0}=", "=", "0="), (".(?#c){,}", "ab", None), ("\\-(?#c)*", "", None),
                       ("a(?#c)(?#d)+?", "aa", ""), (r"a(?#\))b", "ab", "a"), ("(a*)(?#c)*", "aa", "b"),
                       ("(?#c)^a", "a", "")]:
        assert re.fullmatch(p, yes) and _accepts(p, yes), p
        assert no is None or not re.fullmatch(p, no) and not _accepts(p, no), p
    for p, what in [("(?#x)*", "nothing to repeat"), ("a*(?#c)*", "multiple repeat"), ("^(?#c)+", "nothing to repeat"),
                    ("(?#[{0}.)?", "nothing to repeat"), ("a(?#\\)", "unterminated comment")]:
        with pytest.raises(RegexError, match=what):
            parse(p)


# --------------------------------------------------------------------------- (b) token masks
def _synthetic_vocab(seed):
    """id 0: EOS; every POOL character; multi-character tokens and tokens that are prefixes of each other;
    partial UTF-8 sequences (leading / continuation bytes, 2 of 3, 3 of 4) and invalid bytes; an empty piece."""
    rng = random.Random(seed)
    pieces = [None]
    pieces += [chr(cp).encode() for cp in POOL]
    pieces += [s.encode() for s in ["ab", "abc", "abcd", "aa", "aaa", "01", "012", "-1", ".5", "é日", "日😀",
                                    "x😀", " a", "\n\n", "\\\\", "{}", "[]", "a|b", "$^", "__"]]
    for ch in ["é", "日", "😀", "\U0010ffff", "\u0800", "\uffff"]:
        e = ch.encode()
        pieces += [e[:k] for k in range(1, len(e))] + [e[k:] for k in range(1, len(e))]
    pieces += [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\xc3", b"\xa9b"]
    alphabet = [chr(cp) for cp in POOL[:30]] + ["é", "日", "😀"]
    pieces += ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5))).encode() for _ in range(120)]
    pieces += [b"", None]
    return pieces


def _brute_mask(guide, pieces, s):
    allowed = {t for t, b in enumerate(pieces) if b and guide.dfa.step(s, b) != DEAD}
    if guide.dfa.is_accepting(s) or not allowed:
        allowed.add(0)                          # documented: EOS where accepting, or where nothing else is live
    return allowed


def mask_walks(pattern, pieces, rng, walks=5, steps=30):
    guide = Guide(LazyDFA(compile_nfa(pattern)), TokenVocab(pieces), [0])
    oracle = Oracle(pattern)
    V = len(pieces) + 3                         # the model's vocabulary may be padded past the tokenizer's
    brute: dict = {}
    ends = 0
    for _ in range(walks):
        s, out = guide.initial, []
        for _ in range(steps):
            mask, count = guide.mask(s, V)
            assert mask.shape == (V,) and count == int(mask.sum())
            got = set(mask.nonzero().flatten().tolist())
            if s not in brute:
                brute[s] = _brute_mask(guide, pieces, s)
            assert got == brute[s], (pattern, b"".join(pieces[t] for t in out), sorted(got ^ brute[s]))
            assert guide.state_after(out) == s
            if s == DEAD:
                break
            choices = sorted(got - {0})
            if 0 in got and (not choices or rng.random() < 0.2):
                text = b"".join(pieces[t] for t in out)
                if guide.dfa.is_accepting(s):
                    assert oracle.fullmatch(text.decode("utf-8")), (pattern, text)
                    ends += 1
                else:                           # EOS only because the vocabulary cannot continue
                    assert not choices
                    comp = _completion(guide.dfa, s)
                    assert comp is not None and oracle.fullmatch((text + comp).decode("utf-8"))
                break
            t = rng.choice(choices)
            out.append(t)
            s = guide.next_state(s, t)
            assert s != DEAD
    return ends


@pytest.mark.parametrize("chunk", range(4))
def test_masks_equal_brute_force_on_random_patterns(chunk):
    rng = random.Random(2000 + chunk)
    pieces = _synthetic_vocab(chunk)
    ends = 0
    for _ in range(10):
        pattern, _ = random_pattern(rng)
        ends += mask_walks(pattern, pieces, rng)
    assert ends > 5


@pytest.mark.parametrize("pattern", [r"(?:ab|abc|abcd)+d?", r"[é日😀]{1,3}", r"(?:😀|日)*x", r"a{,}b{0}(?:c|)",
                                     r"[\x7f-\x80\u07ff-\u0800]+", r"[^a]{2}", r"(?:0|-?1)\.5"])
def test_masks_on_prefix_tokens_and_partial_utf8(pattern):
    assert mask_walks(pattern, _synthetic_vocab(9), random.Random(pattern), walks=12) > 0


def test_mask_of_dead_and_dead_end_states():
    pieces = [None, b"a", b"\xc3", b"b"]
    guide = Guide(LazyDFA(compile_nfa("ab?|é")), TokenVocab(pieces), [0])
    m, c = guide.mask(DEAD, 4)
    assert c == 1 and bool(m[0])
    s = guide.next_state(guide.initial, 2)      # 'é' half-way: no token finishes it, so EOS alone
    assert s != DEAD and not guide.dfa.is_accepting(s)
    assert guide.mask(s, 4)[0].tolist() == [True, False, False, False]
    s = guide.next_state(guide.initial, 1)      # "a" accepts and "b" continues
    assert guide.mask(s, 4)[0].tolist() == [True, False, False, True]


# --------------------------------------------------------------------------- (c) errors and limits
@pytest.mark.parametrize("pattern, what, pos", [
    (r"(a)\1", "backreferences are not supported", 3),
    (r"(?P<n>a)(?P=n)", "backreferences are not supported", 8),
    (r"(?P<n>a)\g<n>", "bad or unsupported escape", 8),
    (r"x(?=a)a", "lookarounds are not supported", 1), (r"(?!a)b", "lookarounds", 0),
    (r"(?<=a)b", "lookarounds", 0), (r"(?<!a)b", "lookarounds", 0),
    (r"a*+", "possessive quantifiers are not supported", 2), (r"ab{2}+", "possessive", 5),
    (r"(?>a+)a", "atomic groups are not supported", 0),
    (r"(a)(?(1)b|c)", "conditionals are not supported", 3),
    (r"(?i)a", "inline flags", 0), (r"a(?i:b)", "inline flags", 1), (r"(?x) a", "inline flags", 0),
    (r"(?-i:a)", "inline flags", 0), (r"(?R)", "recursion", 0), (r"(?&x)", "recursion", 0),
    (r"\bfoo", "word boundaries", 0), (r"a\B", "word boundaries", 1),
    (r"\Aa", "anchors", 0), (r"a\Z", "anchors", 1), (r"a\z", "anchors", 1),
    (r"\p{L}", "Unicode property classes", 0), (r"[\PL]", "Unicode property classes", 1),
    (r"\N{DASH}", "named characters", 0), (r"\q", "bad or unsupported escape \\q", 0),
    (r"a^b", "anchors ('^')", 1), (r"a$b", "anchors ('$')", 1), (r"(^a)", "anchors", 1), (r"(a$)", "anchors", 2),
    (r"a{3,2}", "min > max", 1), (r"a{10001}", "repetition count above 10000", 1),
    (r"(ab", "missing ')'", 0), (r"ab)", "unbalanced ')'", 2), (r"((a)", "missing ')'", 0),
    (r"[ab", "unterminated character class", 0), (r"[]", "unterminated character class", 0),
    (r"[z-a]", "bad character range 'z'-'a'", 1), (r"[a-\d]", "bad character range", 1),
    (r"*a", "nothing to repeat", 0), (r"a|+", "nothing to repeat", 2), (r"{2}", "nothing to repeat", 0),
    (r"a**", "multiple repeat", 2), (r"a{2}{3}", "multiple repeat", 4), (r"a???", "multiple repeat", 3),
    (r"\x4", "needs 2 hex digits", 0), (r"\u12G4", "needs 4 hex digits", 0), (r"\U00110000", "out of range", 0),
    (r"a\01", "octal escapes are not supported", 1), (r"[\1]", "octal escapes are not supported", 1),
    ("ab\\", "bad escape (end of pattern)", 2), (r"(?#open", "unterminated comment", 0),
    (r"(?P<n", "unterminated group name", 0), ("(" * 201 + ")" * 201, "nested more than 200", 200),
    (r"[[:alpha:]]", "POSIX classes", 1), (r"(?", "unknown extension", 0),
])
def test_errors_name_the_problem_and_position(pattern, what, pos):
    with pytest.raises(RegexError) as e:
        compile_nfa(pattern)
    assert f"position {pos}: " in str(e.value) and what in str(e.value), str(e.value)


FUZZ_ALPHABET = list("ab()[]{}|*+?^$\\.-,:=!<>P0129dwsbxuU#_") + [
    "(?", "(?:", "(?P<", "(?<", "(?#", "[^", "{1,2}", "{,", "{,}", "{0}", "\\x4", "\\u00e9", "\\ud800", "\\b", "\\1",
    "\\\\", "é", "😀", "\ud800", "[a-", "\\]", "\\-", "\\d", "\\W", "\\x41", "\\U0001F600", "\\0", "(?P=", "(?>",
    "(?i)", "\\Z", "\\_", "\\é", "\x7f", "\x80", "\u07ff", "\u0800", "\uffff", "\U00010000", "\n"]


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_syntax_is_accepted_as_re_or_refused(seed):
    """Random metacharacter soup: the parser either raises RegexError or compiles a pattern re also compiles
    to the same language (sampled as in (a)) -- or one of the documented extensions re lacks."""
    rng = random.Random(seed)
    compiled = 0
    for _ in range(700):
        p = "".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(1, 10)))
        try:
            compile_nfa(p)
        except RegexError:
            continue
        try:
            oracle = Oracle(p, strict=False)
        except re.error:                    # accepted where re refuses: only the regex package's extensions
            assert re.search(r"\(\?<\w|\\[dwsDWS]-", p) and regex.compile(p), p
            continue
        compiled += 1
        dfa = LazyDFA(compile_nfa(p))
        for _ in range(6):
            d = dfa_sample(dfa, rng)
            if d is not None:
                for m in [d.decode()] + mutations(rng, d.decode()):
                    check_text(dfa, oracle, m.encode(), p)
        for _ in range(10):
            t = "".join(rng.choice("ab(){}[]|*+?^$.-,:=!<>\\P0129dwsbxuU#é😀\n") for _ in range(rng.randrange(5)))
            check_text(dfa, oracle, t.encode(), p)
    assert compiled > 50


def test_limits_give_clear_errors(monkeypatch):
    t = time.perf_counter()
    with pytest.raises(RegexError, match="too large: its automaton needs more than 400000 states"):
        compile_nfa(r"(?:[^a]{10000}){100}")
    compile_nfa("(?:" * 200 + "a" + ")*" * 200)                 # the deepest nesting allowed compiles
    compile_nfa("a{10000}")
    assert time.perf_counter() - t < 10
    # a DFA blowup (the n-th character from the end): past MAX_DFA_STATES states the walk stops with GuideError
    monkeypatch.setattr(automaton, "MAX_DFA_STATES", 2000)
    dfa = LazyDFA(compile_nfa(r"[ab]*a[ab]{14}"))
    with pytest.raises(GuideError, match="grew past 2000 states"):
        for i in range(100_000):
            dfa.expand(i % len(dfa.sets))
    # and a mask whose walk needs too many automaton steps is refused with MASK_WORK's error
    monkeypatch.setattr(automaton, "MASK_WORK", 2000)
    rng = random.Random(0)
    pieces = [None] + ["".join(rng.choice("ab") for _ in range(30)).encode() for _ in range(50)]
    guide = Guide(LazyDFA(compile_nfa(r"[ab]*a[ab]{14}")), TokenVocab(pieces), [0])
    with pytest.raises(GuideError, match="more than 2000 automaton steps"):
        guide.mask(guide.initial, len(pieces))


def test_escape_round_trips_through_the_guide():
    rng = random.Random(5)
    for _ in range(200):
        text = "".join(chr(rng.choice(POOL)) for _ in range(rng.randrange(8)))
        p = escape(text)
        assert re.fullmatch(p, text) and _accepts(p, text)
        assert not _accepts(p, text + "a") and not _accepts(p, "a" + text)
