"""The CPU's AMX copies of quantized weights (include/decodekit/gemm/quant_amx_rows.h), re-exported by
decodekit.ops."""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from decodekit.quant import Int4Weight, Int8Weight
from decodekit.quant.packed import CopyOnly

from . import reference

_ops = torch.ops.decodekit


def _has_cpu_kernel(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"decodekit::{op}", "CPU")


# The CPU's INT4 / INT8 copies for int4_gemm's 1..12-row and int8_gemm's 1..8-row AMX kernels
# (include/decodekit/gemm/quant_amx_rows.h): on a CPU with AMX-INT8, float32 / float16 activations of that many
# rows then get the exact integer products that 9+ rows get anyway (quant_amx_exact.h; bf16 activations get them
# up to 12 / 8 rows, then quant_amx.h's bf16 products on strips decoded from the copy: quant_amx_rows_bf16.h), so
# a row's bits no longer depend on how many rows come with it (decoding = speculative verification = batches),
# and 1..8 rows run 1.2-1.8x (INT4 layers) / 1.5-2.8x (INT8 LM head) faster than the fp32 GEMV / small-M kernels
# (bench/results/20261206-1747_cpu_xeon_amx_rows.md). Made at load (LlamaModel.prepare_packed_gemms), which then
# drops the weight's own tensors: the copy is read for every row count (13+ rows: quant_amx_exact.h's kernels
# decoding strips from it, bit for bit those on int4.h's layout). DECODEKIT_CPU_AMX_ROWS=0: no copies (the GEMV
# arithmetic for 1..8 rows).
def int4_amx_rows_available() -> bool:
    """Whether int4_gemm / int8_gemm would run their AMX few-row kernels on this CPU (AMX-INT8, a native build,
    DECODEKIT_CPU_AMX not 0) and DECODEKIT_CPU_AMX_ROWS is not 0 (the INT8 LM head's copy follows the same rule)."""
    return (os.environ.get("DECODEKIT_CPU_AMX_ROWS", "1") != "0" and _has_cpu_kernel("int4_amx_rows_pack")
            and bool(_ops.int4_amx_rows_available()))


def int4_amx_rows_pack(weight: Int4Weight) -> torch.Tensor:  # [amx_rows_packed_bytes(N, K, G)] uint8, CPU
    """The weight (stored column order) in the layout of the CPU's AMX few-row INT4 kernels."""
    if weight.device.type != "cpu":
        raise ValueError(f"int4_amx_rows_pack: the weight must be on the CPU, got {weight.device}")
    N, K = weight.shape
    out = torch.empty(reference.amx_rows_packed_bytes(N, K, weight.group_size), dtype=torch.uint8)
    _ops.int4_amx_rows_pack(out, weight.qweight, weight.scales, weight.mins, weight.group_size)
    return out


def int8_amx_rows_pack(weight: Int8Weight) -> torch.Tensor:  # [amx_rows_int8_packed_bytes(N, K, G)] uint8, CPU
    """An INT8 weight in the layout of the CPU's AMX 1..8-row INT8 kernel (the B tiles themselves)."""
    if weight.device.type != "cpu":
        raise ValueError(f"int8_amx_rows_pack: the weight must be on the CPU, got {weight.device}")
    N, K = weight.shape
    out = torch.empty(reference.amx_rows_int8_packed_bytes(N, K, weight.group_size), dtype=torch.uint8)
    _ops.int8_amx_rows_pack(out, weight.qweight, weight.scales, weight.group_size)
    return out


def prepare_amx_rows(weight: Int4Weight | Int8Weight, drop_stored: bool = False) -> None:
    """Make and keep the weight's AMX copy (int4_amx_rows_pack / int8_amx_rows_pack): int4_gemm / int8_gemm (and
    int8_embedding) pass it to the kernels from then on. drop_stored: then hold the weight as the copy alone
    (PackedWeight.drop_stored: its qweight / scales / mins are freed, the kernels read the copy for every row
    count, other readers get them rebuilt from it); not for act-order INT4 weights (their stored-order object
    shares the tensors)."""
    int8 = isinstance(weight, Int8Weight)
    w = weight if int8 else weight.stored()
    if "_amx_rows" not in w.__dict__:
        w.__dict__["_amx_rows"] = int8_amx_rows_pack(w) if int8 else int4_amx_rows_pack(w)
    if not drop_stored or w.copy_only is not None or (not int8 and weight.perm is not None):
        return
    copy, (N, K), G = w.__dict__["_amx_rows"], w.shape, w.group_size
    dtypes = (torch.int8, torch.float16) if int8 else (torch.uint8, torch.float16, torch.float16)
    operands = tuple(torch.empty(N, 0, dtype=dt) for dt in dtypes)
    w.drop_stored(CopyOnly((N, K), copy, operands, functools.partial(_unpack, int8, w._OPERANDS, copy, N, K, G)))


def _unpack(int8: bool, names: tuple[str, ...], copy: torch.Tensor, N: int, K: int, G: int) -> dict:
    """A copy-only weight's dropped fields, rebuilt from its copy (module-level: the weight stays picklable)."""
    unpack = reference.int8_amx_rows_unpack if int8 else reference.int4_amx_rows_unpack
    return dict(zip(names, unpack(copy, N, K, G)))


def _amx_rows_copy(weight, a: torch.Tensor) -> torch.Tensor | None:
    return weight.__dict__.get("_amx_rows") if a.device.type == "cpu" else None


def release_freed_host_memory() -> None:
    """Hand the memory freed at load (the tensors prepare_amx_rows(..., drop_stored=True) dropped) back to the OS:
    glibc keeps freed heap pages (SmolLM2 float32: 200 MB resident instead of 115 MB); elsewhere a no-op."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
