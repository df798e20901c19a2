"""Hugging Face model directories: config.json + *.safetensors (+ tokenizer files).

Weights are read with safetensors.safe_open one tensor at a time (sharded checkpoints through
model.safetensors.index.json). Pickled checkpoints (pytorch_model*.bin, *.pt, *.pth, *.ckpt)
are refused: unpickling runs arbitrary code.

4-bit GPTQ (auto-gptq / gptqmodel, incl. act-order) and AWQ (GEMM) checkpoints, announced by
config.json's `quantization_config` (or a quantize_config.json / AutoAWQ's quant_config.json), are read
layer by layer (`<proj>.qweight/.qzeros/.scales[/.g_idx]`) into decodekit.quant.Int4Weight: kept packed
with keep_quantized, else dequantized to the model dtype.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import Any

import torch

from ..config import MAX_POSITION_EMBEDDINGS, ModelConfig, hf_sliding_window
from ._common import (ModelLoadError, check_tokenizer_fits, check_weights, config_float, config_int, expected_weight_shapes,
                      fused_parts, progress, read_json_object, split_fused, to_target, token_ids)

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}
# defaults of the transformers config classes for keys a config.json may omit
_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0),
    "mistral": dict(max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, rope_theta=10000.0),
    "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0),
    "qwen3": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=128),
    "phi3": dict(max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0),
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickle(path: str) -> None:
    raise ModelLoadError(
        f"{path}: pickled PyTorch checkpoints (.bin/.pt/.pth/.ckpt) are refused because unpickling can "
        f"run arbitrary code. Convert the model to safetensors (e.g. with transformers: "
        f"model.save_pretrained(dir, safe_serialization=True)) or use a .gguf file.")


def _rope(cfg: dict[str, Any], defaults: dict, src: str = "config.json",
          arch: str = "llama") -> tuple[float, dict | None, float]:
    """(rope_theta, rope_scaling, partial_rotary_factor) from a transformers 4.x config (rope_theta +
    rope_scaling) or a 5.x one (rope_parameters: {"rope_theta", "rope_type", ...}). Phi-3 as Phi3Config reads
    it: rope type "su" / "yarn" mean LongRoPE, the top-level original_max_position_embeddings (default 4096)
    wins, partial_rotary_factor at the top level or in rope_parameters. Every architecture: a top-level
    original_max_position_embeddings wins for llama3 / yarn / longrope (transformers 5's standardize_rope_params)."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if params is not None and not isinstance(params, dict):
        raise ModelLoadError(f"{src}: rope_parameters must be an object, got {params!r}")
    if isinstance(params, dict):    # transformers 5 reads rope_parameters first: so does this
        if params.get("rope_theta") is not None:
            theta = params["rope_theta"]
        if params.get("rope_type", params.get("type")) is not None or scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if theta is None:
        theta = defaults["rope_theta"]
    if scaling is not None and not isinstance(scaling, dict):
        raise ModelLoadError(f"{src}: rope_scaling must be an object such as {{\"rope_type\": \"linear\", "
                             f"\"factor\": 2.0}} or null, got {scaling!r}")
    if scaling:
        scaling = dict(scaling)
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        scaling.pop("type", None)
        scaling.pop("rope_theta", None)
        partial = scaling.pop("partial_rotary_factor", None)
        if arch == "phi3" and scaling.get("rope_type") in ("su", "yarn", "longrope"):
            scaling["rope_type"] = "longrope"       # (Phi3Config: the top-level value, default 4096, wins)
            orig = cfg.get("original_max_position_embeddings", 4096)
            scaling["original_max_position_embeddings"] = config_int(
                orig, f"{src}: original_max_position_embeddings", maximum=MAX_POSITION_EMBEDDINGS)
        if scaling.get("rope_type", "default") == "default":
            scaling = None
        elif scaling["rope_type"] in ("llama3", "yarn", "longrope") \
                and cfg.get("original_max_position_embeddings") is not None:
            # transformers 5 (PreTrainedConfig.standardize_rope_params): a top-level value wins over the rope dict's
            # own for these three types, on every architecture (was: only filled in when the dict lacked one, and
            # not for llama3, so a config holding two values got the dict's: other frequencies than transformers')
            scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    else:
        partial = None
    if partial is None:     # (transformers: rope_parameters' own value first, then the top-level one)
        partial = cfg.get("partial_rotary_factor")
    if partial is None:
        partial = 1.0
    if arch != "phi3" and partial != 1.0:
        raise ModelLoadError(f"{src}: partial_rotary_factor {partial!r} is not supported for {arch} (transformers "
                             f"rotates the whole head there)")
    partial = config_float(partial, f"{src}: partial_rotary_factor")
    return config_float(theta, f"{src}: rope_theta"), scaling or None, partial


def config_from_hf(cfg: dict[str, Any], name: str = "", source: str = "config.json") -> ModelConfig:
    """ModelConfig from a config.json dict (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
    Qwen3ForCausalLM, Phi3ForCausalLM).
    source: the file, named in the errors (each names the key and the values allowed)."""
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list):
        raise ModelLoadError(f"{source}: architectures must be a list of class names, got {archs!r}")
    arch = next((SUPPORTED[a] for a in archs if isinstance(a, str) and a in SUPPORTED), None)
    if arch is None and not archs:
        model_type = cfg.get("model_type")
        arch = _MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        raise ModelLoadError(f"{source}: unsupported architecture {archs or cfg.get('model_type')!r} "
                             f"(supported: {', '.join(SUPPORTED)})")
    d = _DEFAULTS[arch]

    def integer(key: str, default: int | None = None, maximum: int | None = None) -> int:
        v = cfg.get(key)
        if default is not None and (v is None or v == 0):  # absent / null / 0: the default (as transformers)
            v = default
        elif key not in cfg:
            raise ModelLoadError(f"{source}: lacks {key!r}")
        return config_int(v, f"{source}: {key}", maximum=maximum)

    hidden = integer("hidden_size")
    heads = integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ModelLoadError(f"{source}: num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
    if not cfg.get("head_dim") and "head_dim" not in d and hidden % heads:
        raise ModelLoadError(f"{source}: hidden_size ({hidden}) must be a multiple of num_attention_heads "
                             f"({heads}) when there is no head_dim")
    kw = dict(vocab_size=integer("vocab_size"), hidden_size=hidden,
              intermediate_size=integer("intermediate_size"), num_layers=integer("num_hidden_layers"),
              num_heads=heads, num_kv_heads=kv_heads,
              head_dim=integer("head_dim", d.get("head_dim", max(hidden // heads, 1))),
              max_position_embeddings=integer("max_position_embeddings", d["max_position_embeddings"],
                                              maximum=MAX_POSITION_EMBEDDINGS))
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"{source}: unsupported hidden_act {cfg.get('hidden_act')!r} (only silu)")
    if cfg.get("mlp_bias"):
        raise ModelLoadError(f"{source}: mlp_bias=True is not supported")
    if arch != "qwen2" and cfg.get("attention_bias"):
        raise ModelLoadError(f"{source}: attention_bias=True is not supported for {arch} (transformers puts a bias "
                             f"on q, k, v and o_proj; decodekit has the q / k / v biases of Qwen2 only)")
    theta, scaling, partial = _rope(cfg, d, source, arch)
    window, window_layers = hf_sliding_window(cfg, arch, kw["num_layers"], source, config_int, ModelLoadError)
    eps = config_float(cfg.get("rms_norm_eps", d["rms_norm_eps"]), f"{source}: rms_norm_eps", positive=False)
    eos = token_ids(cfg.get("eos_token_id"), f"{source}: eos_token_id")
    bos = cfg.get("bos_token_id")
    try:
        return ModelConfig(
            **kw, rms_norm_eps=eps, rope_theta=theta, rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
            architecture=arch, bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
            eos_token_ids=eos, name=name or str(cfg.get("_name_or_path", "")), sliding_window=window,
            sliding_window_layers=window_layers, partial_rotary_factor=partial)
    except ValueError as e:  # rope_scaling fields (ModelConfig checks them)
        raise ModelLoadError(f"{source}: {e}") from e


def _shard_path(path: str, index: str, name: Any) -> str:
    """A shard named by model.safetensors.index.json: a file inside the model directory."""
    full = os.path.realpath(os.path.join(path, name)) if isinstance(name, str) and name else ""
    if not full.startswith(os.path.join(os.path.realpath(path), "")):
        raise ModelLoadError(f"{index}: weight_map names {name!r}; shards must be files inside {path}")
    return full


@contextlib.contextmanager
def open_safetensors(fn: str):
    """safetensors.safe_open, with a truncated or corrupt file a ModelLoadError naming it."""
    from safetensors import safe_open
    try:
        f = safe_open(fn, framework="pt")
    except Exception as e:  # SafetensorError: header too large / incomplete / invalid JSON ...
        raise ModelLoadError(f"{fn}: not a readable safetensors file ({e})") from e
    with f:
        yield f


def safetensors_files(path: str) -> dict[str, str]:
    """{tensor name: file} for a directory's safetensors checkpoint (single or sharded)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: needs a non-empty \"weight_map\" object "
                                 f"{{tensor name: shard file}}, got {weight_map!r:.80}")
        shards = {k: _shard_path(path, index, f) for k, f in weight_map.items()}
        missing = sorted({weight_map[k] for k, f in shards.items() if not os.path.isfile(f)})
        if missing:
            raise ModelLoadError(f"{path}: shards named in model.safetensors.index.json are missing: {missing}")
        return shards
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        pickled = [f for f in os.listdir(path) if f.endswith(PICKLE_SUFFIXES)]
        if pickled:
            refuse_pickle(os.path.join(path, pickled[0]))
        raise ModelLoadError(f"{path}: no *.safetensors weights found")
    out: dict[str, str] = {}
    for fn in files:
        with open_safetensors(fn) as f:
            for k in f.keys():
                if k in out:
                    raise ModelLoadError(f"{path}: tensor {k!r} is in both {os.path.basename(out[k])} and "
                                         f"{os.path.basename(fn)}, and no model.safetensors.index.json says which "
                                         f"to read (remove the stray file)")
                out[k] = fn
    return out


def _own_lm_head(files: dict[str, str]) -> bool:
    """Whether the checkpoint holds an lm_head.weight that is not a copy of its embedding."""
    head, emb = "lm_head.weight", "model.embed_tokens.weight"
    if head not in files or emb not in files:
        return False
    with open_safetensors(files[head]) as f:
        h = f.get_tensor(head)
    with open_safetensors(files[emb]) as f:
        e = f.get_tensor(emb)
    return h.shape != e.shape or not torch.equal(h, e)


def _check_float(t: torch.Tensor, name: str, fn: str) -> None:
    if not t.dtype.is_floating_point:
        raise ModelLoadError(f"{fn}: tensor {name!r} has dtype {t.dtype}; weights must be floating point "
                             f"(float32, float16, bfloat16 or float64; 4-bit GPTQ/AWQ checkpoints say so in "
                             f"config.json's quantization_config)")


def _skip(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


_QUANT_PARTS = ("qweight", "qzeros", "scales", "g_idx", "mins", "perm")


def quant_config(raw: dict[str, Any], path: str) -> dict[str, Any] | None:
    """{"method": "gptq" | "awq", "group_size", "checkpoint_format"} from config.json's
    quantization_config (or auto-gptq's quantize_config.json, or AutoAWQ's older quant_config.json, as vLLM
    reads them); None for an unquantized checkpoint."""
    q = raw.get("quantization_config")
    where = f"{path}: quantization_config"
    default_method = "gptq"
    for fn, method_of_file in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        qpath = os.path.join(path, fn)
        if q is None and os.path.isfile(qpath):
            # (neither file need name its quant_method: auto-gptq's is GPTQ, AutoAWQ's {w_bit, q_group_size,
            # zero_point, version} AWQ)
            q, where, default_method = read_json_object(qpath), qpath, method_of_file
    if not q:
        return None
    if not isinstance(q, dict):
        raise ModelLoadError(f"{where} must be an object with quant_method, bits, group_size, got {q!r}")
    if q.get("quant_method") is None and (q.get("load_in_4bit") or q.get("load_in_8bit")):
        # transformers' reading of a quantization_config without quant_method (AutoQuantizationConfig.from_dict)
        raise ModelLoadError(f"{where}: a bitsandbytes checkpoint (load_in_4bit / load_in_8bit) is not supported "
                             f"(supported: 'gptq', 'awq' and 'decodekit-int4', 4-bit)")
    if q.get("is_marlin_format"):
        raise ModelLoadError(f"{where}: is_marlin_format = true (auto-gptq's Marlin-repacked layout) is not "
                             f"supported; use the checkpoint in the GPTQ format (checkpoint_format 'gptq')")
    method = str(q.get("quant_method", default_method)).lower()
    if method not in ("gptq", "awq", "decodekit-int4"):
        raise ModelLoadError(f"{path}: quantization_config.quant_method {method!r} is not supported "
                             f"(supported: 'gptq', 'awq' and 'decodekit-int4', 4-bit)")
    bits = config_int(q.get("bits", q.get("w_bit", 4)), f"{where}.bits")
    if bits != 4:
        raise ModelLoadError(f"{path}: quantization_config.bits = {bits}; only 4-bit {method.upper()} is supported")
    group = config_int(q.get("group_size", q.get("q_group_size", 128)), f"{where}.group_size", minimum=-1)
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
    from ..tokenizer import Tokenizer

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelLoadError(f"{path}: not a Hugging Face model directory (no config.json)")
    raw = read_json_object(cfg_path)
    cfg = config_from_hf(raw, name=os.path.basename(os.path.abspath(path)), source=cfg_path)
    qc = quant_config(raw, path)
    files = safetensors_files(path)
    tokenizer = Tokenizer.from_pretrained_dir(path)
    check_tokenizer_fits(tokenizer, cfg, path)
    if tokenizer.eos_token_ids:
        cfg.eos_token_ids = list(dict.fromkeys(list(tokenizer.eos_token_ids) + cfg.eos_token_ids))
    if cfg.bos_token_id is None:
        cfg.bos_token_id = tokenizer.bos_token_id

    if cfg.tie_word_embeddings and _own_lm_head(files):
        # transformers (5.x) keeps a checkpoint's lm_head that differs from its embedding, tie or not (quantized
        # checkpoints too: their float lm_head, e.g. `decodekit quantize`'s copy of such a model's head)
        cfg.tie_word_embeddings = False
        logging.getLogger("decodekit").warning(
            "%s: tie_word_embeddings is true but lm_head.weight differs from the embedding: using lm_head.weight "
            "(as transformers does)", path)
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
        known = prefix + ".weight" in expected or fused_parts(cfg, prefix + ".weight") is not None
        return (prefix, part) if part in _QUANT_PARTS and known else None

    split_from: dict[str, str] = {}     # part name -> the fused tensor it came from (Phi-3)

    def unfused(name: str, w, source: str) -> dict:  # {name: w}, a Phi-3 fused weight split into its parts
        if fused_parts(cfg, name) is None:
            if name in split_from:
                twice(name, split_from[name], source)
            return {name: w}
        parts = split_fused(cfg, name, w, source)
        for part in parts:
            twice(part, name, source)
            split_from[part] = name
        return parts

    def twice(part: str, fused: str, source: str) -> None:
        """A checkpoint holding a weight both fused and on its own: which one is meant is not ours to guess."""
        if part in weights or part.removesuffix(".weight") in pending or part in split_from:
            raise ModelLoadError(f"{source}: {part!r} is in the checkpoint both on its own and inside {fused!r}; "
                                 f"keep one of them")

    def items():
        for fn, keys in by_file.items():
            with open_safetensors(fn) as f:
                held = set(f.keys())
                for k in keys:
                    if k not in held:
                        raise ModelLoadError(f"{path}: model.safetensors.index.json puts {k!r} in "
                                             f"{os.path.basename(fn)}, which does not hold it")
                    yield k, f, fn

    for k, f, fn in progress(items(), len(names), f"loading {os.path.basename(os.path.abspath(path))}",
                             progress_bar):
        qp = quant_part(k)
        if qp is not None and qp[1] == "qweight" and qp[0] + ".weight" in files:
            # transformers' quantized module has no float weight (it would drop it): which one is meant is not ours
            # to guess
            raise ModelLoadError(f"{fn}: layer {qp[0]!r} is in the checkpoint both quantized ({qp[0]}.qweight) and "
                                 f"as a float {qp[0]}.weight; keep one of them")
        if qp is not None:
            prefix, part = qp
            got = pending.setdefault(prefix, {})
            got[part] = f.get_tensor(k)
            need = _required_parts(qc) | {x for x in ("g_idx", "perm") if f"{prefix}.{x}" in files}
            if need <= set(got):
                fused = _convert_quant(qc, pending.pop(prefix), f"{fn}: {prefix}")
                for name, w in unfused(prefix + ".weight", fused, fn).items():
                    if plan is not None:
                        w = shard_weight(name, w, plan)
                    if keep_quantized:
                        weights[name] = w.to(device)
                    else:
                        from .. import ops
                        weights[name] = ops.int4_dequantize(w, torch.float32).to(device=device, dtype=dtype)
            continue
        if fused_parts(cfg, k) is not None:   # Phi-3 qkv_proj / gate_up_proj: read whole, split, then sliced
            t = f.get_tensor(k)
            _check_float(t, k, fn)
            for name, w in unfused(k, t, fn).items():
                weights[name] = to_target(shard_weight(name, w, plan) if plan is not None else w, dtype, device)
            del t
            continue
        if k in split_from:
            twice(k, split_from[k], fn)
        if k not in expected:
            if qc is not None and k.endswith(".bias") and k[:-5] + ".qweight" in files:
                if not bool((f.get_tensor(k) == 0).all()):  # quantized layers may carry zero biases
                    raise ModelLoadError(f"{fn}: non-zero bias {k!r} on a layer without bias in {cfg.architecture}")
                continue
            raise ModelLoadError(f"{fn}: unexpected tensor {k!r}; the checkpoint does not look like a "
                                 f"{cfg.architecture} model decodekit supports")
        t = read(f, k)
        _check_float(t, k, fn)
        weights[k] = to_target(t, dtype, device)
    if pending:
        name, parts = next(iter(pending.items()))
        raise ModelLoadError(f"{path}: quantized layer {name!r} lacks {sorted(_required_parts(qc) - set(parts))}")
    check_weights(cfg, weights, path, plan)
    return cfg, weights, tokenizer
