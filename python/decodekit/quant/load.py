"""Quantization of a loaded checkpoint's float weights at engine start (--quantization int4-rtn / fp8),
shared by the engine and the tensor-parallel workers."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("decodekit")

# projections LlamaModel stacks into one weight (fused QKV, gate-up): quantized alike or not at all
_FUSED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))


def _siblings(name: str) -> list[str]:
    """The weights stacked with `name` in one fused projection (itself included)."""
    for group in _FUSED:
        for part in group:
            tail = f".{part}.weight"
            if name.endswith(tail):
                return [f"{name[:-len(tail)]}.{p}.weight" for p in group]
    return [name]


def _packs_with(w, method: str) -> bool:
    """Whether an already-packed weight stacks with what `method` makes of its float siblings (LlamaModel keeps a
    fused projection packed only when every part is packed alike; any other mix is decoded to one dense weight)."""
    from decodekit.quant import Int4Weight
    from decodekit.quant.fp8 import Fp8Weight
    if method == "int4-rtn":
        return isinstance(w, Int4Weight) and w.group_size == 32 and w.perm is None
    return isinstance(w, Fp8Weight)


def quantize_projections(weights: dict, method: str, lm_head_int8: bool = False) -> None:
    """--quantization int4-rtn / fp8, in place: the float projection weights (q/k/v/o, gate/up/down)
    become packed INT4 (round to nearest, groups of 32) or fp8 e4m3 with per-output-channel scales
    (activations then quantized per token at run time); already-packed ones and those whose K is not
    a multiple of 32 stay. A float part of a fused projection (q/k/v, gate/up) whose other parts are
    packed in another form (a GGUF file with Q4_0 q/k and an F16 v, with fp8) stays float too: the
    fused weight is then one dense weight (it could not be one packed weight either way).
    lm_head_int8 (int4-rtn on the CPU): the LM head too, as INT8 in groups of 32 (llama.cpp's Q8_0;
    the tied embedding with it, its rows decoded on lookup) - with a large vocabulary (Qwen: 152k x
    hidden) a float head is most of a decode step's bytes."""
    from decodekit.quant import quantize_int8, quantize_rtn
    from decodekit.quant.fp8 import quantize_fp8_weight
    if method not in ("int4-rtn", "fp8"):
        raise ValueError(f"quantize_projections: method must be 'int4-rtn' or 'fp8', got {method!r}")
    quantize = (lambda w: quantize_rtn(w, 32)) if method == "int4-rtn" else quantize_fp8_weight
    done, packed, narrow, mixed = 0, 0, [], []
    for name, w in list(weights.items()):
        if not name.endswith("_proj.weight"):
            continue
        if not isinstance(w, torch.Tensor):
            packed += 1
            continue
        if w.dim() != 2 or w.shape[1] % 32:
            narrow.append(name)
            continue
        others = [weights.get(s) for s in _siblings(name) if s != name]
        if any(o is not None and not isinstance(o, torch.Tensor) and not _packs_with(o, method) for o in others):
            mixed.append(name)
            continue
        weights[name] = quantize(w)
        done += 1
    if narrow:
        log.warning("quantization %s: %d projection weight(s) kept float: K not a multiple of 32 (e.g. %s)",
                    method, len(narrow), narrow[0])
    if mixed:
        log.warning("quantization %s: %d projection weight(s) kept float: the other parts of their fused projection "
                    "are packed in another format (e.g. %s); those fused projections run dense", method, len(mixed),
                    mixed[0])
    if packed:
        log.info("quantization %s: %d projection weight(s) already packed by the checkpoint, kept as they are",
                 method, packed)
    if done == 0:
        log.warning("quantization %s: no projection weight was quantized", method)
    if lm_head_int8:
        head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
        w = weights.get(head)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[1] % 32 == 0:
            weights[head] = quantize_int8(w)
