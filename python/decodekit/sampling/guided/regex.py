"""A regular-expression compiler to a byte-level NFA, for guided (structured-output) decoding.

Token masks are computed over the bytes each vocabulary token stands for, so the automaton runs on the
UTF-8 bytes of the text: a character class becomes the byte sequences that encode its code points
(``utf8_sequences``), split so each step is one byte range.

The pattern language is the subset of Python's ``re`` that a finite automaton can run, always matched
in full (as vLLM's ``guided_regex``; ``^`` starting and ``$`` ending the pattern or one of its top-level
branches are accepted and ignored):

- literal characters (any Unicode scalar value), ``.`` (any character except ``\\n``), classes ``[...]`` /
  ``[^...]`` with ranges, escapes ``\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\a \\0 \\xHH \\uHHHH
  \\UHHHHHHHH`` (``\\b`` in a class), and a backslash before any other character but an ASCII letter or
  digit is that character (``\\d`` / ``\\w`` / ``\\s`` are the ASCII sets, as ``re.ASCII``; ``re``'s default and
  the Rust regex of vLLM's outlines / guidance backends read them as Unicode classes);
- groups ``(...)``, ``(?:...)``, ``(?P<name>...)`` (``(?<name>...)`` too), comments ``(?#...)``,
  alternation ``|``;
- quantifiers ``* + ?`` and ``{n}`` ``{n,}`` ``{n,m}`` ``{,m}`` ``{,}`` (as ``re``; another ``{`` is a
  literal); a trailing ``?`` (lazy) changes nothing for a full match and is accepted.

Refused with :class:`RegexError` (its message gives the position): lookarounds, backreferences, possessive
quantifiers and atomic groups (they change the language: ``a*+a`` matches nothing), conditionals, recursion,
``\\b \\B \\A \\Z``, ``\\p{..}``, ``\\N{..}``, octal escapes, inline flags (no ``(?i)``: case-insensitive
matching is not supported), anchors inside the pattern, unbalanced brackets, bad group names, surrogate code
points (UTF-8 cannot encode them; ranges across the surrogate block skip it), counts above ``MAX_REPEAT``,
patterns whose automaton would exceed ``MAX_NFA_STATES`` (a large counted repetition copies its operand).

The NFA (``NFA``) has epsilon edges and byte-range edges; states that cannot reach the accepting state
are pruned (``NFA.prune``), so every non-empty set of states a DFA reaches can still complete a match.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_NFA_STATES = 400_000
MAX_REPEAT = 10_000          # the largest count in {n,m}
MAX_GROUP_DEPTH = 200        # groups nested at most this deep
MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


class RegexError(ValueError):
    """An unsupported or malformed pattern; the message names the position."""


# --------------------------------------------------------------------------- code point sets
def _norm(ranges) -> tuple[tuple[int, int], ...]:
    """Sorted, merged, surrogate-free code point ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    res = []
    for lo, hi in out:       # UTF-8 cannot encode surrogates: drop them
        if lo < SURROGATES[0] and hi >= SURROGATES[0]:
            res.append((lo, SURROGATES[0] - 1))
            lo = SURROGATES[0]
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
            lo = SURROGATES[1] + 1
        if lo <= hi:
            res.append((lo, hi))
    return tuple(res)


def negate(ranges) -> tuple[tuple[int, int], ...]:
    out, nxt = [], 0
    for lo, hi in _norm(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return _norm(out)


DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
CHAR_ESCAPES = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11, "a": 7, "0": 0}
ANY_BUT_NEWLINE = negate(((10, 10),))


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The code points [lo, hi] (surrogate-free) as sequences of byte ranges: each sequence matches
    exactly the UTF-8 encodings of one sub-range, one byte range per byte."""
    for edge in (0x7F, 0x7FF, 0xFFFF):              # one encoded length per sub-range
        if lo <= edge < hi:
            return utf8_sequences(lo, edge) + utf8_sequences(edge + 1, hi)
    if hi < 0x80:
        return [[(lo, hi)]]
    for i in (1, 2, 3):                             # align to continuation-byte boundaries
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if hi & m != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    return [list(zip(a, b))]


# --------------------------------------------------------------------------- parser -> AST
# AST: ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi | None) | ("call", name)


class _Parser:
    def __init__(self, pattern: str, calls: bool = False):
        self.p = pattern
        self.i = 0
        self.depth = 0
        self.calls = calls          # (?&name) calls another rule (guided/pda.py's rule sets; not user regexes)

    def error(self, msg: str, at: int | None = None):
        at = self.i if at is None else at
        raise RegexError(f"regex error at position {at}: {msg} (pattern {self.p[:60]!r}"
                         f"{'...' if len(self.p) > 60 else ''})")

    def parse(self):
        node = self.alt()
        if self.i < len(self.p):
            if self.p[self.i] == ")":
                self.error("unbalanced ')'")
            self.error(f"unexpected {self.p[self.i]!r}")
        return node

    def peek(self):
        return self.p[self.i] if self.i < len(self.p) else None

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self):
        items = []
        repeated = False            # items[-1] has a quantifier (another one after a comment: "multiple repeat")
        while True:
            c = self.peek()
            if c is None or c in "|)":
                break
            # anchors where a full match has them anyway: starting / ending a top-level branch
            if c == "$":
                if self.depth == 0 and self.p[self.i + 1:self.i + 2] in ("", "|"):
                    self.i += 1
                    break
                self.error("anchors ('$') are only supported at the end of the pattern (or of a top-level branch)")
            if c == "^":
                if self.depth == 0 and not items:
                    self.i += 1
                    continue
                self.error("anchors ('^') are only supported at the start of the pattern (or of a top-level branch)")
            if self.p.startswith("(?#", self.i):
                # a comment is nothing: a quantifier after it applies to the item before it, as in re
                self.comment()
                c = self.peek()
                if items and c is not None and (c in "*+?" or c == "{" and self._counted() is not None):
                    if repeated:
                        self.error("multiple repeat")
                    items[-1] = self.quantified(items[-1])
                    repeated = True
                continue
            atom = self.atom()
            item = self.quantified(atom)
            repeated = item is not atom
            items.append(item)
        return items[0] if len(items) == 1 else ("cat", items)

    def comment(self):
        """Skip the (?#...) at self.i: it ends at the first ')' that is not escaped (as in re)."""
        start, j = self.i, self.i + 3
        while j < len(self.p) and self.p[j] != ")":
            j += 2 if self.p[j] == "\\" else 1
        if j >= len(self.p):
            self.error("unterminated comment", start)
        self.i = j + 1

    def quantified(self, atom):
        repeated = False
        while True:
            c, start = self.peek(), self.i
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and (cnt := self._counted()) is not None:
                lo, hi = cnt
                self.i = self._counted_end
            else:
                return atom
            if self.peek() == "?":              # lazy: the same language for a full match
                self.i += 1
            elif self.peek() == "+":            # possessive (re 3.11): no backtracking -- another language
                self.error("possessive quantifiers are not supported (they do not backtrack: a*+a matches "
                           "nothing)")
            if atom is None:
                self.error("nothing to repeat", start)
            if hi is not None and hi < lo:
                self.error(f"bad repetition {{{lo},{hi}}}: min > max", start)
            if max(lo, hi or 0) > MAX_REPEAT:
                self.error(f"repetition count above {MAX_REPEAT}", start)
            if repeated:
                self.error("multiple repeat", start)
            repeated = True
            atom = ("rep", atom, lo, hi)

    def _counted(self):
        """(lo, hi) when the '{' at self.i starts {n}, {n,}, {n,m}, {,m} or {,} (as re: ASCII digits, no
        spaces; {,} is {0,}); else None (a literal '{'). Sets self._counted_end past the '}'."""
        p, n = self.p, len(self.p)

        def digits(k):
            while k < n and p[k] in "0123456789":
                k += 1
            return k

        def num(text):              # (a count past MAX_REPEAT is refused: no need to convert all its digits)
            text = text.lstrip("0")
            return int(text or 0) if len(text) <= 9 else MAX_REPEAT + 1

        k = digits(self.i + 1)
        lo = p[self.i + 1:k]
        if k < n and p[k] == ",":
            j = k + 1
            k = digits(j)
            hi = num(p[j:k]) if k > j else None
        elif not lo:
            return None
        else:
            hi = num(lo)
        if k >= n or p[k] != "}":
            return None
        self._counted_end = k + 1
        return num(lo), hi

    def atom(self):
        c = self.p[self.i]
        if c == "(":
            start = self.i
            self.depth += 1
            if self.depth > MAX_GROUP_DEPTH:
                self.error(f"groups nested more than {MAX_GROUP_DEPTH} deep")
            self.i += 1
            if self.calls and self.p.startswith("?&", self.i):
                j = self.p.find(")", self.i)
                if j < 0:
                    self.error("unterminated rule call")
                name = self.p[self.i + 2:j]
                self.i = j + 1
                self.depth -= 1
                return ("call", name)
            if self.p.startswith("?", self.i):
                if self.p.startswith("?:", self.i):
                    self.i += 2
                elif self.p.startswith("?P<", self.i) or (self.p.startswith("?<", self.i)
                                                         and self.p[self.i + 2:self.i + 3] not in ("=", "!")):
                    j = self.p.find(">", self.i)
                    if j < 0:
                        self.error("unterminated group name", start)
                    at = self.i + (3 if self.p[self.i + 1] == "P" else 2)
                    if not self.p[at:j].isidentifier():
                        self.error(f"bad group name {self.p[at:j]!r}", at)
                    self.i = j + 1
                else:
                    self.error(self._extension(), start)
            node = self.alt()
            if self.peek() != ")":
                self.error("missing ')'", start)
            self.i += 1
            self.depth -= 1
            return node
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            self.i += 1
            return ("set", ANY_BUT_NEWLINE)
        if c == "\\":
            v = self.escape(in_class=False)
            return ("set", v if isinstance(v, tuple) else ((v, v),))
        if c in "*+?":
            self.error("nothing to repeat")
        if c == "{" and self._counted() is not None:
            self.error("nothing to repeat")
        cp = self._scalar(ord(c), self.i)
        self.i += 1
        return ("set", ((cp, cp),))

    def _extension(self) -> str:
        """Why the (?... extension at self.i (at its '?') is refused."""
        x = self.p[self.i + 1:self.i + 3]
        if x.startswith(("=", "!", "<=", "<!")):
            return "lookarounds are not supported"
        if x.startswith("P="):
            return "backreferences are not supported"
        if x.startswith(">"):
            return "atomic groups are not supported"
        if x.startswith("("):
            return "conditionals are not supported"
        if x.startswith(("R", "&", "P>")) or x[:1].isdigit() or (x[:1] in "+-" and x[1:].isdigit() and x[1:]):
            return "recursion is not supported"
        if x[:1] and x[:1] in "aiLmsux-^":
            return "inline flags ((?i), (?s), (?x), ...) are not supported"
        return f"unknown extension (?{x[:1]}"

    def _scalar(self, cp: int, at: int) -> int:
        """`cp`, unless it is a surrogate (UTF-8 cannot encode one: a text can never hold it)."""
        if SURROGATES[0] <= cp <= SURROGATES[1]:
            self.error(f"lone surrogate U+{cp:04X} (UTF-8 cannot encode it; write an astral character itself "
                       f"or as \\UXXXXXXXX, not as a surrogate pair)", at)
        return cp

    def escape(self, in_class: bool):
        """The escape at self.i: a code point (int) or a class (ranges tuple)."""
        start = self.i
        self.i += 1
        if self.i >= len(self.p):
            self.error("bad escape (end of pattern)", start)
        c = self.p[self.i]
        self.i += 1
        if c.lower() in CLASS_ESCAPES:
            r = CLASS_ESCAPES[c.lower()]
            return _norm(r) if c.islower() else negate(r)
        if c in CHAR_ESCAPES:
            if c == "0" and self.peek() is not None and self.peek() in "01234567":
                self.error("octal escapes are not supported", start)
            return CHAR_ESCAPES[c]
        if c == "b" and in_class:
            return 8
        if c in "bB":
            self.error(f"unsupported escape \\{c}: word boundaries are not supported", start)
        if c in "AZzG":
            self.error(f"unsupported escape \\{c}: anchors are not supported (the whole text is matched)", start)
        if c in "pP":
            self.error("Unicode property classes (\\p{...}) are not supported", start)
        if c == "N":
            self.error("named characters (\\N{...}) are not supported", start)
        n = {"x": 2, "u": 4, "U": 8}.get(c)
        if n:
            h = self.p[self.i:self.i + n]
            if len(h) != n or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                self.error(f"bad \\{c} escape: needs {n} hex digits", start)
            self.i += n
            v = int(h, 16)
            if v > MAX_CODEPOINT:
                self.error(f"code point {h} out of range", start)
            return self._scalar(v, start)
        if c in "123456789":
            self.error("octal escapes are not supported" if in_class else "backreferences are not supported", start)
        if c.isascii() and c.isalnum():     # (as re: any other character after a backslash is itself)
            self.error(f"bad or unsupported escape \\{c}", start)
        return self._scalar(ord(c), start)

    def char_class(self):
        start = self.i
        self.i += 1
        neg = self.peek() == "^"
        if neg:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                self.error("unterminated character class", start)
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            at = self.i
            lo = self._class_item()
            if isinstance(lo, tuple):
                ranges.extend(lo)
                continue
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self._class_item()
                if isinstance(hi, tuple):
                    self.error("bad character range (a class escape as its end)", at)
                if hi < lo:
                    self.error(f"bad character range {chr(lo)!r}-{chr(hi)!r}", at)
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return negate(ranges) if neg else _norm(ranges)

    def _class_item(self):
        c = self.p[self.i]
        if c == "\\":
            return self.escape(in_class=True)
        if c == "[" and self.p[self.i + 1:self.i + 2] in (":", "=", "."):
            self.error("POSIX classes are not supported")
        self.i += 1
        return self._scalar(ord(c), self.i - 1)


def parse(pattern: str, calls: bool = False):
    """The pattern's AST (module docstring for the syntax); RegexError when unsupported / malformed.
    calls: accept ``(?&name)``, a call of rule `name` (a rule set's rule body, guided/pda.py)."""
    if not isinstance(pattern, str):
        raise RegexError(f"the pattern must be a str, got {type(pattern).__name__}")
    return _Parser(pattern, calls).parse()


# --------------------------------------------------------------------------- AST -> NFA
@dataclass
class NFA:
    """Thompson NFA over bytes: eps[s] = epsilon targets, edges[s] = [(lo, hi, target)] byte ranges,
    calls[s] = [(rule name, return state)] (rule sets only: guided/pda.py)."""
    eps: list[list[int]] = field(default_factory=list)
    edges: list[list[tuple[int, int, int]]] = field(default_factory=list)
    calls: list[list[tuple[str, int]]] = field(default_factory=list)
    start: int = 0
    accept: int = 0

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise RegexError(f"pattern too large: its automaton needs more than {MAX_NFA_STATES} states "
                             f"(lower the counts of repetitions such as {{n,m}} or maxLength)")
        self.eps.append([])
        self.edges.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def prune(self, accepts=None) -> "NFA":
        """Drop the edges into states that cannot reach `accept` (a class with no code points, say); a rule
        set's NFA gives its rules' accepting states, and its calls count as edges to their return states."""
        rev: list[list[int]] = [[] for _ in self.eps]
        for s, ts in enumerate(self.eps):
            for t in ts:
                rev[t].append(s)
        for s, es in enumerate(self.edges):
            for _, _, t in es:
                rev[t].append(s)
        for s, cs in enumerate(self.calls):
            for _, t in cs:
                rev[t].append(s)
        live = set(accepts) if accepts is not None else {self.accept}
        stack = list(live)
        while stack:
            for s in rev[stack.pop()]:
                if s not in live:
                    live.add(s)
                    stack.append(s)
        # The pruned NFA is final (only read from here on): each state's lists become tuples, which the garbage
        # collector stops tracking once it has seen them -- a large pattern's ~1M lists made every later full
        # collection 0.4 s slower for as long as its guide stayed cached.
        if len(live) < len(self.eps):       # (usually every state is live: nothing to drop)
            self.eps = [[t for t in ts if t in live] for ts in self.eps]
            self.edges = [[e for e in es if e[2] in live] for es in self.edges]
            self.calls = [[c for c in cs if c[1] in live] for cs in self.calls]
        self.eps = [tuple(ts) for ts in self.eps]
        self.edges = [tuple(es) for es in self.edges]
        self.calls = [tuple(cs) for cs in self.calls]
        self.live = live
        return self


def _build(nfa: NFA, node, cache: dict) -> tuple[int, int]:
    """A fragment (entry, exit) for `node`."""
    kind = node[0]
    if kind == "set":
        a, z = nfa.new(), nfa.new()
        seqs = cache.get(node[1])
        if seqs is None:
            seqs = [s for lo, hi in node[1] for s in utf8_sequences(lo, hi)]
            cache[node[1]] = seqs
        tails: dict[tuple, int] = {}          # shared suffixes: remaining byte ranges -> their state

        def tail(rest: tuple) -> int:
            if not rest:
                return z
            t = tails.get(rest)
            if t is None:
                t = nfa.new()
                tails[rest] = t
                nfa.edges[t].append((rest[0][0], rest[0][1], tail(rest[1:])))
            return t

        for seq in seqs:
            nfa.edges[a].append((seq[0][0], seq[0][1], tail(tuple(seq[1:]))))
        return a, z
    if kind == "call":
        a, z = nfa.new(), nfa.new()
        nfa.calls[a].append((node[1], z))
        return a, z
    if kind == "cat":
        a = nfa.new()
        cur = a
        for child in node[1]:
            s, e = _build(nfa, child, cache)
            nfa.eps[cur].append(s)
            cur = e
        return a, cur
    if kind == "alt":
        a, z = nfa.new(), nfa.new()
        for child in node[1]:
            s, e = _build(nfa, child, cache)
            nfa.eps[a].append(s)
            nfa.eps[e].append(z)
        return a, z
    _, child, lo, hi = node
    a = nfa.new()
    cur = a
    template = None                          # the first copy's states: later copies are offset clones

    def copy() -> tuple[int, int]:
        nonlocal template
        if template is None:
            first = len(nfa.eps)
            s, e = _build(nfa, child, cache)
            # a snapshot: the copy's exit gets edges to what follows it, which clones must not inherit
            template = (first, s, e, [list(ts) for ts in nfa.eps[first:]], [list(es) for es in nfa.edges[first:]],
                        [list(cs) for cs in nfa.calls[first:]])
            return s, e
        first, s, e, eps, edges, calls = template   # a fragment's edges stay inside it: shift them
        off = len(nfa.eps) - first
        if len(nfa.eps) + len(eps) > MAX_NFA_STATES:
            nfa.new()                        # raises the "too large" error
        nfa.eps += [[t + off for t in ts] for ts in eps]
        nfa.edges += [[(lo_, hi_, t + off) for lo_, hi_, t in es] for es in edges]
        nfa.calls += [[(n, t + off) for n, t in cs] for cs in calls]
        return s + off, e + off

    for _ in range(lo):                      # the required copies
        s, e = copy()
        nfa.eps[cur].append(s)
        cur = e
    z = nfa.new()
    if hi is None:                           # then a loop
        s, e = copy()
        nfa.eps[cur] += [s, z]
        nfa.eps[e] += [s, z]
        return a, z
    for _ in range(hi - lo):                 # then optional copies, each one able to jump to the end
        s, e = copy()
        nfa.eps[cur] += [s, z]
        cur = e
    nfa.eps[cur].append(z)
    return a, z


def nfa_states_bound(node, memo: dict | None = None) -> int:
    """At least as many states as compile_nfa's Thompson construction builds for a parsed regex (it refuses more
    than MAX_NFA_STATES only after building them: seconds): counts of repetitions multiply. grammar.py's regex
    fallback checks it before handing a pattern on."""
    memo = {} if memo is None else memo
    k = node[0]
    if k == "set":
        if node[1] not in memo:
            memo[node[1]] = 2 + sum(len(q) - 1 for lo, hi in node[1] for q in utf8_sequences(lo, hi))
        return memo[node[1]]
    if k == "call":
        return 2
    if k in ("cat", "alt"):
        return 2 + sum(nfa_states_bound(x, memo) for x in node[1])
    _, child, lo, hi = node
    return 2 + nfa_states_bound(child, memo) * (lo + 1 if hi is None else max(hi, 1))


def compile_nfa(pattern: str) -> NFA:
    """The pruned byte-level NFA that matches the UTF-8 encodings of the strings `pattern` fully matches."""
    ast = parse(pattern)
    nfa = NFA()
    nfa.start, nfa.accept = _build(nfa, ast, {})
    return nfa.prune()


def repeat(atom: str, lo: int, hi: int | None) -> str:
    """The single regex atom ``atom`` repeated lo..hi times (hi None: unbounded)."""
    if hi is None:
        return atom + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
    if lo == hi:
        return "" if lo == 0 else atom if lo == 1 else f"{atom}{{{lo}}}"
    return atom + "?" if (lo, hi) == (0, 1) else f"{atom}{{{lo},{hi}}}"


def escape(text: str) -> str:
    """`text` as a pattern that matches it literally (re.escape's job, for the subset parsed here; characters
    that do not print are written as \\u / \\U escapes)."""
    return "".join("\\" + c if c in ".^$*+?{}[]()|\\/-" else c if c.isprintable() else
                   f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in text)
