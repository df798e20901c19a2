"""Quantization of a loaded checkpoint's float weights at engine start (--quantization int4-rtn / fp8),
shared by the engine and the tensor-parallel workers."""
from __future__ import annotations

import torch


def quantize_projections(weights: dict, method: str, lm_head_int8: bool = False) -> None:
    """--quantization int4-rtn / fp8, in place: the float projection weights (q/k/v/o, gate/up/down)
    become packed INT4 (round to nearest, groups of 32) or fp8 e4m3 with per-output-channel scales
    (activations then quantized per token at run time); already-packed ones and those whose K is not
    a multiple of 32 stay. lm_head_int8 (int4-rtn on the CPU): the LM head too, as INT8 in groups of 32
    (llama.cpp's Q8_0; the tied embedding with it, its rows decoded on lookup) - with a large vocabulary
    (Qwen: 152k x hidden) a float head is most of a decode step's bytes."""
    from decodekit.quant import quantize_int8, quantize_rtn
    from decodekit.quant.fp8 import quantize_fp8_weight
    quantize = (lambda w: quantize_rtn(w, 32)) if method == "int4-rtn" else quantize_fp8_weight
    for name, w in list(weights.items()):
        if name.endswith("_proj.weight") and isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[1] % 32 == 0:
            weights[name] = quantize(w)
    if lm_head_int8:
        head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
        w = weights.get(head)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[1] % 32 == 0:
            weights[head] = quantize_int8(w)
