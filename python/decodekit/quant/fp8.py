"""fp8 e4m3 W8A8 weights (vLLM-style dynamic fp8): Fp8Weight holds the weight quantized per output
channel (scale = max |w_row| / 448); activations are quantized per token at run time
(ops.quantize_fp8) and multiplied on fp8 tensor cores (ops.fp8_gemm; CPU: the same arithmetic in
fp32). Weights take 1 byte each (half of bf16)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .packed import PackedWeight


@dataclass
class Fp8Weight(PackedWeight):
    qweight: torch.Tensor   # [N, K] float8_e4m3fn
    scales: torch.Tensor    # [N] float32: w[n, :] ~ float(qweight[n, :]) * scales[n]

    def __post_init__(self):
        if self.qweight.dtype != torch.float8_e4m3fn or self.qweight.dim() != 2:
            raise ValueError(f"Fp8Weight.qweight must be a 2-d float8_e4m3fn tensor, got {self.qweight.dtype} "
                             f"{tuple(self.qweight.shape)}")
        if self.scales.dtype != torch.float32 or tuple(self.scales.shape) != (self.qweight.shape[0],):
            raise ValueError(f"Fp8Weight.scales must be float32 [{self.qweight.shape[0]}], got {self.scales.dtype} "
                             f"{tuple(self.scales.shape)}")

    def to(self, device) -> "Fp8Weight":
        return Fp8Weight(self.qweight.to(device), self.scales.to(device))

    def rows(self, n0: int, n1: int) -> "Fp8Weight":
        return Fp8Weight(self.qweight[n0:n1], self.scales[n0:n1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [N, K]
        return (self.qweight.float() * self.scales[:, None]).to(dtype)

    @staticmethod
    def cat(parts: list["Fp8Weight"]) -> "Fp8Weight":
        return Fp8Weight(torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]))


def quantize_fp8_weight(w: torch.Tensor) -> Fp8Weight:  # w [N, K] float
    """Per-output-channel fp8: scale = max |w_row| / 448 (1 for an all-zero row), codes RNE, saturated."""
    from decodekit.ops import reference
    q, s = reference.quantize_fp8(w.detach())
    return Fp8Weight(q.contiguous(), s.contiguous())
