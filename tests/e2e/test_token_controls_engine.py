"""logit_bias, allowed_token_ids and bad_words end to end on the embedded model (LLM API): the tokens
obey them, with and without speculative decoding (which must emit exactly what plain decoding does,
with multi-token bad words read against the drafted prefix), and leave no KV block behind."""
import pytest

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_llm

PROMPTS = ["The history of the Roman Empire", "A recipe for pancakes: first,", "Once there was a robot who",
           "My favourite colour is"]


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="256MiB", seed=1)


def _greedy(llm, prompts, **kw):
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **kw)
    return [o.outputs[0] for o in llm.generate(prompts, sp)]


def _contains(tokens, seq):
    return any(tokens[i:i + len(seq)] == seq for i in range(len(tokens) - len(seq) + 1))


def _words(llm, outs):
    """Per output: two words of its greedy text, the second of several tokens where there is one."""
    tok = llm.engine.tokenizer
    res = []
    for o in outs:
        ws = [w for w in o.text.split() if w.isalpha()]
        multi = [w for w in ws if len(tok.encode(" " + w, add_special_tokens=False)) > 1]
        res.append([ws[0]] + multi[:1] if ws else [])
    return res


def test_bad_words_are_never_completed(llm):
    plain = _greedy(llm, PROMPTS)
    words = _words(llm, plain)
    outs = [llm.generate(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=w))[0]
            for p, w in zip(PROMPTS, words)]
    for p, w, o, base in zip(PROMPTS, words, outs, plain):
        sp = SamplingParams(bad_words=w)
        sp.set_bad_words_token_ids(llm.engine.tokenizer, llm.engine.model_config.vocab_size)
        got = o.outputs[0].token_ids
        assert not any(_contains(got, seq) for seq in sp.bad_words_token_ids), (p, w, o.outputs[0].text)
        assert any(_contains(base.token_ids, seq) for seq in sp.bad_words_token_ids)  # the plain text had them
    assert_no_leaks(llm)


def test_logit_bias_and_allowed_tokens(llm):
    outs = _greedy(llm, PROMPTS[:2], logit_bias={1000: 100.0})
    assert all(o.token_ids == [1000] * 24 for o in outs)
    allowed = [28, 253, 1000, 4713]
    sp = SamplingParams(temperature=1.2, max_tokens=20, ignore_eos=True, seed=7, allowed_token_ids=allowed)
    for o in llm.generate(PROMPTS, sp):
        assert set(o.outputs[0].token_ids) <= set(allowed)
    # a bias on the greedy token's competitor changes the argmax exactly where the margin is below it
    base = _greedy(llm, PROMPTS[:1])[0]
    biased = _greedy(llm, PROMPTS[:1], logit_bias={base.token_ids[0]: -100.0})[0]
    assert biased.token_ids[0] != base.token_ids[0]
    assert_no_leaks(llm)


@pytest.mark.parametrize("method", ["ngram", "layerskip"])
def test_speculative_decoding_obeys_them_exactly(llm, method):
    spec = embedded_llm(kv_cache_memory="256MiB", seed=1, speculative=method, num_speculative_tokens=3)
    words = _words(llm, _greedy(llm, PROMPTS))
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=words[0]),
              SamplingParams(temperature=0.9, max_tokens=24, ignore_eos=True, seed=11, bad_words=words[1],
                             logit_bias={13: 5.0}),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=words[2],
                             repetition_penalty=1.3),
              SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=5,
                             allowed_token_ids=list(range(200, 3000)))]
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS, params)]
    assert got == want
    assert_no_leaks(spec)


def test_speculative_bad_word_across_drafts(llm):
    """A repeated phrase the n-gram drafter proposes whole: the multi-token bad word's prefix is in the
    drafts, so its last token must be masked at the verify row after them (not only after accepted ones)."""
    spec = embedded_llm(kv_cache_memory="256MiB", seed=1, speculative="ngram", num_speculative_tokens=4,
                        spec_adaptive=False)
    prompt = "red green blue yellow, red green blue yellow, red green blue yellow, red green blue yellow,"
    base = _greedy(llm, [prompt])[0]
    assert "blue yellow" in base.text
    for words in (["yellow,"], ["blue yellow,"], ["green blue yellow"]):
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=words)
        want = llm.generate(prompt, sp)[0].outputs[0]
        got = spec.generate(prompt, sp)[0]
        assert got.outputs[0].token_ids == want.token_ids, (words, want.text, got.outputs[0].text)
        assert words[0] not in got.outputs[0].text and got.metrics["spec_accepted_tokens"] > 0
    assert spec.engine.spec is not None
    assert_no_leaks(spec)


def test_conflicting_controls(llm):
    """Found by the audit: masks that leave no allowed token drew token 0 (<|endoftext|>). Now: conflicts
    known up front are refused naming bad_words; a bad word that masks the only allowed token partway is
    lifted for that step (allowed_token_ids holds)."""
    from decodekit.sampling.params import SamplingParamsError
    with pytest.raises(SamplingParamsError) as e:   # ':' (42) is a bad word, EOS (2) held by min_tokens
        llm.generate("Hi", SamplingParams(temperature=0, max_tokens=6, min_tokens=3, allowed_token_ids=[42, 2],
                                          bad_words=[":"]))
    assert e.value.field == "bad_words"
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, allowed_token_ids=[260],
                                            bad_words=["the the"]))[0].outputs[0]
    assert out.token_ids == [260] * 5
    with pytest.raises(SamplingParamsError) as e:
        llm.generate("Hi", SamplingParams(max_tokens=2, bad_words=["a\ud800"]))
    assert e.value.field == "bad_words"
    assert_no_leaks(llm)


def test_guided_choice(llm):
    """guided_choice on the embedded model: greedy and sampled outputs (20 seeds, n=3) are exactly one of the
    choices and end with EOS (finish 'stop'); speculative decoding (n-gram) emits the same tokens."""
    conv = [{"role": "user", "content": "Is this review positive or negative? 'The food was cold.'"}]
    choices = ["Positive", "Negative", "Neutral", "Negative, clearly"]
    ids = llm.apply_chat_template(conv)
    greedy = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=12,
                                                                    guided_choice=choices))[0].outputs[0]
    assert greedy.text in choices and greedy.finish_reason == "stop"
    outs = llm.generate([{"prompt_token_ids": ids}] * 20,
                        [SamplingParams(temperature=1.3, seed=s, n=3, max_tokens=12, guided_choice=choices)
                         for s in range(20)])
    texts = [c.text for o in outs for c in o.outputs]
    assert set(texts) <= set(choices) and len(set(texts)) >= 2, texts
    assert all(c.finish_reason == "stop" for o in outs for c in o.outputs)
    spec = embedded_llm(kv_cache_memory="256MiB", seed=1, speculative="ngram", num_speculative_tokens=3)
    params = [SamplingParams(temperature=t, seed=3, max_tokens=12, guided_choice=choices) for t in (0, 1.0)]
    want = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": ids}] * 2, params)]
    assert [o.outputs[0].token_ids for o in spec.generate([{"prompt_token_ids": ids}] * 2, params)] == want
    assert_no_leaks(llm)
    assert_no_leaks(spec)
