"""The LLM API as vLLM users call it: the sampling_params keyword, use_tqdm, {"prompt": str} prompts,
get_tokenizer(); mistakes named."""
import pytest

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_llm


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="128MiB", seed=0)


def test_vllm_call_shapes(llm):
    sp = SamplingParams(temperature=0, max_tokens=6)
    want = llm.generate(["The capital of France is"], sp)[0].outputs[0].token_ids
    assert llm.generate(["The capital of France is"], sampling_params=sp, use_tqdm=False)[0].outputs[0].token_ids == want
    assert llm.generate({"prompt": "The capital of France is"}, sampling_params=sp)[0].outputs[0].token_ids == want
    assert llm.generate([{"prompt": "The capital of France is"}], sp)[0].prompt == "The capital of France is"
    tok = llm.get_tokenizer()
    ids = tok.encode("The capital of France is")
    assert llm.generate({"prompt_token_ids": ids}, sampling_params=sp)[0].outputs[0].token_ids == want
    chat = llm.chat([{"role": "user", "content": "Hi"}], sampling_params=sp, use_tqdm=True)
    assert chat[0].outputs[0].token_ids == llm.chat([{"role": "user", "content": "Hi"}], sp)[0].outputs[0].token_ids
    assert "".join(llm.stream("The capital of France is", sampling_params=sp)) == \
        tok.decode(want)
    assert_no_leaks(llm)


@pytest.mark.parametrize("call, match", [
    (lambda llm, sp: llm.generate("hi", sp, sampling_params=sp), "once"),
    (lambda llm, sp: llm.generate({"text": "hi"}, sp), "'prompt_token_ids' or 'prompt' only"),
    (lambda llm, sp: llm.generate({"prompt": 5}, sp), "needs 'prompt_token_ids'"),
    (lambda llm, sp: llm.generate("hi", sp, use_tqdm="yes"), "use_tqdm"),
])
def test_mistakes_are_named(llm, call, match):
    with pytest.raises(ValueError, match=match):
        call(llm, SamplingParams(max_tokens=2))
    assert_no_leaks(llm)


def test_chat_continue_final_message(llm):
    conv = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "My favourite fruit is"}]
    sp = SamplingParams(temperature=0, max_tokens=5)
    out = llm.chat(conv, sampling_params=sp, add_generation_prompt=False, continue_final_message=True)[0]
    ids = llm.get_tokenizer().encode(llm.get_tokenizer().apply_chat_template(
        conv, add_generation_prompt=False, continue_final_message=True), add_special_tokens=False)
    assert out.prompt_token_ids == ids and llm.get_tokenizer().decode(ids).endswith("My favourite fruit is")
    with pytest.raises(ValueError, match="cannot both be true"):
        llm.chat(conv, sp, continue_final_message=True)
    assert_no_leaks(llm)


def test_truncate_prompt_tokens(llm):
    """vLLM's SamplingParams.truncate_prompt_tokens: the prompt's last k tokens (-1: as many as fit before
    max_tokens); the output is that of the truncated prompt given directly."""
    from decodekit.sampling import SamplingParamsError
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6, add_special_tokens=True)
    sp = SamplingParams(temperature=0, max_tokens=6, truncate_prompt_tokens=9)
    (o,) = llm.generate({"prompt_token_ids": ids}, sp)
    (want,) = llm.generate({"prompt_token_ids": ids[-9:]}, SamplingParams(temperature=0, max_tokens=6))
    assert o.prompt_token_ids == ids[-9:] and o.outputs[0].token_ids == want.outputs[0].token_ids
    (o,) = llm.generate({"prompt_token_ids": ids[:5]}, sp)              # shorter than k: untouched
    assert o.prompt_token_ids == ids[:5]
    (o,) = llm.generate("a " * 40, SamplingParams(max_tokens=3, truncate_prompt_tokens=4))
    assert len(o.prompt_token_ids) == 4 and o.prompt is None              # the text is no longer the prompt
    mml = llm.engine.max_model_len
    (o,) = llm.generate({"prompt_token_ids": (ids * (mml // len(ids) + 1))[:mml + 5]},
                        SamplingParams(max_tokens=3, truncate_prompt_tokens=-1))
    assert len(o.prompt_token_ids) == mml - 3
    for bad in (0, -2, mml + 1, 2.5, -1.0, True):
        with pytest.raises(SamplingParamsError) as e:
            llm.generate("hi", SamplingParams(truncate_prompt_tokens=bad))
        assert e.value.field == "truncate_prompt_tokens"


def test_chat_template_and_kwargs(llm):
    """LLM.chat(chat_template=..., chat_template_kwargs=...) as vLLM's: the template renders the prompt, the kwargs
    are its extra variables; bad ones are refused naming the parameter."""
    t = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<bot>" \
        "{{ style | default('plain') }}:{% endif %}"
    conv = [{"role": "user", "content": "Hi"}]
    sp = SamplingParams(temperature=0, max_tokens=2)
    (o,) = llm.chat(conv, sp, chat_template=t, chat_template_kwargs={"style": "brief"})
    assert llm.get_tokenizer().decode(o.prompt_token_ids, skip_special_tokens=False) == "<user>Hi<bot>brief:"
    (o,) = llm.chat(conv, sp, chat_template=t)
    assert llm.get_tokenizer().decode(o.prompt_token_ids, skip_special_tokens=False) == "<user>Hi<bot>plain:"
    for kw, match in (({"chat_template_kwargs": {"add_generation_prompt": False}}, "own parameter"),
                      ({"chat_template_kwargs": [1]}, "chat_template_kwargs must be an object"),
                      ({"chat_template": "{% if %}"}, "chat_template is not valid Jinja"),
                      ({"chat_template": ""}, "chat_template must be a non-empty")):
        with pytest.raises(ValueError, match=match):
            llm.chat(conv, sp, **kw)
    assert_no_leaks(llm)
