"""Adaptive draft length (spec.adaptive): the acceptance estimate, the choice of k against the
expected-tokens-per-cost rule, back-off with probing, and the online step-cost fit."""
import random

import pytest

from decodekit.spec.adaptive import AdaptiveK, StepCostModel


def test_expected_tokens_formula():
    for a in (0.0, 0.3, 0.8, 0.99):
        for k in range(0, 8):
            want = sum(a ** i for i in range(k + 1))    # accepted prefix of length i with prob a^i
            assert AdaptiveK.expected_tokens(a, k) == pytest.approx(want)
    assert AdaptiveK.expected_tokens(1.0, 5) == 6


def test_acceptance_estimate_converges_to_the_true_rate():
    rng = random.Random(0)
    for a in (0.2, 0.6, 0.9):
        ak = AdaptiveK(4, decay=0.995)
        for _ in range(3000):
            j = 0
            while j < 4 and rng.random() < a:
                j += 1
            ak.update(4, j)
        assert ak.acceptance == pytest.approx(a, abs=0.05)


def test_choice_follows_acceptance_and_cost():
    ak = AdaptiveK(8)
    ak.successes, ak.trials = 95, 100          # a = 0.95: long drafts pay off
    assert ak.choose(0.1) == 8
    ak.successes, ak.trials = 50, 100          # a = 0.5
    k_cheap, k_dear = ak.choose(0.01), ak.choose(0.3)
    assert k_cheap > k_dear >= 1
    ak.successes, ak.trials = 5, 100           # a = 0.05: back off ...
    picks = [ak.choose(0.1) for _ in range(16)]
    assert picks.count(0) == 14 and picks.count(1) == 2   # ... but probe every 8th step
    assert AdaptiveK(3, adaptive=False).choose(10.0) == 3


def test_bad_k_rejected():
    for k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            AdaptiveK(k)


def test_step_cost_fit_recovers_a_linear_cost():
    m = StepCostModel()
    assert m.fit() is None and m.draft_cost(1) == m.prior_cost
    rng = random.Random(1)
    for _ in range(200):
        t = rng.randint(1, 9)
        m.observe(t, 0.010 + 0.002 * t + rng.uniform(-1e-4, 1e-4))
    t0, t1 = m.fit()
    assert t0 == pytest.approx(0.010, rel=0.05) and t1 == pytest.approx(0.002, rel=0.05)
    assert m.draft_cost(1) == pytest.approx(0.002 / 0.012, rel=0.05)
    assert m.draft_cost(8) > m.draft_cost(1)           # bigger batches: less fixed cost to share
    m.observe_drafter(4, 0.004)                         # a model drafter: 1 ms per draft token
    assert m.draft_cost(1) == pytest.approx(0.003 / 0.012, rel=0.05)
    flat = StepCostModel()
    for _ in range(50):
        flat.observe(1, 0.01)                           # no variation in tokens: no fit
    assert flat.fit() is None
