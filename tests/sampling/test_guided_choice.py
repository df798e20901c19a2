"""guided_choice: the tokens allowed after an output against a brute-force transcription of the rule (a
token is allowed iff output bytes + its bytes is a prefix of a choice; EOS iff the output is a choice, or
when nothing fits), on random vocabularies with multi-byte tokens; token bytes of both vocabulary kinds;
argument errors."""
import random

import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams
from decodekit.sampling.params import SamplingParamsError


class _Vocab:
    def __init__(self, pieces):
        self.pieces = pieces
        index = {}
        for i, b in enumerate(pieces):
            if b:
                index.setdefault(b, []).append(i)
        self._tb = (pieces, index)

    def token_bytes(self):
        return self._tb


def _brute(pieces, choices, out, eos):
    o = b"".join(pieces[t] or b"" for t in out)
    ok = {t for t, b in enumerate(pieces) if b and any(c.startswith(o + b) for c in choices)}
    if any(c == o for c in choices):
        ok |= set(eos)
    return sorted(ok) if ok else sorted(eos)


@pytest.mark.parametrize("seed", range(5))
def test_allowed_tokens_match_the_rule(seed):
    rng = random.Random(seed)
    alphabet = b"ab c\xc3\xa9"
    pieces = [None] + [bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 4))) for _ in range(120)]
    pieces += [bytes([c]) for c in alphabet]          # every single byte: every choice can be spelled
    eos = [0]
    choices = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 7))) for _ in range(rng.randrange(1, 5))]
    p = SamplingParams(temperature=1.0, guided_choice=[c.decode("utf-8", "replace") for c in choices])
    p.set_guided(_Vocab(pieces), eos)
    choices = p.__dict__["_guided"][0]
    for _ in range(200):   # random walks that follow the rule, and off it
        out = []
        for _ in range(rng.randrange(0, 6)):
            allowed = p.guided_allowed(out)
            assert allowed == _brute(pieces, choices, out, eos), (choices, out)
            out.append(rng.choice(allowed) if rng.random() < 0.8 else rng.randrange(len(pieces)))


def test_long_choices_look_up_only_token_lengths():
    """Choices of ~1 KB: each step looks up at most the longest token's bytes of each distinct remainder
    (it walked every remainder to its end: seconds a step)."""
    pieces = [None] + [bytes([c]) for c in b"ab"] + [b"ab", b"ba", b"aab"]
    p = SamplingParams(guided_choice=["a" * 1000 + f"{i:03d}" for i in range(3)] + ["b" * 1000])
    p.set_guided(_Vocab(pieces + [bytes([c]) for c in b"0123456789"]), [0])
    assert p.__dict__["_guided"][4] == 3
    choices = p.__dict__["_guided"][0]
    all_pieces = p.__dict__["_guided"][1]
    assert p.guided_allowed([]) == _brute(all_pieces, choices, [], [0])
    assert p.guided_allowed([1] * 999) == _brute(all_pieces, choices, [1] * 999, [0])


def test_sampler_draws_only_allowed_and_finishes_with_eos():
    pieces = [None, b"Yes", b"No", b"Y", b"es", b"N", b"o", b"Maybe", b" "]
    p = SamplingParams(temperature=1.5, guided_choice=["Yes", "No"])
    p.set_guided(_Vocab(pieces), [0])
    V = len(pieces)
    raw = torch.zeros(1, V)
    for seed in range(40):
        out = []
        while True:
            md = SamplingMetadata.build([p], [out], [[1]], [seed], None, [0], "cpu", V)
            t = int(Sampler()(raw, md).token_ids[0])
            if t == 0:
                break
            out.append(t)
        assert b"".join(pieces[t] for t in out) in (b"Yes", b"No")


def test_token_bytes_of_the_embedded_vocabulary(hf_tok):
    from decodekit.loader import embedded_model_path
    from decodekit.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(embedded_model_path())
    tb, index = tok.token_bytes()
    text = "Héllo wörld 🙂 日本語 (x) \n\t end"
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(tb[i] for i in ids).decode() == text
    assert all(tb[i] is None for i in tok.all_special_ids)
    assert index[b" the"] == [hf_tok.convert_tokens_to_ids("Ġthe")]


@pytest.mark.parametrize("kw, text", [
    (dict(guided_choice=[]), "1 to 256"),
    (dict(guided_choice="yes"), "list"),
    (dict(guided_choice=["a", ""]), "non-empty"),
    (dict(guided_choice=["a"] * 257), "1 to 256"),
    (dict(guided_choice=["a"], ignore_eos=True), "ignore_eos"),
    (dict(guided_choice=["a"], allowed_token_ids=[1]), "allowed_token_ids"),
    (dict(guided_choice=["a"], min_tokens=2, max_tokens=4), "min_tokens"),
])
def test_invalid(kw, text):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert e.value.field == "guided_choice" and text in str(e.value)
    with pytest.raises(SamplingParamsError, match="EOS"):
        SamplingParams(guided_choice=["a"]).set_guided(_Vocab([b"a"]), [])
