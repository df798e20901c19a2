"""PackedWeight: what every packed weight dataclass (Int4Weight, Int8Weight, Fp8Weight) answers the
same way: the device and the bytes a GEMM reads (all its tensors). `shape` is the logical [N, K];
qweight's own shape unless the format packs several values per element (INT4 overrides it)."""
from __future__ import annotations

import dataclasses

import torch


class PackedWeight:
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.qweight.shape)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """The weight's own bytes (what a decode step reads); kernel-layout copies cached on the object
        (decodekit.ops.int4_marlin_packed, prepare_amx_rows) are not counted."""
        return sum(t.numel() * t.element_size() for f in dataclasses.fields(self)
                   for t in [getattr(self, f.name)] if isinstance(t, torch.Tensor))

    def clone(self):
        """An owning copy (of a view such as .rows(a, b), so the weight it was cut from can be freed)."""
        return type(self)(**{f.name: (v.clone() if isinstance(v, torch.Tensor) else v)
                             for f in dataclasses.fields(self) for v in [getattr(self, f.name)]})
