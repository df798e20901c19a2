"""PackedWeight: what every packed weight dataclass (Int4Weight, Int8Weight, Fp8Weight) answers the
same way: the device and the bytes a GEMM reads (all its tensors). `shape` is the logical [N, K];
qweight's own shape unless the format packs several values per element (INT4 overrides it)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch


@dataclasses.dataclass(frozen=True)
class CopyOnly:
    """How a weight whose stored tensors were dropped for a kernel-layout copy of the same values is held (kind
    "amx_rows": the CPU's AMX copy, decodekit.ops.prepare_amx_rows(..., drop_stored=True); "marlin": the CUDA
    Marlin-style kernel's, decodekit.ops.prepare_marlin(..., drop_stored=True)): its logical shape, the copy, the
    placeholders the ops take for the dropped operands (qweight [N, 0], scales [N, 0] (, mins [N, 0]): "read
    `packed`") and unpack() -> the dropped fields rebuilt from the copy (fresh tensors: the slow, rare paths --
    dequantize, rows / to / clone, export; the GEMM and embedding ops read the copy itself)."""
    shape: tuple[int, int]
    copy: torch.Tensor
    operands: tuple[torch.Tensor, ...]
    unpack: Callable[[], dict[str, torch.Tensor]]
    kind: str = "amx_rows"


class PackedWeight:
    _OPERANDS: tuple[str, ...] = ("qweight", "scales")  # the ops' weight operands, in order

    def __getattr__(self, name):  # only for attributes not set: a copy-only weight's dropped fields
        co = self.__dict__.get("_copy_only")
        if co is not None and name in self._OPERANDS:
            return co.unpack()[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def copy_only(self) -> CopyOnly | None:
        return self.__dict__.get("_copy_only")

    def drop_stored(self, held: CopyOnly) -> None:
        """Hold the weight as `held` alone: its stored operand tensors are dropped (memory: one copy, not two)."""
        for name in self._OPERANDS:
            self.__dict__.pop(name, None)
        self.__dict__["_copy_only"] = held

    def operands(self) -> tuple[torch.Tensor, ...]:
        """The ops' weight operands (qweight, scales (, mins)); for a copy-only weight the [N, 0] placeholders
        that tell the CPU kernels to read the copy passed as `packed`."""
        co = self.copy_only
        return co.operands if co is not None else tuple(getattr(self, n) for n in self._OPERANDS)

    @property
    def shape(self) -> tuple[int, int]:
        co = self.copy_only
        return co.shape if co is not None else tuple(self.qweight.shape)

    @property
    def device(self) -> torch.device:
        co = self.copy_only
        return co.copy.device if co is not None else self.qweight.device

    @property
    def nbytes(self) -> int:
        """The weight's own bytes (what a decode step reads); kernel-layout copies cached on the object
        (decodekit.ops.int4_marlin_packed, prepare_amx_rows) are not counted, unless the copy is all that
        is held (copy_only)."""
        co = self.copy_only
        if co is not None:
            return co.copy.numel() * co.copy.element_size()
        return sum(t.numel() * t.element_size() for f in dataclasses.fields(self)
                   for t in [getattr(self, f.name)] if isinstance(t, torch.Tensor))

    def clone(self):
        """An owning copy (of a view such as .rows(a, b), so the weight it was cut from can be freed)."""
        return type(self)(**{f.name: (v.clone() if isinstance(v, torch.Tensor) else v)
                             for f in dataclasses.fields(self) for v in [getattr(self, f.name)]})
