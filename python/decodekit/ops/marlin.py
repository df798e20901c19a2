"""The Marlin-style CUDA INT4 kernel's packed copy of a weight (include/decodekit/gemm/int4_marlin_pack.h) and the
weights held as that copy alone (a GPU model: one copy of its INT4 weights in memory, not two); re-exported by
decodekit.ops."""
from __future__ import annotations

import functools
import os

import torch

from decodekit.quant import Int4Weight
from decodekit.quant.packed import CopyOnly

from . import reference
from ._dispatch import _has_kernel

_ops = torch.ops.decodekit

# DECODEKIT_INT4_MARLIN: "auto" (default): on CUDA, fp16 / bf16 models hold each INT4 projection as its copy in the
# packed layout of the Marlin-style kernel alone (int4_marlin_pack, made at load: LlamaModel.prepare_packed_gemms;
# PackedWeight.copy_only: int4.h's qweight / scales / mins are freed); GEMMs of <= 64 rows run that kernel on it
# (int4_gemm_marlin), more rows decode chunks of it (int4_marlin_dequantize) for cuBLAS, the large-M route below.
# "both": the copy and int4.h's tensors (int4_gemm then also picks the CUTLASS sm90 kernel for 33..64 rows where
# K <= 8192, 1.1-1.7x faster than Marlin's there on the H200, 2026-12-04, for a second copy of the weights in
# memory); "unpacked": no copy (the kernel on int4.h's layout; A/B measurements); "never": not that kernel.
# Read per call (the copy-only choice at load).
# DECODEKIT_INT4_LARGE_M: "dense" (default): on CUDA, INT4 GEMMs past 64 rows (prefill) decode the weight in
# chunks of <= 64 MiB (int4_dequantize) and run cuBLAS: the H200 run of 2026-12-04 measured the INT4 kernels
# there at 0.2-0.5x cuBLAS bf16 on the decoded weight (bench/bench_quant.py "int4_gemm vs cuBLAS bf16", M = 64
# to 4096: e.g. 191 vs 38 us at M = 128, 1497 vs 682 us at M = 4096 for 4096 x 14336), and decoding costs about
# one read of the packed weight plus one write of the dense one; "kernel": the INT4 kernels at any M (not for
# copy-only weights: they have only the Marlin kernel, to 64 rows).
_MARLIN_MAX_M = 64
MARLIN_MAX_N = 65536 * 128  # the kernel's column counters (mma_plan.h: kMarlinMaxColumns): copy-only weights' N
# DECODEKIT_INT4_MARLIN_SLICED_MAX_M (default 64: off): a weight held as its Marlin copy alone runs up to this many
# rows as Marlin launches over 64-row slices (each re-reads the weight, mostly from L2) instead of decoding it for
# cuBLAS: an experiment for 65..~256 rows, where the decode's write of the dense weight costs about as much as
# cuBLAS's GEMM; bench_quant's "sliced" rows measure it against the decoded route.


def _int4_dense_rows(a: torch.Tensor) -> bool:
    if a.shape[0] <= _MARLIN_MAX_M:
        return False
    v = os.environ.get("DECODEKIT_INT4_LARGE_M", "") or "dense"
    if v not in ("dense", "kernel"):
        raise ValueError(f"environment variable DECODEKIT_INT4_LARGE_M = {v!r} must be 'dense' or 'kernel'")
    return v == "dense"


def _sliced_max_m() -> int:
    v = os.environ.get("DECODEKIT_INT4_MARLIN_SLICED_MAX_M", "") or str(_MARLIN_MAX_M)
    if not v.isdigit() or int(v) < _MARLIN_MAX_M:
        raise ValueError(f"environment variable DECODEKIT_INT4_MARLIN_SLICED_MAX_M = {v!r} must be an integer "
                         f">= {_MARLIN_MAX_M}")
    return int(v)


def _marlin_mode() -> str:
    v = os.environ.get("DECODEKIT_INT4_MARLIN", "") or "auto"
    if v not in ("auto", "both", "unpacked", "never"):
        raise ValueError(f"environment variable DECODEKIT_INT4_MARLIN = {v!r} must be 'auto', 'both', 'unpacked' "
                         "or 'never'")
    return v


def _marlin_packed_route(a: torch.Tensor) -> bool:
    """Whether int4_gemm gets the packed copy: CUDA, fp16 / bf16, the Marlin kernel's rows."""
    return (a.device.type == "cuda" and a.dtype in (torch.float16, torch.bfloat16) and a.dim() == 2
            and 0 < a.shape[0] <= _MARLIN_MAX_M and _marlin_mode() in ("auto", "both")
            and _has_kernel("int4_marlin_pack", a.device))


def int4_marlin_pack(weight: Int4Weight, dtype: torch.dtype) -> torch.Tensor:  # [packed bytes / 2] of dtype
    """The weight in the packed layout of the Marlin-style CUDA kernel for activations of `dtype` (float16 /
    bfloat16; include/decodekit/gemm/int4_marlin_pack.h), on the weight's device. Act-order weights: the
    stored order (callers gather the activations, as for int4_gemm)."""
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"int4_marlin_pack: dtype must be float16 or bfloat16, got {dtype}")
    N, K = weight.shape
    out = torch.empty(reference.int4_marlin_packed_bytes(N, K, weight.group_size) // 2, dtype=dtype,
                      device=weight.device)
    if _has_kernel("int4_marlin_pack", weight.device):
        _ops.int4_marlin_pack(out, weight.qweight, weight.scales, weight.mins, weight.group_size)
    else:
        out.copy_(reference.int4_marlin_pack(weight.qweight, weight.scales, weight.mins, weight.group_size, dtype))
    return out


def int4_marlin_packed(weight: Int4Weight, dtype: torch.dtype) -> torch.Tensor | None:
    """int4_marlin_pack(weight, dtype), made once and kept on the weight (None while a CUDA graph is being
    captured and it was not made before: the caller takes another kernel; models make it at load,
    LlamaModel.prepare_packed_gemms)."""
    cache = weight.__dict__.setdefault("_marlin", {})
    packed = cache.get(dtype)
    if packed is None:
        if weight.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        packed = cache[dtype] = int4_marlin_pack(weight, dtype)
    return packed


def prepare_marlin(weight: Int4Weight, dtype: torch.dtype, drop_stored: bool = False) -> None:
    """Make and keep the weight's packed copy for activations of `dtype` (int4_marlin_packed). drop_stored: then
    hold the weight as that copy alone (PackedWeight.copy_only: its qweight / scales / mins are freed; int4_gemm
    runs the Marlin-style kernel on the copy to 64 rows (marlin_copy_rows) and decodes chunks of it for more;
    other readers get the fields rebuilt from it, exactly: a bfloat16 copy's float16 scales / mins are kept in host
    memory). Act-order weights: the copy is of the stored column order; the weight and its stored-order object
    (which share the tensors) are both held as it (int4_gemm gathers the activations first, as always)."""
    w = weight.stored()
    copy = int4_marlin_packed(w, dtype)
    if not drop_stored or w.copy_only is not None:
        return
    (N, K), G = w.shape, w.group_size
    operands = tuple(torch.empty(N, 0, dtype=dt, device=copy.device)
                     for dt in (torch.uint8, torch.float16, torch.float16))
    # a bfloat16 copy holds the scale pairs rounded to bfloat16: the float16 originals stay in host memory (1/16
    # of the codes' bytes at G = 128), so that rebuilt fields (export, `decodekit quantize`) lose nothing
    host = (w.scales.cpu(), w.mins.cpu()) if dtype != torch.float16 else None
    held = CopyOnly((N, K), copy, operands, functools.partial(_unpack, copy, N, K, G, host), kind="marlin")
    w.drop_stored(held)
    if weight is not w:
        weight.drop_stored(held)  # its fields are the stored object's: rebuilt from the copy too (perm is kept)


def _unpack(copy: torch.Tensor, N: int, K: int, G: int, host: tuple | None = None) -> dict:
    """A Marlin-copy-only weight's dropped fields rebuilt from its copy (module level: picklable); host: the
    float16 scales / mins kept for a bfloat16 copy."""
    qweight, scales, mins = reference.int4_marlin_unpack(copy, N, K, G)
    if host is not None:
        scales, mins = host
    return {"qweight": qweight.to(copy.device), "scales": scales.to(device=copy.device, dtype=torch.float16),
            "mins": mins.to(device=copy.device, dtype=torch.float16)}


def marlin_copy_only(weight) -> CopyOnly | None:
    """The CopyOnly of a weight held as its Marlin copy alone, else None."""
    held = getattr(weight, "copy_only", None)
    return held if held is not None and held.kind == "marlin" else None


def int4_marlin_dequantize(packed: torch.Tensor,  # [int4_marlin_packed_bytes(n, k, G) / 2] float16 / bfloat16
                           n: int, k: int, group_size: int,
                           row0: int = 0, rows: int | None = None,
                           out: torch.Tensor | None = None,  # [rows, k] of packed's dtype, contiguous
                           ) -> torch.Tensor:
    """Rows [row0, row0 + rows) of the weight held in `packed`, each as the Marlin-style kernel rounds it:
    w = round_T(s_T q + m_T), T = packed's dtype."""
    rows = n - row0 if rows is None else rows
    if out is None:
        out = torch.empty(rows, k, dtype=packed.dtype, device=packed.device)
    if _has_kernel("int4_marlin_dequantize", packed.device):
        _ops.int4_marlin_dequantize(out, packed, n, k, group_size, row0)
    else:
        out.copy_(reference.int4_marlin_dequantize(packed, n, k, group_size, row0, rows))
    return out


def marlin_copy_rows(a: torch.Tensor,       # [M, K] (row stride free)
                     weight: Int4Weight,    # [N, K] held as its Marlin copy alone (prepare_marlin)
                     bias: torch.Tensor | None,  # [N]
                     out: torch.Tensor,     # [M, N]
                     ) -> bool:
    """out = a @ w^T (+ bias) by the Marlin-style kernel on the copy when it takes a: 1..64 rows (or the
    DECODEKIT_INT4_MARLIN_SLICED_MAX_M experiment's) of the copy's dtype; False otherwise (the caller decodes
    chunks of the copy: decodekit.ops._packed_dense)."""
    copy, (N, K), G = weight.copy_only.copy, weight.shape, weight.group_size
    M = a.shape[0]
    if not (a.dtype == copy.dtype and M <= _sliced_max_m() and _has_kernel("int4_gemm_marlin", a.device)):
        return False
    if M == 0:
        return True
    esize = a.element_size()
    if a.stride(1) != 1 or (M > 1 and a.stride(0) * esize % 16) or a.data_ptr() % 16:
        a = a.clone(memory_format=torch.contiguous_format)  # the kernel's 16-byte loads
    dst = out if out.is_contiguous() else torch.empty(M, N, dtype=out.dtype, device=out.device)
    for m0 in range(0, M, _MARLIN_MAX_M):  # one launch up to 64 rows
        m1 = min(M, m0 + _MARLIN_MAX_M)
        _ops.int4_gemm_marlin(dst[m0:m1], a[m0:m1], copy, N, K, G, bias)
    if dst is not out:
        out.copy_(dst)
    return True


def int4_gemm_marlin(a: torch.Tensor,       # [M, K] float16 / bfloat16 (row stride free; CUDA: M <= 64)
                     packed: torch.Tensor,  # [int4_marlin_packed_bytes(N, K, G) / 2] of a's dtype
                     n: int, k: int, group_size: int,
                     bias: torch.Tensor | None = None,  # [N]
                     out: torch.Tensor | None = None,   # [M, N]
                     ) -> torch.Tensor:
    """a @ w^T (+ bias) with w = round_T(s_T q + m_T) from the packed layout (int4_marlin_pack)."""
    if out is None:
        out = torch.empty(a.shape[0], n, dtype=a.dtype, device=a.device)
    _ops.int4_gemm_marlin(out, a, packed, n, k, group_size, bias)
    return out


@torch.library.register_fake("decodekit::int4_marlin_pack")
def _int4_marlin_pack_fake(out, qweight, scales, mins, group_size):
    return None


@torch.library.register_fake("decodekit::int4_gemm_marlin")
def _int4_gemm_marlin_fake(out, a, packed, n, k, group_size, bias):
    return None


@torch.library.register_fake("decodekit::int4_marlin_dequantize")
def _int4_marlin_dequantize_fake(out, packed, n, k, group_size, row0=0):
    return None
