"""LLM.beam_search on the embedded model: the same hypotheses as a plain beam search written here over
an engine without prefix caching (fresh prefills every step); each hypothesis' cum_logprob is the sum
of its tokens' logprobs in one prefill of prompt + hypothesis (prompt_logprobs, another code path); a
beam of 1 is greedy generation; concurrency_limit does not change results; errors name the field; no
KV block is left behind."""
from __future__ import annotations

import pytest

from decodekit import LLM
from decodekit.sampling import SamplingParams, SamplingParamsError
from decodekit.sampling.beam_search import BeamSearchParams, beam_score
from dk_testing import assert_no_leaks, embedded_llm, embedded_model_or_skip

PROMPTS = ["The capital of France is", "def fibonacci(n):", "My favourite fruit", "1, 2, 3,"]


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="256MiB", seed=1)


@pytest.fixture(scope="module")
def plain():
    """The oracle's engine: no prefix cache, so every step computes the whole sequence."""
    return LLM(embedded_model_or_skip(), dtype="float32", device="cpu", kv_cache_memory="128MiB",
               enable_prefix_caching=False, seed=1)


def oracle(plain: LLM, prompt: str, width: int, max_tokens: int, length_penalty: float) -> list[tuple]:
    """(score, tokens) of the best hypotheses: each step ranks all (beam, top-2w token) pairs."""
    eos = set(plain.engine.eos_token_ids)
    start = plain.tokenizer.encode(prompt, add_special_tokens=True)

    def score(cum, toks):
        return cum / ((len(toks) - (toks[-1] in eos)) ** length_penalty)
    beams, done = [(0.0, start)], []
    for _ in range(max_tokens):
        outs = plain.generate([{"prompt_token_ids": t} for _, t in beams],
                              SamplingParams(temperature=0, max_tokens=1, logprobs=2 * width, ignore_eos=True))
        cands = []
        for (cum, toks), o in zip(beams, outs):
            table = o.outputs[0].logprobs[0]
            for tid, lp in sorted(table.items(), key=lambda kv: kv[1].rank):
                if lp.rank <= 2 * width:
                    (done if tid in eos else cands).append((cum + lp.logprob, toks + [tid]))
        cands.sort(key=lambda c: score(*c), reverse=True)
        beams = cands[:width]
        if not beams:
            break
    best = sorted(done + beams, key=lambda c: score(*c), reverse=True)[:width]
    return [(score(*c), c[1]) for c in best]


@pytest.mark.parametrize("width, max_tokens, lp", [(3, 10, 1.0), (2, 7, 0.0), (4, 6, 2.0)])
def test_matches_plain_beam_search(llm, plain, width, max_tokens, lp):
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=lp)
    outs = llm.beam_search([{"prompt": p} for p in PROMPTS[:2]], params)
    eos = set(llm.engine.eos_token_ids)
    for p, out in zip(PROMPTS, outs):
        want = oracle(plain, p, width, max_tokens, lp)
        assert [s.tokens for s in out.sequences] == [t for _, t in want], p
        for s, (sc, _) in zip(out.sequences, want):
            assert beam_score(s, eos, lp) == pytest.approx(sc, abs=2e-4)
    assert_no_leaks(llm)


def test_scores_agree_with_prefill_logprobs(llm):
    """cum_logprob (decode-step logprobs through the prefix cache) == the hypothesis' logprob in one
    prefill; sequences come best first; text is the decoded hypothesis without EOS."""
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=3, max_tokens=12))
    eos = set(llm.engine.eos_token_ids)
    for out in outs:
        scores = [beam_score(s, eos, 1.0) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        for s in out.sequences:
            gen = s.generated_token_ids
            assert len(gen) == len(s.logprobs) and 1 <= len(gen) <= 12
            assert s.cum_logprob == pytest.approx(sum(t[tid].logprob for t, tid in zip(s.logprobs, gen)), abs=1e-9)
            (o,) = llm.generate([{"prompt_token_ids": s.tokens}], SamplingParams(max_tokens=1, prompt_logprobs=0))
            plp = o.prompt_logprobs[len(s.tokens) - len(gen):]
            assert sum(e[tid].logprob for e, tid in zip(plp, gen)) == pytest.approx(s.cum_logprob, abs=2e-3)
            text_ids = gen[:-1] if s.finish_reason == "stop" else gen
            assert s.text == llm.tokenizer.decode(text_ids, skip_special_tokens=True)
            assert (s.finish_reason == "stop") == (gen[-1] in eos)
    assert_no_leaks(llm)


def test_width_one_is_greedy(llm):
    """Without EOS in reach (ignore_eos) a beam of one is greedy decoding."""
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=1, max_tokens=16, ignore_eos=True))
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for b, g in zip(outs, greedy):
        (s,) = b.sequences
        assert s.generated_token_ids == g.outputs[0].token_ids
        assert s.finish_reason == "length"


def test_concurrency_limit_and_prompt_forms(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=5)
    ids = llm.tokenizer.encode(PROMPTS[2], add_special_tokens=True)
    a = llm.beam_search([PROMPTS[2], PROMPTS[3], {"prompt_token_ids": ids}, ids], params, concurrency_limit=1)
    b = llm.beam_search(PROMPTS[2:4], params)
    assert [[s.tokens for s in o.sequences] for o in a[:2]] == [[s.tokens for s in o.sequences] for o in b]
    assert [s.tokens for s in a[2].sequences] == [s.tokens for s in a[0].sequences] == \
        [s.tokens for s in a[3].sequences]
    (one,) = llm.beam_search(PROMPTS[3], params)
    assert [s.tokens for s in one.sequences] == [s.tokens for s in b[1].sequences]


def test_truncate_prompt_tokens(llm):
    """The search starts from the prompt's last k tokens (as SamplingParams'), the same as from those tokens."""
    ids = llm.tokenizer.encode(PROMPTS[1] + " " + PROMPTS[2], add_special_tokens=True)
    (a,) = llm.beam_search({"prompt_token_ids": ids}, BeamSearchParams(beam_width=2, max_tokens=4,
                                                                        truncate_prompt_tokens=5))
    (b,) = llm.beam_search({"prompt_token_ids": ids[-5:]}, BeamSearchParams(beam_width=2, max_tokens=4))
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert all(s.prompt_len == 5 for s in a.sequences)
    for bad in (0, -2, 1.0, True):
        with pytest.raises(SamplingParamsError) as e:
            BeamSearchParams(beam_width=2, max_tokens=4, truncate_prompt_tokens=bad)
        assert e.value.field == "truncate_prompt_tokens"
    assert_no_leaks(llm)


def test_errors(llm):
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(PROMPTS, SamplingParams())
    with pytest.raises(SamplingParamsError) as e:
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=llm.engine.max_model_len))
    assert e.value.field == "max_tokens"
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=0)
    with pytest.raises(ValueError, match="token ids"):
        llm.beam_search([[1, -4]], BeamSearchParams(beam_width=2, max_tokens=2))
    p = BeamSearchParams(beam_width=2, max_tokens=2)
    p.beam_width = 99  # changed after construction: checked again
    with pytest.raises(SamplingParamsError) as e:
        llm.beam_search(PROMPTS, p)
    assert e.value.field == "beam_width"
    assert_no_leaks(llm)
    # the engine still serves
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))[0].outputs[0].token_ids


def _tokens(outs):
    return [[s.tokens for s in o.sequences] for o in outs]


@pytest.mark.parametrize("engine_kw", [
    dict(kv_cache_memory="3MiB", max_model_len=64),       # a few blocks: beams preempted, forks refused
    dict(kv_cache_memory="64MiB", max_num_seqs=2),        # fewer batch slots than beams
    dict(kv_cache_memory="64MiB", speculative="ngram"),   # beams are never drafted for
    dict(kv_cache_memory="64MiB", enable_prefix_caching=False, block_size=32),
])
def test_same_hypotheses_under_engine_settings(llm, engine_kw):
    params = BeamSearchParams(beam_width=3, max_tokens=10)
    want = _tokens(llm.beam_search(PROMPTS[:3], params))
    other = LLM(embedded_model_or_skip(), dtype="float32", device="cpu", seed=1, **engine_kw)
    assert _tokens(other.beam_search(PROMPTS[:3], params)) == want
    if "3MiB" in engine_kw.get("kv_cache_memory", ""):
        assert other.engine.scheduler.num_preemptions > 0
    assert_no_leaks(other)


def test_alongside_other_requests_and_abort(llm):
    """Beam searches and sampled requests in the same steps give what each gives alone; an aborted search
    frees its beams at once."""
    eng = llm.engine
    params = BeamSearchParams(beam_width=4, max_tokens=8, logprobs=2)
    alone_beam = llm.beam_search(PROMPTS[:2], params)
    sp = SamplingParams(temperature=0.8, seed=7, max_tokens=12, n=2)
    alone_gen = llm.generate(PROMPTS[2:], sp)
    ids = [eng.add_request(f"b{i}", p, params) for i, p in enumerate(PROMPTS[:2])]
    ids += [eng.add_request(f"g{i}", p, sp) for i, p in enumerate(PROMPTS[2:])]
    eng.add_request("doomed", PROMPTS[0], BeamSearchParams(beam_width=4, max_tokens=30))
    outs, steps = {}, 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
        steps += 1
        eng.scheduler.check_invariants()
        if steps == 3:
            assert eng.abort_request("doomed")
    assert outs["doomed"].outputs and all(c.finish_reason == "abort" for c in outs["doomed"].outputs)
    for i, want in enumerate(alone_beam):
        o = outs[f"b{i}"]
        assert [o.prompt_token_ids + c.token_ids for c in o.outputs] == [s.tokens for s in want.sequences]
        for c, s in zip(o.outputs, want.sequences):
            # fp32 logits of a different batch differ in the last bits (the tokens do not)
            assert c.cumulative_logprob == pytest.approx(s.cum_logprob, abs=1e-4)
            assert len(c.logprobs) == len(c.token_ids)
            for entry, tid in zip(c.logprobs, c.token_ids):
                assert tid in entry and all(x.rank <= 2 or t == tid for t, x in entry.items())
                assert entry[tid].decoded_token == llm.tokenizer.decode([tid], skip_special_tokens=False)
    for i, want in enumerate(alone_gen):
        assert [c.token_ids for c in outs[f"g{i}"].outputs] == [c.token_ids for c in want.outputs]
    assert_no_leaks(llm)


def test_beam_ids_never_clash_with_user_ids(llm):
    """Beams are requests '<id>#beam<k>': a user request already holding such an id is skipped over, and a
    user id equal to a live beam's is refused (the engine never fails mid-step)."""
    eng = llm.engine
    eng.add_request("z", "1, 2, 3,", BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True))
    for i in range(1, 9):
        eng.add_request(f"z#beam{i}", "hello", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("z#beam0", "hello", SamplingParams(max_tokens=4))
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert len(done["z"].outputs) == 4 and all(len(c.token_ids) == 6 for c in done["z"].outputs)
    assert all(len(done[f"z#beam{i}"].outputs[0].token_ids) == 4 for i in range(1, 9))
    assert_no_leaks(llm)
