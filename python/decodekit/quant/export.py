"""Saving a quantized model: `decodekit quantize` writes a Hugging Face directory whose projections
are decodekit's INT4 layout, so that GPTQ (or RTN) runs once instead of at every load.

Format (quantization_config {"quant_method": "decodekit-int4", "bits": 4, "group_size": G}):
  <proj>.qweight  uint8   [N, K/2]   group-split nibbles (include/decodekit/gemm/int4.h)
  <proj>.scales   float16 [N, K/G]
  <proj>.mins     float16 [N, K/G]   w = scale * q + min
  <proj>.perm     int64   [K]        act-order only: stored column j is input feature perm[j]
Everything else (embedding, norms incl. Qwen3's q_norm / k_norm, LM head, biases) as float tensors under
their usual names; config.json and the tokenizer files are the source directory's, plus quantization_config.
The loader (decodekit.loader.hf) reads it back exactly.
"""
from __future__ import annotations

import json
import os
import shutil

import torch

from .int4 import Int4Weight

QUANT_METHOD = "decodekit-int4"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")


def int4_tensors(name: str, w: Int4Weight) -> dict[str, torch.Tensor]:
    """The safetensors entries of one packed projection `name` (e.g. model.layers.0.mlp.down_proj)."""
    out = {f"{name}.qweight": w.qweight, f"{name}.scales": w.scales, f"{name}.mins": w.mins}
    if w.perm is not None:
        out[f"{name}.perm"] = w.perm
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def from_int4_tensors(parts: dict[str, torch.Tensor], group_size: int) -> Int4Weight:
    """Inverse of int4_tensors (parts keyed qweight / scales / mins / perm)."""
    return Int4Weight(parts["qweight"], parts["scales"], parts["mins"], group_size, parts.get("perm"))


_OWN_FILES = ("model.safetensors", "config.json") + _TOKENIZER_FILES


def check_out_dir(source_dir: str, out_dir: str) -> None:
    """ValueError, before anything is written, where out_dir is source_dir (the float checkpoint would be
    overwritten part-way: config.json and model.safetensors first, then the copy of its own tokenizer files
    fails) or already holds weight files other than a model.safetensors (a model.safetensors.index.json makes
    the loader read its shards and ignore the quantized model.safetensors; other shards mix with it)."""
    if not os.path.isdir(out_dir):
        return
    if os.path.samefile(out_dir, source_dir):
        raise ValueError(f"save_quantized: the output directory {out_dir!r} is the source model directory; "
                         f"choose another one (the float checkpoint would be overwritten)")
    stale = sorted(f for f in os.listdir(out_dir) if f not in _OWN_FILES and (
        f.endswith((".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt")) or f.endswith(".index.json")))
    if stale:
        raise ValueError(f"save_quantized: the output directory {out_dir!r} already holds other weight files "
                         f"({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}) that the loader would read "
                         f"instead of, or beside, the quantized model.safetensors; choose a new or empty directory")


def save_quantized(model, source_dir: str, out_dir: str) -> dict:
    """Writes `model` (a decodekit LlamaModel whose projections are Int4Weight) as a decodekit-int4
    Hugging Face directory at out_dir, with source_dir's config and tokenizer files (out_dir: new, or one
    holding no other weights: check_out_dir). Returns the quantization_config written."""
    from safetensors.torch import save_file
    check_out_dir(source_dir, out_dir)
    c = model.config
    groups = {w.group_size for L in model.layers for w in (L.qkv, L.o, L.gate_up, L.down) if isinstance(w, Int4Weight)}
    if not groups:
        raise ValueError("save_quantized: the model has no INT4 projections")
    if len(groups) > 1:
        raise ValueError(f"save_quantized: mixed group sizes {sorted(groups)}")
    G = groups.pop()
    t: dict[str, torch.Tensor] = {}

    def put(name: str, w) -> None:
        if isinstance(w, Int4Weight):
            t.update(int4_tensors(name, w))
        elif isinstance(w, torch.Tensor):
            t[name + ".weight"] = w.detach().cpu().contiguous()
        else:
            raise ValueError(f"save_quantized: {name} has an unsupported weight type {type(w).__name__}")

    def rows(w, a: int, b: int):
        return w.rows(a, b) if isinstance(w, Int4Weight) else w[a:b]

    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
    for i, L in enumerate(model.layers):
        p = f"model.layers.{i}."
        for name, (a, b) in (("q_proj", (0, q)), ("k_proj", (q, q + kv)), ("v_proj", (q + kv, q + 2 * kv))):
            put(p + "self_attn." + name, rows(L.qkv, a, b))
            if L.qkv_bias is not None:
                t[p + f"self_attn.{name}.bias"] = L.qkv_bias[a:b].detach().cpu().contiguous()
        put(p + "self_attn.o_proj", L.o)
        put(p + "mlp.gate_proj", rows(L.gate_up, 0, inter))
        put(p + "mlp.up_proj", rows(L.gate_up, inter, 2 * inter))
        put(p + "mlp.down_proj", L.down)
        t[p + "input_layernorm.weight"] = L.input_norm.detach().cpu().contiguous()
        t[p + "post_attention_layernorm.weight"] = L.post_norm.detach().cpu().contiguous()
        for name, norm in (("q_norm", L.q_norm), ("k_norm", L.k_norm)):  # Qwen3's per-head norms
            if norm is not None:
                t[p + f"self_attn.{name}.weight"] = norm.detach().cpu().contiguous()
    for what, w in (("embedding", model.embed), ("LM head", model.lm_head)):
        if not isinstance(w, torch.Tensor):   # e.g. INT8: int4-rtn on the CPU packs the head (and a tied embedding)
            raise ValueError(f"save_quantized: the {what} is a packed {type(w).__name__}; the decodekit-int4 format "
                             f"keeps the embedding and LM head in float (quantize with quantize_lm_head=False, "
                             f"as `decodekit quantize` does, or from an HF float checkpoint)")
    t["model.embed_tokens.weight"] = model.embed.detach().cpu().contiguous()
    t["model.norm.weight"] = model.norm.detach().cpu().contiguous()
    if not c.tie_word_embeddings and model.lm_head is not model.embed:
        t["lm_head.weight"] = model.lm_head.detach().cpu().contiguous()
    # slices of fused tensors are views: safetensors wants each its own storage
    t = {k: v.clone() for k, v in t.items()}

    os.makedirs(out_dir, exist_ok=True)
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(source_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    qc = {"quant_method": QUANT_METHOD, "bits": 4, "group_size": G}
    cfg["quantization_config"] = qc
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    for fn in _TOKENIZER_FILES:
        src = os.path.join(source_dir, fn)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, fn))
    return qc
