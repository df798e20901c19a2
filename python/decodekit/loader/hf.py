"""Hugging Face model directories: config.json + *.safetensors (+ tokenizer files).

Weights are read with safetensors.safe_open one tensor at a time (sharded checkpoints through
model.safetensors.index.json). Pickled checkpoints (pytorch_model*.bin, *.pt, *.pth, *.ckpt)
are refused: unpickling runs arbitrary code.

4-bit GPTQ (auto-gptq / gptqmodel, incl. act-order) and AWQ (GEMM) checkpoints, announced by
config.json's `quantization_config` (or a quantize_config.json), are read layer by layer
(`<proj>.qweight/.qzeros/.scales[/.g_idx]`) into decodekit.quant.Int4Weight: kept packed with
keep_quantized, else dequantized to the model dtype.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch

from ..config import ModelConfig
from ._common import ModelLoadError, check_weights, expected_weight_shapes, progress, to_target

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}
# defaults of the transformers config classes for keys a config.json may omit
_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0),
    "mistral": dict(max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, rope_theta=10000.0),
    "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0),
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickle(path: str) -> None:
    raise ModelLoadError(
        f"{path}: pickled PyTorch checkpoints (.bin/.pt/.pth/.ckpt) are refused because unpickling can "
        f"run arbitrary code. Convert the model to safetensors (e.g. with transformers: "
        f"model.save_pretrained(dir, safe_serialization=True)) or use a .gguf file.")


def _rope(cfg: dict[str, Any], defaults: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from a transformers 4.x config (rope_theta + rope_scaling) or a
    5.x one (rope_parameters: {"rope_theta", "rope_type", ...})."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        if theta is None:
            theta = params.get("rope_theta")
        if scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if theta is None:
        theta = defaults["rope_theta"]
    if scaling:
        scaling = dict(scaling)
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        scaling.pop("type", None)
        scaling.pop("rope_theta", None)
        if scaling.get("rope_type", "default") == "default":
            scaling = None
    return float(theta), scaling or None


def config_from_hf(cfg: dict[str, Any], name: str = "") -> ModelConfig:
    """ModelConfig from a config.json dict (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."""
    archs = cfg.get("architectures") or []
    arch = next((SUPPORTED[a] for a in archs if a in SUPPORTED), None)
    if arch is None and not archs:
        arch = _MODEL_TYPES.get(cfg.get("model_type", ""))
    if arch is None:
        raise ModelLoadError(f"unsupported architecture {archs or cfg.get('model_type')!r} "
                             f"(supported: {', '.join(SUPPORTED)})")
    d = _DEFAULTS[arch]
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kw = dict(vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
                  intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
                  num_heads=heads)
    except KeyError as e:
        raise ModelLoadError(f"config.json lacks {e.args[0]!r}") from e
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"unsupported hidden_act {cfg.get('hidden_act')!r} (only silu)")
    if cfg.get("mlp_bias"):
        raise ModelLoadError("mlp_bias=True is not supported")
    theta, scaling = _rope(cfg, d)
    eos = cfg.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return ModelConfig(
        **kw, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", d["rms_norm_eps"])),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or d["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=True if arch == "qwen2" else bool(cfg.get("attention_bias", False)),
        architecture=arch, bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos,
        name=name or str(cfg.get("_name_or_path", "")))


def safetensors_files(path: str) -> dict[str, str]:
    """{tensor name: file} for a directory's safetensors checkpoint (single or sharded)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        missing = sorted({f for f in weight_map.values() if not os.path.isfile(os.path.join(path, f))})
        if missing:
            raise ModelLoadError(f"{path}: shards named in model.safetensors.index.json are missing: {missing}")
        return {k: os.path.join(path, f) for k, f in weight_map.items()}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        pickled = [f for f in os.listdir(path) if f.endswith(PICKLE_SUFFIXES)]
        if pickled:
            refuse_pickle(os.path.join(path, pickled[0]))
        raise ModelLoadError(f"{path}: no *.safetensors weights found")
    from safetensors import safe_open
    out: dict[str, str] = {}
    for fn in files:
        with safe_open(fn, framework="pt") as f:
            for k in f.keys():
                out[k] = fn
    return out


def _skip(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


_QUANT_PARTS = ("qweight", "qzeros", "scales", "g_idx", "mins", "perm")


def quant_config(raw: dict[str, Any], path: str) -> dict[str, Any] | None:
    """{"method": "gptq" | "awq", "group_size", "checkpoint_format"} from config.json's
    quantization_config (or quantize_config.json); None for an unquantized checkpoint."""
    q = raw.get("quantization_config")
    qpath = os.path.join(path, "quantize_config.json")
    if q is None and os.path.isfile(qpath):
        with open(qpath, encoding="utf-8") as f:
            q = json.load(f)
    if not q:
        return None
    method = str(q.get("quant_method", "gptq")).lower()
    if method not in ("gptq", "awq", "decodekit-int4"):
        raise ModelLoadError(f"{path}: quantization_config.quant_method {method!r} is not supported "
                             f"(supported: 'gptq', 'awq' and 'decodekit-int4', 4-bit)")
    bits = int(q.get("bits", q.get("w_bit", 4)))
    if bits != 4:
        raise ModelLoadError(f"{path}: quantization_config.bits = {bits}; only 4-bit {method.upper()} is supported")
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    if group != -1 and (group <= 0 or group % 32):
        raise ModelLoadError(f"{path}: quantization_config.group_size = {group}; supported: -1 or a multiple of 32")
    if method == "decodekit-int4" and group not in (32, 64, 128):
        raise ModelLoadError(f"{path}: quantization_config.group_size = {group}; decodekit-int4 has 32, 64 or 128")
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if method == "gptq" and fmt not in ("gptq", "gptq_v2"):
        raise ModelLoadError(f"{path}: quantization_config.checkpoint_format {fmt!r} is not supported "
                             f"(supported: 'gptq', 'gptq_v2')")
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise ModelLoadError(f"{path}: AWQ version {version!r} is not supported (supported: 'gemm')")
        if q.get("zero_point", True) is False:
            raise ModelLoadError(f"{path}: AWQ without zero points (zero_point = false) is not supported")
    return {"method": method, "group_size": group, "checkpoint_format": fmt}


def _required_parts(qc: dict[str, Any]) -> set[str]:
    """The tensors every quantized layer of this format has (g_idx / perm are optional)."""
    return {"qweight", "scales", "mins"} if qc["method"] == "decodekit-int4" else {"qweight", "qzeros", "scales"}


def _convert_quant(qc: dict[str, Any], parts: dict[str, torch.Tensor], name: str):
    from ..quant import from_awq, from_gptq
    from ..quant.export import from_int4_tensors
    try:
        if qc["method"] == "decodekit-int4":
            return from_int4_tensors(parts, qc["group_size"])
        if qc["method"] == "awq":
            return from_awq(parts["qweight"], parts["qzeros"], parts["scales"], qc["group_size"])
        return from_gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"), qc["group_size"],
                         qc["checkpoint_format"])
    except ValueError as e:
        raise ModelLoadError(f"{name}: {e}") from e


def load_hf_dir(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                progress_bar: bool = True, keep_quantized: bool = False, shard=None):
    """(config, weights, tokenizer) of a Hugging Face model directory (GPTQ / AWQ projections:
    packed Int4Weight with keep_quantized, else dequantized to dtype). shard: see load_model (float
    tensors are read as this rank's slice; quantized layers are converted whole, then cut)."""
    from safetensors import safe_open

    from ..tokenizer import Tokenizer

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelLoadError(f"{path}: not a Hugging Face model directory (no config.json)")
    with open(cfg_path, encoding="utf-8") as f:
        raw = json.load(f)
    cfg = config_from_hf(raw, name=os.path.basename(os.path.abspath(path)))
    qc = quant_config(raw, path)
    files = safetensors_files(path)
    tokenizer = Tokenizer.from_pretrained_dir(path)
    if tokenizer.eos_token_ids:
        cfg.eos_token_ids = list(dict.fromkeys(list(tokenizer.eos_token_ids) + cfg.eos_token_ids))
    if cfg.bos_token_id is None:
        cfg.bos_token_id = tokenizer.bos_token_id

    expected = expected_weight_shapes(cfg)
    names = [n for n in files if not _skip(n)]
    if cfg.tie_word_embeddings:
        names = [n for n in names if n != "lm_head.weight"]  # tied: the embedding serves
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(files[n], []).append(n)
    weights: dict[str, torch.Tensor] = {}
    pending: dict[str, dict[str, torch.Tensor]] = {}  # quantized layer -> its parts read so far
    plan = shard(cfg) if shard is not None else None
    if plan is not None:
        from ..distributed.sharding import shard_weight

    def read(f, k):
        sel = plan.selection(k) if plan is not None else None
        if sel is None:
            return f.get_tensor(k)
        dim, a, b = sel
        sl = f.get_slice(k)
        return sl[a:b] if dim == 0 else sl[:, a:b]

    def quant_part(name: str) -> tuple[str, str] | None:
        if qc is None:
            return None
        prefix, _, part = name.rpartition(".")
        return (prefix, part) if part in _QUANT_PARTS and prefix + ".weight" in expected else None

    def items():
        for fn, keys in by_file.items():
            with safe_open(fn, framework="pt") as f:
                for k in keys:
                    yield k, f, fn

    for k, f, fn in progress(items(), len(names), f"loading {os.path.basename(os.path.abspath(path))}",
                             progress_bar):
        qp = quant_part(k)
        if qp is not None:
            prefix, part = qp
            got = pending.setdefault(prefix, {})
            got[part] = f.get_tensor(k)
            need = _required_parts(qc) | {x for x in ("g_idx", "perm") if f"{prefix}.{x}" in files}
            if need <= set(got):
                w = _convert_quant(qc, pending.pop(prefix), f"{fn}: {prefix}")
                if plan is not None:
                    w = shard_weight(prefix + ".weight", w, plan)
                if keep_quantized:
                    weights[prefix + ".weight"] = w.to(device)
                else:
                    from .. import ops
                    weights[prefix + ".weight"] = ops.int4_dequantize(w, torch.float32).to(device=device, dtype=dtype)
            continue
        if k not in expected:
            if qc is not None and k.endswith(".bias") and k[:-5] + ".qweight" in files:
                if not bool((f.get_tensor(k) == 0).all()):  # quantized layers may carry zero biases
                    raise ModelLoadError(f"{fn}: non-zero bias {k!r} on a layer without bias in {cfg.architecture}")
                continue
            raise ModelLoadError(f"{fn}: unexpected tensor {k!r}; the checkpoint does not look like a "
                                 f"{cfg.architecture} model decodekit supports")
        weights[k] = to_target(read(f, k), dtype, device)
    if pending:
        name, parts = next(iter(pending.items()))
        raise ModelLoadError(f"{path}: quantized layer {name!r} lacks {sorted(_required_parts(qc) - set(parts))}")
    check_weights(cfg, weights, path, plan)
    return cfg, weights, tokenizer
