"""Hostile input to the offline API (LLM.generate / chat / stream, LLMEngine.add_request), found by the
input-robustness audit: a clear ValueError naming what is wrong, never a TypeError from deep inside, a
hang or another request's output lost; KV blocks all free afterwards."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_llm

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
A, B = "The capital of France is", "Once upon a time"


@pytest.fixture(scope="module")
def llm():
    return embedded_llm(kv_cache_memory="64MiB", max_model_len=512, seed=1)


@pytest.fixture(scope="module")
def ref(llm):
    return {p: llm.generate(p, GREEDY)[0].outputs[0].text for p in (A, B)}


def _bounded(fn, timeout=120.0):
    """fn() in a thread: a regression that hangs fails the test instead of the whole run."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_interleaved_streams_each_get_their_whole_text(llm, ref):
    """Was: each stream's loop dropped the other's outputs (lost text), and the stream whose request finished
    inside the other's loop then spun forever on an idle engine."""
    def interleave():
        gens, texts, live = [llm.stream(A, GREEDY), llm.stream(B, GREEDY)], ["", ""], [True, True]
        while any(live):
            for i, g in enumerate(gens):
                if live[i]:
                    try:
                        texts[i] += next(g)
                    except StopIteration:
                        live[i] = False
        return texts
    assert _bounded(interleave) == [ref[A], ref[B]]
    assert_no_leaks(llm)


def test_generate_while_a_stream_is_paused(llm, ref):
    """Was: generate() stepped the paused stream's request to completion and dropped its outputs; resuming the
    stream then hung."""
    s = llm.stream(B, GREEDY)
    first = _bounded(lambda: next(s))
    assert _bounded(lambda: llm.generate(A, GREEDY))[0].outputs[0].text == ref[A]
    assert first + "".join(_bounded(lambda: list(s))) == ref[B]
    assert_no_leaks(llm)


def test_bad_prompt_in_a_batch_fails_the_call_and_spares_a_paused_stream(llm, ref):
    s = llm.stream(B, GREEDY)
    first = _bounded(lambda: next(s))
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([A, ""], GREEDY)
    assert first + "".join(_bounded(lambda: list(s))) == ref[B]
    assert_no_leaks(llm)
    assert not llm.engine.has_unfinished_requests()


def test_closing_a_stream_early_aborts_it(llm, ref):
    s = llm.stream(A, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    next(s)
    s.close()
    assert llm.generate(B, GREEDY)[0].outputs[0].text == ref[B]   # steps the engine past the abort
    assert_no_leaks(llm)


@pytest.mark.parametrize("call, match", [
    # were: TypeError 'int' / 'NoneType' object is not iterable
    (lambda llm: llm.generate(5), "prompts must be"),
    (lambda llm: llm.generate(None), "prompts must be"),
    # was: "prompt must be a string or a list of token ids, got int" (the bytes' first byte)
    (lambda llm: llm.generate(b"hello"), "prompts must be .* got bytes"),
    # was: TypeError object of type 'int' has no len()
    (lambda llm: llm.generate(["a", "b"], 3), "params must be a SamplingParams or a list"),
    # was: "params must be a SamplingParams, got str" (the dict's first key)
    (lambda llm: llm.generate(["a"], {"max_tokens": 2}), "params must be a SamplingParams or a list .* got dict"),
    # was: TypeError 'NoneType' object is not iterable
    (lambda llm: llm.chat(None), "messages must be a list"),
    (lambda llm: llm.chat(7), "messages must be a list"),
])
def test_wrong_types_give_a_clear_error(llm, call, match):
    with pytest.raises(ValueError, match=match):
        call(llm)
    assert_no_leaks(llm)


def test_numpy_token_ids_are_accepted(llm):
    """Was: "prompt token ids must be ints ...; item 0 is np.int64(...)" although SamplingParams takes numpy ints."""
    ids = llm.tokenizer.encode(A)
    want = llm.generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids
    got = llm.generate({"prompt_token_ids": list(np.array(ids, dtype=np.int64))}, GREEDY)[0]
    assert got.outputs[0].token_ids == want and got.prompt_token_ids == ids
    assert all(type(t) is int for t in got.prompt_token_ids)
    with pytest.raises(ValueError, match="token ids must be ints"):
        llm.generate({"prompt_token_ids": [np.bool_(True)]}, GREEDY)
    assert_no_leaks(llm)


def test_request_id_of_a_finished_sample_cannot_be_reused_while_its_siblings_run(llm):
    """Request "x" with n=2 has sequences "x/0" and "x/1". Was: once "x/0" finished (its sibling still running), a
    new request "x/0" was accepted and took over the engine's record of the sequence; finishing "x" then
    dropped it and the next step died with KeyError '<id>' (engine down, every request lost)."""
    eng = llm.engine
    params = None
    for seed in range(50):  # a seed whose two samples stop at different lengths (a stop string)
        p = SamplingParams(n=2, temperature=1.0, seed=seed, max_tokens=24, stop=[" "])
        lens = [len(c.token_ids) for c in llm.generate(A, p)[0].outputs]
        if lens[0] != lens[1]:
            params, first = p, min(range(2), key=lambda i: lens[i])
            break
    assert params is not None
    eng.add_request("x", A, params)
    while eng._seq_of[f"x/{first}"].out.finish_reason is None:
        eng.step()
    assert "x" in eng._groups                             # the sibling is still running
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request(f"x/{first}", B, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs[o.request_id] = o
    assert list(outs) == ["x"] and outs["x"].finished
    assert_no_leaks(llm)


def test_kv_cache_memory_beyond_the_machine_is_refused():
    """Was: the process was OOM-killed (SIGKILL) allocating the pool, no error at all."""
    with pytest.raises(ValueError, match=r"kv_cache_memory \(.* GiB\) exceeds this machine's memory"):
        embedded_llm(kv_cache_memory="1000000GiB")


@pytest.mark.parametrize("kw, match", [
    (dict(dtype="bfloat16", kv_cache_dtype="float16"),
     r"kv_cache_dtype='float16' needs a float16 model, or a float32 model on the CPU; this engine runs bfloat16"),
    (dict(dtype="float16", kv_cache_dtype="bfloat16"), r"kv_cache_dtype='bfloat16' needs a bfloat16 model"),
    (dict(kv_cache_dtype="int8"), r"kv_cache_dtype must be one of auto, fp8, fp8_e4m3, bfloat16, float16"),
])
def test_kv_cache_dtype_combinations_the_kernels_lack_are_refused_up_front(kw, match):
    """A 16-bit KV cache under another 16-bit model (or on CUDA under float32) has no kernel: refused when the
    arguments are made, naming the field, before any model is loaded."""
    from decodekit.engine.args import EngineArgs
    with pytest.raises(ValueError, match=match):
        EngineArgs(device="cpu", **kw)
    EngineArgs(device="cpu", dtype="bfloat16", kv_cache_dtype="bfloat16")   # the model's own dtype: fine
    EngineArgs(device="cpu", dtype="float32", kv_cache_dtype="float16")


CHAT_SP = SamplingParams(temperature=0, max_tokens=4)


def test_chat_takes_openai_content_parts(llm):
    """Was refused offline (the server takes them): content as a list of {"type": "text"} parts is their text
    joined with newlines, as vLLM joins them for a template that takes a string."""
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}],
                     CHAT_SP)
    plain = llm.chat([{"role": "user", "content": "Say \nhi"}], CHAT_SP)
    assert parts[0].prompt_token_ids == plain[0].prompt_token_ids
    assert parts[0].outputs[0].text == plain[0].outputs[0].text


def test_chat_takes_a_tool_call_history(llm):
    """Was refused offline: an assistant turn with content None and tool_calls, then the tool's reply."""
    conv = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    (out,) = llm.chat(conv, CHAT_SP)
    assert len(out.outputs[0].token_ids) >= 1
    outs = llm.chat([conv, [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]], CHAT_SP)
    assert len(outs) == 2


@pytest.mark.parametrize("messages, match", [
    ([], "must not be empty"),                      # was: silently returned []
    ([[]], "conversation 0: 'messages' must be a non-empty list"),
    ([[{"role": "user", "content": "hi"}], []], "conversation 1"),
    ([{"role": "user", "content": None}], r"messages\[0\].content' is required"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "parts must be"),
    ([{"role": "assistant", "content": "", "tool_calls": "x"}], "tool_calls' must be a list"),
    ([{"content": "hi"}], "string 'role'"),
])
def test_chat_refuses_malformed_conversations_with_a_value_error(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, CHAT_SP)
    assert not llm.engine.has_unfinished_requests()
