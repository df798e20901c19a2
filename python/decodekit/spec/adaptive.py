"""Adaptive draft length: each request drafts the k that maximises expected tokens per unit of time,
from its running acceptance rate and a measured cost model of the engine's steps.

With per-token acceptance a, verifying k drafts emits E(k) = (1 - a^(k+1)) / (1 - a) tokens
(Leviathan et al. 2023). A draft token costs c (as a fraction of one request's share of a decode
step: the verifier's marginal token cost plus the drafter's own), so a request picks
argmax_k E(k) / (1 + c k). Speculation backs off (k = 0) when drafts are mostly rejected; every
`probe_every`-th backed-off step still drafts one token so the estimate can recover.

Acceptance is estimated from truncated geometric outcomes: a step that verified k drafts and
accepted j of them contributes j successes and (j < k) failures, decayed exponentially so the
estimate follows the text (a quoted passage, then free prose).
"""
from __future__ import annotations


class AdaptiveK:
    def __init__(self, k_max: int, adaptive: bool = True, decay: float = 0.8, probe_every: int = 8,
                 prior_accepted: float = 1.0, prior_trials: float = 2.0):
        if not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1, got {k_max!r}")
        self.k_max, self.adaptive = k_max, adaptive
        self.decay, self.probe_every = decay, probe_every
        self.successes, self.trials = prior_accepted, prior_trials
        self._backed_off = 0

    @property
    def acceptance(self) -> float:
        """Estimated probability that a draft token is accepted."""
        return self.successes / self.trials if self.trials > 0 else 0.0

    @staticmethod
    def expected_tokens(a: float, k: int) -> float:
        """Tokens emitted per verification of k drafts at acceptance a (accepted drafts + 1)."""
        if a >= 1.0:
            return k + 1.0
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def choose(self, cost: float) -> int:
        """Draft length for the next step; cost: one draft token's cost relative to a decode step."""
        if not self.adaptive:
            return self.k_max
        a = self.acceptance
        best_k, best = 0, 1.0
        for k in range(1, self.k_max + 1):
            v = self.expected_tokens(a, k) / (1.0 + cost * k)
            if v > best * (1 + 1e-9):
                best_k, best = k, v
        if best_k == 0:
            self._backed_off += 1
            if self._backed_off % self.probe_every == 0:
                return 1
        else:
            self._backed_off = 0
        return best_k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + accepted + (1 if accepted < proposed else 0)


class StepCostModel:
    """Online least-squares fit of step time = t0 + t1 * tokens (exponentially weighted), the
    marginal cost of a draft token relative to a decode step's share per request."""

    def __init__(self, decay: float = 0.97, prior_cost: float = 0.1):
        self.decay, self.prior_cost = decay, prior_cost
        self._s = [0.0] * 5  # sum w, sum w x, sum w x^2, sum w y, sum w x y
        self.draft_time_per_token = 0.0   # seconds a drafter spends per draft token (model drafters)

    def observe(self, num_tokens: int, seconds: float) -> None:
        d, x, y = self.decay, float(num_tokens), float(seconds)
        for i, v in enumerate((1.0, x, x * x, y, x * y)):
            self._s[i] = d * self._s[i] + v

    def observe_drafter(self, num_draft_tokens: int, seconds: float) -> None:
        if num_draft_tokens > 0:
            t = seconds / num_draft_tokens
            self.draft_time_per_token = t if self.draft_time_per_token == 0 else (
                0.8 * self.draft_time_per_token + 0.2 * t)

    def fit(self) -> tuple[float, float] | None:
        """(t0, t1) or None while the observed token counts do not vary enough."""
        w, sx, sxx, sy, sxy = self._s
        if w < 3:
            return None
        var = sxx / w - (sx / w) ** 2
        if var < 0.05:
            return None
        t1 = max((sxy / w - sx / w * sy / w) / var, 0.0)
        t0 = max(sy / w - t1 * sx / w, 0.0)
        return t0, t1

    def draft_cost(self, batch_size: int) -> float:
        """One draft token's cost relative to one request's share of a decode step
        (t0 / B + t1): the verifier's marginal token plus the drafter's time per token."""
        f = self.fit()
        if f is None:
            return self.prior_cost
        t0, t1 = f
        share = t0 / max(batch_size, 1) + t1
        if share <= 0:
            return self.prior_cost
        return (t1 + self.draft_time_per_token) / share
