"""Composite ops: one Llama-family decoder layer per call (`decoder_layer`, csrc/decoder_layer.cpp) and a stack of
them (`decoder_layers`), the CPU model's path (models/llama.py); their operands (`projection_operands`) and
workspace size. Semantics: reference.decoder_layer / reference.decoder_layers (ops/reference_layers.py)."""
from __future__ import annotations

import torch

from decodekit.quant import Int4Weight, Int8Weight

from . import _CUDA_QUANT_GEMV_MAX_M, _check_window, _cuda_quant_rows_ok, _ops, reference
from ._dispatch import _has_kernel
from .marlin import marlin_copy_only


def _check_cuda_rows(op: str, hidden: torch.Tensor, operand_counts) -> None:
    """On CUDA a layer's projections must be ones the quantized GEMM kernels take at hidden's rows (up to 8; beyond,
    INT4 with fp16 / bf16 activations): 1 operand = dense, 3 = INT4, 2 = INT8 (no CPU copies on CUDA)."""
    if hidden.device.type == "cuda" and not all(
            c == 1 or _cuda_quant_rows_ok(hidden.shape[0], hidden.dtype, c == 3) for c in operand_counts):
        raise ValueError(f"{op} on CUDA: {hidden.shape[0]} tokens (> {_CUDA_QUANT_GEMV_MAX_M}) need INT4 "
                         f"weights and fp16 / bf16 activations (got {hidden.dtype}); run the layer(s) op by op")


def projection_operands(weight) -> tuple[list[torch.Tensor], int] | None:
    """decoder_layer's form of a projection weight: ([qweight, scales, mins (, packed)], G) for INT4 (not
    act-order), ([qweight, scales (, packed)], G) for INT8 (packed: the CPU's AMX copy), ([weight], 0) for a
    dense tensor; None for any other (fp8, act-order INT4, INT4 held as its CUDA Marlin copy alone)."""
    if isinstance(weight, Int8Weight) or (isinstance(weight, Int4Weight) and weight.perm is None
                                          and marlin_copy_only(weight) is None):
        packed = weight.__dict__.get("_amx_rows")  # prepare_amx_rows
        return [*weight.operands()] + ([packed] if packed is not None else []), weight.group_size
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return [weight], 0
    return None


def decoder_layer_workspace_numel(num_tokens: int, q_size: int, kv_size: int, intermediate: int) -> int:
    return num_tokens * (2 * q_size + 2 * kv_size + 3 * intermediate)


def decoder_layer(out: torch.Tensor,            # [T, hidden]: the MLP's output
                  hidden: torch.Tensor,         # [T, hidden] contiguous, overwritten
                  residual: torch.Tensor,       # [T, hidden], updated in place
                  workspace: torch.Tensor,      # [>= decoder_layer_workspace_numel(...)] of hidden's dtype
                  key_cache: torch.Tensor,      # [num_blocks, Hk, block_size, D], written in place
                  value_cache: torch.Tensor,    # [num_blocks, Hk, block_size, D], written in place
                  qkv_weight: list[torch.Tensor], qkv_bias: torch.Tensor | None,  # projection_operands()[0]; [q + 2 kv]
                  o_weight: list[torch.Tensor], gate_up_weight: list[torch.Tensor], down_weight: list[torch.Tensor],
                  group_sizes: list[int],       # [4]: qkv, o, gate_up, down
                  input_norm: torch.Tensor, post_norm: torch.Tensor, add_input: bool, eps: float,
                  positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                  sliding_window: int = 0,
                  q_norm: torch.Tensor | None = None,   # [head_dim] Qwen3: each q head RMS-normed before RoPE
                  k_norm: torch.Tensor | None = None,   # [head_dim] and each k head (both or neither)
                  decode_rows: int = -1,        # rows [0, decode_rows) are decode-phase rows (see linear)
                  ) -> torch.Tensor:
    """One Llama-family decoder layer in one op call (see reference.decoder_layer; the kernel is the
    op-by-op sequence of models/llama.py issued from C++, so its results are bitwise that sequence's).
    Projections are packed INT4 / INT8 or dense tensors (projection_operands), each routed as ops.linear
    routes it. CUDA: only where the quantized GEMM kernels take every packed projection (up to 8 rows;
    beyond, INT4 with fp16 / bf16 activations), else a ValueError; ops.linear's decode-to-dense
    fallback for packed weights is not part of the op."""
    _check_window("decoder_layer", sliding_window)
    _check_cuda_rows("decoder_layer", hidden, [len(w) for w in (qkv_weight, o_weight, gate_up_weight, down_weight)])
    args = (qkv_weight, qkv_bias, o_weight, gate_up_weight, down_weight, list(group_sizes), input_norm, post_norm,
            add_input, eps, positions, cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc,
            num_heads, num_kv_heads, head_dim, scale, k_scale, v_scale, sliding_window, q_norm, k_norm, decode_rows)
    if _has_kernel("decoder_layer", hidden.device):
        _ops.decoder_layer(out, hidden, residual, workspace, key_cache, value_cache, *args)
        return out
    o, r, kc, vc = reference.decoder_layer(hidden, residual, key_cache, value_cache, *args)
    out.copy_(o)
    residual.copy_(r)
    key_cache.copy_(kc)
    value_cache.copy_(vc)
    return out


def decoder_layers(out: torch.Tensor,             # [T, hidden]: the last layer's MLP output
                   hidden: torch.Tensor,          # [T, hidden] contiguous: layer 0's input; overwritten (scratch)
                   residual: torch.Tensor,        # [T, hidden], updated in place
                   workspace: torch.Tensor,       # [>= decoder_layer_workspace_numel(...)] of hidden's dtype
                   key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],  # [L] x [blocks, Hk, bs, D]
                   weights: list[torch.Tensor],   # every layer's projection_operands (qkv, o, gate_up, down) flat
                   weight_counts: list[int],      # [4 L]: each projection's operand count
                   qkv_biases: list,              # [L]: [q + 2 kv] or None
                   group_sizes: list[int],        # [4 L]
                   input_norms: list[torch.Tensor], post_norms: list[torch.Tensor],  # [L] x [hidden]
                   add_input: bool, eps: float, positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                   slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                   k_scales: list | None = None, v_scales: list | None = None,  # [L] ([1] / [Hk] or None) or None
                   sliding_windows: list[int] | None = None,   # [L] (None: no window)
                   q_norms: list | None = None, k_norms: list | None = None,  # [L] ([head_dim] or None) or None
                   decode_rows: int = -1) -> torch.Tensor:
    """L decoder layers in one op call: decoder_layer on each in turn, bitwise that sequence of calls (layer 0
    adds its input to the residual if add_input, every later layer adds the previous layer's output). What it
    saves is decoder_layer's per-call cost from Python (~6 us of argument conversion a layer). Returns out."""
    windows = [0] * len(key_caches) if sliding_windows is None else sliding_windows
    for w in windows:
        _check_window("decoder_layers", w)
    _check_cuda_rows("decoder_layers", hidden, weight_counts)
    args = (weights, weight_counts, qkv_biases, group_sizes, input_norms, post_norms, add_input, eps, positions,
            cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc, num_heads, num_kv_heads,
            head_dim, scale, k_scales or [], v_scales or [], windows, q_norms or [], k_norms or [], decode_rows)
    if _has_kernel("decoder_layers", hidden.device):  # (the lists as given: the model passes them every step)
        _ops.decoder_layers(out, hidden, residual, workspace, key_caches, value_caches, *args)
        return out
    o, r, kcs, vcs = reference.decoder_layers(hidden, residual, key_caches, value_caches, *args)
    out.copy_(o)
    residual.copy_(r)
    for dst, src in zip(list(key_caches) + list(value_caches), kcs + vcs):
        dst.copy_(src)
    return out


@torch.library.register_fake("decodekit::decoder_layers")
def _decoder_layers_fake(out, hidden, residual, workspace, key_caches, value_caches, weights, weight_counts,
                         qkv_biases, group_sizes, input_norms, post_norms, add_input, eps, positions, cos_sin_cache,
                         is_neox, slot_mapping, block_tables, seq_lens, query_start_loc, num_heads, num_kv_heads,
                         head_dim, scale, k_scales, v_scales, sliding_windows, q_norms, k_norms, decode_rows=-1):
    return None


@torch.library.register_fake("decodekit::decoder_layer")
def _decoder_layer_fake(out, hidden, residual, workspace, key_cache, value_cache, qkv_weight, qkv_bias, o_weight,
                        gate_up_weight, down_weight, group_sizes, input_norm, post_norm, add_input, eps, positions,
                        cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc, num_heads,
                        num_kv_heads, head_dim, scale, k_scale=None, v_scale=None, sliding_window=0, q_norm=None,
                        k_norm=None, decode_rows=-1):
    return None
