"""Sampler: greedy, filters, penalties, min_tokens and logprobs against straightforward
references, and batch invariance of seeded requests."""
import math
import random
import zlib
from collections import Counter

import pytest
import torch

from dk_testing import DEVICES
from decodekit.sampling import (Sampler, SamplingMetadata, SamplingParams, apply_penalties,
                                apply_top_k_top_p_min_p, request_seeds, set_global_seed)

SAMPLER = Sampler()


def build(params, V, outputs=None, prompts=None, seeds=None, steps=None, eos=None, device="cpu"):
    B = len(params)
    outputs = outputs if outputs is not None else [[] for _ in range(B)]
    prompts = prompts if prompts is not None else [[0] for _ in range(B)]
    seeds = seeds if seeds is not None else list(range(B))
    return SamplingMetadata.build(params, outputs, prompts, seeds, steps, eos, device, V)


# ----------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_is_argmax(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 333, generator=g).to(dtype)
    md = build([SamplingParams(temperature=0)] * 9, 333)
    out = SAMPLER(logits, md)
    assert out.token_ids.dtype == torch.int64 and out.logprobs is None
    assert torch.equal(out.token_ids, logits.float().argmax(-1))


def test_greedy_ties_take_first_index():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    md = build([SamplingParams(temperature=0, top_k=2)] * 2, 4)
    assert SAMPLER(logits, md).token_ids.tolist() == [1, 0]


def test_greedy_rows_in_random_batch_are_argmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 100, generator=g)
    params = [SamplingParams(temperature=0 if b % 2 else 0.7, top_k=5, top_p=0.5, min_p=0.1)
              for b in range(8)]
    out = SAMPLER(logits, build(params, 100))
    assert torch.equal(out.token_ids[1::2], logits[1::2].argmax(-1))


def test_bad_logits_shape():
    md = build([SamplingParams()], 10)
    with pytest.raises(ValueError):
        SAMPLER(torch.zeros(1, 11), md)
    with pytest.raises(ValueError):
        SAMPLER(torch.zeros(2, 10), md)


# ----------------------------------------------------------------------------- filters
def ref_filter(l, k, p, min_p):
    """Kept token set: top-k (ties by id), top-p on the top-k-renormalised distribution,
    min-p; in float64. Returns (kept, ambiguous) where ambiguous flags a p/min_p boundary."""
    V = len(l)
    order = sorted(range(V), key=lambda i: (-l[i], i))
    k = V if k <= 0 else k
    kept_k = order[:k]
    m = max(l)
    w = {i: math.exp(l[i] - m) for i in kept_k}
    z = sum(w.values())
    kept, cum, ambiguous = [], 0.0, False
    for i in kept_k:
        if p < 1.0:
            if kept and abs(cum - p) < 1e-5:
                ambiguous = True
            if cum >= p:
                break
        kept.append(i)
        cum += w[i] / z
    ratio = {i: math.exp(l[i] - m) for i in kept}
    if min_p > 0 and any(abs(r - min_p) < 1e-5 for i, r in ratio.items() if i != order[0]):
        ambiguous = True
    kept = [i for i in kept if ratio[i] >= min_p or i == order[0]]
    return set(kept), ambiguous


def run_filter(logits, ks, ps, mps):
    B, V = logits.shape
    top_k = torch.tensor([k if k > 0 else V for k in ks])
    out = apply_top_k_top_p_min_p(logits, top_k, torch.tensor(ps, dtype=torch.float32),
                                  torch.tensor(mps, dtype=torch.float32))
    return [set(torch.nonzero(torch.isfinite(out[b])).flatten().tolist()) for b in range(B)]


def test_top_k_keeps_exactly_k_with_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0, 3.0, 2.0]] * 4)
    kept = run_filter(logits, [1, 2, 4, 6], [1.0] * 4, [0.0] * 4)
    assert kept == [{1}, {1, 2}, {1, 2, 4, 5}, set(range(6))]
    g = torch.Generator().manual_seed(2)
    logits = torch.randint(0, 5, (20, 50), generator=g).float()      # many ties
    ks = list(range(1, 21))
    for b, s in enumerate(run_filter(logits, ks, [1.0] * 20, [0.0] * 20)):
        assert len(s) == ks[b]
        assert s == ref_filter(logits[b].tolist(), ks[b], 1.0, 0.0)[0]


def test_filters_match_reference():
    g = torch.Generator().manual_seed(3)
    rng = random.Random(3)
    B, V = 200, 120
    logits = torch.randn(B, V, generator=g) * torch.rand(B, 1, generator=g) * 4
    ks = [rng.choice([-1, 0, 1, 2, 7, 40, V]) for _ in range(B)]
    ps = [rng.choice([1.0, 0.999, 0.9, 0.5, 0.1, 1e-6]) for _ in range(B)]
    mps = [rng.choice([0.0, 0.0, 0.05, 0.3, 1.0]) for _ in range(B)]
    got = run_filter(logits, ks, ps, mps)
    checked = 0
    for b in range(B):
        want, ambiguous = ref_filter(logits[b].double().tolist(), ks[b], ps[b], mps[b])
        assert got[b], "at least one token is always kept"
        if not ambiguous:
            assert got[b] == want, (b, ks[b], ps[b], mps[b])
            checked += 1
    assert checked > 0.9 * B


def test_top_p_smallest_prefix():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    logits = probs.log().float()[None].repeat(5, 1)
    kept = run_filter(logits, [-1] * 5, [0.3, 0.41, 0.65, 0.85, 0.95], [0.0] * 5)
    assert kept == [{0}, {0, 1}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}]


def test_min_p():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    logits = probs.log().float()[None].repeat(3, 1)
    kept = run_filter(logits, [-1] * 3, [1.0] * 3, [0.45, 0.25, 1.0])
    assert kept == [{0, 1}, {0, 1, 2}, {0}]


def test_sampled_tokens_respect_top_k():
    g = torch.Generator().manual_seed(4)
    V, B = 50, 2000
    logits = torch.randn(1, V, generator=g).repeat(B, 1)
    out = SAMPLER(logits, build([SamplingParams(top_k=5, seed=1)] * B, V, seeds=list(range(B))))
    assert set(out.token_ids.tolist()) == set(logits[0].topk(5).indices.tolist())


# ----------------------------------------------------------------------------- penalties
def ref_penalties(logits, prompt, output, rep, pres, freq):
    """HF RepetitionPenaltyLogitsProcessor on prompt + output, then OpenAI presence/frequency."""
    l = logits.double().clone()
    for t in set(prompt) | set(output):
        l[t] = l[t] * rep if l[t] < 0 else l[t] / rep
    for t, c in Counter(output).items():
        l[t] -= freq * c + pres
    return l


def test_penalties_match_reference():
    rng = random.Random(5)
    g = torch.Generator().manual_seed(5)
    B, V = 12, 64
    logits = torch.randn(B, V, generator=g) * 3
    prompts = [[rng.randrange(V) for _ in range(rng.randrange(1, 30))] for _ in range(B)]
    outputs = [[rng.randrange(V) for _ in range(rng.randrange(0, 40))] for _ in range(B)]
    params = [SamplingParams(temperature=0, repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]),
                             presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2))
              for _ in range(B)]
    params[0] = SamplingParams(temperature=0)            # a row without penalties
    md = build(params, V, outputs=outputs, prompts=prompts)
    got = apply_penalties(logits, md.prompt_token_ids, md.output_token_ids, md.repetition_penalty,
                          md.presence_penalty, md.frequency_penalty)
    want = torch.stack([ref_penalties(logits[b], prompts[b], outputs[b], params[b].repetition_penalty,
                                      params[b].presence_penalty, params[b].frequency_penalty)
                        for b in range(B)])
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[0], logits[0])
    out = SAMPLER(logits, md)
    assert torch.equal(out.token_ids, want.argmax(-1))


@pytest.mark.parametrize("seed", range(6))
def test_penalties_sparse_equal_the_dense_rule(seed):
    """apply_penalties works on the seen ids only (gather / scatter): the same values as the rule written as
    masks over the whole vocabulary, exactly -- duplicates, padding, rows without penalties or without any
    seen id, NaN / +-inf / -0.0 logits, float32 and float64."""
    from decodekit.sampling.sampler import apply_penalties_dense
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B, V = rng.choice([(1, 5), (7, 33), (16, 1000)])
    dtype = rng.choice([torch.float32, torch.float64])
    logits = (torch.randn(B, V, generator=g) * 4).to(dtype)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0], dtype=dtype)
    for _ in range(B * 2):
        logits[rng.randrange(B), rng.randrange(V)] = special[rng.randrange(5)]
    lp = [rng.choice([0, 1, rng.randrange(1, 3 * V)]) for _ in range(B)]
    lo = [rng.choice([0, 1, rng.randrange(1, 3 * V)]) for _ in range(B)]
    pad = lambda rows: torch.tensor([r + [V] * (max(map(len, rows)) + 1 - len(r)) for r in rows])
    prompts = pad([[rng.randrange(V) for _ in range(n)] for n in lp])
    outputs = pad([[rng.randrange(min(V, 4)) if rng.random() < 0.5 else rng.randrange(V) for _ in range(n)]
                   for n in lo])
    rep = torch.tensor([rng.choice([1.0, 0.5, 1.3, 2.0]) for _ in range(B)], dtype=dtype)
    pres = torch.tensor([rng.choice([0.0, rng.uniform(-2, 2)]) for _ in range(B)], dtype=dtype)
    freq = torch.tensor([rng.choice([0.0, rng.uniform(-2, 2)]) for _ in range(B)], dtype=dtype)
    rep[0], pres[0], freq[0] = 1.0, 0.0, 0.0
    got = apply_penalties(logits, prompts, outputs, rep, pres, freq)
    want = apply_penalties_dense(logits, prompts, outputs, rep, pres, freq)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert got[0].view(-1).numpy().tobytes() == logits[0].numpy().tobytes()     # untouched, bit for bit
    assert got.data_ptr() != logits.data_ptr()


def test_penalties_steer_sampling():
    V = 10
    logits = torch.zeros(1, V)
    logits[0, 3] = 5.0
    p = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert SAMPLER(logits, build([p], V, outputs=[[3, 3, 3]])).token_ids.item() != 3
    p = SamplingParams(temperature=0, repetition_penalty=2.0)
    logits[0, 4] = 3.0
    assert SAMPLER(logits, build([p], V, prompts=[[3]])).token_ids.item() == 4


# ----------------------------------------------------------------------------- min_tokens
def test_min_tokens_masks_eos_and_stop_ids():
    V, eos, stop = 20, 3, 7
    logits = torch.zeros(4, V)
    logits[:, eos], logits[:, stop], logits[:, 11] = 10.0, 9.0, 1.0
    params = [SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[stop]),
              SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[stop]),
              SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[stop], ignore_eos=True),
              SamplingParams(temperature=0, min_tokens=2)]
    md = build(params, V, steps=[0, 2, 1, 1], eos=[eos])
    assert SAMPLER(logits, md).token_ids.tolist() == [11, eos, eos, stop]
    # random rows: never EOS / stop during min_tokens, whatever the seed
    B = 500
    logits = torch.zeros(B, V)
    logits[:, eos] = logits[:, stop] = 3.0
    p = SamplingParams(min_tokens=5, stop_token_ids=[stop], top_p=0.9)
    tok = SAMPLER(logits, build([p] * B, V, steps=[4] * B, eos=eos)).token_ids
    assert not ((tok == eos) | (tok == stop)).any()
    tok = SAMPLER(logits, build([p] * B, V, steps=[5] * B, eos=eos)).token_ids
    assert ((tok == eos) | (tok == stop)).float().mean() > 0.5


# ----------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_are_raw_log_softmax(dtype):
    g = torch.Generator().manual_seed(6)
    B, V = 6, 300
    logits = (torch.randn(B, V, generator=g) * 2).to(dtype)
    params = [SamplingParams(logprobs=n, temperature=t, top_k=k, presence_penalty=pp)
              for n, t, k, pp in [(0, 1.0, -1, 0.0), (1, 0.0, -1, 0.0), (5, 0.5, 10, 1.0),
                                  (20, 2.0, -1, 0.0), (None, 0.0, 3, 0.0), (3, 1.0, 50, -1.5)]]
    out = SAMPLER(logits, build(params, V, outputs=[[1, 2, 2]] * B))
    lp = torch.log_softmax(logits.double(), dim=-1)
    tok = out.token_ids
    torch.testing.assert_close(out.logprobs.double(), lp.gather(1, tok[:, None]).squeeze(1),
                               atol=1e-5, rtol=1e-5)
    assert out.ranks.tolist() == [int((lp[b] > lp[b, tok[b]]).sum()) + 1 for b in range(B)]
    assert out.ranks[1].item() == 1                       # greedy, no penalty: the top token
    assert out.topk_ids.shape == (B, 20) and out.topk_logprobs.shape == (B, 20)
    ref_lp, ref_ids = lp.topk(20, dim=-1)
    assert torch.equal(out.topk_ids, ref_ids)
    torch.testing.assert_close(out.topk_logprobs.double(), ref_lp, atol=1e-5, rtol=1e-5)


def test_logprobs_zero_and_none():
    logits = torch.randn(2, 10)
    out = SAMPLER(logits, build([SamplingParams(logprobs=0)] * 2, 10))
    assert out.topk_ids.shape == (2, 0) and out.logprobs.shape == (2,)
    out = SAMPLER(logits, build([SamplingParams()] * 2, 10))
    assert out.logprobs is None and out.topk_ids is None and out.ranks is None


# ----------------------------------------------------------------------------- seeds
def test_seeded_reproducible_and_position_dependent():
    V = 1000
    logits = torch.zeros(64, V)                       # uniform distribution
    p = [SamplingParams(seed=9)] * 64
    a = SAMPLER(logits, build(p, V, seeds=[9] * 64, steps=list(range(64)))).token_ids
    b = SAMPLER(logits, build(p, V, seeds=[9] * 64, steps=list(range(64)))).token_ids
    assert torch.equal(a, b)
    assert len(set(a.tolist())) > 55                  # positions give fresh draws
    c = SAMPLER(logits, build(p, V, seeds=[10] * 64, steps=list(range(64)))).token_ids
    assert (a != c).sum() > 55


def test_request_seeds():
    assert request_seeds(SamplingParams(seed=5)) == [5]
    s = request_seeds(SamplingParams(seed=5, n=4))
    assert s[0] == 5 and len(set(s)) == 4
    set_global_seed(123)
    a = request_seeds(SamplingParams(n=3))
    set_global_seed(123)
    assert request_seeds(SamplingParams(n=3)) == a and len(set(a)) == 3
    assert all(0 <= x < 2 ** 63 for x in a)


# ----------------------------------------------------------------------------- batch invariance
def _others(rng, n):
    out = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            out.append(SamplingParams(temperature=0))
        elif kind == 1:
            out.append(SamplingParams(temperature=1.3, top_k=7, seed=rng.randrange(2 ** 63)))
        elif kind == 2:
            out.append(SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.2,
                                      frequency_penalty=0.3, logprobs=4))
        elif kind == 3:
            out.append(SamplingParams(min_p=0.1, presence_penalty=-0.5, min_tokens=30, max_tokens=64,
                                      stop_token_ids=[5]))
        elif kind == 4:
            out.append(SamplingParams(temperature=0, repetition_penalty=1.5))
        else:
            out.append(SamplingParams(temperature=0.9, top_k=3, top_p=0.5, min_p=0.2, seed=i))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariance(device):
    rng = random.Random(7)
    V, steps = 256, 50
    g = torch.Generator().manual_seed(7)
    table = (torch.randn(V, V, generator=g) * 2.5).to(device)
    target = SamplingParams(temperature=0.8, top_k=100, top_p=0.95, presence_penalty=0.4,
                            repetition_penalty=1.1, seed=424242, logprobs=2)
    reqs = [target] + _others(rng, 16)
    set_global_seed(99)
    seeds = [request_seeds(p)[0] for p in reqs]        # drawn once per request, at add time
    prompts = [[rng.randrange(V) for _ in range(rng.randrange(1, 20))] for _ in reqs]

    def run(order):
        outs = {i: [] for i in order}
        for step in range(steps):
            last = [(outs[i] or prompts[i])[-1] for i in order]
            logits = torch.stack([table[t] + 0.3 * table[(step * 7 + i) % V] for t, i in zip(last, order)])
            md = SamplingMetadata.build([reqs[i] for i in order], [outs[i] for i in order],
                                        [prompts[i] for i in order], [seeds[i] for i in order],
                                        None, [2], device, V)
            tok = SAMPLER(logits, md).token_ids.tolist()
            for i, t in zip(order, tok):
                outs[i].append(t)
        return outs

    alone = run([0])[0]
    assert len(set(alone)) > 5                          # really sampling
    orders = [list(range(17)), list(range(16, -1, -1))]
    orders += [rng.sample(range(17), 17)]
    results = [run(o) for o in orders]
    for r in results:
        assert r[0] == alone
        assert r == results[0]                          # every row is order invariant


def test_no_host_sync_on_meta():
    """The sampler runs on the meta device, where any .item()/.tolist()/.cpu() data access
    or data-dependent shape would raise: it is free of host syncs (CUDA-graph friendly)."""
    V = 64
    params = [SamplingParams(temperature=0), SamplingParams(top_k=5, top_p=0.9, min_p=0.1, seed=3),
              SamplingParams(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.1,
                             min_tokens=4, stop_token_ids=[9], logprobs=3)]
    md = SamplingMetadata.build(params, [[1, 2], [], [3, 3]], [[4], [5, 6], [7]], [1, 2, 3],
                                None, [0], "meta", V)
    out = SAMPLER(torch.empty(3, V, device="meta"), md)
    assert out.token_ids.device.type == "meta" and out.token_ids.shape == (3,)
    assert out.topk_ids.shape == (3, 3) and out.ranks.shape == (3,)


# ----------------------------------------------------------------------------- draws with their distribution
def test_sample_with_probs_draws_from_the_probs_it_returns():
    """Speculative model drafters: the returned probs are exactly Sampler.probs (penalties, min_tokens,
    temperature, filters included), greedy rows are the argmax with one-hot probs, the draws follow
    the probs (chi-square over 6000 seeds per row), are reproducible for a (seed, position), and come
    from the given Philox stream (not the plain sampler's)."""
    from scipy.stats import chisquare
    from decodekit.sampling.philox import STREAM_SPEC_DRAFT
    g = torch.Generator().manual_seed(21)
    V, N = 11, 6000
    base = torch.randn(3, V, generator=g) * 1.5
    params = [SamplingParams(temperature=0.8, top_k=6, repetition_penalty=1.3, seed=1),
              SamplingParams(temperature=0),
              SamplingParams(temperature=1.3, top_p=0.9, min_p=0.02, min_tokens=4)]
    rows = [b for b in range(3) for _ in range(N)]
    md = build([params[b] for b in rows], V, outputs=[[2, 2, 5] if b == 0 else [] for b in rows],
               prompts=[[7] for _ in rows], seeds=[1000 + i for i in range(len(rows))],
               steps=[3 if b == 0 else 1 for b in rows], eos=[4])
    logits = base[rows]
    tok, p = SAMPLER.sample_with_probs(logits, md, STREAM_SPEC_DRAFT)
    assert torch.equal(p, SAMPLER.probs(logits, md))
    assert p[N:2 * N].eq(torch.nn.functional.one_hot(base[1].argmax(), V).float()).all()
    assert tok[N:2 * N].eq(base[1].argmax()).all()
    assert p[2 * N, 4] == 0 and not tok[2 * N:].eq(4).any()   # min_tokens masks EOS
    for b in (0, 2):
        want = p[b * N].double()
        got = torch.bincount(tok[b * N:(b + 1) * N], minlength=V).double()
        assert ((want == 0) <= (got == 0)).all(), "drew a token of probability 0"
        keep = want > 0
        assert chisquare(got[keep].numpy(), (want[keep] / want[keep].sum() * N).numpy()).pvalue > 1e-4
    again, _ = SAMPLER.sample_with_probs(logits, md, STREAM_SPEC_DRAFT)
    assert torch.equal(again, tok)
    plain = SAMPLER(logits, md).token_ids   # stream 0: other draws from the same distribution
    assert not torch.equal(plain[:N], tok[:N])


@pytest.mark.parametrize("case", ["top_p", "top_k", "min_p", "mixed", "ties", "flat", "medium", "ladder"])
def test_filter_candidates_equal_full_sort(case):
    """The CPU path filters only the rows with a filter on, among the best 128, then 1024 logits of each
    row when that is exact (the kept prefix lies among tokens whose rank is certain), else the full sort: its output
    must equal the full sort's bit for bit, on peaked, tied (values repeated across the candidate
    boundary) and flat rows, with per-row top-k / top-p / min-p including rows where a filter is off."""
    from decodekit.sampling import sampler as S
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()))  # (str hash() differs per process)
    B, V = 6, 49152
    logits = torch.randn(B, V, generator=g) * 3
    if case == "ties":
        logits = (logits * 2).round() / 2          # many exact ties, also at the 1024th value
    if case == "flat":
        logits = torch.randn(B, V, generator=g) * 0.01
    if case in ("medium", "ladder"):   # kept prefixes of ~n tokens: each candidate count and the full sort
        logits = torch.randn(B, V, generator=g)
        sizes = (120, 130, 300, 600, 900, 5) if case == "medium" else (5, 1000, 3000, 7000, 20000, 40)
        for b, n in enumerate(sizes):
            logits[b, torch.randperm(V, generator=g)[:n]] += 12.0
    top_k = top_p = min_p = None
    if case in ("top_k", "mixed", "ties"):
        top_k = torch.tensor([50, V, 1, 1024, 1500, V])[:B]
    if case in ("top_p", "mixed", "ties", "flat", "medium", "ladder"):
        top_p = torch.tensor([0.9, 0.5, 1.0 if case not in ("medium", "ladder") else 0.97, 0.95, 0.99, 0.3])[:B]
    if case in ("min_p", "mixed"):
        min_p = torch.tensor([0.05, 0.0, 0.1, 0.2, 0.0, 0.01])[:B]
    if case == "mixed":
        logits[1] = logits[1] * 0.01              # a flat row among peaked ones
    got = S.apply_top_k_top_p_min_p(logits, top_k, top_p, min_p)
    if case == "medium":
        kept = (~torch.isinf(got)).sum(dim=1)
        assert int(kept.max()) > 128 and int(kept.min()) < 128, kept
        assert not S._filter_candidates(logits, top_k, top_p, min_p, 128)[1].all()
        assert S._filter_candidates(logits, top_k, top_p, min_p, 1024)[1].all()
    if case == "ladder":   # rows done at 128, at 1024 and by the whole-row radix sort, in one batch
        kept = (~torch.isinf(got)).sum(dim=1)
        assert int((kept < 128).sum()) >= 1 and int(((kept > 128) & (kept < 1024)).sum()) >= 1
        assert int(((kept > 1024) & (kept < 8192)).sum()) >= 1 and int((kept > 8192).sum()) >= 1, kept
    sorted_l, idx = torch.sort(logits, dim=-1, descending=True, stable=True)   # the full sort, every row
    want = S._filter_sorted(logits, sorted_l, idx, top_k, top_p, min_p, None)[0]
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])


def test_filter_rows_without_a_filter_match_the_full_sort_with_nonfinite_logits():
    """Rows whose filters are all off are left alone on the CPU, except where the full sort would still change
    them: with min_p in the batch, a row with NaN or +inf logits (NaN softmax) keeps only its rank-0 token."""
    from decodekit.sampling import sampler as S
    g = torch.Generator().manual_seed(5)
    B, V = 4, 3000
    logits = torch.randn(B, V, generator=g) * 3
    logits[0, 17] = float("nan")
    logits[2, 99] = float("inf")
    for top_k, top_p, min_p in [(None, None, torch.tensor([0.0, 0.1, 0.0, 0.0])),
                                (torch.tensor([V, 5, V, V]), torch.tensor([1.0, 1.0, 1.0, 0.9]), None)]:
        got = S.apply_top_k_top_p_min_p(logits, top_k, top_p, min_p)
        sorted_l, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
        want = S._filter_sorted(logits, sorted_l, idx, top_k, top_p, min_p, None)[0]
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        fin = torch.isfinite(want)
        assert torch.equal(got[fin], want[fin])


def test_tokens_and_probs_check_the_logits_shape():
    md = SamplingMetadata.build([SamplingParams(seed=1)], [[]], [[1]], [1], None, None, "cpu", 8)
    for fn in (SAMPLER.tokens, SAMPLER.probs, lambda x, m: SAMPLER.sample_with_probs(x, m, 3)):
        with pytest.raises(ValueError, match="logits must be"):
            fn(torch.zeros(1, 9), md)
