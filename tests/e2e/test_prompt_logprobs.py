"""prompt_logprobs through the engine: the same numbers whatever the chunking, batch, preemption, n or
speculative decoding; one-token prompts; aborts mid-prompt; no KV block left behind. (Against HF
transformers: tests/e2e/test_hf_oracle.py.)"""
import pytest

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_llm

PROMPTS = ["The history of the Roman Empire " * 12, "A recipe for pancakes: first,", "Rain fell on the " * 20,
           "Dear Sir or Madam,"]


def _table(out):
    return [None if e is None else {t: (v.logprob, v.rank) for t, v in e.items()} for e in out.prompt_logprobs]


def _same(a, b):
    """Equal up to float32 rounding, which the batch shape changes (GEMM row blocking): logprobs within
    1e-4, ranks exact in the top 10 and within 0.1% deeper (a ~1e-6 shift reorders near-tied tail tokens)."""
    ta, tb = _table(a), _table(b)
    assert len(ta) == len(tb) and ta[0] is None and tb[0] is None
    for i, (x, y) in enumerate(zip(ta[1:], tb[1:]), 1):
        assert x.keys() == y.keys(), i
        for t in x:
            (la, ra), (lb, rb) = x[t], y[t]
            assert abs(la - lb) < 1e-4 and (ra == rb if min(ra, rb) <= 10 else abs(ra - rb) <= 2 + ra // 1000), \
                (i, t, x[t], y[t])


@pytest.fixture(scope="module")
def ref():
    llm = embedded_llm(kv_cache_memory="256MiB", seed=1)
    outs = [llm.generate(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=2))[0]
            for p in PROMPTS]
    return llm, outs


def test_shape_and_first_token(ref):
    llm, outs = ref
    for o in outs:
        pl = o.prompt_logprobs
        assert len(pl) == len(o.prompt_token_ids) and pl[0] is None
        assert all(o.prompt_token_ids[i] in pl[i] and len(pl[i]) in (2, 3) for i in range(1, len(pl)))
    one = llm.generate({"prompt_token_ids": [42]}, SamplingParams(max_tokens=2, prompt_logprobs=0))[0]
    assert one.prompt_logprobs == [None]
    plain = llm.generate(PROMPTS[1], SamplingParams(max_tokens=2))[0]
    assert plain.prompt_logprobs is None
    assert_no_leaks(llm)


@pytest.mark.parametrize("kw", [dict(max_num_batched_tokens=40), dict(kv_cache_memory="9MiB", max_model_len=128, max_num_batched_tokens=32),
                                dict(speculative="ngram", num_speculative_tokens=3),
                                dict(speculative="layerskip", num_speculative_tokens=2, max_num_batched_tokens=48)])
def test_same_under_chunking_batching_preemption_and_spec(ref, kw):
    _, want = ref
    llm = embedded_llm(**{"kv_cache_memory": "256MiB", "seed": 1, **kw})
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, prompt_logprobs=2))
    for o, w in zip(outs, want):
        _same(o, w)
        assert o.outputs[0].token_ids[:6] == w.outputs[0].token_ids
    if "max_model_len" in kw:
        assert llm.engine.scheduler.num_preemptions > 0
    assert_no_leaks(llm)


def test_n_and_abort(ref):
    llm, want = ref
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.8, seed=3, n=3, max_tokens=4, prompt_logprobs=2))[0]
    assert len(out.outputs) == 3
    _same(out, want[0])
    eng = llm.engine
    eng.add_request("lp-abort", PROMPTS[2] * 4, SamplingParams(max_tokens=4, prompt_logprobs=1))
    eng.step()
    assert eng.abort_request("lp-abort")
    while eng.has_unfinished_requests():
        outs = eng.step()
    assert not eng._groups and not eng._seq_of    # no request, so no prompt-logprobs table, left
    assert_no_leaks(llm)


def test_invalid_prompt_logprobs(ref):
    llm, _ = ref
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            llm.generate("hi", SamplingParams(prompt_logprobs=bad))


def test_preempted_mid_prompt(ref):
    """A long prompt computed in small chunks next to growing decodes in an 8-block cache is preempted
    while its prompt logprobs are half in (checked), recomputed from position 0, and ends equal."""
    llm, _ = ref
    prompts = ["Once there was a robot who lived in a small house near the sea, and every morning it walked",
               "The best way to learn a language is to speak it every day with friends and to read books in it,",
               "Rain fell on the " * 20]
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, prompt_logprobs=2)
    want = llm.generate(prompts, sp)
    small = embedded_llm(kv_cache_memory="6MiB", max_model_len=128, max_num_batched_tokens=16, seed=1)
    sched, seen = small.engine.scheduler, []
    preempt = sched._preempt

    def spy(req, out):
        seen.append(req.prompt_logprobs_pending)
        return preempt(req, out)
    sched._preempt = spy
    got = small.generate(prompts, sp)
    assert any(seen), seen
    for o, w in zip(got, want):
        _same(o, w)
        assert o.outputs[0].token_ids == w.outputs[0].token_ids
    assert_no_leaks(small)
