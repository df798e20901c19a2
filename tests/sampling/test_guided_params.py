"""The guided_* SamplingParams fields: vLLM's structured_outputs / guided_decoding (object or dict) spread into
them, one guide at most, errors naming the field; the sampler samples guided rows only among the guide's
tokens (EOS where the output is a match), leaves the other rows' logits alone, and lets min_tokens yield
when the guide allows EOS alone."""
import copy
import functools
import re

import pytest
import torch

from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams
from decodekit.sampling.guided import DEAD, GuidedDecodingParams, StructuredOutputsParams
from decodekit.sampling.params import SamplingParamsError

EOS = 0


class _Tok:
    """A vocabulary of single bytes (ids 1..256 = bytes 0..255) plus a few words; id 0 is EOS."""

    def __init__(self):
        self.pieces = [None] + [bytes([b]) for b in range(256)] + [b"ab", b"123", b"yes", b"no", b" x"]

    def token_bytes(self):
        index = {}
        for i, b in enumerate(self.pieces):
            if b:
                index.setdefault(b, []).append(i)
        return self.pieces, index


TOK = _Tok()
V = len(TOK.pieces) + 3


def _sp(**kw):
    sp = SamplingParams(**kw)
    sp.set_guided(TOK, [EOS])
    return sp


def test_structured_outputs_spread_into_the_guided_fields():
    for so in (StructuredOutputsParams(regex="a+"), {"regex": "a+"}, GuidedDecodingParams(regex="a+")):
        sp = SamplingParams(structured_outputs=so)
        assert sp.guided_regex == "a+" and sp.guided_kind == "guided_regex" and sp.structured_outputs is None
    sp = SamplingParams(guided_decoding={"json": {"type": "integer"}, "whitespace_pattern": "[ ]*"})
    assert sp.guided_json == {"type": "integer"} and sp.guided_whitespace_pattern == "[ ]*"
    sp = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True, disable_any_whitespace=True))
    assert sp.guided_json_object and sp.guided_whitespace_pattern == ""
    assert SamplingParams(structured_outputs={"choice": ["x", "y"]}).guided_choice == ["x", "y"]
    sp = SamplingParams(guided_regex="[0-9]+")
    assert sp.reads_output_tokens and sp.masks_logits
    assert copy.deepcopy(_sp(guided_regex="a")).__dict__["_guide"] is _sp(guided_regex="a").__dict__["_guide"]


@pytest.mark.parametrize("kw, field", [
    (dict(guided_regex="a", guided_json={}), "guided_json"),
    (dict(guided_choice=["a"], guided_regex="a"), "guided_regex"),
    (dict(guided_regex="[a"), "guided_regex"),
    (dict(guided_json={"type": "integer", "minimum": 3, "maximum": 2}), "guided_json"),
    (dict(guided_json={"type": "object", "properties": {"a": {}}, "required": ["b"]}), "guided_json"),
    (dict(guided_json={"type": "object", "unknownKeyword": 1}), "guided_json"),
    (dict(guided_json={"a": {1, 2}}), "guided_json"),
    (dict(guided_json=3), "guided_json"),
    (dict(guided_json_object="yes"), "guided_json_object"),
    (dict(guided_regex="a", min_tokens=0, ignore_eos=True), "guided_regex"),
    (dict(guided_json={}, allowed_token_ids=[1]), "guided_json"),
    (dict(guided_whitespace_pattern="[ ]*"), "guided_whitespace_pattern"),
    (dict(guided_json={}, guided_whitespace_pattern=5), "guided_whitespace_pattern"),
    (dict(guided_json={}, guided_whitespace_pattern="(a"), "guided_whitespace_pattern"),
    (dict(guided_json_object=True, guided_whitespace_pattern="[ ]*$"), "guided_whitespace_pattern"),
    (dict(guided_json={}, guided_whitespace_pattern="^"), "guided_whitespace_pattern"),
    (dict(guided_grammar='root ::= "a"' + "?" * 1200), "guided_grammar"),
    (dict(structured_outputs=StructuredOutputsParams(grammar="root ::= 'a'")), "guided_grammar"),
    (dict(guided_grammar="root ::= x"), "guided_grammar"), (dict(guided_grammar=5), "guided_grammar"),
    (dict(guided_regex="a", guided_grammar='root ::= "a"'), "guided_grammar"),
    (dict(guided_grammar='root ::= "a"', ignore_eos=True), "guided_grammar"),
    (dict(structured_outputs={"structural_tag": "x"}), "structured_outputs"),
    (dict(structured_outputs=7), "structured_outputs"),
    (dict(guided_decoding={"regex": "a", "bogus": 1}), "guided_decoding"),
    (dict(structured_outputs={"regex": "a"}, guided_choice=["x"]), "structured_outputs"),
    (dict(guided_regex="a" * 200_001), "guided_regex"),
])
def test_errors_name_the_field(kw, field):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert e.value.field == field, e.value


def test_unset_guide_is_an_error_not_a_free_row():
    sp = SamplingParams(guided_regex="a")
    with pytest.raises(ValueError, match="set_guided"):
        SamplingMetadata.build([sp], [[]], [[1]], [1], None, [EOS], "cpu", V)


@pytest.mark.parametrize("seed", range(4))
def test_sampler_keeps_guided_rows_on_the_guide(seed):
    g = torch.Generator().manual_seed(seed)
    pattern = r"(?:yes|no)(?:, [0-9]{1,3})?"
    guided = _sp(guided_regex=pattern, temperature=1.0)
    free = SamplingParams(temperature=1.0)
    outs = [[], []]
    for step in range(12):
        logits = torch.randn(2, V, generator=g) * 3
        md = SamplingMetadata.build([guided, free], outs, [[1], [1]], [seed, seed + 1], None, [EOS], "cpu", V)
        tok = Sampler()(logits.clone(), md).token_ids.tolist()
        mask, _ = guided.guided_mask(outs[0], V)
        assert mask[tok[0]], (outs[0], tok[0])
        if tok[0] == EOS:
            text = b"".join(TOK.pieces[t] for t in outs[0]).decode()
            assert re.fullmatch(pattern, text), text
            break
        outs[0].append(tok[0])
        outs[1].append(tok[1])
        assert guided.__dict__["_guide"].state_after(outs[0]) != DEAD


def test_greedy_guided_row_takes_the_best_allowed_token_and_free_rows_are_untouched():
    guided = _sp(guided_regex=r"123|ab", temperature=0)
    free = SamplingParams(temperature=0)
    logits = torch.zeros(2, V)
    logits[:, 5] = 10.0                          # the free favourite, not allowed by the guide
    logits[:, 258] = 2.0                         # "123"
    logits[:, 257] = 3.0                         # "ab"
    md = SamplingMetadata.build([guided, free], [[], []], [[1], [1]], [1, 2], None, [EOS], "cpu", V)
    assert Sampler()(logits.clone(), md).token_ids.tolist() == [257, 5]


def test_min_tokens_yields_when_the_guide_allows_eos_alone():
    sp = _sp(guided_regex="ab", temperature=1.0, min_tokens=5)
    md = SamplingMetadata.build([sp], [[257]], [[1]], [3], None, [EOS], "cpu", V)   # "ab" done: EOS only
    assert Sampler()(torch.randn(1, V), md).token_ids.tolist() == [EOS]
    sp = _sp(guided_regex="a(?:b)?", temperature=1.0, min_tokens=5)
    md = SamplingMetadata.build([sp], [[98]], [[1]], [3], None, [EOS], "cpu", V)    # "a": EOS held, "b" fits
    logits = torch.zeros(1, V)
    logits[0, EOS] = 50.0
    assert Sampler()(logits, md).token_ids.tolist() == [99]


def test_an_automaton_outgrowing_its_bound_ends_the_request_not_the_step(monkeypatch, caplog):
    from decodekit.sampling.guided import automaton
    monkeypatch.setattr(automaton, "MAX_DFA_STATES", 20)
    sp = _sp(guided_regex=r"(?:a|b)*a(?:a|b){12}c", temperature=1.0)   # 2^13 DFA states, reached as it goes
    free = SamplingParams(temperature=1.0)
    out, ended = [], False
    for step in range(40):
        md = SamplingMetadata.build([sp, free], [out, []], [[1], [1]], [1, 2], None, [EOS], "cpu", V)
        tok = Sampler()(torch.randn(2, V), md).token_ids.tolist()[0]
        if tok == EOS:
            ended = True
            break
        out.append(tok)
    assert ended and "grew past 20 states" in caplog.text and "grew past 20 states" in sp.guide_error


def test_schema_key_order_is_kept_through_the_cache():
    """Two schemas with the same keys in another order (pydantic models A(name, age) and B(age, name)) are
    different guides: the generated keys follow each one's declared order."""
    a = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["age", "name"]}
    b = {"type": "object", "properties": {"age": {"type": "integer"}, "name": {"type": "string"}},
         "required": ["age", "name"]}
    pa, pb = SamplingParams(guided_json=a).guided_pattern(), SamplingParams(guided_json=b).guided_pattern()
    assert re.fullmatch(pa, '{"name": "x", "age": 1}') and not re.fullmatch(pa, '{"age": 1, "name": "x"}')
    assert re.fullmatch(pb, '{"age": 1, "name": "x"}') and not re.fullmatch(pb, '{"name": "x", "age": 1}')


@pytest.mark.parametrize("kw", [
    dict(guided_json='{"type": "object", "properties": {"a": ' * 1500 + "{}" + "}}" * 1500),
    dict(guided_json='[' * 5000 + ']' * 5000),
    dict(guided_regex="(" * 300 + "a" + ")" * 300),
    dict(guided_json=functools.reduce(lambda s, _: {"type": "array", "items": s}, range(13), {})),
])
def test_deep_or_huge_guides_are_refused_quickly(kw):
    with pytest.raises(SamplingParamsError) as e:   # (these took minutes, or ran out of memory, before the bounds)
        SamplingParams(**kw)
    assert e.value.field in kw and len(str(e.value)) < 600
