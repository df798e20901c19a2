"""Typed wrappers over torch.ops.decodekit.* and their fake (meta) implementations.

Every op is an out-variant in the schema (the caller allocates), so the engine can
allocate once and CUDA graphs can capture the ops. The wrappers here allocate when no
`out` is given, for convenience. `reference` holds the pure-PyTorch semantics.
"""
from __future__ import annotations

import functools

import torch

from decodekit.quant import Int4Weight, Int8Weight
from decodekit.quant.fp8 import Fp8Weight

from . import reference  # noqa: F401

_ops = torch.ops.decodekit

from ._dispatch import _dense, _has_kernel, _has_kernel_for, _heads, _rows, _rowwise  # noqa: E402,F401
# the CPU's AMX copies of quantized weights (ops/amx_rows.py); the CUDA Marlin kernel's copies (ops/marlin.py)
from .amx_rows import (_amx_rows_copy, int4_amx_rows_available, int4_amx_rows_pack,  # noqa: E402,F401
                       int8_amx_rows_pack, prepare_amx_rows, release_freed_host_memory)
from .marlin import (_MARLIN_MAX_M, MARLIN_MAX_N, _int4_dense_rows, _marlin_mode,  # noqa: E402,F401
                     _marlin_packed_route, int4_gemm_marlin, int4_marlin_dequantize, int4_marlin_pack,
                     int4_marlin_packed, marlin_copy_only, marlin_copy_rows, prepare_marlin)


def rms_norm(x: torch.Tensor,        # [..., hidden]
             weight: torch.Tensor,   # [hidden]
             eps: float = 1e-6,
             out: torch.Tensor | None = None) -> torch.Tensor:  # [..., hidden]
    x = _rowwise(x)
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
    x = _rowwise(x)
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


# --- dense linear layers -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def dense_route(dtype: torch.dtype) -> tuple[int, int, int]:
    """The CPU route of a dense fp32 / bf16 / fp16 projection (include/decodekit/gemm/dense_cpu.h, where the
    measurements behind it are): (dense_min_m, dense_max_m, upcast_min_m): dense_gemm for M rows in
    [dense_min_m, dense_max_m], an fp32 GEMM on upcast operands from upcast_min_m, torch's own GEMM
    otherwise. decoder_layer routes by the same function, so both paths give the same bits."""
    return tuple(_ops.dense_route(dtype))


_DENSE_ROUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dense_prefill_rows_min(dtype: torch.dtype) -> int:
    """Batch invariance (decode_rows >= 0): the fewest rows a dense projection's prompt block runs as (zero rows
    appended), so that every block takes one route: past dense_gemm's rows and from the upcast's threshold, if any
    (include/decodekit/gemm/dense_cpu.h: dense_prefill_rows_min, which decoder_layer uses)."""
    _, hi, up = dense_route(dtype)
    p = max(PREFILL_ROWS_MIN, hi + 1)
    return max(p, up) if up < 2 ** 62 else p


def dense_gemm_takes(x: torch.Tensor) -> bool:   # x: [M, K] activations
    """Whether ops.linear sends x times a dense weight to dense_gemm (CPU, dense_route's rows)."""
    if x.device.type != "cpu" or x.dtype not in _DENSE_ROUTE_DTYPES or x.dim() != 2:
        return False
    lo, hi, _ = dense_route(x.dtype)
    return lo <= x.shape[0] <= hi


def dense_gemm(a: torch.Tensor,                 # [M, K], M <= 64
               weight: torch.Tensor,            # [N, K]
               bias: torch.Tensor | None = None,  # [N]
               out: torch.Tensor | None = None) -> torch.Tensor:  # [M, N]
    a, weight = _rows(a), weight.contiguous()
    if out is None:
        out = torch.empty((a.shape[0], weight.shape[0]), dtype=a.dtype, device=a.device)
    _ops.dense_gemm(out, a, weight, bias)
    return out


# Packed INT4 / INT8 weights on the CPU: int4_gemm / int8_gemm for every M (up to 8 rows weights
# decoded in registers; from 9 each weight panel decoded once to fp32 for a register-blocked fp32
# GEMM, include/decodekit/gemm/int4_tiled.h: bench_quant has it 1.0-2.5x ahead of _packed_dense,
# decode through prefill). On CUDA, rows past the GEMV kernels' limit go to _packed_dense.
_CUDA_QUANT_GEMV_MAX_M = 8  # the CUDA GEMV kernels' limit (include/decodekit/gemm/int4.cuh)


def int4_gemm(a: torch.Tensor,              # [M, K] (row stride free)
              weight: Int4Weight,            # [N, K] packed (scale * q + min per group)
              bias: torch.Tensor | None = None,  # [N]
              out: torch.Tensor | None = None,   # [M, N]
              ) -> torch.Tensor:
    """a @ w^T (+ bias) with w = scale * q + min decoded on the fly (fp32 accumulation)."""
    if weight.perm is not None:  # act-order: the activations gathered into the stored order
        a, weight = a.index_select(1, weight.perm), weight.stored()
    return _quant_gemm(a, weight, bias, out)


def int8_gemm(a: torch.Tensor,              # [M, K] (row stride free)
              weight: Int8Weight,            # [N, K] (GGUF Q8_0: scale * q per group)
              bias: torch.Tensor | None = None,  # [N]
              out: torch.Tensor | None = None,   # [M, N]
              ) -> torch.Tensor:
    """a @ w^T (+ bias), w = scale * q decoded on the fly (fp32 accumulation)."""
    return _quant_gemm(a, weight, bias, out)


def _quant_gemm(a, weight, bias, out, decode_rows: int = -1):
    int8 = isinstance(weight, Int8Weight)
    a = _rows(a)
    if out is None:
        out = torch.empty(a.shape[0], weight.shape[0], dtype=a.dtype, device=a.device)
    if not int8 and marlin_copy_only(weight) is not None:  # held as the CUDA Marlin kernel's copy alone
        return out if marlin_copy_rows(a, weight, bias, out) else _packed_dense(a, weight, bias, out)
    if a.device.type == "cuda" and (not _cuda_quant_kernel(a, weight) or (not int8 and _int4_dense_rows(a))):
        return _packed_dense(a, weight, bias, out)  # past the CUDA kernels' rows, or INT4 prefill-sized rows
    if _has_kernel("int8_gemm" if int8 else "int4_gemm", a.device):
        if int8:
            _ops.int8_gemm(out, a, *weight.operands(), weight.group_size, bias, _amx_rows_copy(weight, a), decode_rows)
        else:
            packed = int4_marlin_packed(weight, a.dtype) if _marlin_packed_route(a) else _amx_rows_copy(weight, a)
            _ops.int4_gemm(out, a, *weight.operands(), weight.group_size, bias, packed, decode_rows)
        return out
    mins = () if int8 else (weight.mins,)
    ref = reference.int8_gemm if int8 else reference.int4_gemm
    out.copy_(ref(a, weight.qweight, weight.scales, *mins, weight.group_size, bias))
    return out


def _cuda_quant_kernel(a, weight) -> bool:
    """Whether a CUDA kernel takes a @ w^T: the GEMV kernels up to 8 rows; INT4 with fp16 / bf16
    activations at any M (the Marlin-style kernel to 64 rows, int4_marlin.cuh, then the mma.sync and CUTLASS
    GEMMs: csrc/cuda/gemm_launch.cpp; _quant_gemm still sends INT4 past 64 rows to _packed_dense unless
    DECODEKIT_INT4_LARGE_M=kernel); the rest decodes chunks (dense)."""
    return _cuda_quant_rows_ok(a.shape[0], a.dtype, isinstance(weight, Int4Weight))


def _cuda_quant_rows_ok(rows: int, dtype: torch.dtype, int4: bool) -> bool:
    return rows <= _CUDA_QUANT_GEMV_MAX_M or (int4 and dtype in (torch.float16, torch.bfloat16))


def _dense_chunk_rows(x: torch.Tensor, K: int) -> int:
    """_packed_dense's rows a chunk: CUDA <= 64 MiB decoded, the CPU a few MB (at least 256 rows)."""
    return max(256, ((64 << 20) // (x.element_size() * K)) if x.device.type == "cuda" else ((4 << 20) // (4 * K)))


def _packed_dense(x, weight, bias, out):
    """x @ w^T for a packed weight decoded a chunk of rows at a time, each chunk through the dense path:
    CPU (no kernel for the shape) a few MB (cache-resident, no whole-weight buffer to allocate and fault
    in); CUDA (INT4 prefill-sized rows, or rows no kernel takes) up to 64 MiB, so that cuBLAS gets a few
    large GEMMs (one for most projections, written straight into out). A weight held as its CUDA Marlin copy
    alone: the chunks decoded from the copy (int4_marlin_dequantize)."""
    N, K = weight.shape
    cuda = x.device.type == "cuda"
    held = marlin_copy_only(weight)
    chunk = _dense_chunk_rows(x, K)
    for n0 in range(0, N, chunk):
        n1 = min(N, n0 + chunk)
        if held is not None:
            w = int4_marlin_dequantize(held.copy, N, K, weight.group_size, n0, n1 - n0).to(x.dtype)
        else:
            part = weight.rows(n0, n1)
            w = int8_dequantize(part, x.dtype) if isinstance(part, Int8Weight) else int4_dequantize(part, x.dtype)
        b = None if bias is None else bias[n0:n1]
        if cuda and n0 == 0 and n1 == N and out.is_contiguous():
            if b is None:
                torch.mm(x, w.t(), out=out)
            else:
                torch.addmm(b, x, w.t(), out=out)
        else:
            out[:, n0:n1] = linear(x, w, b)
    return out


def int4_dequantize(weight: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [N, K]
    """The packed weight decoded to `dtype` (w = scale * q + min in fp32, then rounded), its
    columns in the original input order (act-order weights: un-permuted)."""
    if weight.perm is not None:
        w = int4_dequantize(weight.stored(), dtype)
        out = torch.empty_like(w)
        out[:, weight.perm] = w
        return out
    held = marlin_copy_only(weight)
    if held is not None:
        return int4_marlin_dequantize(held.copy, *weight.shape, weight.group_size).to(dtype)
    if _has_kernel("int4_dequantize", weight.device):
        out = torch.empty(weight.shape, dtype=dtype, device=weight.device)
        _ops.int4_dequantize(out, weight.qweight, weight.scales, weight.mins, weight.group_size)
        return out
    return reference.int4_dequantize(weight.qweight, weight.scales, weight.mins, weight.group_size).to(dtype)


def int8_embedding(ids: torch.Tensor,            # [T] int64
                   weight: Int8Weight,            # [vocab, hidden]
                   dtype: torch.dtype) -> torch.Tensor:  # [T, hidden]
    """Rows `ids` of an INT8 table, decoded (the embedding lookup of a Q8_0 token table)."""
    if _has_kernel("int8_dequantize_rows", weight.device):
        out = torch.empty(ids.shape[0], weight.shape[1], dtype=dtype, device=weight.device)
        held = weight.copy_only  # the weight held only as its AMX copy: the op reads the copy
        _ops.int8_dequantize_rows(out, *weight.operands(), weight.group_size, ids.to(weight.device), held and held.copy)
        return out
    return reference.int8_dequantize(weight.qweight[ids], weight.scales[ids], weight.group_size).to(dtype)


def int8_dequantize(weight: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [N, K]
    """The whole INT8 weight decoded to `dtype` (scale * q, exact in fp32, then rounded)."""
    return int8_embedding(torch.arange(weight.shape[0], device=weight.device), weight, dtype)


@torch.library.register_fake("decodekit::int8_gemm")
def _int8_gemm_fake(out, a, qweight, scales, group_size, bias, packed=None, decode_rows=-1):
    return None


@torch.library.register_fake("decodekit::int8_amx_rows_pack")
def _int8_amx_rows_pack_fake(out, qweight, scales, group_size):
    return None


@torch.library.register_fake("decodekit::int8_dequantize_rows")
def _int8_dequantize_rows_fake(out, qweight, scales, group_size, ids, packed=None):
    return None


@torch.library.register_fake("decodekit::int4_gemm")
def _int4_gemm_fake(out, a, qweight, scales, mins, group_size, bias, packed=None, decode_rows=-1):
    return None


@torch.library.register_fake("decodekit::int4_amx_rows_pack")
def _int4_amx_rows_pack_fake(out, qweight, scales, mins, group_size):
    return None


@torch.library.register_fake("decodekit::int4_dequantize")
def _int4_dequantize_fake(out, qweight, scales, mins, group_size):
    return None


def quantize_fp8(x: torch.Tensor,                 # [M, K] float (row stride free)
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] float8_e4m3fn, [M] float32)
    """Dynamic per-token fp8: scale = max |x_row| / 448, codes = fp8(x / scale) (saturating RNE)."""
    x = _rows(x)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    if _has_kernel("quantize_fp8", x.device):
        _ops.quantize_fp8(q, s, x)
        return q, s
    rq, rs = reference.quantize_fp8(x)
    return q.copy_(rq), s.copy_(rs)


def fp8_gemm(a: torch.Tensor,                     # [M, K] float8_e4m3fn
             a_scale: torch.Tensor,               # [M] float32
             weight: Fp8Weight,                   # [N, K]
             bias: torch.Tensor | None = None,    # [N]
             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [M, N]
    """(a @ w^T) * a_scale[m] * w_scale[n] (+ bias): fp8 x fp8 products, fp32 accumulation."""
    a, a_scale = _dense(a), _dense(a_scale)
    out = torch.empty(a.shape[0], weight.shape[0], dtype=out_dtype, device=a.device)
    if _has_kernel("fp8_gemm", a.device):
        _ops.fp8_gemm(out, a, a_scale, weight.qweight, weight.scales, bias)
        return out
    return out.copy_(reference.fp8_gemm(a, a_scale, weight.qweight, weight.scales, bias, torch.float32))


@torch.library.register_fake("decodekit::quantize_fp8")
def _quantize_fp8_fake(out, scale, input):
    return None


@torch.library.register_fake("decodekit::fp8_gemm")
def _fp8_gemm_fake(out, a, a_scale, weight, w_scale, bias):
    return None


def gumbel_argmax(scores: torch.Tensor,     # [B, V] float32 (row stride free; -inf: never drawn)
                  seeds: torch.Tensor,      # [B] int64
                  positions: torch.Tensor,  # [B] int64
                  stream: int = 0) -> torch.Tensor:  # [B] int64
    """Gumbel-max sampling: argmax_v scores[b, v] + g_v with g_v the Gumbel noise of Philox stream
    ``stream`` at (seeds[b], positions[b], v) (decodekit.sampling.philox; ties -> the lowest v). The
    kernels draw only the keys that can win: the token of drawing every key in their float32
    arithmetic (logf); the torch fallback's log may differ in the last ulp, which can split a key tie
    to ~1e-7."""
    scores, seeds, positions = _rows(scores), _dense(seeds), _dense(positions)
    out = torch.empty(scores.shape[0], dtype=torch.int64, device=scores.device)
    if _has_kernel("gumbel_argmax", scores.device):
        _ops.gumbel_argmax(out, scores, seeds, positions, stream)
        return out
    return out.copy_(reference.gumbel_argmax(scores, seeds, positions, stream))


@torch.library.register_fake("decodekit::gumbel_argmax")
def _gumbel_argmax_fake(out, scores, seeds, positions, stream):
    return None


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:  # [B, V] float32 (row stride free) -> [B] int64
    """The greedy token of each row, torch.argmax(scores, dim=-1)'s rule: ties -> the lowest index, a NaN
    beats everything (the first NaN), -0.0 == +0.0. The CPU kernel (AVX-512, both cores) is ~10x torch's
    CPU argmax over a 49k vocabulary; float32 only (other dtypes: torch.argmax)."""
    if scores.dtype != torch.float32 or scores.dim() != 2 or scores.shape[1] == 0 \
            or not _has_kernel("argmax_rows", scores.device):
        return scores.argmax(dim=-1)
    scores = _rows(scores)
    out = torch.empty(scores.shape[0], dtype=torch.int64, device=scores.device)
    _ops.argmax_rows(out, scores)
    return out


@torch.library.register_fake("decodekit::argmax_rows")
def _argmax_rows_fake(out, scores):
    return None


def sort_desc_stable(x: torch.Tensor,  # [B, V] float32 (row stride free)
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, V] float32, [B, V] int64)
    """torch.sort(x, dim=-1, descending=True, stable=True), bit for bit (ties in position order, NaNs
    first, -0.0 equal to +0.0), by a radix sort on order-preserving integer keys: O(V) per row. The CPU
    sampler's top-p / min-p filters use it for rows that keep thousands of tokens."""
    if _has_kernel("sort_desc_stable", x.device):
        x = _rows(x)
        values = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        indices = torch.empty(x.shape, dtype=torch.int64, device=x.device)
        _ops.sort_desc_stable(values, indices, x)
        return values, indices
    return reference.sort_desc_stable(x)


@torch.library.register_fake("decodekit::sort_desc_stable")
def _sort_desc_stable_fake(values, indices, x):
    return None


def rejection_sample(draft_tokens: torch.Tensor,        # [B, k] int64
                     num_draft: torch.Tensor,           # [B] int32 (0 .. k)
                     draft_probs: torch.Tensor | None,  # [B, k, V] float32 (None: one-hot drafts)
                     target_probs: torch.Tensor,        # [B, k+1, V] float32
                     seeds: torch.Tensor,               # [B] int64
                     positions: torch.Tensor,           # [B] int64: each request's first draft position
                     greedy: bool = False,
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, k+1] int64, [B] int32)
    """Speculative-decoding verification (exact: the emitted tokens follow the target distribution).
    Returns the emitted tokens (-1 after them) and how many each request emitted (1 .. n + 1)."""
    draft_tokens, num_draft, draft_probs, target_probs, seeds, positions = map(
        _dense, (draft_tokens, num_draft, draft_probs, target_probs, seeds, positions))
    B, k = draft_tokens.shape
    dev = draft_tokens.device
    out = torch.empty(B, k + 1, dtype=torch.int64, device=dev)
    n = torch.empty(B, dtype=torch.int32, device=dev)
    if _has_kernel("rejection_sample", dev):
        _ops.rejection_sample(out, n, draft_tokens, num_draft, draft_probs, target_probs, seeds, positions, greedy)
        return out, n
    ro, rn = reference.rejection_sample(draft_tokens.cpu(), num_draft.cpu(), None if draft_probs is None else
                                        draft_probs.cpu(), target_probs.cpu(), seeds.cpu(), positions.cpu(), greedy)
    return out.copy_(ro), n.copy_(rn)


@torch.library.register_fake("decodekit::rejection_sample")
def _rejection_sample_fake(out, num_emitted, draft_tokens, num_draft, draft_probs, target_probs, seeds, positions,
                           greedy):
    return None


# Batch invariance on the CPU (decode_rows >= 0; include/decodekit/gemm/dense_cpu.h: kDecodeRowBlock /
# kPrefillRowsMin): decode-phase rows get the bits they get alone, prompt rows run as one block of at least
# PREFILL_ROWS_MIN rows (zero rows appended) on the many-row kernels. int4_gemm / int8_gemm split the rows themselves;
# fp8 weights here in blocks of DECODE_ROW_BLOCK rows (fp8_gemm's few-row kernel), dense ones in blocks of
# dense_gemm's rows (dense_route) and their prompt rows padded to dense_prefill_rows_min.
DECODE_ROW_BLOCK = 8
PREFILL_ROWS_MIN = 17


def linear(x: torch.Tensor,                      # [M, K]
           weight,                               # [N, K] tensor, or packed: decodekit.quant.Int4Weight / Int8Weight
           bias: torch.Tensor | None = None,     # [N]
           decode_rows: int = -1) -> torch.Tensor:  # [M, N]
    """x @ weight^T + bias (see _linear for the routes). decode_rows: rows [0, decode_rows) are decode-phase rows
    (a decode step's or a verification pass's); -1: none marked. On the CPU, decode_rows >= 0 makes every row's bits
    those it gets in any batch (above; decoder_layer's projections split the same way)."""
    M = x.shape[0] if x.dim() == 2 else 0
    if x.dim() == 2 and not -1 <= decode_rows <= M:
        raise ValueError(f"linear: decode_rows must be in [-1, M = {M}], got {decode_rows}")
    if decode_rows < 0 or x.device.type != "cpu" or M == 0:
        return _linear(x, weight, bias)
    if isinstance(weight, (Int4Weight, Int8Weight)):
        return _linear(x, weight, bias, decode_rows)
    if isinstance(weight, Fp8Weight) or x.dtype not in _DENSE_ROUTE_DTYPES:
        block, prompt_min = DECODE_ROW_BLOCK, PREFILL_ROWS_MIN
    else:
        block, prompt_min = max(1, dense_route(x.dtype)[1]), dense_prefill_rows_min(x.dtype)
    parts = [_linear(x[m0:min(m0 + block, decode_rows)], weight, bias) for m0 in range(0, decode_rows, block)]
    p = M - decode_rows
    if p >= prompt_min:
        parts.append(_linear(x[decode_rows:], weight, bias))
    elif p > 0:
        padded = x.new_zeros(prompt_min, x.shape[1])
        padded[:p] = x[decode_rows:]
        parts.append(_linear(padded, weight, bias)[:p])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _linear(x: torch.Tensor,                      # [M, K]
            weight,                               # [N, K] tensor, or packed: Int4Weight / Int8Weight / Fp8Weight
            bias: torch.Tensor | None = None,
            decode_rows: int = -1) -> torch.Tensor:  # [M, N]; decode_rows: int4_gemm / int8_gemm's
    """x @ weight^T + bias. Packed INT4 / INT8 weights: int4_gemm / int8_gemm (CPU: any M; CUDA: GEMV
    up to 8 rows, INT4 on tensor cores up to 64 rows for fp16/bf16 (the Marlin-style kernel on the packed
    copy), else decoded a chunk at a time and the dense path: cuBLAS); act-order INT4 gathers x's columns first; fp8 weights: W8A8 (quantize_fp8 +
    fp8_gemm). On the CPU in fp32 / bf16 / fp16 the rows decide (dense_route, per CPU): dense_gemm (weights
    widened to fp32 in registers, near memory bandwidth), an fp32 GEMM on upcast operands, or torch's;
    everything else goes to torch (oneDNN/MKL, cuBLAS on CUDA)."""
    if isinstance(weight, Fp8Weight):  # W8A8: activations quantized per token, fp8 GEMM
        q, sc = quantize_fp8(x)
        return fp8_gemm(q, sc, weight, bias, x.dtype)
    if isinstance(weight, Int4Weight) and weight.perm is not None:  # act-order: inputs in the stored order
        x = x.index_select(1, weight.perm)
        weight = weight.stored()
    if isinstance(weight, (Int4Weight, Int8Weight)):
        return _quant_gemm(x, weight, bias, None, decode_rows)  # CUDA past its kernels' rows: _packed_dense
    if dense_gemm_takes(x):
        return dense_gemm(x, weight, bias)
    if (x.device.type == "cpu" and x.dtype in _DENSE_ROUTE_DTYPES and x.dim() == 2
            and x.shape[0] >= dense_route(x.dtype)[2]):  # prefill-sized rows: fp32 on upcast operands
        b = None if bias is None else bias.float()
        return torch.nn.functional.linear(x.float(), weight.float(), b).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


@torch.library.register_fake("decodekit::dense_gemm")
def _dense_gemm_fake(out, a, weight, bias):
    return None


# --- paged KV cache and attention --------------------------------------------------------
# KV cache per layer: K and V each [num_blocks, num_kv_heads, block_size, head_dim].

def kv_cache_dtype_ok(act: torch.dtype, kv: torch.dtype, device: torch.device | str) -> bool:
    """Whether reshape_and_cache / paged_attention take a KV cache of dtype `kv` under activations of dtype
    `act` on `device`: the activations' own dtype, float8_e4m3fn, or on the CPU a bfloat16 / float16 cache
    under float32 (csrc/op_args.h: kv_cache_scales, kv_cache_mixed)."""
    mixed = (torch.device(device).type == "cpu" and act == torch.float32
             and kv in (torch.bfloat16, torch.float16))
    return kv in (act, torch.float8_e4m3fn) or mixed


def reshape_and_cache(key: torch.Tensor,          # [T, Hk, D] (token stride free)
                      value: torch.Tensor,        # [T, Hk, D] (token stride free)
                      key_cache: torch.Tensor,    # [num_blocks, Hk, block_size, D], written in place
                      value_cache: torch.Tensor,  # [num_blocks, Hk, block_size, D], written in place
                      slot_mapping: torch.Tensor,  # [T] int64, < 0 = skip
                      k_scale: torch.Tensor | None = None,  # fp8 cache: [1] or [Hk] float32 (None = 1)
                      v_scale: torch.Tensor | None = None,
                      ) -> None:
    """Writes the new K/V rows into the paged caches; an fp8 (float8_e4m3fn) cache stores
    x / scale saturated to +-448."""
    key, value, slot_mapping = _heads(key), _heads(value), _dense(slot_mapping)
    if _has_kernel("reshape_and_cache", key_cache.device):
        _ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
        return
    kc, vc = reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    key_cache.copy_(kc)
    value_cache.copy_(vc)


def _check_window(op: str, w) -> None:
    """sliding_window: an int (the kernels take 0 .. 2**31 - 1 and say so); a bool is not one."""
    if isinstance(w, bool) or not isinstance(w, int):
        raise ValueError(f"{op}: 'sliding_window' must be an int in [0, 2**31), got {w!r}")


def paged_attention(query: torch.Tensor,            # [T, Hq, D] (token stride free)
                    key_cache: torch.Tensor,        # [num_blocks, Hk, block_size, D]
                    value_cache: torch.Tensor,      # [num_blocks, Hk, block_size, D]
                    block_tables: torch.Tensor,     # [S, max_blocks] int32
                    seq_lens: torch.Tensor,         # [S] int32
                    query_start_loc: torch.Tensor,  # [S + 1] int32
                    scale: float,
                    out: torch.Tensor | None = None,   # [T, Hq, D]
                    lse: torch.Tensor | None = None,   # [T, Hq] float32
                    k_scale: torch.Tensor | None = None,  # fp8 cache: [1] or [Hk] float32 (None = 1)
                    v_scale: torch.Tensor | None = None,
                    sliding_window: int = 0,              # > 0: each token sees its last sliding_window keys
                    ) -> torch.Tensor:
    _check_window("paged_attention", sliding_window)
    query, block_tables, seq_lens, query_start_loc = (_heads(query), _dense(block_tables), _dense(seq_lens),
                                                      _dense(query_start_loc))
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if _has_kernel("paged_attention", query.device):
        _ops.paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                             scale, lse, k_scale, v_scale, sliding_window)
        return out
    o, l = reference.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale,
                                     k_scale, v_scale, sliding_window)
    out.copy_(o)
    if lse is not None:
        lse.copy_(l)
    return out


def copy_blocks(key_caches: list[torch.Tensor],    # per layer [num_blocks, Hk, block_size, D], in place
                value_caches: list[torch.Tensor],  # per layer [num_blocks, Hk, block_size, D], in place
                block_mapping: torch.Tensor,       # [N, 2] int64 (src, dst) on the caches' device
                ) -> None:
    """Copies block src onto block dst in every layer's K and V cache (copy-on-write)."""
    if not key_caches:
        return
    if _has_kernel("copy_blocks", key_caches[0].device):
        _ops.copy_blocks(key_caches, value_caches, block_mapping)
        return
    ks, vs = reference.copy_blocks(key_caches, value_caches, block_mapping)
    for c, n in zip(list(key_caches) + list(value_caches), ks + vs):
        c.copy_(n)


def swap_blocks(src: torch.Tensor,            # [num_src_blocks, ...]
                dst: torch.Tensor,            # [num_dst_blocks, ...] same block shape, written in place
                block_mapping: torch.Tensor,  # [N, 2] int64 (src block, dst block) on the CPU
                ) -> None:
    """Copies blocks between caches on the same or different devices (CPU <-> GPU swap). On
    CUDA the copies are queued on the current stream: synchronize before reading a host dst."""
    dev = dst.device if dst.device.type == "cuda" else src.device
    if _has_kernel("swap_blocks", dev):
        _ops.swap_blocks(src, dst, block_mapping)
        return
    dst.copy_(reference.swap_blocks(src, dst, block_mapping))


@torch.library.register_fake("decodekit::copy_blocks")
def _copy_blocks_fake(key_caches, value_caches, block_mapping):
    return None


@torch.library.register_fake("decodekit::swap_blocks")
def _swap_blocks_fake(src, dst, block_mapping):
    return None


@torch.library.register_fake("decodekit::reshape_and_cache")
def _reshape_and_cache_fake(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None):
    return None


@torch.library.register_fake("decodekit::paged_attention")
def _paged_attention_fake(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, lse=None,
                          k_scale=None, v_scale=None, sliding_window=0):
    return None


# --- custom all-reduce over peer-mapped buffers ------------------------------------------
# Kernels: include/decodekit/comm/allreduce.{h,cuh}. Driver (allocates and maps the buffers, exchanges
# the addresses): decodekit.distributed.custom_allreduce.CustomAllReduce. buffer_ptrs / signal_ptrs:
# [world_size] addresses in this process of every rank's data buffer / Signal block. Collective: every
# rank makes the same calls in the same order.

def custom_all_reduce(inp: torch.Tensor,               # [...] contiguous, nbytes <= buffer_bytes / 4
                      buffer_ptrs: list[int],          # [world_size]
                      signal_ptrs: list[int],          # [world_size]
                      rank: int,
                      buffer_bytes: int,
                      two_shot: bool = False,
                      out: torch.Tensor | None = None,  # [...] like inp (may be inp)
                      ) -> torch.Tensor:
    """Sum over ranks of inp, in rank order (bitwise identical on every rank)."""
    if out is None:
        out = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    _ops.custom_all_reduce(out, inp, list(buffer_ptrs), list(signal_ptrs), rank, buffer_bytes, two_shot)
    return out


def gemm_allreduce(a: torch.Tensor,                     # [M, K] (row stride free)
                   weight,                              # [N, K] this rank's shard: tensor, Int4Weight or Fp8Weight
                   buffer_ptrs: list[int],              # [world_size]
                   signal_ptrs: list[int],              # [world_size]
                   rank: int,
                   buffer_bytes: int,
                   bias: torch.Tensor | None = None,      # [N], added once (by rank 0)
                   residual: torch.Tensor | None = None,  # [M, N] in/out: out + residual
                   norm_weight: torch.Tensor | None = None,  # [N]
                   eps: float = 1e-6,
                   out: torch.Tensor | None = None,       # [M, N]
                   ) -> torch.Tensor:
    """allreduce(a @ weight^T) (+ bias); with residual/norm_weight, fused_add_rms_norm after it. Packed
    weights: gemm_allreduce_int4 (int4_gemm's operands; act-order: a's columns gathered first) or
    gemm_allreduce_fp8 (a quantized per token by quantize_fp8, as ops.linear does)."""
    if out is None:
        out = torch.empty((a.shape[0], weight.shape[0]), dtype=a.dtype, device=a.device)
    comm = (list(buffer_ptrs), list(signal_ptrs), rank, buffer_bytes, residual, norm_weight, eps)
    if isinstance(weight, Fp8Weight):
        q, sc = quantize_fp8(a)
        _ops.gemm_allreduce_fp8(out, q, sc, weight.qweight, weight.scales, bias, *comm)
    elif isinstance(weight, Int4Weight):
        if weight.perm is not None:
            a, weight = a.index_select(1, weight.perm), weight.stored()
        _ops.gemm_allreduce_int4(out, a, weight.qweight, weight.scales, weight.mins, weight.group_size, bias, *comm)
    elif isinstance(weight, torch.Tensor):
        _ops.gemm_allreduce(out, a, weight, bias, *comm)
    else:
        raise TypeError(f"gemm_allreduce: 'weight' must be a tensor, Int4Weight or Fp8Weight, got "
                        f"{type(weight).__name__}")
    return out


def allreduce_signal_bytes() -> int:
    return int(_ops.allreduce_signal_bytes())


def allreduce_init_signal(signal: torch.Tensor,  # [>= allreduce_signal_bytes()] uint8, 128-byte aligned
                          world_size: int, timeout_s: float, epoch: int = 0, diag_ptr: int = 0) -> None:
    """Zeroes a Signal block and writes its header; `epoch` (int64, taken mod 2^64) precedes the first
    call; diag_ptr (CUDA): address of a pinned int64 [4] that a timed-out kernel fills before trapping."""
    _ops.allreduce_init_signal(signal, world_size, timeout_s, epoch, diag_ptr)


def ipc_mem_handle(buf: torch.Tensor) -> torch.Tensor:  # CUDA buf -> [72] uint8 on the CPU
    return _ops.ipc_mem_handle(buf)


def ipc_open(handle: torch.Tensor) -> int:  # [72] uint8 from another process's ipc_mem_handle
    return int(_ops.ipc_open(handle))


def ipc_close(ptr: int) -> None:
    _ops.ipc_close(ptr)


@torch.library.register_fake("decodekit::custom_all_reduce")
def _custom_all_reduce_fake(out, inp, buffer_ptrs, signal_ptrs, rank, buffer_bytes, two_shot):
    return None


@torch.library.register_fake("decodekit::gemm_allreduce")
def _gemm_allreduce_fake(out, a, weight, bias, buffer_ptrs, signal_ptrs, rank, buffer_bytes, residual, norm_weight,
                         eps):
    return None


@torch.library.register_fake("decodekit::gemm_allreduce_int4")
def _gemm_allreduce_int4_fake(out, a, qweight, scales, mins, group_size, bias, buffer_ptrs, signal_ptrs, rank,
                              buffer_bytes, residual, norm_weight, eps):
    return None


@torch.library.register_fake("decodekit::gemm_allreduce_fp8")
def _gemm_allreduce_fp8_fake(out, a, a_scale, weight, w_scale, bias, buffer_ptrs, signal_ptrs, rank, buffer_bytes,
                             residual, norm_weight, eps):
    return None


@torch.library.register_fake("decodekit::allreduce_init_signal")
def _allreduce_init_signal_fake(signal, world_size, timeout_s, epoch, diag_ptr=0):
    return None


@torch.library.register_fake("decodekit::ipc_mem_handle")
def _ipc_mem_handle_fake(buf):
    return torch.empty(72, dtype=torch.uint8, device="cpu")


# One decoder layer / a stack of them per call (models/llama.py's CPU path): ops/layers.py
from .layers import decoder_layer, decoder_layer_workspace_numel, decoder_layers, projection_operands  # noqa: E402,F401
