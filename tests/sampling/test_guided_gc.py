"""A large guide stays out of the garbage collector's way: its pruned NFA is held in tuples (which the collector
stops tracking once it has seen them), and compile_guide runs with the collector paused. Was: a 20000-way
guided_regex left ~1.1M tracked lists alive while cached (every full collection 0.4 s slower: 0.14 -> 0.55 s)
and compiled 4x slower with the collector on (its full collections walking the growing NFA again and again)."""
from __future__ import annotations

import gc

import pytest

import decodekit.sampling.guided as guided
from decodekit.sampling.guided import compile_guide, compile_nfa
from decodekit.sampling.guided.grammar import grammar_guide


class _Tok:
    """Single bytes as tokens (ids 1..256 = bytes 0..255); id 0 is EOS."""

    def __init__(self):
        self.pieces = [None] + [bytes([b]) for b in range(256)]

    def token_bytes(self):
        return self.pieces, {b: [i] for i, b in enumerate(self.pieces) if b}


def _alternation(n: int, tag: str) -> str:
    return "|".join(f"w{i}{tag}" for i in range(n))


def _tracked(objs) -> int:
    return sum(gc.is_tracked(o) for o in objs)


def test_pruned_nfa_is_untracked_by_the_collector():
    nfa = compile_nfa(_alternation(3000, "q") + "|[a-z]{2,5}")
    assert len(nfa.eps) > 10_000
    for _ in range(3):              # (a tuple of tuples is untracked once its elements are)
        gc.collect()
    held = [*nfa.eps, *nfa.edges, *nfa.calls]
    assert all(type(x) is tuple for x in held)
    assert _tracked(held) == 0, f"{_tracked(held)} of {len(held)} NFA containers still tracked"


def test_a_cached_guide_adds_few_tracked_objects():
    tok = _Tok()
    gc.collect()
    before = len(gc.get_objects())
    g = compile_guide(_alternation(5000, "gc"), tok, [0])
    assert len(g.dfa.nfa.eps) > 20_000
    for _ in range(3):
        gc.collect()
    grown = len(gc.get_objects()) - before
    # was ~3 lists per NFA state (eps, edges, calls: > 60000 here); now the DFA's few states and the guide's
    # own objects
    assert grown < 5_000, grown


@pytest.mark.parametrize("kind", ["regex", "grammar"])
def test_compile_guide_pauses_the_collector(monkeypatch, kind):
    seen = []
    real_dfa, real_pda = guided.LazyDFA, guided.LazyPDA

    def recording(real):
        class Recording(real):
            def __init__(self, *a, **k):
                seen.append(gc.isenabled())
                super().__init__(*a, **k)
        return Recording

    monkeypatch.setattr(guided, "LazyDFA", recording(real_dfa))
    monkeypatch.setattr(guided, "LazyPDA", recording(real_pda))
    assert gc.isenabled()
    tok = _Tok()
    if kind == "regex":
        g = compile_guide(_alternation(50, "pause"), tok, [0])
    else:
        g = compile_guide(grammar_guide('root ::= "(" root ")" | "x" "pause"'), tok, [0])
    assert g is not None and seen == [False]
    assert gc.isenabled()                           # back on afterwards


def test_compile_guide_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        compile_guide(_alternation(40, "off"), _Tok(), [0])
        assert not gc.isenabled()
    finally:
        gc.enable()
