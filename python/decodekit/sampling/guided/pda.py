"""Rule sets - a context-free grammar whose rule bodies are regular expressions that may call rules - run as
a byte-level pushdown automaton, so recursion (nested JSON, a GBNF grammar's expressions) has no depth bound.

A ``RuleSet`` is a tuple of (name, pattern) rules, the first one the start rule; a pattern is regex.py's
subset plus ``(?&name)``, a call of rule ``name``. ``compile_rules`` builds all the bodies into one NFA
(regex.py's Thompson construction; a call is an edge that pushes its return state), drops the rules that
derive no string and the states that cannot finish their rule, and refuses left recursion (a rule that can
call itself before reading a byte: ``RuleSetError``; grammar.py then unrolls such a grammar as before).

``LazyPDA`` is a LazyDFA (automaton.py) whose states are sets of stacks instead of sets of NFA states. A
set of stacks is a hash-consed trie read from the top (a graph-structured stack, as GLR parsers keep): one
entry per top state, the stacks below it one shared node, so parses of an ambiguous grammar that reach the
same state merge instead of multiplying. The epsilon closure follows epsilon edges, pushes at calls (the
return state; a tail call, whose return state can only finish its rule, pushes nothing) and pops at a rule's
end; byte edges move the top entries. States are built on demand, as
the DFA's are, so ``Guide`` computes token masks, caches them per state and steps through tokens unchanged;
each nesting depth a request reaches adds states (and their masks) once.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .automaton import MAX_DFA_ELEMENTS, MAX_DFA_STATES, GuideError, LazyDFA
from .regex import NFA, RegexError, _build, parse

ACCEPT = -1                      # the element of a state whose stack has finished the start rule
MAX_CLOSURE = 200_000            # stacks one closure may visit (an ambiguous grammar's sets grow with depth)


class RuleSetError(RegexError):
    """A rule set that cannot run as a pushdown automaton here (an undefined rule, no string matches...)."""


class LeftRecursionError(RuleSetError):
    """A rule that can call itself before reading a byte (the pushdown automaton's stack would grow forever)."""


@dataclass(frozen=True)
class RuleSet:
    """((name, pattern), ...): the first rule is the start rule; patterns call rules with (?&name)."""
    rules: tuple

    def __post_init__(self):
        if not self.rules:
            raise RuleSetError("a rule set needs at least one rule")

    @property
    def chars(self) -> int:
        return sum(len(p) for _, p in self.rules)


@dataclass
class RuleNFA:
    nfa: NFA
    start: dict          # rule name -> its entry state
    end: dict            # rule name -> its exit state
    root: str
    ends: frozenset      # all rules' exit states
    tails: dict          # state -> whether its epsilon closure reads nothing and calls nothing (can only end its rule)

    def is_tail(self, z: int) -> bool:
        t = self.tails.get(z)
        if t is None:
            nfa = self.nfa
            t = self.tails[z] = not any(nfa.edges[x] or nfa.calls[x] for x in _eps_reach(nfa, z, lambda n: False))
        return t


def _reach(nfa: NFA, s0: int, follow_call, read_bytes: bool = True) -> set:
    """States reachable from s0 over epsilon edges, byte edges (read_bytes) and calls where follow_call(rule)
    (to the return state)."""
    seen, work = {s0}, [s0]
    while work:
        s = work.pop()
        nxt = list(nfa.eps[s]) + [z for n, z in nfa.calls[s] if follow_call(n)]
        if read_bytes:
            nxt += [t for _, _, t in nfa.edges[s]]
        for t in nxt:
            if t not in seen:
                seen.add(t)
                work.append(t)
    return seen


def _eps_reach(nfa: NFA, s0: int, follow_call) -> set:
    """States reachable from s0 without reading a byte (epsilon edges, calls where follow_call(rule))."""
    return _reach(nfa, s0, follow_call, read_bytes=False)


def _fixpoint(names, check, callers) -> set:
    """The least set S of rule names closed under "check(n, S) -> n in S": a worklist that re-checks only the
    callers of a rule that joined (a chain of n rules costs n checks, not n passes over all of them)."""
    got: set = set()
    work, queued = list(names), set(names)
    while work:
        n = work.pop()
        queued.discard(n)
        if n not in got and check(n, got):
            got.add(n)
            for c in callers.get(n, ()):
                if c not in got and c not in queued:
                    queued.add(c)
                    work.append(c)
    return got


@lru_cache(maxsize=64)
def compile_rules(rs: RuleSet) -> RuleNFA:
    """The pruned NFA of a rule set (module docstring); RuleSetError / RegexError when it cannot run."""
    nfa, cache = NFA(), {}
    start, end, called, callers = {}, {}, {}, {}
    for name, pattern in rs.rules:
        if not isinstance(name, str) or not name or ")" in name or name in start:
            raise RuleSetError(f"bad or repeated rule name {name!r}")
        ast = parse(pattern, calls=True)
        first = len(nfa.eps)
        start[name], end[name] = _build(nfa, ast, cache)
        for cs in nfa.calls[first:]:
            for n, _ in cs:
                called.setdefault(n, name)
                callers.setdefault(n, set()).add(name)
    missing = sorted(n for n in called if n not in start)
    if missing:
        raise RuleSetError(f"rule {called[missing[0]]!r} calls undefined rule {missing[0]!r}")
    root = rs.rules[0][0]
    # rules that derive some string: a fixpoint over "the end is reachable calling only productive rules"
    productive = _fixpoint(list(start), lambda n, got: end[n] in _reach(nfa, start[n], got.__contains__), callers)
    if root not in productive:
        raise RuleSetError("the grammar matches nothing (does every recursive rule have a way out?)")
    nfa.calls = [[c for c in cs if c[0] in productive] for cs in nfa.calls]
    nfa.prune(accepts=[end[n] for n in productive])
    # left recursion: a rule that calls itself, through calls reachable without reading a byte
    nullable = _fixpoint(sorted(productive), lambda n, got: end[n] in _eps_reach(nfa, start[n], got.__contains__),
                         callers)
    left = {n: sorted({c for s in _eps_reach(nfa, start[n], nullable.__contains__) for c, _ in nfa.calls[s]})
            for n in productive}
    state: dict = {}
    for n0 in sorted(productive):
        if n0 in state:
            continue
        path, work = [n0], [iter(left[n0])]
        state[n0] = 1
        while work:
            m = next(work[-1], None)
            if m is None:
                state[path.pop()] = 2
                work.pop()
            elif state.get(m) == 1:
                cycle = path[path.index(m):] + [m]
                raise LeftRecursionError(f"left recursion: {' -> '.join(cycle)} (a rule reached again before any "
                                   f"character is read)")
            elif m not in state:
                state[m] = 1
                path.append(m)
                work.append(iter(left[m]))
    return RuleNFA(nfa, start, end, root, frozenset(end[n] for n in productive), {})


class LazyPDA(LazyDFA):
    """A LazyDFA over sets of stacks (module docstring). A set of stacks is a hash-consed trie read from the
    top: node id -> (whether it holds the empty stack, frozenset of (top state, node of the rest)), one entry
    per top state; two parses that reach the same state merge their rests (a graph-structured stack, as GLR
    parsers keep), so an ambiguous grammar's states stay small. A DFA state's elements are the top-level
    (state, rest) pairs, plus ACCEPT when the start rule can have ended."""

    def __init__(self, rn: RuleNFA):
        self.rn = rn
        self.nodes: list[tuple[bool, frozenset]] = []     # node id -> (holds the empty stack, entries)
        self.node_index: dict = {}
        self._unions: dict = {}
        self.BOTTOM = self._node(True, frozenset())        # {the empty stack}: below the start rule's frame
        super().__init__(rn.nfa)

    def _node(self, eps: bool, entries: frozenset) -> int:
        key = (eps, entries)
        k = self.node_index.get(key)
        if k is None:
            k = self.node_index[key] = len(self.nodes)
            self.nodes.append(key)
        return k

    def _union(self, a: int, b: int) -> int:
        """The node of the union of two nodes' stacks (entries with the same top state merge their rests);
        memoized, iterative (the rests may differ thousands of frames down)."""
        if a == b:
            return a
        memo, nodes = self._unions, self.nodes
        goal = (a, b) if a < b else (b, a)
        todo = [goal]
        while todo:
            key = todo[-1]
            if key in memo:
                todo.pop()
                continue
            (ea, xa), (eb, xb) = nodes[key[0]], nodes[key[1]]
            d = dict(xa)
            need = [k for k in (((d[s], c) if d[s] < c else (c, d[s])) for s, c in xb if s in d and d[s] != c)
                    if k not in memo]
            if need:
                todo += need
                continue
            for s, c in xb:
                o = d.get(s)
                d[s] = c if o is None or o == c else memo[(o, c) if o < c else (c, o)]
            memo[key] = self._node(ea or eb, frozenset(d.items()))
            todo.pop()
        return memo[goal]

    def _initial(self) -> frozenset:
        return self._closure([(self.rn.start[self.rn.root], self.BOTTOM)])

    def _closure(self, elements) -> frozenset:
        nfa, rn, nodes = self.nfa, self.rn, self.nodes
        top: dict[int, int] = {}        # top state -> node of the stacks below it
        work: list[int] = []
        accept = False
        visits = 0

        def add(s, c):
            old = top.get(s)
            if old is None:
                top[s] = c
                work.append(s)
            else:
                m = self._union(old, c)
                if m != old:
                    top[s] = m
                    work.append(s)

        for x in elements:
            if x != ACCEPT:
                add(*x)
        while work:
            s = work.pop()
            c = top[s]
            visits += 1
            if visits > MAX_CLOSURE:
                raise GuideError(f"the grammar's automaton needs more than {MAX_CLOSURE} steps for one state "
                                 f"(a grammar too ambiguous to guide)")
            for t in nfa.eps[s]:
                add(t, c)
            for name, z in nfa.calls[s]:       # push the return state (a tail call: nothing to return to)
                add(rn.start[name], c if rn.is_tail(z) else self._node(False, frozenset(((z, c),))))
            if s in rn.ends:                   # the rule ends: pop, the return states below go on
                eps, entries = nodes[c]
                accept |= eps
                for s2, c2 in entries:
                    add(s2, c2)
        self.work += visits
        out = {(s, c) for s, c in top.items() if nfa.edges[s]}
        if accept:
            out.add(ACCEPT)
        return frozenset(out)

    def _edges(self, x) -> list:
        if x == ACCEPT:
            return []
        s, c = x
        return [(lo, hi, (t, c)) for lo, hi, t in self.nfa.edges[s]]

    def _accepts(self, key: frozenset) -> bool:
        return ACCEPT in key

    def _too_big(self) -> str:
        return (f"the grammar's automaton grew past {MAX_DFA_STATES} states (each nesting depth an output reaches, "
                f"and each count a grammar must remember, adds states; or {MAX_DFA_ELEMENTS} stack entries in them)")


__all__ = ["ACCEPT", "LazyPDA", "LeftRecursionError", "RuleNFA", "RuleSet", "RuleSetError", "compile_rules"]
