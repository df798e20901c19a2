"""SamplingParams validation: every field's bad values raise SamplingParamsError naming it."""
import math

import numpy as np
import pytest

from decodekit.sampling import SamplingParams, SamplingParamsError

NAN, INF = math.nan, math.inf

BAD = {
    "n": [0, -1, 129, True, 1.0, "2", None],
    "temperature": [-0.1, 100.5, NAN, INF, -INF, "1", True, None],
    "top_k": [-2, -100, 1.5, 5.0, True, "5", None],
    "top_p": [0.0, -0.1, 1.01, NAN, INF, "0.9", False],
    "min_p": [-0.01, 1.01, NAN, INF, "0.1", True],
    "presence_penalty": [-2.01, 2.01, NAN, INF, -INF, "0", True],
    "frequency_penalty": [-2.5, 3, NAN, -INF, "0", False],
    "repetition_penalty": [0.0, -1.0, 2.01, NAN, INF, "1.1", True],
    "seed": [-1, 2 ** 63, 1.0, "7", True],
    "stop": [3, [1], ["ok", ""], [None], {"a"}],
    "stop_token_ids": [[-1], [1.0], [True], ["3"], 5],
    "ignore_eos": [1, 0, "yes", None],
    "max_tokens": [0, -5, 1.0, True, None, "16"],
    "min_tokens": [-1, 1.0, True, 17],          # 17 > max_tokens = 16
    "logprobs": [-1, 21, 2.0, True, "1"],
    "include_stop_str_in_output": [1, "no", None],
    "skip_special_tokens": [0, "yes", None],
}
CASES = [(f, v) for f, vals in BAD.items() for v in vals]


@pytest.mark.parametrize("field,value", CASES, ids=[f"{f}={v!r}" for f, v in CASES])
def test_bad_value_raises_naming_field(field, value):
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(**{field: value})
    assert ei.value.field == field
    assert field in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_message_names_range():
    with pytest.raises(SamplingParamsError, match=r"top_p.*\(0, 1\]"):
        SamplingParams(top_p=0)
    with pytest.raises(SamplingParamsError, match=r"temperature.*\[0, 100\]"):
        SamplingParams(temperature=-1)
    with pytest.raises(SamplingParamsError, match=r"repetition_penalty.*\(0, 2\]"):
        SamplingParams(repetition_penalty=0)
    with pytest.raises(SamplingParamsError, match=r"n.*\[1, 128\]"):
        SamplingParams(n=0)


GOOD = [
    dict(), dict(n=128), dict(temperature=0), dict(temperature=100), dict(temperature=1),
    dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(top_p=1e-9), dict(top_p=1),
    dict(min_p=0), dict(min_p=1.0), dict(presence_penalty=-2), dict(frequency_penalty=2.0),
    dict(repetition_penalty=1e-3), dict(repetition_penalty=2), dict(seed=0),
    dict(seed=2 ** 63 - 1), dict(stop="###"), dict(stop=["a", "b"]), dict(stop_token_ids=[0, 5]),
    dict(max_tokens=1), dict(min_tokens=16), dict(logprobs=0), dict(logprobs=20),
    dict(top_k=np.int64(5), temperature=np.float32(0.5), seed=np.int64(3)),
]


@pytest.mark.parametrize("kw", GOOD, ids=[repr(k) for k in GOOD])
def test_good_values_accepted(kw):
    p = SamplingParams(**kw)
    assert p.validate(vocab_size=100) is p


def test_normalisation():
    p = SamplingParams(stop="END", top_k=np.int64(5), temperature=np.float32(0.5), seed=np.int64(3))
    assert p.stop == ["END"]
    assert type(p.top_k) is int and type(p.temperature) is float and type(p.seed) is int
    assert SamplingParams().stop == [] and SamplingParams().stop_token_ids == []
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_vocab_dependent_checks():
    # top_k past the vocabulary keeps every token (vLLM / transformers clamp it); past int64 is refused
    SamplingParams(top_k=101).validate(vocab_size=100)
    SamplingParams(top_k=10**12).validate(vocab_size=100)
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(top_k=2**63).validate(vocab_size=100)
    assert ei.value.field == "top_k" and str(2**63 - 1) in str(ei.value)
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(stop_token_ids=[3, 100]).validate(vocab_size=100)
    assert ei.value.field == "stop_token_ids"
    SamplingParams(stop_token_ids=[99]).validate(vocab_size=100)


def test_max_logprobs():
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(logprobs=6).validate(max_logprobs=5)
    assert ei.value.field == "logprobs"
    SamplingParams(logprobs=5).validate(max_logprobs=5)


def test_mutation_then_validate():
    p = SamplingParams()
    p.top_p = 2.0
    with pytest.raises(SamplingParamsError) as ei:
        p.validate()
    assert ei.value.field == "top_p"


def test_helpers():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=0.1).is_greedy
    assert not SamplingParams().has_penalties
    assert SamplingParams(presence_penalty=0.1).has_penalties
    assert SamplingParams(stop_token_ids=[4]).all_stop_token_ids([2]) == [4, 2]
    assert SamplingParams(stop_token_ids=[4], ignore_eos=True).all_stop_token_ids([2]) == [4]


HUGE = 10 ** 400          # a JSON integer literal parses to this; float(HUGE) overflows
HUGER = 10 ** 5000        # past sys.get_int_max_str_digits(): repr() raises


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty"])
@pytest.mark.parametrize("value", [HUGE, -HUGE, HUGER], ids=["1e400", "-1e400", "1e5000"])
def test_numbers_beyond_float_range_are_rejected_naming_field(field, value):
    """Was: OverflowError (int too large to convert to float) out of SamplingParams(), a 500 from the server."""
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(**{field: value})
    assert ei.value.field == field and "must be a number in" in str(ei.value)


@pytest.mark.parametrize("field", ["n", "top_k", "min_tokens", "seed", "logprobs"])
def test_ints_too_long_to_print_give_a_short_message(field):
    """Was: ValueError 'Exceeds the limit (4300 digits) for integer string conversion' (naming no field)."""
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(**{field: HUGER}).validate(vocab_size=100)
    assert ei.value.field == field and "bits>" in str(ei.value) and len(str(ei.value)) < 200
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(stop_token_ids=[HUGER]).validate(vocab_size=100)
    assert ei.value.field == "stop_token_ids" and len(str(ei.value)) < 200


def test_long_values_are_shortened_in_messages():
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(stop=["x" * 10000, ""])
    assert ei.value.field == "stop" and len(str(ei.value)) < 200
