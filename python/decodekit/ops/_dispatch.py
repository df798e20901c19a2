"""Which devices an op of decodekit._C has a kernel for."""
from __future__ import annotations

import functools

import torch


def _has_kernel(op: str, device: torch.device) -> bool:
    return _has_kernel_for(op, "CUDA" if device.type == "cuda" else "CPU")


@functools.lru_cache(maxsize=None)
def _has_kernel_for(op: str, key: str) -> bool:  # registrations are fixed once _C is loaded
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"decodekit::{op}", key)
