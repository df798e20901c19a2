"""The model's recommended sampling defaults (vLLM's --generation-config auto | vllm | PATH and
--override-generation-config): read from generation_config.json (values equal to transformers' defaults are not
recommendations) or a GGUF's general.sampling.*, applied where a request leaves a field out (LLM without
SamplingParams, the server's completions and chat), max_new_tokens capping max_tokens; bad files named."""
from __future__ import annotations

import json
import os
import warnings

import pytest

from decodekit import LLM, SamplingParams
from decodekit.engine.generation_config import generation_defaults

transformers = pytest.importorskip("transformers")

RECOMMENDED = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1,
               "max_new_tokens": 7, "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, hf_tok):
    import torch
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    d = tmp_path_factory.mktemp("gencfg") / "llama"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.LlamaForCausalLM(cfg).save_pretrained(d)
        hf_tok.save_pretrained(d)
    (d / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return str(d)


def test_defaults_read_and_applied(model_dir):
    llm = LLM(model=model_dir, kv_cache_memory="16MiB")
    d = llm.get_default_sampling_params()
    # top_k 50 is transformers' own default (not a recommendation, as vLLM reads it); do_sample is not read
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty, d.max_tokens) == (0.6, 0.9, -1, 1.1, 7)
    outs = llm.generate(["Hello there", "Once upon a time"])            # no SamplingParams: the defaults
    assert all(1 <= len(o.outputs[0].token_ids) <= 7 for o in outs)
    assert all(len(o.outputs[0].token_ids) == 7 or o.outputs[0].finish_reason == "stop" for o in outs)
    # seeded: the defaults are what runs (equal to giving them explicitly)
    explicit = SamplingParams(temperature=0.6, top_p=0.9, repetition_penalty=1.1, max_tokens=7, seed=5)
    implicit = llm.get_default_sampling_params()
    implicit.seed = 5
    assert llm.generate("Hello there", explicit)[0].outputs[0].token_ids == \
        llm.generate("Hello there", implicit)[0].outputs[0].token_ids
    del llm
    vanilla = LLM(model=model_dir, kv_cache_memory="16MiB", generation_config="vllm").get_default_sampling_params()
    assert (vanilla.temperature, vanilla.top_p, vanilla.repetition_penalty) == (1.0, 1.0, 1.0)
    over = LLM(model=model_dir, kv_cache_memory="16MiB",
               override_generation_config={"temperature": 0.2, "top_k": 0}).get_default_sampling_params()
    assert (over.temperature, over.top_p, over.top_k, over.max_tokens) == (0.2, 0.9, -1, 7)


def test_generation_config_paths_and_errors(model_dir, tmp_path):
    assert generation_defaults("auto", "") == {}                     # random: presets recommend nothing
    assert generation_defaults("vllm", model_dir) == {}
    other = tmp_path / "g"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 20, "min_p": 0.05}))
    for where in (str(other), str(other / "generation_config.json")):
        assert generation_defaults(where, model_dir) == {"temperature": 0.3, "top_k": 20, "min_p": 0.05}
    with pytest.raises(ValueError, match="generation_config: no such file"):
        generation_defaults(str(tmp_path / "nope"), model_dir)
    with pytest.raises(ValueError, match="override_generation_config: unknown key 'temprature'"):
        generation_defaults("auto", model_dir, {"temprature": 0.5})
    with pytest.raises(ValueError, match="override_generation_config must be a JSON object"):
        generation_defaults("auto", model_dir, "{temperature")
    (other / "generation_config.json").write_text(json.dumps({"temperature": -1.0}))
    with pytest.raises(ValueError, match=r"generation config \(.*generation_config.json\).*temperature"):
        LLM(model=model_dir, generation_config=str(other))
    (other / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        generation_defaults(str(other), model_dir)


def test_gguf_general_sampling(tmp_path):
    """llama.cpp's general.sampling.* keys (float32 in the file: 0.6 reads back as 0.6); a GGUF without them
    recommends nothing (the embedded model)."""
    import gguf
    import numpy as np

    from dk_testing import embedded_model_or_skip
    path = str(tmp_path / "s.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_float32(gguf.Keys.General.SAMPLING_TEMP, 0.6)
    w.add_int32(gguf.Keys.General.SAMPLING_TOP_K, 40)
    w.add_float32(gguf.Keys.General.SAMPLING_MIN_P, np.float32(0.05))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert generation_defaults("auto", path) == {"temperature": 0.6, "top_k": 40, "min_p": 0.05}
    assert generation_defaults("auto", embedded_model_or_skip()) == {}


def test_server_applies_defaults(model_dir):
    """A request that leaves temperature & co. out samples with the model's; an explicit field wins; max_tokens
    (the request's, or the context's room) is capped by max_new_tokens."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
    from server_harness import LiveServer

    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.server.async_engine import AsyncEngine
    aeng = AsyncEngine(LLMEngine(EngineArgs(model=model_dir, kv_cache_memory="16MiB", seed=0)))
    aeng.start()
    s = LiveServer(aeng)
    try:
        def completion(**kw):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello there", "ignore_eos": True, **kw},
                           timeout=60)
            assert r.status_code == 200, r.text
            return r.json()
        a = completion(seed=3, max_tokens=50)
        b = completion(seed=3, max_tokens=50, temperature=0.6, top_p=0.9, repetition_penalty=1.1)
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["usage"]["completion_tokens"] == 7                       # min(50, max_new_tokens 7)
        c = completion(seed=3, max_tokens=50, temperature=1.0, top_p=1.0, repetition_penalty=1.0)
        d = completion(seed=3, max_tokens=50, temperature=1.0, top_p=1.0, repetition_penalty=1.0)
        assert c["choices"][0]["text"] == d["choices"][0]["text"]
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                             "ignore_eos": True, "seed": 1}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7, r.text
        # a beam search takes the recommended temperature only (its repetition_penalty would be refused)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello", "use_beam_search": True, "n": 2,
                                                        "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    finally:
        s.stop()
        aeng.shutdown()


def test_cli_flags_left_out_take_the_model_defaults(model_dir):
    """decodekit generate / chat: a flag left out takes the model's recommendation (generate stays greedy unless
    --temperature is given; chat takes the recommended temperature), a flag given wins."""
    import argparse

    from decodekit.cli import _params, build_parser
    gen = build_parser().parse_args(["generate", "--model", model_dir, "x"])
    p = _params(gen, {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 7})
    assert (p.temperature, p.top_p, p.repetition_penalty, p.max_tokens, p.top_k) == (0.0, 0.9, 1.1, 7, -1)
    p = _params(build_parser().parse_args(["generate", "x", "--top-p", "0.5", "--max-tokens", "3"]),
                {"top_p": 0.9, "max_tokens": 7})
    assert (p.top_p, p.max_tokens) == (0.5, 3)
    chat = build_parser().parse_args(["chat"])
    assert _params(chat, {"temperature": 0.6}).temperature == 0.6 and _params(chat, {}).temperature == 0.7
    assert _params(chat).max_tokens == 128 and isinstance(chat, argparse.Namespace)


def test_typed_fields_and_a_cap_past_the_context(model_dir, tmp_path):
    """true is no temperature; max_new_tokens may be 12.0 but not -1 (named as in the file); a recommended
    max_new_tokens past the context does not make default requests fail: they stop at the context (length)."""
    import shutil
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    for cfg, err in (({"temperature": True}, "temperature must be a number, got true"),
                     ({"max_new_tokens": -1}, "max_new_tokens: must be an int >= 1"),
                     ({"top_k": 2.5}, "top_k must be an integer")):
        (d / "generation_config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match=err):
            generation_defaults("auto", str(d))
    (d / "generation_config.json").write_text(json.dumps({"max_new_tokens": 12.0}))
    assert generation_defaults("auto", str(d)) == {"max_tokens": 12}
    (d / "generation_config.json").write_text(json.dumps({"max_new_tokens": 100, "temperature": 0.0}))
    llm = LLM(model=str(d), max_model_len=64, kv_cache_memory="16MiB")
    (out,) = llm.generate({"prompt_token_ids": list(range(5, 25))})
    assert len(out.outputs[0].token_ids) == 44 and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="exceeds max_model_len"):     # asked for explicitly: refused as ever
        llm.generate({"prompt_token_ids": list(range(5, 25))}, SamplingParams(max_tokens=100))
