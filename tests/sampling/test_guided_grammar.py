"""GBNF grammars (sampling/guided/grammar.py) -> the pushdown guide (rule sets, guided/pda.py) and, for
left-recursive grammars, the unrolled regex. The pushdown automaton accepts exactly the grammar's language
(an independent recognizer over the parsed rules is the oracle) on strings derived from the grammar at
random - also far deeper than the regex's bound - and mutated; every string the regex fully matches is in
the language and strings nesting within its promised depth match; syntax errors give line and column;
escapes, classes, repetition bounds and left recursion behave."""
from __future__ import annotations

import random
import re
import zlib

import pytest

from decodekit.sampling.guided import DEAD, RuleSet
from decodekit.sampling.guided.grammar import GrammarError, grammar_guide, grammar_to_regex, grammar_to_rules, parse_grammar
from decodekit.sampling.guided.pda import LazyPDA, LeftRecursionError, compile_rules
from decodekit.sampling.guided.regex import parse as parse_regex

ARITH = r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*   # products
factor ::= [0-9]+ | "(" expr ")"
'''
JSON = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''
LIST = 'root ::= list "."\nlist ::= list ", " item | item\nitem ::= [a-z]{1,3}'
MISC = r'''root ::= greet " " name{1,2} tail?
greet ::= "h\x69" | "\u00e9t\u00E9" | [A-C]
name ::= [^ \n.0-9] .
tail ::= "!"{2,} | "?"{,2}'''
GRAMMARS = {"arith": ARITH, "json": JSON, "list": LIST, "misc": MISC}


class Recognizer:
    """The grammar's language, straight from the rules: end positions of each node from each position
    (memoized; a rule re-entered at the same position without consuming input contributes nothing, which
    loses no string of a grammar whose every cycle consumes input... except left recursion, handled by
    iterating to a fixed point)."""

    def __init__(self, rules):
        self.rules = rules

    def accepts(self, s: str) -> bool:
        self.s, self.memo = s, {}
        while True:                      # left recursion: grow rule results until nothing changes
            before = {k: set(v) for k, v in self.memo.items()}
            self.active = set()
            got = self.ref("root", 0)
            if {k: set(v) for k, v in self.memo.items()} == before:
                return len(s) in got

    def ref(self, name, i):
        key = (name, i)
        if key in self.active:
            return self.memo.get(key, set())
        self.active.add(key)
        res = self.node(self.rules[name], i)
        self.memo[key] = self.memo.get(key, set()) | res
        self.active.discard(key)
        return self.memo[key]

    def node(self, n, i):
        s, k = self.s, n[0]
        if k == "lit":
            return {i + len(n[1])} if s.startswith(n[1], i) else set()
        if k == "cls":
            if i >= len(s):
                return set()
            inside = any(lo <= ord(s[i]) <= hi for lo, hi in n[2])
            return {i + 1} if inside != n[1] else set()
        if k == "any":
            return {i + 1} if i < len(s) else set()
        if k == "ref":
            return self.ref(n[1], i)
        if k == "seq":
            cur = {i}
            for x in n[1]:
                cur = set().union(*(self.node(x, p) for p in cur)) if cur else set()
            return cur
        if k == "alt":
            return set().union(*(self.node(x, i) for x in n[1]))
        if k == "rep":
            item, lo, hi = n[1], n[2], n[3]
            out, cur, count = set(), {i}, 0
            seen = set()
            while cur and (hi is None or count <= hi):
                if count >= lo:
                    out |= cur
                if hi is not None and count == hi:
                    break
                nxt = set().union(*(self.node(item, p) for p in cur))
                count += 1
                if count >= lo:   # positions seen before at a count past lo add nothing new
                    nxt -= seen
                seen |= cur
                cur = nxt
            return out
        raise AssertionError(k)


def derive(rules, rng: random.Random, name="root", budget=None, max_depth=12) -> str:
    """A random string of the grammar (expansions chosen at random, the shortest alternatives once the
    budget runs low or past max_depth references)."""
    budget = budget if budget is not None else [60]

    def go(n, depth):
        k = n[0]
        budget[0] -= 1
        if k == "lit":
            return n[1]
        if k == "cls":
            if n[1]:
                while True:
                    c = chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x3000)]))
                    if not any(lo <= ord(c) <= hi for lo, hi in n[2]):
                        return c
            lo, hi = rng.choice(n[2])
            return chr(rng.randint(lo, hi))
        if k == "any":
            return chr(rng.randrange(32, 127))
        if k == "ref":
            return go(rules[n[1]], depth + 1)
        if k == "seq":
            return "".join(go(x, depth) for x in n[1])
        if k == "alt":
            opts = n[1]
            if budget[0] < 0 or depth > max_depth:   # prefer alternatives without references
                plain = [x for x in opts if "ref" not in repr(x)]
                # (else the fewest references: `list ::= list ", " item | item` must end with `item`)
                opts = plain or [min(opts, key=lambda x: repr(x).count("'ref'"))]
            return go(rng.choice(opts), depth)
        if k == "rep":
            lo, hi = n[2], n[3]
            m = lo if budget[0] < 0 else rng.randint(lo, lo + 3 if hi is None else min(hi, lo + 3))
            return "".join(go(n[1], depth) for _ in range(m))
        raise AssertionError(k)
    return go(rules[name], 0)


def mutate(s: str, rng: random.Random) -> str:
    if not s:
        return rng.choice(["a", "(", "{"])
    i = rng.randrange(len(s))
    op = rng.randrange(3)
    if op == 0:
        return s[:i] + s[i + 1:]
    if op == 1:
        return s[:i] + rng.choice('(){}[]",:1a .-+*!?') + s[i:]
    return s[:i] + rng.choice('(){}[]",:1a .') + s[i + 1:]


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_regex_matches_only_grammar_strings(name):
    rules = parse_grammar(GRAMMARS[name])
    rx = re.compile(grammar_to_regex(GRAMMARS[name]))
    rec = Recognizer(rules)
    rng = random.Random(zlib.crc32(name.encode()))  # (str hash() differs per process)
    matched = 0
    for _ in range(150):
        s = derive(rules, rng)
        assert rec.accepts(s), (name, s)           # the oracle itself agrees with the derivation
        for t in (s, mutate(s, rng), mutate(mutate(s, rng), rng)):
            if rx.fullmatch(t):
                matched += 1
                assert rec.accepts(t), (name, t)   # sound: never a string outside the language
    assert matched >= 100


def _pda_accepts(pda: LazyPDA, s: str) -> bool:
    sid = pda.step(pda.start, s.encode("utf-8"))
    return sid != DEAD and pda.is_accepting(sid)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_pushdown_guide_accepts_exactly_the_language(name):
    rules = parse_grammar(GRAMMARS[name])
    g = grammar_guide(GRAMMARS[name])               # (list's direct left recursion becomes repetition)
    assert isinstance(g, RuleSet) and g.rules[0][0] == "root"
    pda = LazyPDA(compile_rules(g))
    rec = Recognizer(rules)
    rng = random.Random(zlib.crc32(b"pda-" + name.encode()))
    inside = outside = 0
    for i in range(120):
        s = derive(rules, rng, budget=[60 if i % 2 else 400], max_depth=12 if i % 3 else 40)
        assert rec.accepts(s) and _pda_accepts(pda, s), (name, s)
        for t in (mutate(s, rng), mutate(mutate(s, rng), rng)):
            ok = rec.accepts(t)
            inside, outside = inside + ok, outside + (not ok)
            assert _pda_accepts(pda, t) == ok, (name, t, ok)
    assert outside >= 50
    # each prefix of an accepted string leaves the automaton alive; a rejected byte kills it
    s = derive(rules, rng, budget=[200], max_depth=30)
    sid = pda.start
    for b in s.encode("utf-8"):
        sid = pda.step(sid, bytes([b]))
        assert sid != DEAD


@pytest.mark.parametrize("grammar, deep, bad", [
    (ARITH, ["(" * 60 + "7" + ")" * 60, "1+(2*(3-(4/(5+(6*(7-(8/(9))))))))"],
     ["(" * 60 + "7" + ")" * 59, "(1+)"]),
    (JSON, ['{"a": ' * 40 + "1" + "}" * 40, '{"a": [' + "[" * 50 + "]" * 50 + '], "b": {"c": [{"d": null}]}}'],
     ['{"a": ' * 40 + "1" + "}" * 39, '{"a": [[[1]]}']),
])
def test_pushdown_guide_nests_past_the_regex_bound(grammar, deep, bad):
    pda = LazyPDA(compile_rules(grammar_guide(grammar)))
    rec = Recognizer(parse_grammar(grammar))
    rx = re.compile(grammar_to_regex(grammar))
    for s in deep:
        assert rec.accepts(s) and _pda_accepts(pda, s) and not rx.fullmatch(s), s
    for s in bad:
        assert not rec.accepts(s) and not _pda_accepts(pda, s), s


@pytest.mark.parametrize("grammar, ok, bad", [
    ('root ::= e\ne ::= e ("+" | "-") t | t | e\nt ::= t "*" f | f\nf ::= [0-9] | "(" e ")"',
     ["1", "1+2*3-4", "(" * 30 + "1*2" + ")" * 30, "((1+2)*3)"], ["1+", "+1", "1**2", "(1"]),
    ('root ::= x ";"\nx ::= x "a" | x "b" "c" | "d" | "e" x', ["d;", "dabc;", "edaa;", "eedbcbc;"], ["da", "db;", ";"]),
])
def test_direct_left_recursion_becomes_repetition(grammar, ok, bad):
    """A ::= A a | b is A ::= b a* (the same language): left-recursive expression grammars get the pushdown
    guide, nesting without a bound; a rule reached again only through other rules still falls back to the
    unrolled regex (RuleSet refuses it: LeftRecursionError)."""
    g = grammar_guide(grammar)
    assert isinstance(g, RuleSet)
    pda, rec = LazyPDA(compile_rules(g)), Recognizer(parse_grammar(grammar))
    for s in ok:
        assert rec.accepts(s) and _pda_accepts(pda, s), s
    for s in bad:
        assert not rec.accepts(s) and not _pda_accepts(pda, s), s
    # through other rules: inlined away (Paull's algorithm); behind a nullable item: the unrolled regex
    for indirect, ok, bad in [('root ::= a\na ::= b "x" | "y"\nb ::= a "z"', ["y", "yzx", "yzxzx"], ["yz", "x"]),
                              ('root ::= a ";"\na ::= b "1" | c "2" | "0"\nb ::= c "3" | a "4"\nc ::= a "5" | b "6" | "7"',
                               ["0;", "72;", "041;", "0" + "41" * 30 + ";", "731;", "052;", "0" + "52" * 20 + ";"], ["04;", "1;", "7;"])]:
        with pytest.raises(LeftRecursionError):
            grammar_to_rules(indirect)
        g = grammar_guide(indirect)
        assert isinstance(g, RuleSet)
        pda, rec = LazyPDA(compile_rules(g)), Recognizer(parse_grammar(indirect))
        for s in ok + bad:
            assert _pda_accepts(pda, s) == rec.accepts(s) == (s not in bad), s
        rng = random.Random(zlib.crc32(indirect.encode()))
        for _ in range(300):                        # random strings over the grammar's characters
            s = "".join(rng.choice("01234567;xyz") for _ in range(rng.randrange(1, 9)))
            assert _pda_accepts(pda, s) == rec.accepts(s), s
    nullable = 'root ::= a\na ::= n a "x" | "y"\nn ::= "q"?'
    assert isinstance(grammar_guide(nullable), str)
    with pytest.raises(LeftRecursionError, match="list -> list"):
        compile_rules(RuleSet((("root", "(?&list)"), ("list", "(?&list), x|x"))))


def test_pushdown_rule_calls():
    """Tail calls push nothing (a right-recursive list 5000 items long keeps one frame); nullable rules and
    calls at a rule's end; rules deriving nothing are dropped; undefined calls are named."""
    rs = RuleSet((("root", "(?&items)"), ("items", "[a-z](?:,(?&items))?")))
    pda = LazyPDA(compile_rules(rs))
    sid = pda.step(pda.start, b"a," * 5000 + b"b")
    assert pda.is_accepting(sid) and len(pda.nodes) < 50
    rs = RuleSet((("root", "x(?&opt)(?&opt)y"), ("opt", "(?:z(?&opt))?"), ("dead", "q(?&dead)")))
    pda = LazyPDA(compile_rules(rs))
    for s, ok in [("xy", True), ("xzy", True), ("xzzzzy", True), ("xzq", False), ("x", False)]:
        assert _pda_accepts(pda, s) == ok, s
    with pytest.raises(GrammarError, match="undefined rule 'b'"):
        grammar_guide('root ::= "a" b')
    with pytest.raises(Exception, match="calls undefined rule 'nope'"):
        compile_rules(RuleSet((("root", "a(?&nope)"),)))
    with pytest.raises(GrammarError, match="matches nothing"):
        grammar_guide('root ::= "a" loop\nloop ::= "b" loop')
    # a 300-rule chain: far past the unrolled regex's bounds, a rule set as big as the grammar
    chain = "root ::= r0\n" + "\n".join(f'r{i} ::= "x" r{i + 1} | "y"' for i in range(300)) + '\nr300 ::= "z"'
    pda = LazyPDA(compile_rules(grammar_guide(chain)))
    assert _pda_accepts(pda, "x" * 300 + "z") and _pda_accepts(pda, "xxy") and not _pda_accepts(pda, "x" * 301 + "z")
    # 3000 rules, each productive only through the next (the worklist finds them in one pass, not 3000)
    chain = "root ::= r0\n" + "\n".join(f'r{i} ::= "x" r{i + 1} "w"?' for i in range(3000)) + '\nr3000 ::= "z"'
    pda = LazyPDA(compile_rules(grammar_guide(chain)))
    assert _pda_accepts(pda, "x" * 3000 + "z" + "w" * 7) and not _pda_accepts(pda, "x" * 2999 + "z")


@pytest.mark.parametrize("grammar, n", [
    ('root ::= "a" (r2? "a")+\nr2 ::= root+', 2000),             # a{2,}, parses that differ in depth
    ('root ::= x*\nx ::= "a" | "a" x | "a" x "b"', 3000),       # the b's owed: a count to remember
])
def test_ambiguous_grammars_merge_their_stacks(grammar, n):
    """Parses that reach the same state share one graph-structured stack: the stack sets of these grammars grew
    5x per character (2000 'a's: ~10^1400 stacks) or by one per character before; now each state holds a few
    entries. The second grammar's language is a^n b^m with m < n (for n >= 1), checked at its edges."""
    pda = LazyPDA(compile_rules(grammar_guide(grammar)))
    sid = pda.start
    for i in range(n):
        sid = pda.step(sid, b"a")
        assert sid != DEAD
    assert pda.is_accepting(sid) and max(len(x) for x in pda.sets) < 10
    if "b" in grammar:
        rec = Recognizer(parse_grammar(grammar))
        for s in ("aab", "aabb", "ab", "aaabb", "b", "aaba"):
            assert _pda_accepts(pda, s) == rec.accepts(s), s
        end = pda.step(sid, b"b" * (n - 1))
        assert pda.is_accepting(end) and pda.step(end, b"b") == DEAD


@pytest.mark.parametrize("grammar, ok, too_deep", [
    (ARITH, ["1", "2+3*(4-5)", "((((7))))", "(1+(2*(3/(4))))"], ["(((((7)))))"]),
    (JSON, ['{}', '{"a": [1, {"b": null}], "c": "x\\n"}', '{"a": {"b": [true]}}', '{"a":-1.5e+3}',
            '{"a": {"b": {"c": 1}}}'],
     ['{"a": {"b": {"c": {"d": 1}}}}', '{"a": [[[1]]]}']),
    (LIST, ["a.", "ab, c, def, g."], []),
])
def test_depth_promised(grammar, ok, too_deep):
    rx = re.compile(grammar_to_regex(grammar))
    rec = Recognizer(parse_grammar(grammar))
    for s in ok:
        assert rx.fullmatch(s), s
    for s in too_deep:   # in the language, past the unrolled depth
        assert rec.accepts(s) and not rx.fullmatch(s), s


def test_misc_syntax():
    rx = re.compile(grammar_to_regex(MISC))
    for s in ["hi ab", "\u00e9t\u00e9 xyzw!!!", "B zz??", "hi q\n"]:
        assert rx.fullmatch(s), repr(s)
    for s in ["hi 1a", "hi ab!", "hi .a", "D ab", "hi ab!?!"]:
        assert not rx.fullmatch(s), repr(s)
    parse_regex(grammar_to_regex(MISC))       # within the engine's regex subset
    assert re.fullmatch(grammar_to_regex('root ::= [\\]\\-^a]+ "\\"\\\\"'), '-]^a"\\')


@pytest.mark.parametrize("text, where", [
    ('root ::= "a', "unterminated string"), ("x ::= 'a'", "line 1"), ('x ::= "a"', "no 'root'"),
    ('root ::= "a"\n  | foo', "undefined rule 'foo' at line 2, column 5"),
    ("root ::= " + "(" * 150 + '"a"' + ")" * 150, "nested more than 100 deep"), ('root ::= [z-a]', "bad character range"),
    ('root ::= "a"{3,2}', "repetition bounds"), ("root ::= r0\n" + "\n".join(f'r{i} ::= "x" r{i + 1} | "y"' for i in range(300)) + '\nr300 ::= "z"',
                                                   "bounds"), ('root ::= "a"{x}', "bad repetition"),
    ('root ::= "a" {', "unterminated repetition"), ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\ud800"', "not a Unicode scalar"), ('root ::= ("a"', "expected ')'"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"), ('root ::= root "a"', "matches nothing"),
    ('root ::= "a"\n  b ::= )', "line 2"), ('root ::= "a"' + "?" * 150, "repetition operators in a row"), ("", "non-empty"), ('root ::= []', "empty character class"),
])
def test_errors_say_where(text, where):
    with pytest.raises(GrammarError) as e:
        grammar_to_regex(text)
    assert where in str(e.value), str(e.value)


def test_too_large_is_refused():
    big = "root ::= " + " ".join(f"r{i}" for i in range(250)) + "\n" + "\n".join(
        f"r{i} ::= " + " | ".join(f'"{i}-{j}-' + "x" * 30 + '"' for j in range(8)) for i in range(250))
    assert len(big) < 100_000
    with pytest.raises(GrammarError, match="longer than 60000"):
        grammar_to_regex(big)


@pytest.mark.parametrize("name", ["arith", "json"])
def test_pushdown_masks_equal_brute_force(name):
    """Guide.mask over the pushdown automaton = stepping every token's bytes one by one; random walks through
    the masks end (EOS) only in strings of the language, some nested past the regex's bound."""
    from decodekit.sampling.guided import Guide
    from decodekit.sampling.guided.automaton import TokenVocab
    rng = random.Random(zlib.crc32(b"masks-" + name.encode()))
    alphabet = ['(', ')', '1', '23', '+', '*', '{', '}', '[', ']', '"', 'a', ':', ',', ' ', 'null', 'é', '\\']
    pieces = [None] + sorted({"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4))).encode()
                              for _ in range(400)}) + [bytes([b]) for b in range(256)]
    guide = Guide(LazyPDA(compile_rules(grammar_guide(GRAMMARS[name]))), TokenVocab(pieces), [0])
    rec = Recognizer(parse_grammar(GRAMMARS[name]))
    V = len(pieces) + 3
    open_tokens = [t for t, b in enumerate(pieces) if b in (b"(", b"[", b"{", b"((", b"[[")]
    ended = 0
    for walk in range(10):
        s, out, t = guide.initial, [], None
        for step in range(150):
            mask, count = guide.mask(s, V)
            brute = {t for t, b in enumerate(pieces) if b and guide.dfa.step(s, b) != DEAD}
            if guide.dfa.is_accepting(s) or not brute:
                brute.add(0)
            assert set(mask.nonzero().flatten().tolist()) == brute and count == len(brute)
            assert guide.state_after(out) == s
            ok_open = [x for x in open_tokens if x in brute]
            t = rng.choice(ok_open) if step < 40 and ok_open and rng.random() < 0.5 else rng.choice(sorted(brute))
            if t == 0:
                break
            out.append(t)
            s = guide.next_state(s, t)
        if t == 0:
            ended += 1
            text = b"".join(pieces[x] for x in out).decode("utf-8")
            assert rec.accepts(text), text
    assert ended >= 1
