"""INT4 weight-only weights: Int4Weight and the GGUF Q4_0 / Q4_1 converters.

Layout (include/decodekit/gemm/int4.h): weight [N, K] in groups of G along K;
  qweight [N, K/2] uint8: in group g, byte g*G/2 + i holds element g*G + i (low nibble) and
          element g*G + G/2 + i (high nibble) -- GGUF Q4_0/Q4_1's own order when G = 32;
  scales, mins [N, K/G] float16:  w = scale * q + min  (fp32; scale * q is exact);
  perm [K] int64 or None: act-order checkpoints (GPTQ desc_act) store the input features
          reordered so that groups are contiguous; stored column j is input feature perm[j]
          (linear gathers x[:, perm] first; int4_dequantize returns the original order).
GGUF Q4_1 blocks (32 weights: d fp16, m fp16, 16 bytes of nibbles) map to it byte for byte;
Q4_0 blocks (d fp16, 16 bytes; w = d * (q - 8)) become min = -8 d, exact in fp16.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .packed import PackedWeight

Q4_1_BLOCK_BYTES = 20  # d, m (fp16 each), 16 bytes of codes
Q4_0_BLOCK_BYTES = 18  # d (fp16), 16 bytes of codes


@dataclass
class Int4Weight(PackedWeight):
    """A packed INT4 weight [N, K] (see the module docstring)."""
    qweight: torch.Tensor   # [N, K/2] uint8
    scales: torch.Tensor    # [N, K/G] float16
    mins: torch.Tensor      # [N, K/G] float16
    group_size: int
    perm: torch.Tensor | None = None  # [K] int64: stored column j is input feature perm[j] (act-order)

    def __post_init__(self):
        N, half = self.qweight.shape
        G = self.group_size
        if G not in (32, 64, 128):
            raise ValueError(f"group_size must be 32, 64 or 128, got {G}")
        if (2 * half) % G or self.scales.shape != (N, 2 * half // G) or self.mins.shape != self.scales.shape:
            raise ValueError(f"inconsistent INT4 weight: qweight {tuple(self.qweight.shape)}, scales "
                             f"{tuple(self.scales.shape)}, mins {tuple(self.mins.shape)}, group_size {G}")
        if self.perm is not None and (self.perm.dtype != torch.int64 or tuple(self.perm.shape) != (2 * half,)):
            raise ValueError(f"INT4 weight perm must be int64 [{2 * half}], got {self.perm.dtype} "
                             f"{tuple(self.perm.shape)}")
        if self.perm is not None and self.perm.device.type == "cpu" and not torch.equal(
                torch.sort(self.perm).values, torch.arange(2 * half)):  # (a CUDA perm: checked where it was made)
            bad = [int(i) for i in torch.nonzero(torch.bincount(self.perm.clamp(0, 2 * half), minlength=2 * half + 1)
                                                 [:2 * half] != 1).flatten()[:3]]
            raise ValueError(f"INT4 weight perm must be a permutation of 0 .. {2 * half - 1} (K = {2 * half}): "
                             f"entries out of range or repeated (first features not taken exactly once: {bad})")

    _OPERANDS = ("qweight", "scales", "mins")

    @property
    def shape(self) -> tuple[int, int]:
        co = self.copy_only
        return co.shape if co is not None else (self.qweight.shape[0], 2 * self.qweight.shape[1])

    def to(self, device) -> "Int4Weight":
        perm = None if self.perm is None else self.perm.to(device)
        return Int4Weight(self.qweight.to(device), self.scales.to(device), self.mins.to(device), self.group_size,
                          perm)

    def rows(self, n0: int, n1: int) -> "Int4Weight":
        """Output rows [n0, n1) (views)."""
        return Int4Weight(self.qweight[n0:n1], self.scales[n0:n1], self.mins[n0:n1], self.group_size, self.perm)

    def stored(self) -> "Int4Weight":
        """The weight in its stored column order (no perm): what the kernels see (one object, kept: caches such
        as the CUDA kernel's packed copy, decodekit.ops.int4_marlin_packed, live on it)."""
        if self.perm is None:
            return self
        if "_stored" not in self.__dict__:
            self.__dict__["_stored"] = Int4Weight(self.qweight, self.scales, self.mins, self.group_size)
        return self.__dict__["_stored"]

    def codes(self) -> torch.Tensor:
        """The 4-bit codes as uint8 [N, K] in element order."""
        N, K = self.shape
        G = self.group_size
        q = self.qweight.view(N, K // G, G // 2)
        return torch.cat([q & 15, q >> 4], dim=2).reshape(N, K)

    @staticmethod
    def cat(parts: list["Int4Weight"]) -> "Int4Weight":
        """Rows of several weights stacked (fused QKV / gate-up projections)."""
        G = parts[0].group_size
        if any(p.group_size != G or p.shape[1] != parts[0].shape[1] for p in parts):
            raise ValueError("Int4Weight.cat: all parts need the same K and group_size")
        if not Int4Weight.same_perm(parts):
            raise ValueError("Int4Weight.cat: all parts need the same input order (act-order perm)")
        return Int4Weight(torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.mins for p in parts]), G, parts[0].perm)

    @staticmethod
    def same_perm(parts: list["Int4Weight"]) -> bool:
        p0 = parts[0].perm
        return all((p.perm is None and p0 is None) or (p.perm is not None and p0 is not None and
                                                       torch.equal(p.perm, p0)) for p in parts)


def _blocks(raw: np.ndarray, shape: tuple[int, int], block_bytes: int) -> np.ndarray:
    N, K = shape
    if K % 32:
        raise ValueError(f"GGUF 4-bit rows must hold a multiple of 32 elements, got K = {K}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N, -1)
    if raw.shape[1] != K // 32 * block_bytes:
        raise ValueError(f"GGUF block data: expected {K // 32 * block_bytes} bytes per row, got {raw.shape[1]}")
    return raw.reshape(N, K // 32, block_bytes)


def from_gguf_q4_1(raw: np.ndarray, shape: tuple[int, int]) -> Int4Weight:
    """GGUF Q4_1 rows (uint8 [N, K/32 * 20], rows in the final order) -> Int4Weight (G = 32)."""
    N, K = shape
    b = _blocks(raw, shape, Q4_1_BLOCK_BYTES)
    d = torch.from_numpy(np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(N, K // 32).copy())
    m = torch.from_numpy(np.ascontiguousarray(b[:, :, 2:4]).view(np.float16).reshape(N, K // 32).copy())
    q = torch.from_numpy(np.ascontiguousarray(b[:, :, 4:]).reshape(N, K // 2).copy())
    return Int4Weight(q, d, m, 32)


def from_gguf_q4_0(raw: np.ndarray, shape: tuple[int, int]) -> Int4Weight:
    """GGUF Q4_0 rows (uint8 [N, K/32 * 18]) -> Int4Weight (G = 32, min = -8 d, exact)."""
    N, K = shape
    b = _blocks(raw, shape, Q4_0_BLOCK_BYTES)
    d = torch.from_numpy(np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(N, K // 32).copy())
    q = torch.from_numpy(np.ascontiguousarray(b[:, :, 2:]).reshape(N, K // 2).copy())
    return Int4Weight(q, d, d * -8, 32)


def to_gguf_q4_1(w: Int4Weight) -> np.ndarray:
    """Int4Weight (G = 32) -> GGUF Q4_1 rows, uint8 [N, K/32 * 20] (inverse of from_gguf_q4_1)."""
    if w.group_size != 32:
        raise ValueError(f"GGUF Q4_1 has groups of 32, got {w.group_size}")
    N, K = w.shape
    out = np.empty((N, K // 32, Q4_1_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, 0:2] = w.scales.cpu().numpy().reshape(N, K // 32, 1).view(np.uint8)
    out[:, :, 2:4] = w.mins.cpu().numpy().reshape(N, K // 32, 1).view(np.uint8)
    out[:, :, 4:] = w.qweight.cpu().numpy().reshape(N, K // 32, 16)
    return out.reshape(N, -1)


def quantize_rtn(w: torch.Tensor,        # [N, K] float
                 group_size: int = 32) -> Int4Weight:
    """Round-to-nearest asymmetric INT4 (per group of `group_size` along K: min and scale =
    (max - min) / 15, both stored in fp16; codes round((w - min) / scale) clamped to 0..15,
    computed with the fp16-rounded min and scale so that decoding reproduces the nearest code)."""
    N, K = w.shape
    G = group_size
    if K % G:
        raise ValueError(f"quantize_rtn: K = {K} is not a multiple of group_size = {G}")
    wf = w.detach().float().view(N, K // G, G)
    lo, hi = wf.amin(dim=2), wf.amax(dim=2)
    scale = ((hi - lo) / 15).clamp_min(1e-8).half()
    mins = lo.half()
    q = torch.round((wf - mins.float()[:, :, None]) / scale.float()[:, :, None]).clamp_(0, 15).to(torch.uint8)
    packed = q[:, :, : G // 2] | (q[:, :, G // 2:] << 4)          # group-split nibble order
    return Int4Weight(packed.reshape(N, K // 2).contiguous(), scale.contiguous(), mins.contiguous(), G)
