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
