"""Which devices an op of decodekit._C has a kernel for."""
from __future__ import annotations

import functools

import torch


def _has_kernel(op: str, device: torch.device) -> bool:
    return _has_kernel_for(op, "CUDA" if device.type == "cuda" else "CPU")


@functools.lru_cache(maxsize=None)
def _has_kernel_for(op: str, key: str) -> bool:  # registrations are fixed once _C is loaded
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"decodekit::{op}", key)


# The public wrappers take any layout: an operand the kernels read row by row ("row stride free") needs a unit
# last stride, attention's query / key / value contiguous heads; otherwise it is copied (the kernels' own checks,
# csrc/check.h and csrc/op_args.h, stay strict for the raw torch.ops.decodekit calls).
def _rows(x: torch.Tensor) -> torch.Tensor:  # [..., K]
    if x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _rowwise(x: torch.Tensor) -> torch.Tensor:  # [..., hidden]: rows of the leading dims (norms, activations)
    if x.dim() <= 2:
        return _rows(x)
    return x if x.is_contiguous() else x.clone(memory_format=torch.contiguous_format)


def _heads(x: torch.Tensor) -> torch.Tensor:  # [T, H, D]
    if x.dim() != 3 or (x.stride(2) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[2])):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _dense(x: torch.Tensor | None) -> torch.Tensor | None:  # small metadata / sampling tensors
    return None if x is None else x.contiguous()
