"""Sampling semantics and logprobs, differential against HF transformers on the same weights (the embedded
SmolLM2-135M-Instruct GGUF, dequantized to float32 by both) and vLLM's documented rules.

* the processed distribution (penalties, temperature, top-k / top-p / min-p) vs transformers' logits processors
  (plus vLLM's presence / frequency rule written out in float64), on real model logits;
* the engine's first-token frequencies over many seeds vs softmax(processed HF logits) (chi-square);
* generated-token logprobs, ranks, top-N and cumulative logprobs vs HF's log_softmax along each sampled path;
  prompt_logprobs with n > 1 and seeds;
* seeds: batch neighbours and batch position do not change a seeded request; n > 1 children are distinct;
* stop strings, stop_token_ids, include_stop_str_in_output, min_tokens, ignore_eos, max_tokens and
  skip_special_tokens vs vLLM's rules (text = the detokenized tokens, cut before the first stop string).

Every seed is fixed: the tests are deterministic.
"""
from __future__ import annotations

import os
import random
import warnings

import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams as SP
from dk_testing import assert_no_leaks, embedded_llm, embedded_model_or_skip

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
scipy_stats = pytest.importorskip("scipy.stats")
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,  # noqa: E402
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

PROMPTS = ["The capital of France is", "Once upon a time, in a small village", "def fibonacci(n):",
           "My favourite colour is", "Write a poem in French about été:"]


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="256MiB", seed=0)


@pytest.fixture(scope="module")
def hf_model():
    path = embedded_model_or_skip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                              dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module")
def hf_tok():
    path = embedded_model_or_skip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@torch.no_grad()
def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] float32 logits of HF's full forward."""
    return model(torch.tensor([ids])).logits[0].float()


def _hf_processed(logits: torch.Tensor, p: SP, prompt: list[int], output: list[int]) -> torch.Tensor:
    """softmax (float64) of the logits after transformers' processors in HF's / vLLM's order: repetition penalty
    (prompt + output), vLLM's frequency / presence (output only), temperature, top-k, top-p, min-p."""
    V = logits.shape[-1]
    ids = torch.tensor([prompt + output])
    s = logits[None].double()
    if p.repetition_penalty != 1.0:
        s = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, s)
    counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=V).double()
    s = s - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).double()
    if p.temperature != 1.0:
        s = TemperatureLogitsWarper(p.temperature)(ids, s)
    if 0 < p.top_k < V:
        s = TopKLogitsWarper(p.top_k)(ids, s)
    if p.top_p < 1.0:
        s = TopPLogitsWarper(p.top_p)(ids, s)
    if p.min_p > 0:
        s = MinPLogitsWarper(p.min_p)(ids, s)
    return torch.softmax(s[0], dim=-1)


COMBOS = [dict(temperature=0.7, top_p=0.9), dict(top_k=5), dict(min_p=0.1), dict(temperature=1e-3),
          dict(temperature=50.0), dict(temperature=100.0, top_p=0.5), dict(top_k=1), dict(top_p=1e-6),
          dict(top_p=1.0, top_k=-1), dict(top_k=49152), dict(repetition_penalty=1.3), dict(repetition_penalty=0.6),
          dict(presence_penalty=1.5, frequency_penalty=-0.5), dict(presence_penalty=-2.0, frequency_penalty=2.0),
          dict(temperature=0.5, top_k=50, top_p=0.8, min_p=0.05, repetition_penalty=1.2, frequency_penalty=0.3),
          dict(temperature=2.0, top_k=3000, top_p=0.95), dict(temperature=1.3, top_k=1500, min_p=0.02)]


def test_processed_distribution_matches_hf_processors(llm, hf_model):
    """Sampler.probs (the distribution forward() draws from) equals transformers' processor chain on HF's own
    logits, at the last position of prompt + a generated continuation (so every penalty has tokens to act on).
    Both sides get the same float32 logits; decodekit computes in float32, the reference in float64: 2e-5 in
    probability covers float32 rounding of softmax over 49152 logits (measured worst ~7e-7)."""
    worst = 0.0
    for text in PROMPTS[:3]:
        prompt = llm.tokenizer.encode(text)
        out = llm.generate({"prompt_token_ids": prompt},
                           SP(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True))[0].outputs[0].token_ids
        logits = _hf_logits(hf_model, prompt + out)[-1]
        V = logits.shape[0]
        for kw in COMBOS:
            p = SP(**kw)
            md = SamplingMetadata.build([p], [out], [prompt], [1], None, llm.engine.eos_token_ids, "cpu", V)
            mine = Sampler().probs(logits[None].clone(), md)[0].double()
            want = _hf_processed(logits, p, prompt, out)
            assert torch.equal(mine > 0, want > 0) or kw.get("temperature") == 1e-3, (text, kw)
            worst = max(worst, float((mine - want).abs().max()))
            assert worst < 2e-5, (text, kw, worst)


def _documented_filter(l: torch.Tensor, k: int | None, p: float | None, m: float | None) -> torch.Tensor:
    """The sampler docstring's rule, written plainly: ranks by (logit desc, token id asc); top-k keeps exactly k;
    top-p keeps rank r while the top-k-renormalised mass before r is < p; min-p keeps prob >= m * max; rank 0 kept."""
    V = l.shape[0]
    order = sorted(range(V), key=lambda i: (-float(l[i]), i))
    kept = order[:V if k is None else k]
    masked = torch.full((V,), float("-inf"), dtype=torch.float64)
    masked[kept] = l[kept].double()
    pr = torch.softmax(masked, 0)
    keep, cum = torch.zeros(V, dtype=torch.bool), 0.0
    for r, i in enumerate(kept):
        ok = (p is None or p >= 1 or cum < p) and (m is None or pr[i] >= m * pr[kept[0]])
        keep[i] = ok or r == 0
        cum += float(pr[i])
    return keep


def test_filters_follow_the_documented_tie_rules():
    """apply_top_k_top_p_min_p (its 128 / 1024-candidate shortcuts and the full radix sort) against the
    documented rule on logits full of exact ties, mixed batches of rows with and without each filter."""
    from decodekit.sampling.sampler import apply_top_k_top_p_min_p
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(60):
        V = rng.choice([50, 300, 2000, 6000])
        B = rng.randint(1, 4)
        x = torch.randn(B, V) * rng.choice([0.5, 3.0, 20.0])
        if rng.random() < 0.6:
            x = (x * 2).round() / 2
        ks = [rng.choice([None, 1, 2, 5, 127, 128, 129, 1023, 1025, V]) for _ in range(B)]
        ps = [rng.choice([None, 1e-6, 0.5, 0.9, 0.999]) for _ in range(B)]
        ms = [rng.choice([None, 1e-4, 0.1, 0.5]) for _ in range(B)]
        kt = torch.tensor([V if k is None else min(k, V) for k in ks])
        pt = torch.tensor([1.0 if q is None else q for q in ps])
        mt = torch.tensor([0.0 if q is None else q for q in ms])
        got = torch.isfinite(apply_top_k_top_p_min_p(x, kt, pt, mt))
        for b in range(B):
            want = _documented_filter(x[b], min(ks[b], V) if ks[b] else None, ps[b], ms[b])
            assert torch.equal(got[b], want), (V, ks[b], ps[b], ms[b])


def _chi_square_pvalue(tokens: list[int], probs: torch.Tensor) -> float:
    """Goodness of fit: bins with expected count >= 5, the rest of the support pooled; a token outside the
    support fails outright."""
    import numpy as np
    p = probs.numpy()
    n = len(tokens)
    counts = np.bincount(np.array(tokens), minlength=len(p))
    assert counts[p == 0].sum() == 0, "sampled a token the filters drop"
    exp = p * n
    big = np.nonzero(exp >= 5)[0]
    rest = np.setdiff1d(np.nonzero(p > 0)[0], big)
    obs = list(counts[big]) + ([counts[rest].sum()] if len(rest) else [])
    e = list(exp[big]) + ([exp[rest].sum()] if len(rest) else [])
    if len(obs) < 2:
        return 1.0
    e = np.array(e) * sum(obs) / sum(e)
    return float(scipy_stats.chisquare(obs, e).pvalue)


@pytest.mark.parametrize("kw", [dict(temperature=0.7, top_p=0.9), dict(top_k=5), dict(min_p=0.1)],
                         ids=["t0.7-top_p0.9", "top_k5", "min_p0.1"])
def test_first_token_frequencies_match_hf(llm, hf_model, kw):
    """2000 seeded one-token requests in one batch: their first tokens follow softmax of HF's processed logits.
    Fixed seeds make it deterministic; p > 1e-4 has a false-alarm rate of 1e-4 for a correct sampler, while a
    missing temperature or a mis-ordered filter moves whole percent of mass (~20 sigma at N=2000). The float32
    logits differ from HF's by ~1e-4 nats: a relative change of 1e-4 in each probability, far below the noise."""
    prompt = llm.tokenizer.encode(PROMPTS[3])
    want = _hf_processed(_hf_logits(hf_model, prompt)[-1], SP(**kw), prompt, [])
    N = 2000
    outs = llm.generate([{"prompt_token_ids": prompt}] * N, [SP(max_tokens=1, seed=10_000 + i, **kw) for i in range(N)])
    tokens = [o.outputs[0].token_ids[0] for o in outs]
    assert _chi_square_pvalue(tokens, want) > 1e-4
    assert_no_leaks(llm)


def test_sampled_logprobs_match_hf(llm, hf_model):
    """Along each sampled path (n=3 seeded children, penalties and top-p on): every entry's logprob is HF's
    log_softmax of the RAW logits (vLLM's default), the sampled token is always in the entry with HF's rank
    (1 + #strictly larger), the top-N are HF's top-N in order, and cumulative_logprob is the sum of the
    sampled tokens' logprobs. Tolerance 5e-4 nats: the engine's float32 forward differs from HF's float32 by
    ~4e-5 nats (measured); near-ties within it may swap rank order, so ranks are checked away from ties."""
    prompt = llm.tokenizer.encode(PROMPTS[1])
    N = 4
    sp = SP(temperature=0.9, top_p=0.95, repetition_penalty=1.2, max_tokens=10, logprobs=N, seed=11, n=3,
            ignore_eos=True)
    out = llm.generate({"prompt_token_ids": prompt}, sp)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    for c in out.outputs:
        ref = torch.log_softmax(_hf_logits(hf_model, prompt + c.token_ids).double(), -1)
        assert len(c.logprobs) == len(c.token_ids) == 10
        for j, t in enumerate(c.token_ids):
            r, e = ref[len(prompt) - 1 + j], c.logprobs[j]
            assert t in e and len(e) in (N, N + 1)
            assert (len(e) == N) == (e[t].rank <= N)
            for tt, v in e.items():
                assert abs(v.logprob - r[tt].item()) < 5e-4, (j, tt, v.logprob, r[tt].item())
                assert v.decoded_token == llm.tokenizer.decode([tt], skip_special_tokens=False)
            gap = (r - r[t]).abs()
            gap[t] = float("inf")
            if gap.min() > 1e-3:
                assert e[t].rank == int((r > r[t]).sum()) + 1
            top = sorted((v.rank, tt) for tt, v in e.items() if tt != t or v.rank <= N)
            assert [rk for rk, _ in top][:N] == list(range(1, N + 1))
            hf_top = torch.topk(r, N + 1)
            if float(hf_top.values.diff().abs().min()) > 1e-3:      # no near-tie among HF's top N + 1
                assert [tt for _, tt in top][:N] == hf_top.indices[:N].tolist()
        assert c.cumulative_logprob == pytest.approx(sum(c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)),
                                                     abs=1e-9)
    assert_no_leaks(llm)


def test_prompt_logprobs_with_n_seeds_and_logprobs(llm, hf_model):
    """prompt_logprobs=2 with n=2, a seed and logprobs=0: position 0 is None, then per position the prompt
    token's logprob (HF's, 5e-4 nats as above) and rank, plus HF's top-2; the children share the prompt's table
    but draw distinct streams; logprobs=0 gives exactly the sampled token's entry."""
    prompt = llm.tokenizer.encode(PROMPTS[0] + " a city")
    out = llm.generate({"prompt_token_ids": prompt}, SP(prompt_logprobs=2, logprobs=0, n=2, seed=3, temperature=1.0,
                                                        max_tokens=6, ignore_eos=True))[0]
    ref = torch.log_softmax(_hf_logits(hf_model, prompt).double(), -1)
    pl = out.prompt_logprobs
    assert pl is not None and len(pl) == len(prompt) and pl[0] is None
    for pos in range(1, len(prompt)):
        r, e, t = ref[pos - 1], pl[pos], prompt[pos]
        assert t in e and len(e) in (2, 3)
        for tt, v in e.items():
            assert abs(v.logprob - r[tt].item()) < 5e-4
        assert abs(e[t].rank - (int((r > r[t]).sum()) + 1)) <= 1     # +-1: a near-tie within the tolerance
        top3 = torch.topk(r, 3).values
        if float(top3.diff().abs().min()) > 1e-3:                    # no near-tie among HF's top 3
            assert sorted(tt for tt, v in e.items() if v.rank <= 2) == sorted(torch.topk(r, 2).indices.tolist())
    assert out.outputs[0].token_ids != out.outputs[1].token_ids
    for c in out.outputs:
        assert all(list(d) == [t] for d, t in zip(c.logprobs, c.token_ids))
    assert_no_leaks(llm)


def test_seeded_request_ignores_batch_neighbours_and_position(llm):
    """A seeded request's tokens and logprobs are the same alone and at every position of a batch of other
    prompts with other seeds, lengths and filters (vLLM's per-request generator); a different seed differs;
    an n=4 request's child 0 is the plain request (derive_seed(seed, 0) = seed) and the 4 children differ."""
    sp = SP(temperature=1.0, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True, logprobs=2)
    alone = llm.generate(PROMPTS[1], sp)[0].outputs[0]
    key = (alone.token_ids, [{t: l.logprob for t, l in d.items()} for d in alone.logprobs])
    others = [SP(temperature=0.8, max_tokens=m, seed=s, ignore_eos=True, top_k=k)
              for s, m, k in [(1, 5, -1), (2, 20, 40), (3, 9, -1), (1234, 16, 3)]]
    for pos in range(5):
        params = others[:pos] + [sp] + others[pos:]
        prompts = [PROMPTS[(3 * i + pos) % 5] for i in range(5)]
        prompts[pos] = PROMPTS[1]
        c = llm.generate(prompts, params)[pos].outputs[0]
        assert (c.token_ids, [{t: l.logprob for t, l in d.items()} for d in c.logprobs]) == key, pos
    other = llm.generate(PROMPTS[1], SP(temperature=1.0, top_p=0.95, max_tokens=16, seed=1235, ignore_eos=True))
    assert other[0].outputs[0].token_ids != alone.token_ids
    kids = llm.generate(PROMPTS[1], SP(temperature=1.0, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True, n=4))
    toks = [c.token_ids for c in kids[0].outputs]
    assert toks[0] == alone.token_ids and len({tuple(t) for t in toks}) == 4
    assert_no_leaks(llm)


def test_stop_strings_cut_the_detokenized_text(llm):
    """Random substrings of a sampled output as stop strings: the text is the full text cut before the stop
    string's first occurrence (with it, include_stop_str_in_output), the token ids run up to the token that
    completes it, finish_reason "stop" and stop_reason the string (vLLM's rule)."""
    rng = random.Random(0)
    tok = llm.tokenizer
    base = [dict(temperature=1.1, max_tokens=24, seed=s, ignore_eos=True) for s in range(6)]
    fulls = [o.outputs[0] for o in llm.generate([PROMPTS[s % 5] for s in range(6)], [SP(**kw) for kw in base])]
    cases = []                  # (prompt index, stop string, include_stop_str_in_output)
    for s, full in enumerate(fulls):
        for _ in range(3):
            a = rng.randrange(0, len(full.text) - 1)
            stop = full.text[a:a + rng.randint(1, min(6, len(full.text) - a))]
            if "\ufffd" not in stop:   # an incomplete character's placeholder exists only in the flushed text
                cases += [(s, stop, False), (s, stop, True)]
    outs = llm.generate([PROMPTS[s % 5] for s, _, _ in cases],
                        [SP(stop=[stop], include_stop_str_in_output=inc, **base[s]) for s, stop, inc in cases])
    for (s, stop, inc), o in zip(cases, outs):
        full, c = fulls[s], o.outputs[0]
        j = next(j for j in range(1, len(full.token_ids) + 1) if stop in tok.decode(full.token_ids[:j]))
        i = full.text.find(stop)
        assert c.text == full.text[:i + (len(stop) if inc else 0)], (stop, inc)
        assert c.token_ids == full.token_ids[:j]
        assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert_no_leaks(llm)


def test_stop_tokens_min_tokens_and_max_tokens(llm):
    """vLLM's boundaries, forced with logit_bias so they do not depend on what the model likes: min_tokens holds
    EOS (both of the model's EOS ids) and stop_token_ids back for exactly min_tokens tokens; a stop token
    ends the output with its id kept and its text only with include_stop_str_in_output (and
    skip_special_tokens=False for a special one); stop strings count only after min_tokens; ignore_eos runs
    to max_tokens."""
    eos = sorted(llm.engine.eos_token_ids)
    assert len(eos) >= 1
    P = PROMPTS[0]

    def run(**kw):
        kw.setdefault("temperature", 0)
        kw.setdefault("max_tokens", 12)
        return llm.generate(P, SP(**kw))[0].outputs[0]
    for e in eos:
        for kw in (dict(), dict(temperature=1.0, seed=3)):
            c = run(min_tokens=5, logit_bias={e: 100.0}, **kw)
            assert len(c.token_ids) == 6 and c.token_ids[-1] == e and e not in c.token_ids[:5]
            assert (c.finish_reason, c.stop_reason) == ("stop", None)
    c = run(min_tokens=5, stop_token_ids=[30], logit_bias={30: 100.0})
    assert c.token_ids[5:] == [30] and 30 not in c.token_ids[:5] and (c.finish_reason, c.stop_reason) == ("stop", 30)
    assert c.text == llm.tokenizer.decode(c.token_ids[:5])
    c = run(stop_token_ids=[30], logit_bias={30: 100.0}, include_stop_str_in_output=True)
    assert (c.token_ids, c.text, c.stop_reason) == ([30], ".", 30)
    c = run(min_tokens=4, logit_bias={30: 100.0}, stop=["."])
    assert (c.token_ids, c.text, c.stop_reason) == ([30] * 5, "....", ".")
    c = run(min_tokens=4, logit_bias={30: 100.0}, stop=["."], include_stop_str_in_output=True)
    assert (c.token_ids, c.text) == ([30] * 5, ".....")
    c = run(min_tokens=3, logit_bias={eos[-1]: 100.0}, ignore_eos=True, max_tokens=6)
    assert (c.token_ids, c.text, c.finish_reason) == ([eos[-1]] * 6, "", "length")
    c = run(logit_bias={eos[-1]: 100.0}, ignore_eos=True, max_tokens=2, skip_special_tokens=False)
    assert c.text == llm.tokenizer.decode([eos[-1]] * 2, skip_special_tokens=False) and c.text
    c = run(max_tokens=1, logit_bias={eos[-1]: 100.0}, include_stop_str_in_output=True, skip_special_tokens=False)
    eos_text = llm.tokenizer.decode([eos[-1]], skip_special_tokens=False)
    assert (c.token_ids, c.text, c.finish_reason) == ([eos[-1]], eos_text, "stop")
    c = run(max_tokens=3, ignore_eos=True)
    assert len(c.token_ids) == 3 and c.finish_reason == "length"
    assert_no_leaks(llm)


def test_text_is_hf_decode_of_the_tokens(llm, hf_tok):
    """The incremental detokenizer's final text equals HF's tokenizer decoding all generated ids at once, with
    and without skip_special_tokens, with special tokens pushed into the middle of the output by logit_bias and
    multi-byte characters (French, Japanese, emoji prompts)."""
    prompts = PROMPTS[:4] + ["日本の首都は", "Emoji party: 🎉"]
    for skip in (True, False):
        for bias in (None, {0: 4.0, 1: 4.0, 2: 4.0}):
            params = [SP(temperature=1.3, max_tokens=32, seed=s, ignore_eos=True, skip_special_tokens=skip,
                         logit_bias=bias) for s in range(len(prompts))]
            for o in llm.generate(prompts, params):
                c = o.outputs[0]
                assert c.text == hf_tok.decode(c.token_ids, skip_special_tokens=skip), (skip, bias, c.token_ids)
    assert_no_leaks(llm)


def test_stop_string_straddling_the_min_tokens_boundary(llm):
    """Greedy ' Paris' '.' ...: with min_tokens=1 the stop string 's.' is completed by token 2, past min_tokens, so
    (vLLM v1: the stop check runs once len(output) > min_tokens over the new text plus len(stop) - 1 characters
    before it) the output stops there with text ' Pari'. Was: decodekit searched only text finalised after
    min_tokens and ran on, its text holding the stop string."""
    c = llm.generate(PROMPTS[0], SP(temperature=0, max_tokens=8, stop=["s."], min_tokens=1))[0].outputs[0]
    assert c.token_ids[:2] == [7042, 30]        # ' Paris' '.' (the test's premise)
    assert (c.text, c.finish_reason, c.stop_reason) == (" Pari", "stop", "s.")


def test_stop_string_completed_by_the_final_flush():
    """A stop string that only the end of the output completes (the flush turns a trailing incomplete UTF-8
    sequence into U+FFFD) ends the request as a stop: finish_reason "stop", stop_reason the string, text cut.
    Was: the text was cut but finish_reason stayed "length" with stop_reason None."""
    from decodekit import LLM
    llm = LLM("random:tiny", kv_cache_memory="16MiB", max_model_len=256, seed=0)
    _, index = llm.engine.tokenizer.token_bytes()
    lead = index[bytes([0xE2])][:1]          # a 3-byte character's first byte, alone: never a complete character
    c = llm.generate("hello", SP(max_tokens=1, allowed_token_ids=lead, stop=["\ufffd"], temperature=0))[0].outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason, c.token_ids) == ("", "stop", "\ufffd", lead)
    c = llm.generate("hello", SP(max_tokens=1, allowed_token_ids=lead, temperature=0))[0].outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("\ufffd", "length", None)


def test_eos_in_stop_token_ids_reports_no_stop_reason(llm):
    """vLLM: EOS ends a request with stop_reason None even when stop_token_ids lists it (the EOS check comes
    first); another listed token reports its id."""
    eos = llm.engine.tokenizer.eos_token_id
    base = llm.generate(PROMPTS[0], SP(temperature=0, max_tokens=6))[0].outputs[0]
    c = llm.generate(PROMPTS[0], SP(temperature=0, max_tokens=6, stop_token_ids=[eos, base.token_ids[1]]))[0].outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", base.token_ids[1])
    c = llm.generate(PROMPTS[0], SP(temperature=0, max_tokens=6, allowed_token_ids=[eos, base.token_ids[0]],
                                    logit_bias={eos: 100.0}, stop_token_ids=[eos]))[0].outputs[0]
    assert (c.token_ids, c.finish_reason, c.stop_reason) == ([eos], "stop", None)
