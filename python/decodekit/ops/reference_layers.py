"""Reference semantics of the composite layer ops (csrc/decoder_layer.cpp): one Llama-family decoder layer
(`decoder_layer`) and a stack of them (`decoder_layers`), built from reference.py's primitives (re-exported there as
reference.decoder_layer / reference.decoder_layers)."""
from __future__ import annotations

import torch

from . import reference as _r  # (attribute access at call time: either module may be imported first)


def _packed_linear(x: torch.Tensor, w: list[torch.Tensor], group_size: int,
                   bias: torch.Tensor | None = None) -> torch.Tensor:  # w: [q, s, m] INT4, [q, s] INT8, [w] dense
    if len(w) == 1:
        return torch.nn.functional.linear(x, w[0].to(x.dtype), None if bias is None else bias.to(x.dtype))
    return _r.int4_gemm(x, *w, group_size, bias) if len(w) == 3 else _r.int8_gemm(x, *w, group_size, bias)


def decoder_layer(hidden: torch.Tensor,          # [T, hidden]: the layer's input (normed, or to add, see add_input)
                  residual: torch.Tensor,        # [T, hidden]
                  key_cache: torch.Tensor,       # [num_blocks, Hk, block_size, D]
                  value_cache: torch.Tensor,     # [num_blocks, Hk, block_size, D]
                  qkv_weight: list[torch.Tensor], qkv_bias: torch.Tensor | None, o_weight: list[torch.Tensor],
                  gate_up_weight: list[torch.Tensor], down_weight: list[torch.Tensor],
                  group_sizes: list[int],        # [4]: qkv, o, gate_up, down
                  input_norm: torch.Tensor, post_norm: torch.Tensor, add_input: bool, eps: float,
                  positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                  sliding_window: int = 0, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                  decode_rows: int = -1):
    """Returns (out [T, hidden], residual, key_cache, value_cache) after one decoder layer:
    (input add + norm), QKV projection, (q_norm / k_norm: each head RMS-normed, Qwen3), rotary embedding,
    cache write, paged attention, O projection, add + norm, SwiGLU MLP. Projections: [qweight, scales, mins]
    INT4, [qweight, scales] INT8 or [weight] dense. decode_rows (the kernels' row blocking) changes no value."""
    if not -1 <= decode_rows <= hidden.shape[0]:
        raise ValueError(f"decoder_layer: decode_rows must be in [-1, T = {hidden.shape[0]}], got {decode_rows}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("decoder_layer: q_norm / k_norm must be given both or neither")
    T = hidden.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if add_input:
        hidden, residual = _r.fused_add_rms_norm(hidden, residual, input_norm, eps)
    qkv = _packed_linear(hidden, qkv_weight, group_sizes[0], qkv_bias)
    q, k = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]
    if q_norm is not None:
        q = _r.rms_norm(q.reshape(-1, head_dim), q_norm, eps).reshape(T, q_size)
        k = _r.rms_norm(k.reshape(-1, head_dim), k_norm, eps).reshape(T, kv_size)
    q, k = _r.rotary_embedding(positions, q, k, cos_sin_cache, head_dim, is_neox)
    v = qkv[:, q_size + kv_size:]
    key_cache, value_cache = _r.reshape_and_cache(k.view(T, num_kv_heads, head_dim),
                                                  v.reshape(T, num_kv_heads, head_dim), key_cache, value_cache,
                                                  slot_mapping, k_scale, v_scale)
    attn, _ = _r.paged_attention(q.reshape(T, num_heads, head_dim), key_cache, value_cache, block_tables, seq_lens,
                                 query_start_loc, scale, k_scale, v_scale, sliding_window)
    h = _packed_linear(attn.reshape(T, q_size), o_weight, group_sizes[1])
    h, residual = _r.fused_add_rms_norm(h, residual, post_norm, eps)
    act = _r.silu_and_mul(_packed_linear(h, gate_up_weight, group_sizes[2]))
    out = _packed_linear(act, down_weight, group_sizes[3])
    return out, residual, key_cache, value_cache


def decoder_layers(hidden: torch.Tensor,          # [T, hidden]: layer 0's input
                   residual: torch.Tensor,        # [T, hidden]
                   key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],  # [L] x [num_blocks, Hk, bs, D]
                   weights: list[torch.Tensor],   # every layer's qkv, o, gate_up, down operands back to back
                   weight_counts: list[int],      # [4 L]: each projection's operand count
                   qkv_biases: list, group_sizes: list[int], input_norms: list[torch.Tensor],
                   post_norms: list[torch.Tensor], add_input: bool, eps: float, positions: torch.Tensor,
                   cos_sin_cache: torch.Tensor, is_neox: bool, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: torch.Tensor, query_start_loc: torch.Tensor, num_heads: int, num_kv_heads: int,
                   head_dim: int, scale: float, k_scales: list, v_scales: list, sliding_windows: list[int],
                   q_norms: list, k_norms: list, decode_rows: int = -1):
    """decoder_layer over L layers in turn (layer 0 adds its input if add_input, the others always); returns
    (out [T, hidden], residual, key_caches, value_caches)."""
    L = len(key_caches)
    if L < 1 or len(weight_counts) != 4 * L or sum(weight_counts) != len(weights):
        raise ValueError(f"decoder_layers: inconsistent layer lists (L = {L}, weight_counts {len(weight_counts)}, "
                         f"weights {len(weights)})")
    at = 0
    key_caches, value_caches = list(key_caches), list(value_caches)
    for i in range(L):
        proj = []
        for c in weight_counts[4 * i:4 * i + 4]:
            proj.append(list(weights[at:at + c]))
            at += c
        pick = (lambda xs: xs[i] if len(xs) else None)
        hidden, residual, key_caches[i], value_caches[i] = decoder_layer(
            hidden, residual, key_caches[i], value_caches[i], proj[0], qkv_biases[i], proj[1], proj[2], proj[3],
            group_sizes[4 * i:4 * i + 4], input_norms[i], post_norms[i], add_input or i > 0, eps, positions,
            cos_sin_cache, is_neox, slot_mapping, block_tables, seq_lens, query_start_loc, num_heads, num_kv_heads,
            head_dim, scale, pick(k_scales), pick(v_scales), sliding_windows[i], pick(q_norms), pick(k_norms),
            decode_rows)
    return hidden, residual, key_caches, value_caches
