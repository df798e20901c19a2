"""Token controls (logit_bias, allowed_token_ids, bad_words): the sampler's processed logits against a
straightforward reference in float64 (vLLM's order: allowed mask, bad words, bias, then penalties),
the bad-word rule against a direct transcription of it on random histories, and argument errors."""
import math
import random

import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams, apply_penalties
from decodekit.sampling.params import SamplingParamsError

SAMPLER = Sampler()


class _Tok:
    """encode(text): one id per character (ord % 97), a leading space its own id 96, so words with and
    without the space differ in their first token and length."""

    def encode(self, text, add_special_tokens=False):
        return [96 if c == " " else ord(c) % 96 for c in text]


def _md(params, V, outputs=None, prompts=None):
    B = len(params)
    outputs = outputs if outputs is not None else [[] for _ in range(B)]
    prompts = prompts if prompts is not None else [[0]] * B
    return SamplingMetadata.build(params, outputs, prompts, list(range(1, B + 1)), None, None, "cpu", V)


def _reference(raw, params, outputs, prompts):
    """float64 processed logits, row by row, written from the rules (not the sampler's code)."""
    x = raw.double().clone()
    V = x.shape[1]
    for b, p in enumerate(params):
        if p.allowed_token_ids is not None:
            keep = set(p.allowed_token_ids)
            for t in range(V):
                if t not in keep:
                    x[b, t] = -math.inf
        for w in p.bad_words_token_ids:
            if len(w) == 1 or (len(outputs[b]) >= len(w) - 1 and list(outputs[b][len(outputs[b]) - len(w) + 1:]) == w[:-1]):
                x[b, w[-1]] = -math.inf
        for t, v in (p.logit_bias or {}).items():
            x[b, t] += v
    if any(p.has_penalties for p in params):
        L = max(1, max(len(o) for o in outputs))
        pad = lambda rows: torch.tensor([list(r) + [V] * (L - len(r)) for r in rows])  # noqa: E731
        Lp = max(len(q) for q in prompts)
        x = apply_penalties(x, torch.tensor([list(q) + [V] * (Lp - len(q)) for q in prompts]), pad(outputs),
                            torch.tensor([p.repetition_penalty for p in params], dtype=torch.float64),
                            torch.tensor([p.presence_penalty for p in params], dtype=torch.float64),
                            torch.tensor([p.frequency_penalty for p in params], dtype=torch.float64))
    return x


@pytest.mark.parametrize("seed", range(6))
def test_processed_logits_match_reference(seed):
    rng = random.Random(seed)
    V, B = 131, 7
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, V, generator=g) * 3
    params, outputs, prompts = [], [], []
    for b in range(B):
        kw = {}
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 5))]
        if rng.random() < 0.6:  # half the biased tokens seen before, where the repetition penalty scales them
            kw["logit_bias"] = {rng.choice(prompt) if rng.random() < 0.5 else rng.randrange(V): rng.uniform(-100, 100)
                                for _ in range(rng.randrange(1, 6))}
        if rng.random() < 0.5:
            kw["allowed_token_ids"] = rng.sample(range(V), rng.randrange(1, 40))
        if rng.random() < 0.6:
            kw["bad_words"] = ["".join(chr(97 + rng.randrange(26)) for _ in range(rng.randrange(1, 4)))
                               for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.4:
            kw.update(repetition_penalty=rng.uniform(0.5, 2), presence_penalty=rng.uniform(-2, 2),
                      frequency_penalty=rng.uniform(-2, 2))
        p = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.3]), **kw)
        if p.bad_words:
            p.set_bad_words_token_ids(_Tok(), V)
        out = [rng.randrange(V) for _ in range(rng.randrange(0, 6))]
        if p.bad_words_token_ids and rng.random() < 0.7:  # end the history with a bad word's prefix
            w = rng.choice(p.bad_words_token_ids)
            out += w[:-1]
        params.append(p)
        outputs.append(out)
        prompts.append(prompt)
    md = SamplingMetadata.build(params, outputs, prompts, list(range(B)), None, None, "cpu", V)
    got = Sampler._processed(raw, md).double()
    want = _reference(raw, params, outputs, prompts)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert torch.allclose(got[finite], want[finite], rtol=1e-6, atol=1e-4)  # float32 sums of |x| <= ~110
    # the drawn token (greedy: the processed argmax) is never a masked one; probs put no mass there
    toks = SAMPLER(raw, md).token_ids
    assert all(finite[b, t] for b, t in enumerate(toks.tolist()))
    probs = SAMPLER.probs(raw, md)
    assert torch.all(probs[~finite] == 0)


def test_bias_forces_and_forbids_tokens():
    V = 50
    raw = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    top = int(raw[0].argmax())
    params = [SamplingParams(temperature=0, logit_bias={7: 100.0}),
              SamplingParams(temperature=1.0, logit_bias={t: -100.0 for t in range(V) if t != 3}),
              SamplingParams(temperature=0, logit_bias={top: -100.0})]
    toks = SAMPLER(raw, _md(params, V)).token_ids.tolist()
    assert toks[0] == 7 and toks[1] == 3 and toks[2] != top
    # logprobs stay those of the raw logits (vLLM's default)
    params[0].logprobs = 0
    out = SAMPLER(raw, _md(params, V))
    assert torch.allclose(out.logprobs[0], torch.log_softmax(raw[0], -1)[7])


def test_allowed_tokens_under_sampling():
    V = 97
    allowed = [2, 40, 41, 96]
    raw = torch.randn(1, V, generator=torch.Generator().manual_seed(2))
    seen = set()
    for s in range(200):
        md = SamplingMetadata.build([SamplingParams(temperature=1.5, allowed_token_ids=allowed)], [[]], [[0]], [s],
                                    None, None, "cpu", V)
        seen.add(int(SAMPLER(raw, md).token_ids[0]))
    assert seen == set(allowed)


def test_bad_word_rule_matches_transcription():
    """vLLM's rule on random histories: a word w of n tokens masks w[-1] iff n == 1 or the history ends
    with w[:-1]; the history is the generated tokens only (not the prompt)."""
    rng = random.Random(5)
    V = 8
    for _ in range(300):
        words = [[rng.randrange(V) for _ in range(rng.randrange(1, 4))] for _ in range(rng.randrange(1, 4))]
        out = [rng.randrange(V) for _ in range(rng.randrange(0, 5))]
        p = SamplingParams(temperature=1.0, bad_words=["x"])
        object.__setattr__(p, "_bad_words_token_ids", words)
        md = _md([p], V, [out], [[1, 2, 3]])
        got = set(md.bad_ids.tolist()) if md.bad_ids is not None else set()
        want = {w[-1] for w in words if len(w) == 1 or out[len(out) - len(w) + 1:] == w[:-1] and len(out) >= len(w) - 1}
        assert got == want, (words, out)


def test_bad_words_encoding():
    p = SamplingParams(bad_words=["ab", "  cd", "e f"])
    p.set_bad_words_token_ids(_Tok(), 97)
    # "ab" and " ab" (another first token, but one longer): only the plain; same for the others
    assert p.bad_words_token_ids == [[97 % 96, 98 % 96], [99 % 96, 100 % 96], [101 % 96, 96, 102 % 96]]

    class Spaced(_Tok):  # " word" is one token of its own: both kept
        def encode(self, text, add_special_tokens=False):
            return [50] if text == " ab" else super().encode(text)
    q = SamplingParams(bad_words=["ab"])
    q.set_bad_words_token_ids(Spaced(), 97)
    assert q.bad_words_token_ids == [[1, 2]]  # " ab" -> [50]: a different length, left out (vLLM's rule)

    class SameLength(_Tok):
        def encode(self, text, add_special_tokens=False):
            return [50, 51] if text == " ab" else super().encode(text)
    q.set_bad_words_token_ids(SameLength(), 97)
    assert q.bad_words_token_ids == [[1, 2], [50, 51]]
    with pytest.raises(SamplingParamsError, match="outside the model's vocabulary"):
        SamplingParams(bad_words=["zz"]).set_bad_words_token_ids(_Tok(), 10)
    r = SamplingParams(bad_words=["a"], allowed_token_ids=[1])
    with pytest.raises(SamplingParamsError, match="allowed_token_ids"):
        r.set_bad_words_token_ids(_Tok(), 97)


@pytest.mark.parametrize("kw, field, text", [
    (dict(logit_bias={5: 101}), "logit_bias", "[-100, 100]"),
    (dict(logit_bias={5: float("nan")}), "logit_bias", "[-100, 100]"),
    (dict(logit_bias={5: "1"}), "logit_bias", "[-100, 100]"),
    (dict(logit_bias={-1: 1}), "logit_bias", "[0, vocab_size"),
    (dict(logit_bias=[1, 2]), "logit_bias", "dict"),
    (dict(allowed_token_ids=[]), "allowed_token_ids", "non-empty"),
    (dict(allowed_token_ids=[1.0]), "allowed_token_ids", "[0, vocab_size"),
    (dict(bad_words="word"), "bad_words", "list"),
    (dict(bad_words=["  "]), "bad_words", "non-space"),
    (dict(bad_words=["x" * 1025]), "bad_words", "1024 characters"),
    (dict(bad_words=["x"] * 1025), "bad_words", "at most 1024"),
])
def test_invalid_token_controls(kw, field, text):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert e.value.field == field and text in str(e.value)


def test_vocab_bounds_and_min_tokens():
    with pytest.raises(SamplingParamsError, match=r"vocab_size=10\)") as e:
        SamplingParams(logit_bias={10: 1.0}).validate(vocab_size=10)
    assert e.value.field == "logit_bias"
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(allowed_token_ids=[3, 10]).validate(vocab_size=10)
    assert e.value.field == "allowed_token_ids"
    with pytest.raises(SamplingParamsError, match="min_tokens=2") as e:
        SamplingParams(allowed_token_ids=[0, 3], stop_token_ids=[3], min_tokens=2, max_tokens=4).validate(
            vocab_size=10, eos_token_ids=[0])
    assert e.value.field == "allowed_token_ids"
    SamplingParams(allowed_token_ids=[0, 3], stop_token_ids=[3], min_tokens=2, max_tokens=4,
                   ignore_eos=True).validate(vocab_size=10, eos_token_ids=[0])


def test_allowed_tokens_always_hold_when_masks_leave_nothing():
    """Masks that would leave none of allowed_token_ids: the min_tokens hold is lifted first, then the bad
    words' masks; the drawn token is always an allowed one (it was token 0 before)."""
    V = 97
    raw = torch.randn(1, V, generator=torch.Generator().manual_seed(4))
    # allowed {1, 2}: the bad word "ab" ([1, 2]) masks 2 after a 1; min_tokens holds 1 (a stop token)
    p = SamplingParams(temperature=0, allowed_token_ids=[1, 2], bad_words=["ab"], stop_token_ids=[1], min_tokens=3,
                       max_tokens=5)
    p.set_bad_words_token_ids(_Tok(), V)
    md = SamplingMetadata.build([p], [[1]], [[0]], [1], None, None, "cpu", V)
    assert md.min_tokens_rows is None and md.bad_ids.tolist() == [2]   # hold lifted, bad word kept
    assert SAMPLER(raw, md).token_ids.tolist() == [1]
    # allowed {1}: "aa" ([1, 1]) masks 1 after a 1: lifted
    q = SamplingParams(temperature=0.8, allowed_token_ids=[1], bad_words=["aa"])
    q.set_bad_words_token_ids(_Tok(), V)
    md = SamplingMetadata.build([q, q], [[1], [3]], [[0], [0]], [1, 2], None, None, "cpu", V)
    assert md.bad_rows is None and SAMPLER(raw.repeat(2, 1), md).token_ids.tolist() == [1, 1]
    # a row that still has a token keeps every mask
    md = SamplingMetadata.build([p], [[3]], [[0]], [1], None, None, "cpu", V)
    assert md.min_tokens_ids.tolist() == [1] and md.bad_rows is None
    assert SAMPLER(raw, md).token_ids.tolist() == [2]


def test_static_conflicts_and_bad_unicode_are_refused():
    with pytest.raises(SamplingParamsError, match="min_tokens=3") as e:
        SamplingParams(allowed_token_ids=[1, 5], bad_words=["a"], min_tokens=3, max_tokens=4).set_bad_words_token_ids(
            _Tok(), 97, eos_token_ids=[5])
    assert e.value.field == "bad_words"
    SamplingParams(allowed_token_ids=[1, 5], bad_words=["a"], max_tokens=4).set_bad_words_token_ids(
        _Tok(), 97, eos_token_ids=[5])                                   # no min_tokens: EOS can be drawn
    class Strict(_Tok):
        def encode(self, text, add_special_tokens=False):
            text.encode("utf-8")
            return super().encode(text)
    with pytest.raises(SamplingParamsError, match="not valid Unicode") as e:
        SamplingParams(bad_words=["a\ud800"]).set_bad_words_token_ids(Strict(), 97)
    assert e.value.field == "bad_words"


def test_controls_are_built_once_per_request():
    """32 rows of one request with a full-vocabulary logit_bias and allowed list: each step's metadata reuses
    the request's tensors (they were rebuilt per row and step: ~0.3 s a step at 32 rows), and a new
    logit_bias dict is picked up."""
    V = 49152
    p = SamplingParams(temperature=1.0, logit_bias={t: 0.5 for t in range(V)}, allowed_token_ids=list(range(V)))

    def build():
        return SamplingMetadata.build([p] * 32, [[]] * 32, [[0]] * 32, list(range(32)), None, None, "cpu", V)
    first = build()
    cached = (p.__dict__["_dk_bias"][1], p.__dict__["_dk_allowed"][1])
    md = build()
    assert p.__dict__["_dk_bias"][1] is cached[0] and p.__dict__["_dk_allowed"][1] is cached[1]
    assert torch.equal(md.bias_vals, first.bias_vals) and md.bias_ids.shape == (32 * V,)
    assert bool(md.allowed_mask.all())
    p2 = SamplingParams(temperature=1.0, logit_bias={3: 1.0})
    SamplingMetadata.build([p2], [[]], [[0]], [0], None, None, "cpu", V)
    p2.logit_bias = {4: -1.0}
    md = SamplingMetadata.build([p2], [[]], [[0]], [0], None, None, "cpu", V)
    assert md.bias_ids.tolist() == [4] and md.bias_vals.tolist() == [-1.0]
