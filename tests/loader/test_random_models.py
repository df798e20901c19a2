"""random:NAME presets: shapes, determinism, value ranges, tokenizers."""
from __future__ import annotations

import pytest
import torch

from decodekit.loader import expected_weight_shapes, load_model
from decodekit.loader.random import PRESETS, num_params, preset_config, random_tensor
from decodekit.tokenizer import Tokenizer


def test_preset_shapes():
    c = preset_config("smollm2-135m")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (49152, 576, 1536, 30)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta) == (9, 3, 64, 100000.0)
    assert c.tie_word_embeddings and num_params(c) == 134515008  # == the real SmolLM2-135M
    c = preset_config("llama3-8b")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (128256, 4096, 14336, 32)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta) == (32, 8, 128, 500000.0)
    assert c.rope_scaling["rope_type"] == "llama3" and not c.tie_word_embeddings
    assert num_params(c) == 8030261248  # == Llama-3.1-8B
    c = preset_config("llama3-70b-layer")
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads) == (8192, 28672, 1, 64, 8)
    shapes = expected_weight_shapes(c)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 8192)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (8192, 28672)
    assert shapes["lm_head.weight"] == (128256, 8192)
    c = preset_config("tiny")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads) == \
        (512, 64, 128, 2, 4, 2)
    assert preset_config("tiny") is not preset_config("tiny")  # fresh records


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2", "tiny-qwen3"])
def test_tiny_deterministic(name):
    a = load_model(f"random:{name}", progress=False)
    b = load_model(f"random:{name}", progress=False)
    assert a.source == f"random:{name}"
    assert a.weights.keys() == b.weights.keys() == expected_weight_shapes(a.config).keys()
    for k, v in a.weights.items():
        assert v.shape == expected_weight_shapes(a.config)[k] and v.dtype == torch.float32
        assert torch.equal(v, b.weights[k]), k
    w = a.weights["model.layers.0.self_attn.q_proj.weight"]
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    n = a.weights["model.norm.weight"]
    assert (n - 1).abs().max() < 0.15
    assert not torch.equal(a.weights["model.layers.0.mlp.up_proj.weight"], a.weights["model.layers.0.mlp.gate_proj.weight"])
    assert a.config.attention_bias == (name == "tiny-qwen2") and a.config.qk_norm == (name == "tiny-qwen3")
    assert a.tokenizer.vocab_size == a.config.vocab_size == 512
    assert a.config.eos_token_ids == a.tokenizer.eos_token_ids == [2, 0]


def test_dtype_and_per_tensor_reproducibility():
    f32 = load_model("random:tiny", progress=False).weights
    bf16 = load_model("random:tiny", dtype=torch.bfloat16, progress=False).weights
    for k in f32:
        assert bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k], f32[k].to(torch.bfloat16))
    one = random_tensor("tiny", "model.layers.1.mlp.down_proj.weight", (64, 128), torch.float32, "cpu")
    assert torch.equal(one, f32["model.layers.1.mlp.down_proj.weight"])


def test_large_preset_tensor_deterministic():
    shape = expected_weight_shapes(preset_config("llama3-8b"))["model.layers.5.self_attn.q_proj.weight"]
    a = random_tensor("llama3-8b", "model.layers.5.self_attn.q_proj.weight", shape, torch.bfloat16, "cpu")
    b = random_tensor("llama3-8b", "model.layers.5.self_attn.q_proj.weight", shape, torch.bfloat16, "cpu")
    assert a.shape == (4096, 4096) and torch.equal(a, b)


def test_smollm2_preset(gguf_path):
    m = load_model("random:smollm2-135m", dtype=torch.bfloat16, progress=False)
    assert m.num_params() == 134515008
    assert m.tokenizer.vocab_size == 49152 and m.tokenizer.eos_token_id == 2  # the embedded tokenizer
    assert m.tokenizer.encode("Hello world") == [19556, 905]


def test_synthetic_tokenizer():
    a, b = Tokenizer.synthetic(512), Tokenizer.synthetic(128256)
    assert a.vocab_size == 512 and b.vocab_size == 128256
    assert a.backend.to_str() == Tokenizer.synthetic(512).backend.to_str()
    for text in ["Hello world, 123!", "Café 🙂 日本語", "def f(x):\n    return x"]:
        assert a.decode(a.encode(text)) == text
        assert b.decode(b.encode(text)) == text
        assert len(b.encode(text)) <= len(a.encode(text)) <= len(text.encode())
    assert a.encode("<|im_start|>user") == [1] + a.encode("user")
    assert b.decode([127000]).startswith("<|reserved_")  # filler ids decode to their own text
    assert set(PRESETS) >= {"tiny", "smollm2-135m", "llama3-8b", "llama3-70b-layer"}
