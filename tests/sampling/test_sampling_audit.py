"""Sampling parameters found by the input-robustness audit: values that pass the range checks but break the
float32 sampler, stop ids that leave min_tokens nothing to sample, and assignments after construction."""
from __future__ import annotations

import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams, SamplingParamsError
from decodekit.sampling.params import MIN_REPETITION_PENALTY

V = 16


def _probs(p: SamplingParams, logits: torch.Tensor, prompt=(3, 5), output=(5, 7)) -> torch.Tensor:
    md = SamplingMetadata.build([p], [list(output)], [list(prompt)], [1], None, [0], "cpu", V)
    return Sampler().probs(logits, md)


@pytest.mark.parametrize("value", [1e-300, 1e-40, 1e-37, 1e-10, 9.99e-7])
def test_repetition_penalty_too_small_for_float32_is_rejected(value):
    """Was accepted: in float32 1e-300 is 0 (1e-40 subnormal, 1e-37 tiny), and a seen token's positive logit divided
    by it is inf -- the distribution turns to NaN (greedy: the first seen token wins whatever the model says)."""
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(repetition_penalty=value)
    assert ei.value.field == "repetition_penalty"
    assert "(0, 2] and >= 1e-06" in str(ei.value) and "float32" in str(ei.value), str(ei.value)


def test_smallest_repetition_penalty_keeps_the_distribution_finite():
    logits = torch.linspace(-40.0, 40.0, V)[None, :].flip(1)   # token 3, 5 and 7 seen: large positive logits
    for temperature in (1e-5, 1.0):
        p = SamplingParams(repetition_penalty=MIN_REPETITION_PENALTY, temperature=temperature)
        probs = _probs(p, logits)
        assert torch.isfinite(probs).all() and abs(probs.sum().item() - 1) < 1e-5


@pytest.mark.parametrize("kw", [dict(temperature=1e-5), dict(temperature=1e-300), dict(top_p=1e-300),
                                dict(top_p=1e-40), dict(min_p=1e-300), dict(min_p=1e-40),
                                dict(presence_penalty=1e-300), dict(frequency_penalty=-1e-40),
                                dict(presence_penalty=2, frequency_penalty=-2, temperature=1e-5)])
def test_other_float_params_stay_finite_in_float32(kw):
    """The other float parameters never divide by themselves (temperature below 1e-5 is greedy, not a divisor):
    their extreme in-range values, tiny ones that are 0 or subnormal in float32 included, give a finite
    distribution (the limit's meaning: top_p -> 0 keeps the top token, min_p / penalties -> 0 are off)."""
    logits = torch.linspace(-40.0, 40.0, V)[None, :]
    probs = _probs(SamplingParams(**kw), logits)
    assert torch.isfinite(probs).all() and abs(probs.sum().item() - 1) < 1e-5


def test_stop_ids_covering_the_vocabulary_with_min_tokens_are_rejected():
    """Was accepted: during min_tokens every token was masked to -inf and token 0 came out anyway."""
    every = list(range(V))
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(stop_token_ids=every, min_tokens=2).validate(vocab_size=V)
    assert ei.value.field == "stop_token_ids" and "min_tokens=2" in str(ei.value) and f"({V} tokens)" in str(ei.value)
    # with the EOS ids (not ignored) they cover it too
    with pytest.raises(SamplingParamsError, match=r"stop_token_ids: .*\(with the EOS token ids\) cover the whole"):
        SamplingParams(stop_token_ids=every[1:], min_tokens=1).validate(vocab_size=V, eos_token_ids=[0])
    # fine: no min_tokens, one token left, or EOS ignored
    SamplingParams(stop_token_ids=every).validate(vocab_size=V)
    SamplingParams(stop_token_ids=every[1:], min_tokens=1).validate(vocab_size=V)
    SamplingParams(stop_token_ids=every[1:], min_tokens=1, ignore_eos=True).validate(vocab_size=V, eos_token_ids=[0])


def test_engine_refuses_stop_ids_plus_eos_covering_the_vocabulary():
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.engine.args import EngineArgs
    eng = LLMEngine(EngineArgs(model="random:tiny", kv_cache_memory="16MiB", max_model_len=128))
    vocab = eng.model_config.vocab_size
    others = [t for t in range(vocab) if t not in eng.eos_token_ids]
    with pytest.raises(SamplingParamsError, match="min_tokens=3") as ei:
        eng.add_request("r", "hi", SamplingParams(stop_token_ids=others, min_tokens=3, max_tokens=4))
    assert ei.value.field == "stop_token_ids" and not eng.has_unfinished_requests()
    eng.add_request("ok", "hi", SamplingParams(stop_token_ids=others[1:], min_tokens=3, max_tokens=4, temperature=0))
    while eng.has_unfinished_requests():
        (out,) = eng.step()
    assert out.outputs[0].token_ids[:3] == [others[0]] * 3          # the only token left during min_tokens


def test_assignment_after_construction_normalises_like_the_constructor():
    """Was: sp.stop = "abc" then failed validation with "must be a str or a list of non-empty str, got 'abc'"."""
    sp = SamplingParams()
    sp.stop = "abc"
    assert sp.stop == ["abc"] and sp.validate() is sp
    sp.stop, sp.stop_token_ids = ("a", "b"), (4, 5)
    assert sp.stop == ["a", "b"] and sp.stop_token_ids == [4, 5]
    sp.stop, sp.stop_token_ids = None, None
    assert sp.stop == [] and sp.stop_token_ids == [] and sp.validate() is sp
    sp.stop = ["ok", ""]                                               # still checked by validate / add_request
    with pytest.raises(SamplingParamsError, match="stop"):
        sp.validate()


HUGE = 10 ** 400      # an int beyond float's range: float() / math.isfinite() of it raise OverflowError


@pytest.mark.parametrize("kw, field", [(dict(length_penalty=HUGE), "length_penalty"),
                                       (dict(length_penalty=-HUGE), "length_penalty"),
                                       (dict(temperature=HUGE), "temperature"),
                                       (dict(temperature=10 ** 5000), "temperature")],
                         ids=["lp", "-lp", "temperature", "temperature-5000-digits"])
def test_beam_search_params_huge_ints_are_out_of_range(kw, field):
    """Was OverflowError (a 500 at the server) from math.isfinite of a huge int."""
    from decodekit.sampling.beam_search import BeamSearchParams
    with pytest.raises(SamplingParamsError) as ei:
        BeamSearchParams(beam_width=2, max_tokens=4, **kw)
    assert ei.value.field == field and "finite number in [" in str(ei.value) and len(str(ei.value)) < 200


@pytest.mark.parametrize("schema", [{"type": "integer", "minimum": HUGE}, {"type": "integer", "maximum": -HUGE},
                                    {"type": "number", "minimum": -HUGE, "maximum": 5},
                                    {"type": "integer", "minimum": HUGE, "maximum": HUGE + 3},
                                    {"type": "integer", "exclusiveMaximum": HUGE}])
def test_huge_integer_schema_bounds_are_exact(schema):
    """Was OverflowError from math.isfinite of an int bound: ints are exact, only floats can be inf / NaN."""
    assert SamplingParams(guided_json=schema, max_tokens=4).guided_pattern() is not None


@pytest.mark.parametrize("schema, match", [({"type": "integer", "minimum": HUGE, "maximum": 0}, "leave no integer"),
                                           ({"type": "integer", "exclusiveMinimum": HUGE}, "automaton copies"),
                                           ({"type": "number", "minimum": float("inf")}, "must be a number")])
def test_unusable_huge_schema_bounds_are_refused_briefly(schema, match):
    with pytest.raises(SamplingParamsError, match=match) as ei:
        SamplingParams(guided_json=schema, max_tokens=4)
    assert ei.value.field == "guided_json" and len(str(ei.value)) < 300, str(ei.value)


@pytest.mark.parametrize("schema, match", [
    ({"type": "object", "properties": [1]}, "'properties' must be an object"),       # was "'required' [] must list"
    ({"type": "object", "required": "a"}, "'required' must be an array"),
    ({"type": "object", "properties": {}, "required": [[1]]}, "must list names in 'properties'")])  # was TypeError
def test_malformed_object_schemas_say_what_is_wrong(schema, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(guided_json=schema, max_tokens=4)


@pytest.mark.parametrize("so, key", [({"json_object": "no"}, "json_object"), ({"json_object": 1}, "json_object"),
                                     ({"json_object": "yes please"}, "json_object"),
                                     ({"json": {"type": "object"}, "disable_any_whitespace": "no"},
                                      "disable_any_whitespace"),
                                     ({"regex": "a+", "disable_fallback": "false"}, "disable_fallback")])
def test_structured_outputs_flags_must_be_bools(so, key):
    """Were read by truthiness: {"json_object": "no"} forced JSON output."""
    with pytest.raises(SamplingParamsError, match="must be a bool") as ei:
        SamplingParams(structured_outputs=so, max_tokens=4)
    assert ei.value.field == "structured_outputs" and repr(key) in str(ei.value), str(ei.value)


def test_structured_outputs_bool_flags_still_work():
    assert SamplingParams(structured_outputs={"json_object": True}).guided_json_object is True
    p = SamplingParams(structured_outputs={"json": {"type": "object"}, "disable_any_whitespace": True})
    assert p.guided_whitespace_pattern == ""
    assert SamplingParams(structured_outputs={"regex": "a", "json_object": None, "disable_any_whitespace": False}
                          ).guided_regex == "a"
