"""Fixtures for the loader tests: the embedded model loaded (gguf_path and hf_tok are tests/conftest.py's),
and a writer of small GGUF files laid out the way llama.cpp's convert_hf_to_gguf.py writes them (q/k rows
permuted for llama)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch


@pytest.fixture(scope="session")
def smollm(gguf_path):
    from decodekit.loader import load_model
    return load_model(gguf_path, progress=False)


_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",     # phi3
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}


def _phi3_fused(cfg, weights: dict) -> dict:
    """Phi-3's layout: q, k, v rows in one qkv_proj; gate then up rows in one gate_up_proj."""
    out = {}
    for name, t in weights.items():
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue
        if name.endswith("self_attn.q_proj.weight"):
            p = name[:-len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = torch.cat([t, weights[p + "k_proj.weight"], weights[p + "v_proj.weight"]])
        elif name.endswith("mlp.gate_proj.weight"):
            p = name[:-len("gate_proj.weight")]
            out[p + "gate_up_proj.weight"] = torch.cat([t, weights[p + "up_proj.weight"]])
        else:
            out[name] = t
    return out


def gguf_name(hf: str) -> str:
    if hf in _TO_GGUF or hf.startswith("rope_factors"):
        return _TO_GGUF.get(hf, hf)
    parts = hf.split(".")
    return f"blk.{parts[2]}." + _TO_GGUF[".".join(parts[3:])]


def synthetic_tokenizer_meta(vocab_size: int) -> dict:
    """GGUF tokenizer metadata (gpt2 byte-level BPE) of decodekit's synthetic tokenizer."""
    from decodekit.tokenizer.builders import SYNTHETIC_SPECIALS, synthetic_backend
    backend = synthetic_backend(vocab_size)
    model = json.loads(backend.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in SYNTHETIC_SPECIALS else 1 for t in tokens]
    return dict(tokens=tokens, merges=merges, types=types, bos=1, eos=2, pre="gpt2")


def write_gguf(path: str, cfg, weights: dict[str, torch.Tensor], qtype=None, arch: str = "llama",
               tokenizer: dict | None = None, rope_freqs: np.ndarray | None = None, extra: dict | None = None) -> str:
    """Writes an HF-named weight dict as a GGUF file. qtype: a GGMLQuantizationType (or a
    function name -> type) for 2-D weights; 1-D tensors stay F32 as llama.cpp keeps them."""
    import gguf

    from decodekit.loader.gguf import permute

    qt = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name("decodekit-test")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.rotary_dim)
    if cfg.head_dim * cfg.num_heads != cfg.hidden_size:     # as llama.cpp's converter writes them then
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    tok = tokenizer or synthetic_tokenizer_meta(cfg.vocab_size)
    w.add_tokenizer_model(tok.get("model", "gpt2"))
    if tok.get("pre"):
        w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    if tok.get("merges"):
        w.add_token_merges(tok["merges"])
    if tok.get("scores"):
        w.add_token_scores(tok["scores"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    if "unk" in tok:
        w.add_unk_token_id(tok["unk"])
    w.add_add_bos_token(bool(tok.get("add_bos", False)))
    if "add_space_prefix" in tok:
        w.add_add_space_prefix(tok["add_space_prefix"])
    if tok.get("chat_template"):
        w.add_chat_template(tok["chat_template"])
    for k, v in (extra or {}).items():
        if isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_uint32(k, v)
    if arch == "phi3":
        weights = _phi3_fused(cfg, weights)
        w.add_sliding_window(cfg.sliding_window or 0)    # (0: none, as llama.cpp's converter writes it)
        s = cfg.rope_scaling
        if s and s.get("rope_type") == "longrope":     # as convert_hf_to_gguf.py's Phi3MiniModel
            w.add_rope_scaling_orig_ctx_len(s["original_max_position_embeddings"])
            from decodekit.ops.reference import rope_attention_factor
            w.add_rope_scaling_attn_factors(rope_attention_factor(s))
            weights["rope_factors_long.weight"] = torch.tensor(s["long_factor"])
            weights["rope_factors_short.weight"] = torch.tensor(s["short_factor"])
    for name, t in weights.items():
        a = t.detach().float().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = permute(a, cfg.num_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = permute(a, cfg.num_kv_heads)
        q = qtype(name) if callable(qtype) else qtype
        if a.ndim == 1 or q in (None, qt.F32):
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
        elif q == qt.F16:
            w.add_tensor(gguf_name(name), a.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(a, q), raw_dtype=q)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def make_gguf(tmp_path):
    def make(name: str = "model.gguf", **kw) -> str:
        os.makedirs(tmp_path / name.replace(".gguf", ""), exist_ok=True)
        return write_gguf(str(tmp_path / name.replace(".gguf", "") / name), **kw)
    return make


@pytest.fixture(scope="session")
def gguf_helpers():
    """gguf_name and synthetic_tokenizer_meta for test modules (a conftest is not importable by name here:
    tests/conftest.py has the same module name)."""
    import types
    return types.SimpleNamespace(gguf_name=gguf_name, synthetic_tokenizer_meta=synthetic_tokenizer_meta)
