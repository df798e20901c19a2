"""Malformed and unusual model files: every bad one is ONE ModelLoadError (a ValueError) naming the file and
the metadata key / config field / tensor with what was expected -- never a raw RuntimeError, TypeError,
JSONDecodeError, tokenizers' bare Exception or an out-of-memory table -- and unusual valid ones load."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from decodekit.loader import ModelLoadError, load_config, load_model
from decodekit.loader.random import random_model



@pytest.fixture(scope="module")
def tiny():
    cfg, weights, _ = random_model("tiny", progress_bar=False)
    return cfg, weights


@pytest.fixture(autouse=True)
def _helpers(gguf_helpers):
    global gguf_name, synthetic_tokenizer_meta
    gguf_name, synthetic_tokenizer_meta = gguf_helpers.gguf_name, gguf_helpers.synthetic_tokenizer_meta


# ---------------------------------------------------------------------------------------------- GGUF

def _gguf(path, cfg, weights, meta=None, tok=None, drop_tok=()):
    """The tiny model as a GGUF file; meta: {key: (type, value) or None (omit)} over the usual keys."""
    import gguf

    from decodekit.loader.gguf import permute
    keys = {"llama.block_count": ("uint32", cfg.num_layers), "llama.context_length": ("uint32", 2048),
            "llama.embedding_length": ("uint32", cfg.hidden_size),
            "llama.feed_forward_length": ("uint32", cfg.intermediate_size),
            "llama.attention.head_count": ("uint32", cfg.num_heads),
            "llama.attention.head_count_kv": ("uint32", cfg.num_kv_heads),
            "llama.attention.layer_norm_rms_epsilon": ("float32", 1e-5),
            "llama.rope.freq_base": ("float32", 10000.0), "llama.vocab_size": ("uint32", cfg.vocab_size)}
    keys.update(meta or {})
    w = gguf.GGUFWriter(str(path), arch="llama")
    for k, v in keys.items():
        if v is not None:
            getattr(w, f"add_{v[0]}")(k, v[1])
    t = tok or synthetic_tokenizer_meta(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    if "tokens" not in drop_tok:
        w.add_token_list(t["tokens"])
        w.add_token_types(t["types"])
    w.add_token_merges(t["merges"])
    w.add_eos_token_id(t["eos"])
    for name, x in weights.items():
        a = x.float().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            a = permute(a, cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("meta, match", [
    ({"llama.attention.head_count": ("uint32", 0)}, r"llama\.attention\.head_count must be an integer >= 1, got 0"),
    ({"llama.attention.head_count": ("string", "four")}, r"llama\.attention\.head_count must be an integer"),
    ({"llama.attention.head_count_kv": ("uint32", 3)}, r"head_count \(4\) must be a multiple of llama\.attention\.head_count_kv \(3\)"),
    # q rows do not split into the configured heads: was a RuntimeError from undoing llama.cpp's row permutation
    ({"llama.attention.head_count": ("uint32", 3), "llama.attention.head_count_kv": ("uint32", 1),
      "llama.rope.dimension_count": ("uint32", 16)},
     r"tensor blk\.0\.attn_q\.weight .* has shape \(64, 64\), the configuration implies \(48, 64\)"),
    ({"llama.attention.head_count": ("uint32", 3), "llama.attention.head_count_kv": ("uint32", 1)},
     r"llama\.embedding_length \(64\) must be a multiple of llama\.attention\.head_count \(3\)"),
    ({"llama.block_count": None}, r"GGUF metadata lacks llama\.block_count"),
    ({"llama.block_count": ("int32", -2)}, r"llama\.block_count must be an integer >= 1, got -2"),
    # a corrupt context length sized a [context, head_dim] rope table: an allocation error or an OOM kill
    ({"llama.context_length": ("uint64", 1 << 40)}, r"llama\.context_length must be an integer \[1, 16777216\]"),
    ({"llama.rope.freq_base": ("float32", 0.0)}, r"llama\.rope\.freq_base must be a finite number > 0"),
    ({"llama.attention.layer_norm_rms_epsilon": ("float32", float("nan"))}, r"layer_norm_rms_epsilon must be a finite"),
])
def test_gguf_bad_metadata(tmp_path, tiny, meta, match):
    path = _gguf(tmp_path / "m.gguf", *tiny, meta=meta)
    with pytest.raises(ModelLoadError, match=match) as e:
        load_model(path, progress=False)
    assert str(e.value).startswith(path)
    if not match.startswith("tensor"):  # the TP pre-check reads the config alone (no tensor shapes)
        with pytest.raises(ModelLoadError, match=match):
            load_config(path)


def test_gguf_bad_tokenizer_metadata(tmp_path, tiny):
    cfg, weights = tiny
    path = _gguf(tmp_path / "notok.gguf", cfg, weights, drop_tok=("tokens",))
    with pytest.raises(ModelLoadError, match=r"notok\.gguf: cannot build the tokenizer .*tokenizer\.ggml\.tokens"):
        load_model(path, progress=False)  # was NotImplementedError: a traceback from the CLI
    tok = synthetic_tokenizer_meta(cfg.vocab_size)
    path = _gguf(tmp_path / "merge.gguf", cfg, weights, tok=dict(tok, merges=["abc"] + tok["merges"]))
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.merges\[0\] = 'abc' is not two tokens"):
        load_model(path, progress=False)  # was a TypeError from inside `tokenizers`
    dup = dict(tok, tokens=tok["tokens"][:-1] + [tok["tokens"][5]])
    path = _gguf(tmp_path / "dup.gguf", cfg, weights, tok=dup)
    with pytest.raises(ModelLoadError, match=r"dup\.gguf: cannot build the tokenizer"):
        load_model(path, progress=False)  # was tokenizers' bare Exception
    # one token more than the embedding has rows: was an IndexError inside the model at the first such prompt;
    # now a warning at load, and a prompt that encodes to it is refused alone (the others run)
    big = dict(tok, tokens=tok["tokens"] + ["<|extra|>"], types=tok["types"] + [3])
    path = _gguf(tmp_path / "big.gguf", cfg, weights, tok=big)
    with pytest.warns(UserWarning, match=r"token ids up to 512 \('<\|extra\|>'\) but the model's embedding has 512"):
        load_model(path, progress=False)
    from decodekit import LLM, SamplingParams
    with pytest.warns(UserWarning):
        llm = LLM(model=str(path))
    with pytest.raises(ValueError, match=r"prompt: encodes to token id 512, past the model's embedding"):
        llm.generate("hi <|extra|>", SamplingParams(max_tokens=2))
    assert len(llm.generate("hi", SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids) == 2


def test_cli_bad_gguf_is_one_line(tmp_path, tiny, capsys):
    from decodekit.cli import main
    path = _gguf(tmp_path / "m.gguf", *tiny, meta={"llama.attention.head_count": ("string", "four")})
    assert main(["generate", "--model", path, "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("decodekit: error: ") and "head_count" in err, err


# ------------------------------------------------------------------------------------ Hugging Face

def _hf(d, cfg, weights, config=None, tok_vocab=None, **kw):
    from safetensors.torch import save_file

    from decodekit.tokenizer import Tokenizer
    os.makedirs(d, exist_ok=True)
    c = dict(architectures=["LlamaForCausalLM"], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
             intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
             num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, rms_norm_eps=1e-5)
    c.update(kw)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config if config is not None else json.dumps(c))
    if weights is not None:
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
    Tokenizer.synthetic(tok_vocab or cfg.vocab_size).backend.save(os.path.join(d, "tokenizer.json"))
    return str(d)


@pytest.mark.parametrize("kw, match", [
    (dict(hidden_size="abc"), r"config\.json: hidden_size must be an integer >= 1, got 'abc'"),
    (dict(hidden_size=64.5), r"hidden_size must be an integer >= 1, got 64\.5"),  # was silently 64
    (dict(num_attention_heads=0), r"num_attention_heads must be an integer >= 1, got 0"),  # was ZeroDivisionError
    (dict(num_attention_heads=None), r"num_attention_heads must be an integer >= 1, got None"),  # was TypeError
    (dict(num_hidden_layers=True), r"num_hidden_layers must be an integer >= 1, got True"),
    (dict(num_key_value_heads=3), r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    (dict(num_attention_heads=5, num_key_value_heads=1), r"hidden_size \(64\) must be a multiple of num_attention_heads \(5\)"),
    (dict(max_position_embeddings=1 << 40), r"max_position_embeddings must be an integer \[1, 16777216\]"),
    (dict(rope_theta=0), r"rope_theta must be a finite number > 0, got 0"),
    (dict(rms_norm_eps=-1e-5), r"rms_norm_eps must be a finite number >= 0"),
    (dict(head_dim=15), r"head_dim must be even \(RoPE rotates pairs of features\), got 15"),  # named the factor
    (dict(eos_token_id="x"), r"config\.json: eos_token_id must be a token id"),
    (dict(rope_scaling="linear"), r"rope_scaling must be an object"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), r"rope_type 'dynamic' is not supported \(supported: default, linear, llama3, yarn, longrope\)"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"rope_scaling \(llama3\) lacks 'original_max_position_embeddings'"),
    (dict(rope_scaling={"type": "linear", "factor": 0}), r"rope_scaling\.factor must be a number > 0, got 0"),  # was NaN logits
    (dict(architectures=None, model_type="gpt2"), r"config\.json: unsupported architecture 'gpt2'"),
])
def test_hf_bad_config_fields(tmp_path, tiny, kw, match):
    d = _hf(tmp_path / "m", *tiny, **kw)
    with pytest.raises(ModelLoadError, match=match):
        load_model(d, progress=False)
    with pytest.raises(ModelLoadError, match=match):
        load_config(d)


@pytest.mark.parametrize("text, match", [("{not json", r"config\.json: not valid JSON"),
                                         ("[1, 2]", r"config\.json: expected a JSON object, got list")])
def test_hf_config_not_a_json_object(tmp_path, tiny, text, match):
    d = _hf(tmp_path / "m", *tiny, config=text)
    with pytest.raises(ModelLoadError, match=match):
        load_model(d, progress=False)


def test_hf_corrupt_safetensors_and_bad_index(tmp_path, tiny):
    cfg, weights = tiny
    d = _hf(tmp_path / "trunc", cfg, weights)
    p = os.path.join(d, "model.safetensors")
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"trunc/model\.safetensors: not a readable safetensors file"):
        load_model(d, progress=False)  # was safetensors' SafetensorError
    from safetensors.torch import save_file
    keys = sorted(weights)
    for name, weight_map, match in [
        ("wrong", None, r"index\.json puts 'lm_head\.weight' in b\.safetensors, which does not hold it"),
        ("escape", {k: "../trunc/model.safetensors" for k in keys}, r"weight_map names '\.\./trunc/model\.safetensors'; shards must be files inside"),
        ("list", [1], r"needs a non-empty \"weight_map\" object"),
    ]:
        d = _hf(tmp_path / name, cfg, None)
        save_file({k: weights[k] for k in keys[:5]}, os.path.join(d, "a.safetensors"))
        save_file({k: weights[k] for k in keys[5:]}, os.path.join(d, "b.safetensors"))
        if weight_map is None:  # lm_head.weight (keys[0]) listed in the wrong shard
            weight_map = {k: "a.safetensors" for k in keys[:5]} | {k: "b.safetensors" for k in keys[5:]}
            weight_map[keys[0]] = "b.safetensors"
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": weight_map}, f)
        with pytest.raises(ModelLoadError, match=match):
            load_model(d, progress=False)


def test_hf_integer_tensor_refused(tmp_path, tiny):
    cfg, weights = tiny
    w = dict(weights)
    w["model.layers.0.mlp.up_proj.weight"] = (w["model.layers.0.mlp.up_proj.weight"] * 100).to(torch.int8)
    d = _hf(tmp_path / "int", cfg, w)
    with pytest.raises(ModelLoadError, match=r"tensor 'model\.layers\.0\.mlp\.up_proj\.weight' has dtype torch\.int8; "
                                             r"weights must be floating point"):
        load_model(d, progress=False)  # was loaded as garbage floats


def test_hf_bad_tokenizer_files(tmp_path, tiny):
    cfg, weights = tiny
    d = _hf(tmp_path / "tj", cfg, weights)
    open(os.path.join(d, "tokenizer.json"), "w").write("{bad")
    with pytest.raises(ModelLoadError, match=r"tj/tokenizer\.json: not a readable tokenizer\.json"):
        load_model(d, progress=False)
    for name, fname, content, match in [
        ("tc", "tokenizer_config.json", "[1]", r"tokenizer_config\.json: expected a JSON object, got list"),
        ("ct", "tokenizer_config.json", json.dumps({"chat_template": 5}), r"tokenizer_config\.json: chat_template must be a string"),
        ("gc", "generation_config.json", "{", r"generation_config\.json: not valid JSON"),
        ("ge", "generation_config.json", json.dumps({"eos_token_id": ["x"]}), r"generation_config\.json: eos_token_id must be a token id"),
    ]:
        d = _hf(tmp_path / name, cfg, weights)
        open(os.path.join(d, fname), "w").write(content)
        with pytest.raises(ModelLoadError, match=match):
            load_model(d, progress=False)
    d = _hf(tmp_path / "big", cfg, weights, tok_vocab=cfg.vocab_size + 8)
    with pytest.warns(UserWarning, match=r"token ids up to 519 .* embedding has 512 rows"):
        load_model(d, progress=False)


def test_hf_chat_template_syntax_error_names_chat_template(tmp_path, tiny):
    d = _hf(tmp_path / "m", *tiny)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}\n{{ m['content'] }"}, f)
    tok = load_model(d, progress=False).tokenizer  # plain completions still work
    with pytest.raises(ValueError, match=r"chat_template is not valid Jinja \(line 2: unexpected '}'\)"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_hf_unusual_but_valid(tmp_path, tiny):
    cfg, weights = tiny
    w64 = {k: v.double() for k, v in weights.items()}
    d = _hf(tmp_path / "f64", cfg, w64, hidden_size=64.0, pad_token_id=-1, max_position_embeddings=0,
            rope_scaling={"type": "linear", "factor": 2.0})
    m = load_model(d, progress=False)
    assert m.config.hidden_size == 64 and m.config.max_position_embeddings == 2048  # 0: the default
    assert m.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    for k, v in weights.items():
        assert torch.equal(m.weights[k], v), k
    # tied embeddings with an lm_head of its own in the file: that lm_head serves (transformers 5 does not tie
    # them then: "both are present in the checkpoints with different values, so we will NOT tie them")
    d = _hf(tmp_path / "tied", cfg, weights, tie_word_embeddings=True)
    m = load_model(d, progress=False)
    assert not m.config.tie_word_embeddings and torch.equal(m.weights["lm_head.weight"], weights["lm_head.weight"])


def test_unknown_random_preset_lists_presets():
    with pytest.raises(ModelLoadError, match=r"unknown random model 'random:nope'; presets: random:tiny, "):
        load_model("random:nope", progress=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weight_refused(tmp_path, tiny, bad):
    """Was: loaded, and every request's logits came out NaN (greedy picked token 0 forever). Now one error
    naming the weight and the count, from HF safetensors (bf16 too) and GGUF alike."""
    cfg, weights = tiny
    w = dict(weights)
    t = w["model.layers.1.self_attn.o_proj.weight"].clone()
    t[3, 5] = bad
    t[7, 1] = bad
    w["model.layers.1.self_attn.o_proj.weight"] = t
    pat = r"weight model\.layers\.1\.self_attn\.o_proj\.weight holds 2 NaN / inf value\(s\) of \d+"
    with pytest.raises(ModelLoadError, match=pat):
        load_model(_hf(tmp_path / "hf", cfg, w), progress=False)
    with pytest.raises(ModelLoadError, match=pat):
        load_model(_hf(tmp_path / "hf16", cfg, {k: v.bfloat16() for k, v in w.items()}), progress=False)
    p = tmp_path / "m.gguf"
    _gguf(p, cfg, w)
    with pytest.raises(ModelLoadError, match=pat):
        load_model(str(p), progress=False)


def test_packed_weight_with_non_finite_scale_refused():
    from decodekit.loader._common import check_finite
    from decodekit.quant import quantize_rtn
    q = quantize_rtn(torch.randn(8, 64))
    check_finite("w", q, "src")  # finite: passes
    q.scales[2, 1] = float("inf")
    with pytest.raises(ModelLoadError, match=r"src: weight w \(its scales\) holds 1 NaN / inf value\(s\) of 16"):
        check_finite("w", q, "src")
    check_finite("big", torch.full((4,), 3e38), "src")  # the fp32 sum overflows; every value is finite
