"""INT8 weight-only weights (GGUF Q8_0): Int8Weight and its converters.

Layout: qweight [N, K] int8, scales [N, K/G] float16, w = scale * q (fp32, exact). GGUF Q8_0
blocks (32 weights: d fp16, 32 int8) map to it byte for byte. The embedding table of a model
with a Q8_0 token_embd (tied LM head) stays in this form: rows are decoded on lookup.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .packed import PackedWeight

Q8_0_BLOCK_BYTES = 34  # d (fp16), 32 int8


@dataclass
class Int8Weight(PackedWeight):
    qweight: torch.Tensor   # [N, K] int8
    scales: torch.Tensor    # [N, K/G] float16
    group_size: int

    def __post_init__(self):
        N, K = self.qweight.shape
        if self.group_size not in (32, 64, 128) or K % self.group_size or \
                self.scales.shape != (N, K // self.group_size):
            raise ValueError(f"inconsistent INT8 weight: qweight {tuple(self.qweight.shape)}, scales "
                             f"{tuple(self.scales.shape)}, group_size {self.group_size}")

    def rows(self, n0: int, n1: int) -> "Int8Weight":
        """Output rows [n0, n1) (views)."""
        return Int8Weight(self.qweight[n0:n1], self.scales[n0:n1], self.group_size)

    def to(self, device) -> "Int8Weight":
        return Int8Weight(self.qweight.to(device), self.scales.to(device), self.group_size)

    @staticmethod
    def cat(parts: list["Int8Weight"]) -> "Int8Weight":
        """Rows of several weights stacked (fused QKV / gate-up projections)."""
        G = parts[0].group_size
        if any(p.group_size != G or p.shape[1] != parts[0].shape[1] for p in parts):
            raise ValueError("Int8Weight.cat: all parts need the same K and group_size")
        return Int8Weight(torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), G)


def from_gguf_q8_0(raw: np.ndarray, shape: tuple[int, int]) -> Int8Weight:
    """GGUF Q8_0 rows (uint8 [N, K/32 * 34]) -> Int8Weight (G = 32)."""
    N, K = shape
    if K % 32:
        raise ValueError(f"GGUF Q8_0 rows must hold a multiple of 32 elements, got K = {K}")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N, K // 32, Q8_0_BLOCK_BYTES)
    d = torch.from_numpy(np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(N, K // 32).copy())
    q = torch.from_numpy(np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(N, K).copy())
    return Int8Weight(q, d, 32)


def quantize_int8(w: torch.Tensor,          # [N, K] float, K a multiple of 32
                  group_size: int = 32) -> Int8Weight:
    """Round to nearest, as llama.cpp's Q8_0: per group of `group_size` weights d = amax / 127 (fp16; the codes
    use the rounded d, so a group's largest weight maps to +-127 or just inside), q = round(w / d). As in Q8_0, a
    group whose amax / 127 is below fp16's normal range (~6e-5) loses precision (d subnormal or 0)."""
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"quantize_int8: K = {K} must be a multiple of group_size = {group_size}")
    g = w.detach().float().reshape(N, K // group_size, group_size)
    d = (g.abs().amax(-1) / 127.0).half()
    inv = torch.where(d.float() > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round(g * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q.reshape(N, K).contiguous(), d.contiguous(), group_size)


def to_gguf_q8_0(w: Int8Weight) -> np.ndarray:
    """Int8Weight (G = 32) -> GGUF Q8_0 rows, uint8 [N, K/32 * 34]."""
    if w.group_size != 32:
        raise ValueError(f"GGUF Q8_0 has groups of 32, got {w.group_size}")
    N, K = w.shape
    out = np.empty((N, K // 32, Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, 0:2] = w.scales.cpu().numpy().reshape(N, K // 32, 1).view(np.uint8)
    out[:, :, 2:] = w.qweight.cpu().numpy().reshape(N, K // 32, 32).view(np.uint8)
    return out.reshape(N, -1)
