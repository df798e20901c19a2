"""Guided decoding end to end on the embedded model (LLM API): guided_regex / guided_json /
guided_json_object outputs that end with EOS fully match (Python's re; json + jsonschema for the
schemas), truncated ones are prefixes of a match; sampled with seeds and n > 1; speculative decoding
(n-gram, layer-skip) emits exactly the plain tokens; min_tokens yields to the guide; errors name the field;
no KV block is left behind."""
import json
import re

import pytest

from decodekit.sampling import SamplingParams
from decodekit.sampling.guided import DEAD, StructuredOutputsParams
from decodekit.sampling.params import SamplingParamsError
from dk_testing import assert_no_leaks, embedded_llm

PROMPTS = ["The phone number of the office is", "Answer with yes or no: is the sky green?",
           "Write a date:", "Describe a person as JSON:"]
REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"(?:yes|no)(?:, because [a-z ]{1,40})?\.", r"\d{4}-(?:0[1-9]|1[0-2])-\d{2}",
           r"[A-Z][a-z]{1,12}(?: [A-Z][a-z]{1,12})?, aged (?:[1-9]\d?)"]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    "married": {"type": "boolean"}}, "required": ["name", "age"]}


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="256MiB", seed=1)


def _guide_sp(llm, sp):
    sp = SamplingParams(**{k: v for k, v in sp.to_dict().items() if k.startswith("guided_")})
    sp.set_guided(llm.engine.tokenizer, llm.engine.eos_token_ids)
    return sp.__dict__["_guide"]


def _guide_state(llm, sp, token_ids):
    return _guide_sp(llm, sp).state_after(list(token_ids))


def _check(llm, sp, outs, full):
    """Each finished ('stop') output satisfies `full(text)`; truncated ones ('length') are live prefixes."""
    n_stop = 0
    for o in outs:
        for c in o.outputs:
            if c.finish_reason == "stop":
                assert full(c.text), c.text
                n_stop += 1
            else:
                assert c.finish_reason == "length" and _guide_state(llm, sp, c.token_ids) != DEAD, c.text
    return n_stop


def test_regex_outputs_match(llm):
    stops = 0
    for pattern in REGEXES:
        sp = SamplingParams(guided_regex=pattern, temperature=0.9, seed=3, n=2, max_tokens=40)
        outs = llm.generate(PROMPTS, sp)
        stops += _check(llm, sp, outs, lambda t, p=pattern: re.fullmatch(p, t, re.ASCII))
        greedy = llm.generate(PROMPTS[:2], SamplingParams(guided_regex=pattern, temperature=0, max_tokens=40))
        stops += _check(llm, sp, greedy, lambda t, p=pattern: re.fullmatch(p, t, re.ASCII))
    assert stops >= 20
    assert_no_leaks(llm)


def test_json_schema_and_json_object(llm):
    jsonschema = pytest.importorskip("jsonschema")
    for sp in (SamplingParams(guided_json=PERSON, temperature=0.7, seed=5, n=2, max_tokens=80),
               SamplingParams(structured_outputs=StructuredOutputsParams(json=json.dumps(PERSON)), temperature=0,
                              max_tokens=80)):
        outs = llm.generate(PROMPTS, sp)

        def valid(text):
            jsonschema.validate(json.loads(text), PERSON)
            return True
        assert _check(llm, sp, outs, valid) >= 3
    sp = SamplingParams(guided_json_object=True, temperature=0.8, seed=2, max_tokens=60)
    outs = llm.generate(PROMPTS, sp)
    assert _check(llm, sp, outs, lambda t: isinstance(json.loads(t), dict)) >= 1
    assert_no_leaks(llm)


@pytest.mark.parametrize("method", ["ngram", "layerskip"])
def test_speculative_decoding_emits_the_plain_tokens(llm, method):
    spec = embedded_llm(kv_cache_memory="256MiB", seed=1, speculative=method, num_speculative_tokens=3)
    for sp in (SamplingParams(guided_regex=REGEXES[1], temperature=0, max_tokens=30),
               SamplingParams(guided_json=PERSON, temperature=0, max_tokens=60),
               SamplingParams(guided_regex=REGEXES[3], temperature=0.8, seed=11, max_tokens=30),
               SamplingParams(guided_grammar=ARITH, temperature=0.8, seed=12, max_tokens=30),     # pushdown guides
               SamplingParams(guided_json_object=True, temperature=0, max_tokens=40)):
        want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
        got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS, sp)]
        assert got == want
    assert_no_leaks(spec)


ARITH = r"""
root ::= expr
expr ::= term ((" + " | " - ") term)*
term ::= factor ((" * ") factor)*
factor ::= [1-9] [0-9]? | "(" expr ")"
"""


def test_grammar_outputs_are_in_the_language(llm):
    """guided_grammar (GBNF): outputs that end with EOS are arithmetic expressions of the grammar (Python
    evaluates them); sampled, n > 1, and through structured_outputs."""
    prompts = ["Write an arithmetic expression:", "2 + 2 is"]
    stops = 0
    for sp in (SamplingParams(guided_grammar=ARITH, temperature=0.9, seed=4, n=3, max_tokens=48),
               SamplingParams(structured_outputs={"grammar": ARITH}, temperature=0, max_tokens=48)):
        for o in llm.generate(prompts, sp):
            for c in o.outputs:
                if c.finish_reason == "stop":
                    assert re.fullmatch(r"[0-9()+\-* ]+", c.text) and isinstance(eval(c.text, {}), (int, float)), c.text
                    stops += 1
                else:
                    assert c.finish_reason == "length" and _guide_state(llm, sp, c.token_ids) != DEAD, c.text
    assert stops >= 1       # (the model likes long sums: most outputs run to max_tokens)
    assert_no_leaks(llm)


def test_schema_free_values_and_grammars_nest_without_a_bound(llm):
    """Schema-free JSON values (json_object's, a schema's {}) and recursive grammars run as pushdown automata:
    with the bracket tokens favoured (logit_bias), greedy outputs open 20+ containers (the unrolled regexes
    stopped at 4), every token allowed by the guide; a grammar that must close them does."""
    tok = llm.engine.tokenizer
    tb, _ = tok.token_bytes()
    brackets = {i: 40.0 for i, b in enumerate(tb) if b and set(b) <= set(b"[")}
    assert brackets
    schema = {"type": "object", "properties": {"a": {}}, "required": ["a"]}
    sp = SamplingParams(guided_json=schema, temperature=0, max_tokens=40, logit_bias=brackets)
    c = llm.generate(["A JSON object:"], sp)[0].outputs[0]
    depth = max(c.text[:i].count("[") - c.text[:i].count("]") for i in range(len(c.text) + 1))
    assert c.finish_reason == "length" and depth >= 20 and _guide_state(llm, sp, c.token_ids) != DEAD, c.text
    grammar = 'root ::= "<" inner ">"\ninner ::= "<" inner ">" | "x"'
    opens = {i: 40.0 for i, b in enumerate(tb) if b and set(b) <= set(b"<")}
    sp = SamplingParams(guided_grammar=grammar, temperature=0, max_tokens=60, logit_bias=opens)
    c = llm.generate(["Nest:"], sp)[0].outputs[0]
    assert c.finish_reason == "length" and c.text.count("<") >= 20 and set(c.text) <= set("<"), c.text
    # after those tokens the guide wants "<" or "x", then exactly as many ">" as were opened, then EOS
    g = _guide_sp(llm, sp)
    st = g.state_after(list(c.token_ids))
    allowed = {tb[i] for i in g.mask(st, len(tb))[0].nonzero().flatten().tolist() if i < len(tb)}
    assert allowed == {b"<", b"<<", b"x"}, allowed
    st = g.dfa.step(st, b"x")
    for k in range(c.text.count("<")):
        assert st != DEAD and not g.dfa.is_accepting(st)
        st = g.dfa.step(st, b">")
    assert g.dfa.is_accepting(st) and g.dfa.step(st, b">") == DEAD
    assert_no_leaks(llm)


def test_min_tokens_yields_to_the_guide(llm):
    sp = SamplingParams(guided_regex=r"\d{1,2}", min_tokens=6, temperature=0, max_tokens=10)
    for o in llm.generate(PROMPTS[:2], sp):
        c = o.outputs[0]
        assert re.fullmatch(r"\d{1,2}", c.text) and c.finish_reason == "stop", c.text
        # the guide's EOS ends the output at once (not EOS again and again until min_tokens)
        assert c.token_ids[-1] in llm.engine.eos_token_ids and not set(c.token_ids[:-1]) & set(llm.engine.eos_token_ids)
    (o,) = llm.generate(PROMPTS[1], SamplingParams(guided_grammar='root ::= "yes" | "no"', min_tokens=5, temperature=0))
    assert o.outputs[0].text in ("yes", "no") and len(o.outputs[0].token_ids) <= 3, o.outputs[0].token_ids
    assert_no_leaks(llm)


@pytest.mark.parametrize("kw, field", [
    (dict(guided_regex="(a"), "guided_regex"), (dict(guided_regex=5), "guided_regex"),
    (dict(guided_regex='(?:[^"]{0,100}){100}'), "guided_regex"),      # too ambiguous: refused at add_request
    (dict(guided_json={"type": "object", "properties": {"a": {"type": "nope"}}}), "guided_json"),
    (dict(guided_json="{not json"), "guided_json"), (dict(guided_json=[1]), "guided_json"),
    (dict(guided_regex="a", guided_json_object=True), "guided_json_object"),
    (dict(guided_regex="a", ignore_eos=True), "guided_regex"),
    (dict(guided_regex="a", allowed_token_ids=[1]), "guided_regex"),
    (dict(guided_regex="a", guided_whitespace_pattern=" "), "guided_whitespace_pattern"),
    (dict(guided_json_object=True, guided_whitespace_pattern="(?=x)"), "guided_whitespace_pattern"),
    (dict(guided_json_object=1), "guided_json_object"),
    (dict(structured_outputs={"grammar": "root ::= x"}), "guided_grammar"),
    (dict(guided_grammar="root ::= [a-"), "guided_grammar"),
    (dict(structured_outputs={"regex": "a", "nope": 1}), "structured_outputs"),
    (dict(structured_outputs={"regex": "a"}, guided_regex="b"), "structured_outputs"),
])
def test_errors_name_the_field(llm, kw, field):
    with pytest.raises(SamplingParamsError) as e:
        llm.generate("hi", SamplingParams(max_tokens=2, **kw))
    assert e.value.field == field, e.value
    assert_no_leaks(llm)


def test_bad_request_does_not_disturb_others(llm):
    eng = llm.engine
    eng.add_request("ok", "hi", SamplingParams(guided_regex=r"[a-z]{3}", max_tokens=8, temperature=0))
    with pytest.raises(SamplingParamsError):
        eng.add_request("big", "hi", SamplingParams(guided_regex=r"(?:x{9999}){9999}", max_tokens=8))
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert re.fullmatch(r"[a-z]{3}", done["ok"].outputs[0].text) and "big" not in done
    assert_no_leaks(llm)


def test_a_guide_that_gives_up_mid_request_finishes_with_error(llm, monkeypatch):
    """A guide whose automaton outgrows its bounds mid-request (automaton.GuideError from a mask) ends that
    request with finish_reason "error" (never "stop": its text is no match), and the batch goes on."""
    from decodekit.sampling.guided import automaton
    real, calls = automaton.Guide.allowed_rows, []

    def failing(self, sid):
        calls.append(sid)
        if len(calls) > 4:
            raise automaton.GuideError("the guide's automaton grew past its bounds (test)")
        return real(self, sid)
    monkeypatch.setattr(automaton.Guide, "allowed_rows", failing)
    outs = llm.generate(PROMPTS[:2], [SamplingParams(guided_regex=r"[a-z ]{5,60}\\.", temperature=0, max_tokens=30),
                                      SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)])
    bad, good = outs[0].outputs[0], outs[1].outputs[0]
    assert bad.finish_reason == "error" and "test" in bad.stop_reason, bad
    assert good.finish_reason == "length" and len(good.token_ids) == 12
    assert_no_leaks(llm)


def test_preemption_and_prefix_caching_keep_guided_outputs(llm):
    """Guided requests preempted by recompute (a KV cache of 8 blocks) and served from the prefix cache give
    the tokens they give alone; n > 1 with a seed too."""
    sps = [SamplingParams(guided_json=PERSON, temperature=0, max_tokens=50),
           SamplingParams(guided_regex=REGEXES[3], temperature=0.9, seed=4, n=2, max_tokens=40)]
    prompts = [p + " Answer:" for p in PROMPTS]
    want = [[[c.token_ids for c in o.outputs] for o in llm.generate(prompts, sp)] for sp in sps]
    small = embedded_llm(kv_cache_memory="6MiB", max_model_len=128, seed=1)   # forces preemption
    for sp, w in zip(sps, want):
        assert [[c.token_ids for c in o.outputs] for o in small.generate(prompts, sp)] == w
        assert [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, sp)] == w   # prefix-cache hits
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leaks(small)
    assert_no_leaks(llm)


def test_reasoning_parser_guides_the_answer_only(llm):
    """reasoning_parser: a guide constrains what follows </think> (the embedded model is pushed to close its
    reasoning by a bias on "</"); the tokens equal a guide written out by hand (free text without </think>,
    </think>, the answer), and speculative decoding emits the same tokens."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    conv = [{"role": "user", "content": "What is 2+2? Answer in JSON."},
            {"role": "assistant", "content": "<think>\nThe user wants"}]
    tok = llm.get_tokenizer()
    bias = {tok.encode("</think>", add_special_tokens=False)[0]: 8.0}
    thinker = embedded_llm(kv_cache_memory="256MiB", seed=1, reasoning_parser="deepseek_r1")
    spec = embedded_llm(kv_cache_memory="256MiB", seed=1, reasoning_parser="deepseek_r1", speculative="ngram",
                        num_speculative_tokens=3)
    from decodekit.sampling.reasoning import REASONING_PARSERS, reasoning_guide
    from decodekit.sampling.guided import guide_pattern
    by_hand = reasoning_guide(REASONING_PARSERS["deepseek_r1"], "open", guide_pattern("json", schema))
    for sp in (SamplingParams(guided_json=schema, temperature=0, max_tokens=60, logit_bias=bias),
               SamplingParams(guided_json=schema, temperature=0.7, seed=4, n=2, max_tokens=60, logit_bias=bias)):
        kw = dict(add_generation_prompt=False, continue_final_message=True)
        (o,) = thinker.chat(conv, sp, **kw)
        (s,) = spec.chat(conv, sp, **kw)
        hand = SamplingParams(**{**sp.to_dict(), "guided_json": None, "guided_regex": by_hand})
        (h,) = llm.chat(conv, hand, **kw)
        assert [c.token_ids for c in o.outputs] == [c.token_ids for c in s.outputs] == [c.token_ids for c in h.outputs]
        for c in o.outputs:
            head, sep, tail = c.text.partition("</think>")
            if c.finish_reason == "stop" and sep:
                assert json.loads(tail).keys() == {"answer"} and "</think>" not in head
        if sp.temperature == 0:     # greedy: it did close its reasoning, then answered in JSON
            assert "</think>" in o.outputs[0].text and o.outputs[0].finish_reason == "stop"
    # without the parser the same request answers in JSON from its first token
    (o,) = llm.chat(conv, SamplingParams(guided_json=schema, temperature=0, max_tokens=60, logit_bias=bias),
                    add_generation_prompt=False, continue_final_message=True)
    assert o.outputs[0].text.startswith("{")
    for e in (thinker, spec):
        assert_no_leaks(e)
    with pytest.raises(ValueError, match="reasoning_parser must be one of deepseek_r1, qwen3"):
        embedded_llm(reasoning_parser="r1")
