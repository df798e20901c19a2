"""Speculative decoding audit (random: presets, CPU, fast): speculation must not change what a request
produces. Greedy requests give plain decoding's tokens, text, finish reasons and logprobs with every
drafter under stops, min_tokens, max_tokens, penalties and n > 1; seeded sampled requests give the
same tokens whatever k (fixed 1, fixed 4 or adaptive: timing-driven), the batch and the drafter are,
and those are plain sampling's (the verifier accepts a draft when it equals the token plain sampling
draws at its position); preemption, prefix caching and aborts leave no trace; the acceptance
figures exist and are sane when nothing was drafted.
"""
from __future__ import annotations

import random

import pytest

from decodekit import LLM
from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks

MODEL = "random:tiny"
DRAFTERS = {
    "ngram": dict(speculative="ngram", spec_ngram_min=1, num_speculative_tokens=4),
    "layerskip": dict(speculative="layerskip", spec_layers=1, num_speculative_tokens=3),
    "draft": dict(speculative="draft", spec_draft_model="random:tiny-qwen2", num_speculative_tokens=3),
    "draft-self": dict(speculative="draft", spec_draft_model=MODEL, num_speculative_tokens=3),
}


def _llm(**kw):
    kw.setdefault("kv_cache_memory", "16MiB")
    return LLM(MODEL, dtype="float32", device="cpu", **kw)


@pytest.fixture(scope="module")
def base():
    return _llm()


@pytest.fixture(scope="module")
def prompts(base):
    rng = random.Random(0)
    ps = [[rng.randrange(3, 512) for _ in range(rng.randint(3, 40))] for _ in range(3)]
    loop = [5, 6, 7, 8, 9]
    g = base.generate({"prompt_token_ids": loop}, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    ps.append(loop + g[0].outputs[0].token_ids + loop)   # continues its own text: n-gram drafts hit
    return ps


def _key(out):
    """What must be identical: tokens, text, finish and stop reasons, the logprob entries' token ids
    and ranks (logprob values are compared with a tolerance: a verification's rows may differ from
    one-token steps in the last float32 bits on a float-weight model)."""
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason,
             None if c.logprobs is None else [{t: l.rank for t, l in d.items()} for d in c.logprobs])
            for c in out.outputs]


def _logprob_values(out):
    return [l.logprob for c in out.outputs for d in (c.logprobs or []) for l in d.values()]


def _gen(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def _greedy_params(base, prompts):
    ref = _gen(base, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    out = [dict(max_tokens=16, ignore_eos=True), dict(max_tokens=16, repetition_penalty=1.6, ignore_eos=True),
           dict(max_tokens=16, frequency_penalty=0.6, presence_penalty=0.4, ignore_eos=True),
           dict(max_tokens=16, presence_penalty=-1.5, ignore_eos=True),
           *[dict(max_tokens=m, ignore_eos=True) for m in (1, 2, 3, 5)],
           dict(max_tokens=16, logprobs=2), dict(max_tokens=16, n=2, ignore_eos=True)]
    ids, text = ref[-1].outputs[0].token_ids, ref[-1].outputs[0].text
    out += [dict(max_tokens=16, stop_token_ids=[ids[5]]),
            dict(max_tokens=16, stop_token_ids=[ids[5]], min_tokens=9, ignore_eos=True),
            dict(max_tokens=16, stop=[text[4:8]]), dict(max_tokens=16, stop=[text[4:8]], include_stop_str_in_output=True),
            dict(max_tokens=16, stop=[text[4:8]], min_tokens=5)]
    return [SamplingParams(temperature=0, **p) for p in out]


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_greedy_identical_to_plain_under_every_option(method, base, prompts):
    spec = _llm(**DRAFTERS[method], spec_adaptive=False)
    for sp in _greedy_params(base, prompts):
        a, b = _gen(base, prompts, sp), _gen(spec, prompts, sp)
        assert [_key(o) for o in b] == [_key(o) for o in a], sp
        for x, y in zip(a, b):
            assert _logprob_values(y) == pytest.approx(_logprob_values(x), abs=1e-4)
        assert all(len(c.token_ids) <= sp.max_tokens for o in _gen(spec, prompts[:1], sp) for c in o.outputs)
    assert spec.engine.spec.stats["spec_draft_tokens"] > 0
    assert_no_leaks(spec)


SAMPLED = [dict(temperature=0.05), dict(temperature=0.05, presence_penalty=0.1, frequency_penalty=0.1),
           dict(temperature=0.05, top_p=0.7), dict(temperature=0.05, min_p=0.2, top_k=5),
           dict(temperature=1.0, repetition_penalty=1.5)]


@pytest.mark.parametrize("method", ["ngram", "layerskip", "draft"])
def test_seeded_sampling_does_not_depend_on_k_or_batch(method, base, prompts):
    """A seeded sampled request's tokens must not depend on how many drafts were verified per step
    (k is picked per request from measured step times when adaptive, so it varies from run to run
    and with the batch): k = 1, k = 4 and adaptive k, alone and beside other requests, all give the
    same tokens, and they are plain sampling's (same seeds)."""
    kw = {k: v for k, v in DRAFTERS[method].items() if k != "num_speculative_tokens"}
    k1 = _llm(**kw, num_speculative_tokens=1, spec_adaptive=False)
    k4 = _llm(**kw, num_speculative_tokens=4, spec_adaptive=False)
    ad = _llm(**kw, num_speculative_tokens=4)
    loop = prompts[-1]
    others = [[7] * 5 + p for p in prompts[:3]]
    for i, pd in enumerate(SAMPLED):
        sp = SamplingParams(max_tokens=24, ignore_eos=True, seed=100 + i, n=3, **pd)
        want = [c.token_ids for c in _gen(base, [loop], sp)[0].outputs]
        for llm in (k1, k4, ad):
            assert [c.token_ids for c in _gen(llm, [loop], sp)[0].outputs] == want, (method, pd)
        mixed = _gen(ad, [loop, *others], [sp] + [SamplingParams(temperature=0.7, max_tokens=20)] * 3)
        assert [c.token_ids for c in mixed[0].outputs] == want, (method, pd)
    assert k4.engine.spec.stats["spec_accepted_tokens"] > 0
    for llm in (k1, k4, ad):
        assert_no_leaks(llm)


def test_sampled_many_seeds_equal_plain_and_drafts_get_accepted(base, prompts):
    """Many seeds (the whole first-tokens distribution): layer-skip and a self-draft emit plain
    sampling's tokens; a self-draft (q = p) agrees with the target nearly always."""
    sp = [SamplingParams(temperature=0.05, max_tokens=6, ignore_eos=True, seed=7 + i, n=40) for i in range(2)]
    want = [c.token_ids for o in _gen(base, [prompts[-1]] * 2, sp) for c in o.outputs]
    for method in ("layerskip", "draft-self"):
        spec = _llm(**DRAFTERS[method], spec_adaptive=False)
        got = [c.token_ids for o in _gen(spec, [prompts[-1]] * 2, sp) for c in o.outputs]
        assert got == want, method
        s = spec.engine.spec.summary()
        if method == "draft-self":
            assert s["spec_acceptance_rate"] > 0.95, s
        assert_no_leaks(spec)


@pytest.mark.parametrize("method", ["layerskip", "draft"])
def test_preemption_and_prefix_caching_with_model_drafters(method, base, prompts):
    """A KV cache too small for the batch (preemption by recompute) and shared prompt prefixes
    (prefix-cache hits on blocks the drafter also writes): greedy and seeded outputs are plain's."""
    kw = dict(kv_cache_memory=24 * 4096, block_size=8, max_model_len=128, max_num_seqs=4, enable_prefix_caching=True)
    small_base = _llm(**kw)   # 24 blocks of 8 tokens (4 KiB each; a draft model's pool doubles that)
    spec = _llm(**{**kw, "kv_cache_memory": 24 * 4096 * (2 if method == "draft" else 1)},
                **DRAFTERS[method], spec_adaptive=False)
    shared = prompts[-1]
    reqs = [shared + p[:6] for p in prompts[:3]] + [shared]
    for sp in (SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
               SamplingParams(temperature=0.05, max_tokens=40, ignore_eos=True, seed=3, presence_penalty=0.1)):
        want = [o.outputs[0].token_ids for o in _gen(base, reqs, sp)]
        assert [o.outputs[0].token_ids for o in _gen(small_base, reqs, sp)] == want
        assert [o.outputs[0].token_ids for o in _gen(spec, reqs, sp)] == want, sp
    assert spec.engine.scheduler.num_preemptions > 0
    assert_no_leaks(spec)


def test_metrics_sane_and_abort_mid_run(prompts):
    # fixed k: the adaptive k is timing-driven and, on a loaded machine, may draft nothing for a whole request
    spec = _llm(**DRAFTERS["ngram"], spec_adaptive=False)
    # nothing drafted (max_tokens 1 and 2 leave no room for a draft): the figures are 0, not an error
    out = _gen(spec, prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    for o in out:
        m = o.metrics
        assert m["spec_draft_tokens"] == m["spec_accepted_tokens"] == m["spec_verify_steps"] == 0
        assert m["spec_acceptance_rate"] == 0.0 and m["spec_mean_accepted_length"] == 0.0
    s = spec.engine.spec.summary()
    assert s["spec_acceptance_rate"] == 0.0 and s["spec_mean_accepted_length"] == 0.0 and s["spec_method"] == "ngram"
    o = _gen(spec, [prompts[-1]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    m = o.metrics
    assert 0 < m["spec_accepted_tokens"] <= m["spec_draft_tokens"]
    assert m["spec_acceptance_rate"] == pytest.approx(m["spec_accepted_tokens"] / m["spec_draft_tokens"])
    assert 1.0 <= m["spec_mean_accepted_length"] <= 1 + spec.engine.args.num_speculative_tokens
    # each verification emits its accepted drafts + 1; the prefill and undrafted steps one token each
    assert len(o.outputs[0].token_ids) >= m["spec_verify_steps"] + m["spec_accepted_tokens"] + 1
    # abort mid-run: the engine forgets the request and its drafter state, nothing leaks
    eng = spec.engine
    rid = eng.add_request("abort-me", {"prompt_token_ids": prompts[-1]},
                          SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    keep = eng.add_request("keep", {"prompt_token_ids": prompts[-1]},
                           SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(4):
        eng.step()
    eng.abort_request(rid)
    done = {}
    while eng.has_unfinished_requests():
        for r in eng.step():
            done[r.request_id] = r
    assert done[rid].outputs[0].finish_reason == "abort"
    assert done[keep].outputs[0].token_ids == o.outputs[0].token_ids[:20]
    assert rid not in spec.engine.spec._k_of and rid not in spec.engine.spec.drafter._proposers
    assert_no_leaks(spec)
