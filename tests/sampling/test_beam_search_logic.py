"""BeamSearch (sampling/beam_search.py) against exhaustive search on synthetic models: with a beam wide
enough to keep every prefix, the result is exactly the best hypotheses by vLLM's score among all
sequences (EOS-ended ones at any length, the others at max_tokens), for any length_penalty; a beam of 1
is greedy; candidates past 2 * beam_width are ignored; parameters are validated naming the field."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from decodekit.engine.outputs import Logprob
from decodekit.sampling import SamplingParamsError
from decodekit.sampling.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence, beam_score


class ToyModel:
    """log-probabilities over V tokens as a deterministic function of the whole token history."""

    def __init__(self, vocab: int, seed: int):
        self.V, self.seed = vocab, seed

    def logprobs(self, tokens) -> list[float]:
        r = random.Random(hash((self.seed, tuple(tokens))))
        logits = [r.gauss(0, 2) for _ in range(self.V)]
        m = max(logits)
        lse = m + math.log(sum(math.exp(x - m) for x in logits))
        return [x - lse for x in logits]

    def table(self, tokens, n: int, extra: int = 0) -> dict:
        """The engine's step table: the n best (rank 1..n) plus `extra` worse ones (ranked past n)."""
        lp = self.logprobs(tokens)
        order = sorted(range(self.V), key=lambda t: -lp[t])[:n + extra]
        return {t: Logprob(lp[t], rank=i + 1) for i, t in enumerate(order)}


def run(model: ToyModel, prompt, params, eos, extra=0) -> list[BeamSearchSequence]:
    s = BeamSearch(prompt, params, eos)
    while not s.done:
        s.advance([model.table(b.tokens, 2 * params.beam_width, extra) for b in s.beams])
    return s.result().sequences


def exhaustive(model: ToyModel, prompt, max_tokens, eos, length_penalty) -> list[tuple[float, list[int]]]:
    """Every hypothesis (ended by EOS at any length, else max_tokens long) with its score, best first."""
    hyps = []

    def walk(tokens, cum, depth):
        lp = model.logprobs(tokens)
        for t in range(model.V):
            seq, c = tokens + [t], cum + lp[t]
            if t in eos:
                hyps.append((c / ((len(seq) - 1) ** length_penalty), seq))
            elif depth + 1 == max_tokens:
                hyps.append((c / (len(seq) ** length_penalty), seq))
            else:
                walk(seq, c, depth + 1)
    walk(list(prompt), 0.0, 0)
    return sorted(hyps, key=lambda h: -h[0])


@pytest.mark.parametrize("seed", range(6))
def test_wide_beam_is_exhaustive(seed):
    rng = random.Random(1000 + seed)
    T = 3
    V = 4 if seed % 2 == 0 else 3
    eos = {rng.randrange(V)} if seed % 2 == 0 else set()  # 3 non-EOS tokens: 9 live prefixes at most
    lp = rng.choice([0.0, 1.0, -0.5, 2.0])
    prompt = [rng.randrange(V) for _ in range(rng.randint(1, 5))]
    model = ToyModel(V, seed)
    width = (V - len(eos)) ** (T - 1)  # every live prefix survives up to the last step
    assert width <= 10 and 2 * width >= V  # and every token is a candidate
    got = run(model, prompt, BeamSearchParams(beam_width=width, max_tokens=T, length_penalty=lp), eos)
    want = exhaustive(model, prompt, T, eos, lp)[:width]
    assert len(got) == width
    for g, (score, seq) in zip(got, want):
        assert g.tokens == seq
        assert beam_score(g, eos, lp) == pytest.approx(score, abs=1e-12)
        assert g.cum_logprob == pytest.approx(sum(model.logprobs(seq[:i])[seq[i]]
                                                  for i in range(len(prompt), len(seq))), abs=1e-12)
        assert g.finish_reason == ("stop" if seq[-1] in eos else "length")
        assert g.stop_reason == (seq[-1] if seq[-1] in eos else None)
        assert len(g.logprobs) == len(seq) - len(prompt)


@pytest.mark.parametrize("seed", range(4))
def test_width_one_is_greedy_without_eos_plus_eos_exits(seed):
    """A beam of 1 follows the best non-EOS token; every step whose 2 best hold EOS leaves an EOS-ended
    hypothesis behind; the result is the best of those and the beam by score."""
    V, eos, lp_pen = 7, {2}, [0.0, 1.0, 0.7, -1.0][seed]
    model = ToyModel(V, 50 + seed)
    prompt = [1, 5, 3]
    (got,) = run(model, prompt, BeamSearchParams(beam_width=1, max_tokens=12, length_penalty=lp_pen), eos)
    toks, cum, hyps = list(prompt), 0.0, []
    for _ in range(12):
        lp = model.logprobs(toks)
        top2 = sorted(range(V), key=lambda x: -lp[x])[:2]
        if 2 in top2:
            hyps.append(((cum + lp[2]) / (len(toks) ** lp_pen), toks + [2]))
        t = max((x for x in range(V) if x != 2), key=lambda x: lp[x])
        toks.append(t)
        cum += lp[t]
    hyps.append((cum / (len(toks) ** lp_pen), toks))
    best = max(hyps, key=lambda h: h[0])  # max keeps the first of equals: the earlier EOS exit, as the sort
    assert got.tokens == best[1]
    assert beam_score(got, eos, lp_pen) == pytest.approx(best[0], abs=1e-12)


def test_extra_table_entries_are_not_candidates():
    model = ToyModel(9, 3)
    p = BeamSearchParams(beam_width=2, max_tokens=4)
    a = run(model, [0], p, set(), extra=0)
    b = run(model, [0], p, set(), extra=5)  # the caller's top-N may hold more than 2 * beam_width entries
    assert [s.tokens for s in a] == [s.tokens for s in b]


def test_ignore_eos_and_text():
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join("<eos>" if (t == 0 and not skip_special_tokens) else "" if t == 0 else chr(97 + t)
                           for t in ids)
    model = ToyModel(4, 11)
    for ignore in (False, True):
        s = BeamSearch([1, 2], BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=ignore), {0})
        while not s.done:
            s.advance([model.table(b.tokens, 6) for b in s.beams])
        res = s.result(Tok()).sequences
        for seq in res:
            gen = seq.generated_token_ids
            if ignore:
                assert seq.finish_reason == "length" and len(gen) == 5
            if seq.finish_reason == "stop":
                assert gen[-1] == 0 and seq.text == Tok().decode(gen[:-1])
            else:
                assert seq.text == Tok().decode(gen)
    s = BeamSearch([1], BeamSearchParams(beam_width=2, max_tokens=3, include_stop_str_in_output=True), {0})
    s.advance([{0: Logprob(-0.1, 1), 3: Logprob(-2.5, 2)}])
    res = s.result(Tok()).sequences
    assert res[0].tokens == [1, 0] and res[0].text == "<eos>"


@pytest.mark.parametrize("kw, field", [
    (dict(beam_width=0, max_tokens=4), "beam_width"), (dict(beam_width=11, max_tokens=4), "beam_width"),
    (dict(beam_width=True, max_tokens=4), "beam_width"), (dict(beam_width=2, max_tokens=0), "max_tokens"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
    (dict(beam_width=2, max_tokens=4, length_penalty=11), "length_penalty"),
    (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature"),
    (dict(beam_width=2, max_tokens=4, ignore_eos=1), "ignore_eos"),
])
def test_params_validated(kw, field):
    with pytest.raises(SamplingParamsError) as e:
        BeamSearchParams(**kw)
    assert e.value.field == field


def test_prompt_and_length_checked():
    p = BeamSearchParams(beam_width=2, max_tokens=8)
    with pytest.raises(SamplingParamsError) as e:
        BeamSearch([], p, {0})
    assert e.value.field == "prompt"
    with pytest.raises(SamplingParamsError) as e:
        BeamSearch(list(range(5)), p, {0}, max_model_len=12)
    assert e.value.field == "max_tokens" and "max_model_len=12" in str(e.value)
    BeamSearch(list(range(4)), p, {0}, max_model_len=12)
    s = BeamSearch([1], p, {0})
    with pytest.raises(ValueError):
        s.advance([{}, {}])


def test_all_candidates_eos_ends_search():
    s = BeamSearch([1], BeamSearchParams(beam_width=1, max_tokens=5), {0, 2})
    s.advance([{0: Logprob(-0.5, 1), 2: Logprob(-1.0, 2)}])
    assert s.done and s.steps == 1
    res = s.result().sequences
    assert [q.tokens for q in res] == [[1, 0]]


def test_exhaustive_helper_counts():  # the oracle itself: V^T leaves without EOS
    m = ToyModel(3, 0)
    assert len(exhaustive(m, [0], 3, set(), 1.0)) == 27
    assert len(exhaustive(m, [0], 2, {0}, 1.0)) == 1 + 2 * 3
    assert all(a[0] >= b[0] for a, b in itertools.pairwise(exhaustive(m, [0], 3, {1}, 0.5)))
