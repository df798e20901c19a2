"""Typed wrappers over torch.ops.decodekit.* and their fake (meta) implementations.

Every op is an out-variant in the schema (the caller allocates), so the engine can
allocate once and CUDA graphs can capture the ops. The wrappers here allocate when no
`out` is given, for convenience. `reference` holds the pure-PyTorch semantics.
"""
from __future__ import annotations

import torch

from . import reference  # noqa: F401

_ops = torch.ops.decodekit


def rms_norm(x: torch.Tensor,        # [..., hidden]
             weight: torch.Tensor,   # [hidden]
             eps: float = 1e-6,
             out: torch.Tensor | None = None) -> torch.Tensor:  # [..., hidden]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _ops.rms_norm(out, x, weight, eps)
    return out


def fused_add_rms_norm(x: torch.Tensor,         # [..., hidden], overwritten with the normed sum
                       residual: torch.Tensor,  # [..., hidden], overwritten with x + residual
                       weight: torch.Tensor,    # [hidden]
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    _ops.fused_add_rms_norm(x, residual, weight, eps)
    return x, residual


def rotary_embedding(positions: torch.Tensor,       # [num_tokens] int64
                     query: torch.Tensor,           # [num_tokens, Hq * D] or [num_tokens, Hq, D], in place
                     key: torch.Tensor | None,      # [num_tokens, Hk * D] or [num_tokens, Hk, D], in place
                     cos_sin_cache: torch.Tensor,   # [max_position, rot_dim] float32
                     head_size: int,
                     is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    _ops.rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox)
    return query, key


def silu_and_mul(x: torch.Tensor,                      # [..., 2d]
                 out: torch.Tensor | None = None) -> torch.Tensor:  # [..., d]
    if out is None:
        out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    _ops.silu_and_mul(out, x)
    return out


# Fake implementations: the ops return nothing and only mutate their out arguments, so
# tracing needs no shape logic beyond "returns None".
@torch.library.register_fake("decodekit::rms_norm")
def _rms_norm_fake(out, input, weight, epsilon):
    return None


@torch.library.register_fake("decodekit::fused_add_rms_norm")
def _fused_add_rms_norm_fake(input, residual, weight, epsilon):
    return None


@torch.library.register_fake("decodekit::rotary_embedding")
def _rotary_embedding_fake(positions, query, key, cos_sin_cache, head_size, is_neox):
    return None


@torch.library.register_fake("decodekit::silu_and_mul")
def _silu_and_mul_fake(out, input):
    return None


# --- paged KV cache and attention --------------------------------------------------------
# Until the attention kernels land (issue 4) these run the reference in place; the model
# calls only these wrappers, so it does not care which implementation is behind them.

def reshape_and_cache(key: torch.Tensor,          # [T, Hk, D]
                      value: torch.Tensor,        # [T, Hk, D]
                      key_cache: torch.Tensor,    # [num_blocks, Hk, block_size, D], written in place
                      value_cache: torch.Tensor,  # [num_blocks, Hk, block_size, D], written in place
                      slot_mapping: torch.Tensor  # [T] int64, < 0 = skip
                      ) -> None:
    bs = key_cache.shape[2]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    blk, off = slot_mapping // bs, slot_mapping % bs
    key_cache[blk, :, off] = key.to(key_cache.dtype)
    value_cache[blk, :, off] = value.to(value_cache.dtype)


def paged_attention(query: torch.Tensor,            # [T, Hq, D]
                    key_cache: torch.Tensor,        # [num_blocks, Hk, block_size, D]
                    value_cache: torch.Tensor,      # [num_blocks, Hk, block_size, D]
                    block_tables: torch.Tensor,     # [S, max_blocks] int32
                    seq_lens: torch.Tensor,         # [S]
                    query_start_loc: torch.Tensor,  # [S + 1]
                    scale: float,
                    out: torch.Tensor | None = None) -> torch.Tensor:  # [T, Hq, D]
    o, _ = reference.paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                     query_start_loc, scale)
    if out is None:
        return o
    out.copy_(o)
    return out
