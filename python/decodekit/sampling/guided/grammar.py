"""GBNF grammars (llama.cpp's format, which vLLM's guided_grammar takes with its xgrammar backend) -> what
the byte-level guide runs (``grammar_guide``): a rule set for the pushdown automaton (pda.py), or, for a
grammar left-recursive through other rules, a regular expression with the recursion unrolled (regex.py /
automaton.py).

Syntax: rules ``name ::= expression`` (names of letters, digits, ``-`` and ``_``; a rule may span lines: the
next one starts at the next ``name ::=``); ``root`` is the start rule. Expressions: string literals
``"..."`` (escapes ``\\n \\r \\t \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH``), character classes ``[a-z0-9_]`` and
``[^...]`` (the same escapes, plus ``\\] \\- \\^``), ``.`` (any character), rule references, ``( ... )``,
alternatives ``|``, repetition ``* + ?`` and ``{m}`` ``{m,}`` ``{m,n}`` ``{,n}``; comments from ``#`` to the
end of the line.

``grammar_to_rules``: each rule reached from root becomes one pattern of the rule set, its references calls
``(?&name)``; recursion then has no depth bound (each nesting depth an output reaches costs new automaton
states and masks once) and the rule set is as large as the grammar. Direct left recursion becomes repetition
(``list ::= list "," item | item`` is ``item ("," item)*``), and left recursion through other rules
(``a ::= b "x" | "y"``, ``b ::= a "z"``) is inlined away as Paull's algorithm does; a rule that can still
call itself before reading a character (behind a nullable item: ``a ::= n a "x" | "y"``, ``n ::= "q"?``)
would grow the stack forever: such a grammar falls back to ``grammar_to_regex``.

``grammar_to_regex``: a context-free grammar is more than a regular expression: recursive rules are unrolled. The references that
close a cycle of the rule graph in a depth-first walk from root (e.g. a JSON grammar's object -> value and
array -> value, an arithmetic grammar's factor -> expr) each cost one level, and at most ``max_depth``
levels are open on any path; deeper branches are cut, so the guide accepts only outputs that nest at most
that deep: a subset of the grammar's language, never a string outside it. The depth starts at MAX_DEPTH and
comes down until the regex fits MAX_REGEX_CHARS (60k characters, under a second to compile against a 49k
vocabulary) and its automaton regex.py's MAX_NFA_STATES (counts multiply: root{4} inside root). Each level
inlines the recursive rules again, so the regex grows about 4x per level: llama.cpp's JSON grammar fits 3
containers deep (the top-level object and two nested), a four-rule arithmetic grammar 4 parentheses deep. A grammar that does not fit at depth 0 raises GrammarError.
"""
from __future__ import annotations

import sys

from .pda import LeftRecursionError, RuleSet, RuleSetError, compile_rules
from .regex import MAX_CODEPOINT, MAX_NFA_STATES, RegexError, escape, negate, nfa_states_bound, repeat
from .regex import parse as parse_regex

MAX_GRAMMAR_CHARS = 100_000
MAX_DEPTH = 24
MAX_REGEX_CHARS = 60_000
MAX_RULES_CHARS = 200_000  # a rule set's patterns, all together (no inlining: about the grammar's size)
MAX_REPEAT = 1000
MAX_NESTING = 100          # parentheses inside one rule


class GrammarError(ValueError):
    pass


class _TooBig(Exception):
    pass


# AST: ("lit", str) | ("cls", negated, [(lo, hi)]) | ("any",) | ("ref", name, offset) | ("seq", [items])
#      | ("alt", [items]) | ("rep", item, lo, hi|None)
class _Parser:
    def __init__(self, text: str):
        self.s, self.i = text, 0
        self.depth = 0

    def error(self, msg: str, at: int | None = None):
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        raise GrammarError(f"{msg} at line {line}, column {col}")

    def ws(self) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "#":
                j = s.find("\n", self.i)
                self.i = len(s) if j < 0 else j
            elif c in " \t\r\n":
                self.i += 1
            else:
                return

    def name(self) -> str:
        j = self.i
        while j < len(self.s) and (self.s[j].isascii() and (self.s[j].isalnum() or self.s[j] in "-_")):
            j += 1
        if j == self.i:
            self.error("expected a rule name")
        n, self.i = self.s[self.i:j], j
        return n

    def at_rule_start(self) -> bool:
        """Is the text at the cursor `name ::=` (the next rule)?"""
        save = self.i
        try:
            self.name()
            self.ws()
            return self.s.startswith("::=", self.i)
        except GrammarError:
            return False
        finally:
            self.i = save

    def rules(self) -> dict:
        rules: dict = {}
        self.ws()
        while self.i < len(self.s):
            start = self.i
            n = self.name()
            self.ws()
            if not self.s.startswith("::=", self.i):
                self.error(f"expected '::=' after rule name {n!r}")
            self.i += 3
            if n in rules:
                self.error(f"rule {n!r} is defined twice", start)
            rules[n] = self.alt(top=True)
            self.ws()
        return rules

    def alt(self, top: bool = False):
        alts = [self.seq(top)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            alts.append(self.seq(top))
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def seq(self, top: bool):
        items = []
        while True:
            self.ws()
            if self.i >= len(self.s):
                break
            c = self.s[self.i]
            if c in "|)" or (top and self.at_rule_start()):
                break
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else ("seq", items)

    def atom(self):
        s, c = self.s, self.s[self.i]
        if c == '"':
            self.i += 1
            out = []
            while True:
                if self.i >= len(s):
                    self.error("unterminated string literal")
                c = s[self.i]
                if c == '"':
                    self.i += 1
                    return ("lit", "".join(out))
                out.append(self.char())
        if c == "[":
            self.i += 1
            neg = self.i < len(s) and s[self.i] == "^"
            self.i += neg
            ranges = []
            while True:
                if self.i >= len(s):
                    self.error("unterminated character class")
                if s[self.i] == "]":
                    self.i += 1
                    break
                lo = self.char(in_class=True)
                hi = lo
                if self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]":
                    self.i += 1
                    hi = self.char(in_class=True)
                if ord(hi) < ord(lo):
                    self.error(f"bad character range {lo!r}-{hi!r}")
                ranges.append((ord(lo), ord(hi)))
            if not ranges and not neg:
                self.error("empty character class")
            return ("cls", neg, ranges)
        if c == ".":
            self.i += 1
            return ("any",)
        if c == "(":
            if self.depth >= MAX_NESTING:
                self.error(f"parentheses nested more than {MAX_NESTING} deep")
            self.i += 1
            self.depth += 1
            inner = self.alt()
            self.depth -= 1
            self.ws()
            if self.i >= len(s) or s[self.i] != ")":
                self.error("expected ')'")
            self.i += 1
            return inner
        if c.isascii() and (c.isalnum() or c in "-_"):
            at = self.i
            return ("ref", self.name(), at)
        self.error(f"unexpected {c!r}")

    def char(self, in_class: bool = False) -> str:
        s = self.s
        c = s[self.i]
        if c != "\\":
            if in_class and c == "\n":
                self.error("newline in a character class")
            self.i += 1
            return c
        if self.i + 1 >= len(s):
            self.error("dangling backslash")
        e = s[self.i + 1]
        simple = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^",
                  "'": "'", "/": "/", "0": "\0"}
        if e in simple:
            self.i += 2
            return simple[e]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is None:
            self.error(f"unknown escape \\{e}")
        digits = s[self.i + 2:self.i + 2 + width]
        if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            self.error(f"\\{e} needs {width} hex digits")
        cp = int(digits, 16)
        if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            self.error(f"\\{e}{digits} is not a Unicode scalar value")
        self.i += 2 + width
        return chr(cp)

    def postfix(self, item):
        s = self.s
        ops = 0
        while True:
            j = self.i          # spaces may come before an operator (not a newline: the next line may start a rule)
            while j < len(s) and s[j] in " \t":
                j += 1
            if j >= len(s) or s[j] not in "*+?{":
                break
            self.i = j
            c = s[self.i]
            ops += 1
            if ops > MAX_NESTING:
                self.error(f"more than {MAX_NESTING} repetition operators in a row")
            if c in "*+?":
                self.i += 1
                item = ("rep", item, 1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                j = s.find("}", self.i)
                if j < 0:
                    self.error("unterminated repetition '{'")
                lo_s, comma, hi_s = (x.strip() for x in s[self.i + 1:j].partition(","))
                if not all(x.isascii() and x.isdigit() for x in (lo_s, hi_s) if x) or not (lo_s or comma):
                    self.error("bad repetition: expected {m}, {m,}, {m,n} or {,n}")
                lo = int(lo_s or 0)
                hi = (int(hi_s) if hi_s else None) if comma else lo
                if lo < 0 or (hi is not None and hi < lo) or max(lo, hi or 0) > MAX_REPEAT:
                    self.error(f"repetition bounds must satisfy 0 <= m <= n <= {MAX_REPEAT}")
                self.i = j + 1
                item = ("rep", item, lo, hi)
        return item


def _rule_refs(node, out: dict) -> dict:
    """The rule names a rule body refers to, each with its first offset in the text (added to `out`); a walk
    with its own stack (a chain of postfix operators nests the AST as deep as it is long)."""
    todo = [node]
    while todo:
        n = todo.pop()
        k = n[0]
        if k == "ref":
            out.setdefault(n[1], n[2])
        elif k in ("seq", "alt"):
            todo += reversed(n[1])
        elif k == "rep":
            todo.append(n[1])
    return out


def parse_grammar(text: str) -> dict:
    """{rule name: AST}; GrammarError (with line and column) on a syntax error, an undefined rule or no root."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("the grammar must be a non-empty string of GBNF rules (root ::= ...)")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar has {len(text)} characters, more than {MAX_GRAMMAR_CHARS}")
    p = _Parser(text)
    rules = p.rules()
    if "root" not in rules:
        raise GrammarError("the grammar has no 'root' rule (the start rule)")

    for n, body in rules.items():
        refs: dict = {}
        _rule_refs(body, refs)
        missing = [(at, name) for name, at in refs.items() if name not in rules]
        if missing:
            at, name = min(missing)
            p.error(f"rule {n!r} refers to undefined rule {name!r}", at)
    return rules


def _back_edges(rules: dict, refs: dict) -> set:
    """Edges (rule, referenced rule) that close a cycle in a depth-first walk from root (then from the other
    rules): every cycle of the rule graph holds one, and they depend only on the grammar."""
    back, state = set(), {}          # state: 1 on the walk's stack, 2 done
    for start in ["root"] + sorted(rules):
        if start in state:
            continue
        state[start] = 1
        work = [(start, iter(sorted(refs[start])))]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                state[v] = 2
                work.pop()
            elif state.get(w) == 1:
                back.add((v, w))
            elif w not in state:
                state[w] = 1
                work.append((w, iter(sorted(refs[w]))))
    return back


def _class_regex(ranges) -> str:
    """One character out of the code point ranges (escape() writes class metacharacters escaped too)."""
    return "[" + "".join(escape(chr(lo)) if lo == hi else f"{escape(chr(lo))}-{escape(chr(hi))}"
                         for lo, hi in ranges) + "]"


ANY = ((0, MAX_CODEPOINT),)


class _Emitter:
    def __init__(self, rules: dict, depth: int | None):
        self.rules, self.depth = rules, depth       # depth None: references are rule calls (?&name)
        self.refs = {n: set(_rule_refs(b, {})) for n, b in rules.items()}
        self.back = _back_edges(rules, self.refs)
        self.memo: dict = {}

    def rule(self, name: str, level: int) -> str | None:
        key = (name, level)
        if key not in self.memo:
            self.memo[key] = None       # a cycle reached at the same level (no progress) matches nothing
            r = self.node(self.rules[name], name, level)
            self.memo[key] = r
            if r is not None and len(r) > MAX_REGEX_CHARS:   # the root holds it: too big already
                raise _TooBig
        return self.memo[key]

    def node(self, n, rule: str, level: int) -> str | None:
        k = n[0]
        if k == "lit":
            return escape(n[1])
        if k == "cls":
            ranges = negate(n[2]) if n[1] else n[2]
            return _class_regex(ranges) if ranges else None     # [^ everything ]: no character
        if k == "any":
            return _class_regex(ANY)
        if k == "ref":
            target = n[1]
            if self.depth is None:
                return f"(?&{target})"
            nxt = level + 1 if (rule, target) in self.back else level
            if nxt > self.depth:
                return None
            r = self.rule(target, nxt)
            return None if r is None else (f"(?:{r})" if r else "")
        if k == "seq":
            parts = []
            for x in n[1]:
                r = self.node(x, rule, level)
                if r is None:
                    return None
                parts.append(r)
            return "".join(parts)
        if k == "alt":
            parts = [r for r in (self.node(x, rule, level) for x in n[1]) if r is not None]
            if not parts:
                return None
            return f"(?:{'|'.join(parts)})" if len(parts) > 1 else parts[0]
        if k == "rep":
            inner, lo, hi = self.node(n[1], rule, level), n[2], n[3]
            if inner is None:
                return "" if lo == 0 else None
            return "" if inner == "" else repeat(f"(?:{inner})", lo, hi)
        raise AssertionError(k)


NEVER = "[^\\x00-\\U0010FFFF]"       # a rule body that can match nothing


def _unleft(name: str, body):
    """A rule's body with its direct left recursion turned into repetition: A ::= A a1 | ... | A an | b1 | ... | bm
    is A ::= (b1 | ... | bm) (a1 | ... | an)*, the same language (`list ::= list ", " item | item` becomes
    item (", " item)*). Bodies that recurse on the left otherwise (inside a group, after a nullable item, or
    only through other rules) are left as they are (the rule set then refuses them: the regex fallback)."""
    branches = body[1] if body[0] == "alt" else [body]
    alphas, betas, bare = [], [], False
    for b in branches:
        items = b[1] if b[0] == "seq" else [b]
        if items and items[0][0] == "ref" and items[0][1] == name:
            rest = items[1:]
            if rest:
                alphas.append(rest[0] if len(rest) == 1 else ("seq", rest))
            else:
                bare = True                             # A ::= A | ...: that branch adds nothing
        else:
            betas.append(b)
    if not betas or not (alphas or bare):
        return body
    one = lambda xs: xs[0] if len(xs) == 1 else ("alt", xs)    # noqa: E731
    if not alphas:
        return one(betas)
    tail = ("rep", one(alphas), 0, None)        # b1 a* | ... | bm a*: each branch still shows what it starts with
    return one([("seq", (b[1] if b[0] == "seq" else [b]) + [tail]) for b in betas])


MAX_INLINED_BRANCHES = 256       # _inline_left: a rule's alternatives after substitution, at most


def _branches(body) -> list:
    return list(body[1]) if body[0] == "alt" else [body]


def _items(branch) -> list:
    return list(branch[1]) if branch[0] == "seq" else [branch]


def _lead(branch):
    """The rule a branch starts with (a plain reference as its first item), else None."""
    it = _items(branch)
    return it[0][1] if it and it[0][0] == "ref" else None


def _inline_left(rules: dict, order: list) -> dict:
    """Left recursion through other rules removed as Paull's algorithm does, for the rules on a cycle of
    leading references: in order, each such rule gets the earlier ones on its cycle inlined where a branch
    starts with them, then its direct left recursion becomes repetition (_unleft). Inlining keeps the
    language; recursion on the left that this does not reach (behind a nullable item, inside a group) stays,
    and the caller falls back. Unchanged when a rule would grow past MAX_INLINED_BRANCHES alternatives."""
    leads = {n: {_lead(b) for b in _branches(rules[n])} - {None} for n in order}
    reach = {}
    for n in order:
        seen, todo = set(), list(leads[n])
        while todo:
            m = todo.pop()
            if m not in seen and m in leads:
                seen.add(m)
                todo += leads[m]
        reach[n] = seen
    out, done = dict(rules), []
    for a in order:
        if a not in reach[a]:
            continue
        for b in done:
            if b in reach[a] and a in reach[b]:             # on one cycle
                new = []
                for br in _branches(out[a]):
                    if _lead(br) != b:
                        new.append(br)
                        continue
                    rest = _items(br)[1:]
                    for d in _branches(out[b]):
                        its = _items(d) + rest
                        new.append(its[0] if len(its) == 1 else ("seq", its))
                if len(new) > MAX_INLINED_BRANCHES:
                    return rules
                out[a] = new[0] if len(new) == 1 else ("alt", new)
        out[a] = _unleft(a, out[a])
        done.append(a)
    return out


def grammar_to_rules(text: str, inline_left: bool = False) -> RuleSet:
    """The grammar as a rule set for the pushdown guide (pda.py): root first, then the rules it reaches; each
    body a regex with its references as calls, direct left recursion turned into repetition (_unleft), and
    with inline_left, left recursion through other rules inlined first (_inline_left). RuleSetError (left
    recursion that remains) / GrammarError."""
    def reached(rules) -> list:         # root, then the rules it reaches
        order, work = ["root"], ["root"]
        while work:
            for m in sorted(_rule_refs(rules[work.pop()], {})):
                if m not in order:
                    order.append(m)
                    work.append(m)
        return order

    rules = parse_grammar(text)
    rules = {n: _unleft(n, b) for n, b in rules.items()}
    if inline_left:
        rules = _inline_left(rules, reached(rules))
    order = reached(rules)             # (inlining may leave a rule unreferenced)
    em = _Emitter(rules, None)
    out = []
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        for n in order:
            r = em.node(rules[n], n, 0)
            out.append((n, NEVER if r is None else r))
    except RecursionError:
        raise GrammarError("the grammar's expressions nest too deeply") from None
    finally:
        sys.setrecursionlimit(old)
    rs = RuleSet(tuple(out))
    if rs.chars > MAX_RULES_CHARS:
        raise GrammarError(f"the grammar's rules have {rs.chars} characters of pattern, more than {MAX_RULES_CHARS}")
    try:
        compile_rules(rs)
    except LeftRecursionError:
        raise
    except RuleSetError as e:
        raise GrammarError(str(e)) from None
    except RegexError as e:
        raise GrammarError(f"the grammar does not fit the guide: {e}") from None
    return rs


def grammar_guide(text: str):
    """What the guide runs for a GBNF grammar: its rule set (recursion unbounded), or, for a left-recursive
    grammar, its regex with the recursion unrolled (grammar_to_regex)."""
    try:
        return grammar_to_rules(text)
    except LeftRecursionError:
        pass
    try:
        return grammar_to_rules(text, inline_left=True)
    except LeftRecursionError:
        return grammar_to_regex(text)


def grammar_to_regex(text: str, max_depth: int | None = None) -> str:
    """The regex of a GBNF grammar's root rule, recursion unrolled (see the module docstring)."""
    rules = parse_grammar(text)
    depths = [max_depth] if max_depth is not None else list(range(MAX_DEPTH, -1, -1))
    last = f"its regex is longer than {MAX_REGEX_CHARS} characters"
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        for d in depths:
            try:
                em = _Emitter(rules, d)
                r = em.rule("root", 0)
            except _TooBig:
                last = f"its regex is longer than {MAX_REGEX_CHARS} characters"
                continue
            except RecursionError:
                last = "its rules refer to one another too deeply"
                continue
            if r is None:
                raise GrammarError("the grammar matches nothing within the recursion bound (does every "
                                   "recursive rule have a way out?)")
            if len(r) <= MAX_REGEX_CHARS:
                try:
                    ast = parse_regex(r)    # within the guide's regex bounds (group nesting, size)
                except RegexError as e:
                    last = f"its regex is beyond the guide's bounds ({e})"
                    continue
                if nfa_states_bound(ast) <= MAX_NFA_STATES:    # and its automaton's (counts multiply)
                    return r
                last = f"its automaton needs more than {MAX_NFA_STATES} states"
                continue
            last = f"its regex is longer than {MAX_REGEX_CHARS} characters"
    finally:
        sys.setrecursionlimit(old)
    raise GrammarError(f"the grammar does not fit the guide even with its recursion unrolled 0 levels deep: {last} "
                       f"(too many or too large rules, or rules nested too deeply)")


__all__ = ["GrammarError", "grammar_guide", "grammar_to_regex", "grammar_to_rules", "parse_grammar", "RegexError"]
