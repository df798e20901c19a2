"""Speculative-decoding verification (rejection_sample): exactness.

The CPU kernel equals the vectorised reference token for token; greedy verification keeps exactly
the target argmax; and statistically (chi-square, p > 1e-3, 200k verifications per case, several
seeds), with target rows p_0..p_k and draft rows q_0..q_{k-1} fixed per case, (a) the token emitted
at each position j (given that the request got that far) follows p_j, (b) the number of emitted
tokens follows P(m) = prod_{i<m-1} a_i (1 - a_{m-1}) (m <= n), P(n+1) = prod a_i, with
a_i = sum_v min(p_i, q_i). Deliberately broken rules (resample from p instead of max(p - q, 0), the
bonus from the wrong row, a deterministic accept) must fail the same test."""
import pytest
import torch
from scipy import stats

from dk_testing import cuda_only
from decodekit import ops
from decodekit.ops import reference as ref


def _case(B, k, V, gen, with_q=True, sharp=1.0):
    p = torch.softmax(torch.randn(B, k + 1, V, generator=gen) * sharp, dim=-1)
    q = torch.softmax(torch.randn(B, k, V, generator=gen) * sharp, dim=-1) if with_q else None
    if with_q:
        draft = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, k)
    else:
        draft = torch.randint(0, V, (B, k), generator=gen)
    return draft, p, q


def _kernel_vs_reference(draft, p, q, greedy, gen):
    """Random draft counts, seeds and positions; the kernel's tokens must be the reference's exactly.
    Returns (out, n, (num_draft, seeds, positions))."""
    B, k = draft.shape
    nd = torch.randint(0, k + 1, (B,), generator=gen, dtype=torch.int32)
    seeds = torch.randint(0, 2 ** 62, (B,), generator=gen)
    pos = torch.randint(0, 2 ** 40, (B,), generator=gen)
    out, n = ops.rejection_sample(draft, nd, q, p, seeds, pos, greedy)
    ro, rn = ref.rejection_sample(draft, nd, q, p, seeds, pos, greedy)
    assert torch.equal(n, rn) and torch.equal(out, ro)
    return out, n, (nd, seeds, pos)


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("greedy", [False, True])
def test_kernel_equals_reference(with_q, greedy):
    gen = torch.Generator().manual_seed(3)
    B, k, V = 64, 5, 37
    draft, p, q = _case(B, k, V, gen, with_q)
    if greedy:  # some drafts equal the target argmax, so acceptance runs are long
        draft[::2] = p[::2, :k].argmax(-1)
    out, n, (nd, seeds, pos) = _kernel_vs_reference(draft, p, q, greedy, gen)
    assert ((n >= 1) & (n <= nd + 1)).all()
    for b in range(B):  # -1 after the emitted tokens; accepted drafts are the drafts
        assert (out[b, n[b]:] == -1).all() and (out[b, :n[b]] >= 0).all()
        assert torch.equal(out[b, :n[b] - 1], draft[b, :n[b] - 1])
    if greedy:
        t = p.argmax(-1)
        for b in range(B):
            m = int(n[b])
            assert torch.equal(out[b, :m], t[b, :m])  # greedy emits exactly the target's argmax chain
    # a request's tokens do not depend on its neighbours
    o1, n1 = ops.rejection_sample(draft[5:6], nd[5:6], None if q is None else q[5:6], p[5:6], seeds[5:6], pos[5:6],
                                  greedy)
    assert torch.equal(o1[0], out[5]) and n1[0] == n[5]


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("shape", ["peaked", "ties"])
def test_kernel_equals_reference_peaked_and_tied(with_q, shape):
    """The kernel's Gumbel-max skips tokens that cannot beat the largest weight's key (rejection.h):
    on peaked distributions (most tokens skipped) and exact ties it must still pick the reference's token
    (every key drawn, the lowest index on ties)."""
    gen = torch.Generator().manual_seed(11)
    B, k, V = 48, 4, 3001
    draft, p, q = _case(B, k, V, gen, with_q, sharp=9.0 if shape == "peaked" else 1.0)
    if shape == "ties":  # equal weights on a few tokens, zero elsewhere (p rows; q rows where present)
        p = torch.zeros_like(p)
        p[..., 7] = p[..., 1000] = p[..., 2999] = 1 / 3
        p[:, :, 5] = torch.where(torch.rand(B, k + 1, generator=gen) < 0.5, 0.0, 1 / 3)
        p = p / p.sum(-1, keepdim=True)
    _kernel_vs_reference(draft, p, q, False, gen)


def _chi2(counts, probs):
    keep = probs * counts.sum() > 0
    c, e = counts[keep].double(), probs[keep].double() * counts.sum()
    return stats.chisquare(c.numpy(), (e * c.sum() / e.sum()).numpy()).pvalue


def _verify_stats(fn, p1, q1, k, N, seed):
    """Runs N verifications of one (p, q) case; returns the smallest chi-square p-value."""
    V = p1.shape[1]
    gen = torch.Generator().manual_seed(seed)
    p = p1[None].expand(N, k + 1, V).contiguous()
    q = q1[None].expand(N, k, V).contiguous()
    draft = torch.multinomial(q1, N, replacement=True, generator=gen).T.contiguous()  # [N, k]
    nd = torch.full((N,), k, dtype=torch.int32)
    seeds = torch.randint(0, 2 ** 62, (N,), generator=gen)
    pos = torch.randint(0, 2 ** 32, (N,), generator=gen)
    out, n = fn(draft, nd, q, p, seeds, pos)
    pv = []
    for j in range(k + 1):  # (a) the token at position j follows p_j
        sel = n > j
        pv.append(_chi2(torch.bincount(out[sel, j], minlength=V), p1[j]))
    a = torch.minimum(p1[:k], q1).sum(-1).double()  # (b) the number emitted
    pm = torch.empty(k + 1, dtype=torch.float64)
    run = 1.0
    for m in range(1, k + 2):
        pm[m - 1] = run * (1 - a[m - 1]) if m <= k else run
        if m <= k:
            run *= float(a[m - 1])
    pv.append(_chi2(torch.bincount(n.long() - 1, minlength=k + 1), pm))
    return min(pv)


def _kernel(draft, nd, q, p, seeds, pos):
    return ops.rejection_sample(draft, nd, q, p, seeds, pos, False)


@pytest.mark.parametrize("V,k", [(4, 3), (11, 2), (32, 4)])
def test_distribution_exact(V, k):
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(100 * V + seed)
        p1 = torch.softmax(torch.randn(k + 1, V, generator=gen) * 1.5, -1)
        q1 = torch.softmax(torch.randn(k, V, generator=gen) * 1.5, -1)
        pmin = _verify_stats(_kernel, p1, q1, k, 200_000, seed)
        assert pmin > 1e-3 / (k + 2), pmin  # Bonferroni over the k + 2 tests of the case


@pytest.mark.parametrize("variant", ["resample_from_p", "bonus_wrong_row", "accept_if_p_ge_q"])
def test_broken_rules_are_caught(variant):
    V, k = 8, 3
    gen = torch.Generator().manual_seed(7)
    p1 = torch.softmax(torch.randn(k + 1, V, generator=gen) * 1.5, -1)
    q1 = torch.softmax(torch.randn(k, V, generator=gen) * 1.5, -1)

    def broken(draft, nd, q, p, seeds, pos):
        return ref.rejection_sample(draft, nd, q, p, seeds, pos, False, variant=variant)

    def right(draft, nd, q, p, seeds, pos):
        return ref.rejection_sample(draft, nd, q, p, seeds, pos, False)

    assert _verify_stats(right, p1, q1, k, 200_000, 1) > 1e-3 / (k + 2)  # the reference itself is exact
    assert _verify_stats(broken, p1, q1, k, 200_000, 1) < 1e-6


def test_rejection_sample_errors():
    draft = torch.zeros(2, 3, dtype=torch.int64)
    p = torch.full((2, 4, 5), 0.2)
    seeds = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="'num_draft'\\[1\\] = 4 is outside"):
        ops.rejection_sample(draft, torch.tensor([1, 4], dtype=torch.int32), None, p, seeds, seeds)
    with pytest.raises(RuntimeError, match="'target_probs'"):
        ops.rejection_sample(draft, torch.tensor([1, 1], dtype=torch.int32), None, p[:, :3], seeds, seeds)
    with pytest.raises(RuntimeError, match="'draft_probs'"):
        ops.rejection_sample(draft, torch.tensor([1, 1], dtype=torch.int32), p[:, :2], p, seeds, seeds)


def test_rejection_sample_opcheck():
    from torch.library import opcheck
    gen = torch.Generator().manual_seed(0)
    draft, p, q = _case(3, 2, 9, gen)
    nd = torch.tensor([0, 2, 1], dtype=torch.int32)
    seeds = torch.tensor([1, 2, 3])
    out = torch.empty(3, 3, dtype=torch.int64)
    n = torch.empty(3, dtype=torch.int32)
    for qq, greedy in ((q, False), (None, True)):
        opcheck(torch.ops.decodekit.rejection_sample.default, (out, n, draft, nd, qq, p, seeds, seeds, greedy))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda_only)])
def test_greedy_nan_rows_follow_argmax(device):
    """Greedy verification takes each row's token by torch.argmax's rule, NaN included (the first NaN wins, as
    argmax_rows and the reference): a NaN after the row's maximum used to be skipped (the draft accepted past
    it) while one at index 0 won. Rows of 4 tokens and of 70000 (split over CTAs on CUDA), NaNs before and
    after the maximum, twice in a row, and a NaN-free row as the control."""
    nan = float("nan")
    for V in (4, 70000):
        gen = torch.Generator().manual_seed(V)
        p = torch.rand(4, 3, V, generator=gen)
        p[0, 0, 1] = nan                        # after the max? (max anywhere): the first NaN wins
        p[1, 0, V - 1] = nan                    # last token
        p[1, 1, 0] = nan
        p[2, 0, 2] = nan
        p[2, 0, V // 2] = nan                   # two NaNs: the first
        draft = p[:, :2].nan_to_num(-1.0).argmax(-1)   # the NaN-free argmax: rejected wherever a NaN wins
        draft[3] = p[3, :2].argmax(-1)                 # the control row: every draft accepted
        nd = torch.full((4,), 2, dtype=torch.int32)
        seeds, pos = torch.arange(4), torch.zeros(4, dtype=torch.int64)
        want, wn = ref.rejection_sample(draft, nd, None, p, seeds, pos, True)
        assert want[0, 0] == 1 and wn[0] == 1 and want[3].tolist() == [*draft[3].tolist(), p[3, 2].argmax()]
        got, gn = ops.rejection_sample(*(t.to(device) for t in (draft, nd)), None,
                                       *(t.to(device) for t in (p, seeds, pos)), True)
        assert torch.equal(got.cpu(), want) and torch.equal(gn.cpu(), wn)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("shape", [(40, 4, 1000), (2, 3, 152064), (5, 4, 50001)])
def test_cuda_equals_cpu(device, greedy, shape):
    """The CUDA kernel emits the CPU kernel's tokens on identical inputs: V larger than the CTA, and small
    batches over large vocabularies, which the kernel splits over several CTAs per request (on 132 SMs: 38
    slices of 4004 tokens for V = 152064, 13 for 50001; the last one short) and merges."""
    gen = torch.Generator().manual_seed(9)
    B, k, V = shape
    draft, p, q = _case(B, k, V, gen, True, sharp=3.0)
    draft[::3] = p[::3, :k].argmax(-1)
    nd = torch.randint(0, k + 1, (B,), generator=gen, dtype=torch.int32)
    seeds = torch.randint(0, 2 ** 62, (B,), generator=gen)
    pos = torch.randint(0, 2 ** 40, (B,), generator=gen)
    for qq in (q, None):
        co, cn = ops.rejection_sample(draft, nd, qq, p, seeds, pos, greedy)
        go, gn = ops.rejection_sample(*(t.to(device) for t in (draft, nd)), None if qq is None else qq.to(device),
                                      *(t.to(device) for t in (p, seeds, pos)), greedy)
        assert torch.equal(go.cpu(), co) and torch.equal(gn.cpu(), cn)


@pytest.mark.parametrize("seed", range(4))
def test_engine_greedy_accept_equals_the_op(seed):
    """The engine verifies all-greedy batches in Python (spec_decode.greedy_accept on the rows' argmax);
    it must emit exactly what rejection_sample(greedy=True) does on one-hot target rows: ragged draft
    counts (0 included), drafts that match the argmax often, ties in the logits (argmax takes the first)."""
    from decodekit.engine.spec_decode import greedy_accept
    g = torch.Generator().manual_seed(seed)
    B, V = 9, 6
    ks = torch.randint(0, 5, (B,), generator=g).tolist()
    kmax = max(ks)
    logits = torch.randint(0, 3, (sum(k + 1 for k in ks), V), generator=g).float()  # many ties
    top = logits.argmax(-1)
    drafts, i = [], 0
    for k in ks:  # each draft the argmax with probability 0.7, else a random token
        row = top[i:i + k]
        rnd = torch.randint(0, V, (k,), generator=g)
        drafts.append(torch.where(torch.rand(k, generator=g) < 0.7, row, rnd).tolist())
        i += k + 1
    target = torch.zeros(B, kmax + 1, V)
    i = 0
    for b, k in enumerate(ks):
        target[b, :k + 1].scatter_(1, top[i:i + k + 1, None], 1.0)
        i += k + 1
    draft_t = torch.tensor([d + [0] * (kmax - len(d)) for d in drafts], dtype=torch.int64).reshape(B, kmax)
    out, n = ops.rejection_sample(draft_t, torch.tensor(ks, dtype=torch.int32), None, target,
                                  torch.zeros(B, dtype=torch.int64), torch.zeros(B, dtype=torch.int64), greedy=True)
    want = [row[:m] for row, m in zip(out.tolist(), n.tolist())]
    assert greedy_accept(drafts, top.tolist()) == want
