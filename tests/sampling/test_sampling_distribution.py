"""Sampled frequencies follow the intended distribution (chi-square goodness of fit), and
the same check rejects a deliberately wrong sampler. All seeds are fixed: deterministic."""
import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams

N = 100_000            # the main checks
N_SMALL = 30_000       # per filter combination (still rejects e.g. a missing temperature)
V = 8
PROBS = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.05, 0.01], dtype=torch.float64)
LOGITS = (PROBS.log() + 1.7).float()          # any shift: softmax-invariant
SAMPLER = Sampler()

try:
    from scipy.stats import chi2 as _chi2
except ImportError:                            # pragma: no cover
    _chi2 = None


def chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution: Q(dof/2, x/2)."""
    if _chi2 is not None:
        return float(_chi2.sf(x, dof))
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def chi2_pvalue(tokens: torch.Tensor, expected: torch.Tensor) -> float:
    """Goodness of fit over the tokens with expected probability > 0 (those with 0 must not occur)."""
    counts = torch.bincount(tokens, minlength=len(expected)).double()
    support = expected > 0
    assert counts[~support].sum() == 0, f"sampled a token outside the support: {counts}"
    e = expected[support] / expected[support].sum() * len(tokens)
    stat = float(((counts[support] - e) ** 2 / e).sum())
    return chi2_sf(stat, int(support.sum()) - 1)


def sample(params: SamplingParams, seeds, steps, sampler=SAMPLER, tamper=None) -> torch.Tensor:
    n = len(seeds)
    md = SamplingMetadata.build([params] * n, [[]] * n, [[0]] * n, seeds, steps, None, "cpu", V)
    if tamper is not None:
        tamper(md)
    return sampler(LOGITS.expand(n, V).contiguous(), md).token_ids


def reference(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0) -> torch.Tensor:
    p = torch.softmax(LOGITS.double() / temperature, dim=-1)
    order = torch.argsort(-p, stable=True)
    keep = torch.zeros(V, dtype=torch.bool)
    k = V if top_k <= 0 else top_k
    kept = p[order[:k]] / p[order[:k]].sum()
    before = torch.cumsum(kept, 0) - kept
    for r in range(k):
        if top_p >= 1.0 or before[r] < top_p:
            keep[order[r]] = True
    keep &= p >= min_p * p.max()
    q = torch.where(keep, p, torch.zeros_like(p))
    return q / q.sum()


def test_chi2_sf_fallback_agrees():
    for x, dof in [(3.0, 7), (14.07, 7), (30.0, 3)]:
        q = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                          torch.tensor(x / 2, dtype=torch.float64)))
        assert abs(q - chi2_sf(x, dof)) < 1e-9
    assert abs(chi2_sf(14.0671, 7) - 0.05) < 1e-4


def test_different_seeds_follow_distribution():
    tok = sample(SamplingParams(seed=0), list(range(N)), [0] * N)
    assert chi2_pvalue(tok, PROBS) > 1e-3


def test_one_seed_over_positions_follows_distribution():
    tok = sample(SamplingParams(seed=12345), [12345] * N, list(range(N)))
    assert chi2_pvalue(tok, PROBS) > 1e-3


@pytest.mark.parametrize("kw", [dict(temperature=0.5), dict(temperature=1.7),
                                dict(top_k=3), dict(top_p=0.6), dict(min_p=0.3),
                                dict(temperature=0.8, top_k=5, top_p=0.7, min_p=0.1)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_processed_distribution(kw):
    seeds = list(range(10 ** 6, 10 ** 6 + N_SMALL))
    tok = sample(SamplingParams(**kw), seeds, [3] * N_SMALL)
    assert chi2_pvalue(tok, reference(**kw)) > 1e-3


def test_detects_wrong_sampler():
    """The check has power: a sampler that drops the temperature (or the filters) fails it."""
    seeds = list(range(N))
    small = seeds[:N_SMALL]

    def no_temperature(md):
        md.temperature = torch.ones_like(md.temperature)

    tok = sample(SamplingParams(temperature=0.7), seeds, [0] * N, tamper=no_temperature)
    assert chi2_pvalue(tok, reference(temperature=0.7)) < 1e-3

    def no_top_p(md):
        md.top_p = None

    tok = sample(SamplingParams(top_p=0.6), small, [0] * N_SMALL, tamper=no_top_p)
    with pytest.raises(AssertionError, match="outside the support"):
        chi2_pvalue(tok, reference(top_p=0.6))

    class BiasedSampler(Sampler):                     # samples from the squared probabilities
        def forward(self, logits, md):
            return super().forward(logits * 2.0, md)

    tok = sample(SamplingParams(), small, [0] * N_SMALL, sampler=BiasedSampler())
    assert chi2_pvalue(tok, PROBS) < 1e-3
