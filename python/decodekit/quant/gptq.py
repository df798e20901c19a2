"""4-bit GPTQ and AWQ checkpoints <-> Int4Weight.

GPTQ (auto-gptq / gptqmodel safetensors, per linear layer `<name>.qweight`, `.qzeros`, `.scales`,
`.g_idx`), weight W [N, K] (N output features, K input features), group size Gq along K:
  qweight int32 [K/8, N]:   bits 4j..4j+3 of qweight[i, n] = code of W[n, 8i + j]
  qzeros  int32 [Gn, N/8]:  bits 4j..4j+3 of qzeros[g, i]  = zero of group g, column 8i + j
  scales  fp16  [Gn, N]
  g_idx   int32 [K]:        group of input feature k (k // Gq, or any assignment with act-order)
  W[n, k] = scales[g, n] * (code - zero), g = g_idx[k]; checkpoint_format "gptq" (v1, the usual
  one) stores zero - 1, "gptq_v2" the zero itself.
AWQ (AutoAWQ "gemm" version, `<name>.qweight`, `.qzeros`, `.scales`):
  qweight int32 [K, N/8]:   bits 4j..4j+3 of qweight[k, i] = code of W[8i + AWQ_ORDER[j], k]
  qzeros  int32 [K/G, N/8]: the same packing of the zeros; scales fp16 [K/G, N]
  W[n, k] = scales[k // G, n] * (code - zero).

Int4Weight stores w = scale * q + min per group of 32/64/128 contiguous input features, so:
  - min = -(scale * zero), rounded once to fp16 (|error| <= 2^-11 |scale * zero|; the zero is
    recovered exactly: round(-min / scale));
  - groups larger than 128 (or per-channel, group_size -1) are split into groups of 128 (or 64,
    32) sharing the scale and min;
  - act-order (g_idx not k // Gq): the input features are reordered so that each group is
    contiguous, and the weight keeps the order in `perm` (linear gathers x[:, perm] first).
"""
from __future__ import annotations

import torch

from .int4 import Int4Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble j of a word holds column 8i + AWQ_ORDER[j]
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> uint8 [R, 8C]: nibble j of word c is element 8c + j."""
    R, C = packed.shape
    x = (packed.to(torch.int32)[:, :, None] >> _SHIFTS) & 15
    return x.reshape(R, C * 8).to(torch.uint8)


def _pack_cols(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [R, 8C] -> int32 [R, C] (inverse of _unpack_cols; the top nibble wraps to a negative int32)."""
    R, n = codes.shape
    x = codes.to(torch.int64).reshape(R, n // 8, 8) << _SHIFTS.to(torch.int64)
    word = x.sum(dim=2)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def _our_group(group: int) -> int:
    for g in (128, 64, 32):
        if group % g == 0:
            return g
    raise ValueError(f"group size {group} is not a multiple of 32 (decodekit's INT4 groups are 32, 64 or 128)")


def _from_codes(codes: torch.Tensor,   # [N, K] uint8, groups contiguous along K
                scales: torch.Tensor,  # [N, K / group] float
                zeros: torch.Tensor,   # [N, K / group] float (the zero point, in code units)
                group: int, perm: torch.Tensor | None) -> Int4Weight:
    N, K = codes.shape
    G = _our_group(group)
    rep = group // G
    s = scales.float().repeat_interleave(rep, dim=1)
    z = zeros.float().repeat_interleave(rep, dim=1)
    s16 = s.half()
    mins = (-(s16.float() * z)).half()
    q = codes.view(N, K // G, G)
    packed = (q[:, :, : G // 2] | (q[:, :, G // 2:] << 4)).reshape(N, K // 2).contiguous()
    return Int4Weight(packed, s16.contiguous(), mins.contiguous(), G, perm)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def from_gptq(qweight: torch.Tensor,        # [K/8, N] int32
              qzeros: torch.Tensor,         # [Gn, N/8] int32
              scales: torch.Tensor,         # [Gn, N] float16
              g_idx: torch.Tensor | None = None,   # [K] int32 (None: k // group_size)
              group_size: int = 128,        # -1: one group per output row (per-channel)
              checkpoint_format: str = "gptq") -> Int4Weight:
    """A 4-bit GPTQ layer (see the module docstring) as an Int4Weight (act-order: with `perm`)."""
    _check(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           f"GPTQ qweight / qzeros must be int32, got {qweight.dtype} / {qzeros.dtype}")
    _check(checkpoint_format in ("gptq", "gptq_v2"),
           f"GPTQ checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    group = K if group_size == -1 else int(group_size)
    _check(group > 0 and K % group == 0, f"GPTQ group_size {group_size} does not divide in_features {K}")
    Gn = K // group
    _check(tuple(scales.shape) == (Gn, N), f"GPTQ scales: expected shape {(Gn, N)}, got {tuple(scales.shape)}")
    _check(tuple(qzeros.shape) == (Gn, N // 8) and N % 8 == 0,
           f"GPTQ qzeros: expected shape {(Gn, N // 8)} (out_features {N} a multiple of 8), got {tuple(qzeros.shape)}")
    codes = _unpack_cols(qweight.t().contiguous())          # [N, K]  (word i of row n -> inputs 8i..8i+7)
    zeros = _unpack_cols(qzeros).t().float()                 # [N, Gn]
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    perm = None
    if g_idx is not None:
        g = g_idx.to(torch.int64).cpu()
        _check(tuple(g.shape) == (K,), f"GPTQ g_idx: expected shape {(K,)}, got {tuple(g.shape)}")
        _check(bool(((g >= 0) & (g < Gn)).all()), f"GPTQ g_idx values must lie in [0, {Gn})")
        if not torch.equal(g, torch.arange(K) // group):  # act-order: make every group contiguous
            _check(bool((torch.bincount(g, minlength=Gn) == group).all()),
                   f"GPTQ g_idx: every group must hold exactly {group} input features")
            perm = torch.argsort(g, stable=True)
            codes = codes[:, perm]
    return _from_codes(codes, scales.t(), zeros, group, perm)


def _scales_zeros(w: Int4Weight, group_size: int | None, zmin: int, zmax: int, who: str):
    """(group, scales [N, K/group], integer zeros [N, K/group]) of w in a checkpoint's group (default
    w's own; a multiple of it dividing K), checking mins == -scale * zero with zero in zmin..zmax."""
    K, G = w.shape[1], w.group_size
    group = group_size or G
    _check(group % G == 0 and K % group == 0, f"{who}: group_size {group} is not a multiple of {G} dividing {K}")
    rep = group // G
    s = w.scales.float().cpu()[:, ::rep]
    z = torch.round(-w.mins.float().cpu()[:, ::rep] / s)
    _check(bool(((z >= zmin) & (z <= zmax)).all()),
           f"{who}: mins are not -scale * zero with zero in {zmin}..{zmax}")
    return group, s, z


def to_gptq(w: Int4Weight, group_size: int | None = None) -> dict[str, torch.Tensor]:
    """Int4Weight -> {"qweight", "qzeros", "scales", "g_idx"} in the GPTQ v1 format (inverse of
    from_gptq for weights it made; group_size: the GPTQ group, default the weight's own). The
    weight's mins must be -scale * zero with an integer zero in 1..16."""
    K = w.shape[1]
    group, s, z = _scales_zeros(w, group_size, 1, 16, "to_gptq")
    codes = w.codes().cpu()
    if w.perm is not None:
        inv = torch.empty_like(w.perm)
        inv[w.perm] = torch.arange(K, device=w.perm.device)
        codes = codes[:, inv.cpu()]
        g_idx = torch.empty(K, dtype=torch.int32)
        g_idx[w.perm.cpu()] = (torch.arange(K) // group).to(torch.int32)
    else:
        g_idx = (torch.arange(K) // group).to(torch.int32)
    return {"qweight": _pack_cols(codes).t().contiguous(),               # [K/8, N]
            "qzeros": _pack_cols((z - 1).t().to(torch.uint8)),         # [K/group, N/8]
            "scales": s.t().half().contiguous(),                       # [K/group, N]
            "g_idx": g_idx}


def from_awq(qweight: torch.Tensor,   # [K, N/8] int32
             qzeros: torch.Tensor,    # [K/G, N/8] int32
             scales: torch.Tensor,    # [K/G, N] float16
             group_size: int = 128) -> Int4Weight:
    """A 4-bit AWQ (GEMM) layer (see the module docstring) as an Int4Weight."""
    _check(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           f"AWQ qweight / qzeros must be int32, got {qweight.dtype} / {qzeros.dtype}")
    K, N = qweight.shape[0], qweight.shape[1] * 8
    group = K if group_size == -1 else int(group_size)
    _check(group > 0 and K % group == 0, f"AWQ group_size {group_size} does not divide in_features {K}")
    Gn = K // group
    _check(tuple(scales.shape) == (Gn, N), f"AWQ scales: expected shape {(Gn, N)}, got {tuple(scales.shape)}")
    _check(tuple(qzeros.shape) == (Gn, N // 8), f"AWQ qzeros: expected shape {(Gn, N // 8)}, got {tuple(qzeros.shape)}")
    order = torch.tensor(AWQ_ORDER)
    inv = torch.argsort(order)  # position j of the nibbles holds column AWQ_ORDER[j]
    def cols(p):  # int32 [R, N/8] -> uint8 [R, N] in column order
        x = _unpack_cols(p).view(p.shape[0], -1, 8)
        return x[:, :, inv].reshape(p.shape[0], -1)
    codes = cols(qweight).t().contiguous()  # [N, K]
    zeros = cols(qzeros).t().float()        # [N, Gn]
    return _from_codes(codes, scales.t(), zeros, group, None)


def to_awq(w: Int4Weight, group_size: int | None = None) -> dict[str, torch.Tensor]:
    """Int4Weight (no act-order) -> {"qweight", "qzeros", "scales"} in the AWQ GEMM format
    (inverse of from_awq); mins must be -scale * zero with an integer zero in 0..15."""
    _check(w.perm is None, "to_awq: AWQ has no act-order")
    _, s, z = _scales_zeros(w, group_size, 0, 15, "to_awq")
    order = list(AWQ_ORDER)
    def pack(x):  # uint8 [R, N] -> int32 [R, N/8]
        return _pack_cols(x.view(x.shape[0], -1, 8)[:, :, order].reshape(x.shape[0], -1))
    return {"qweight": pack(w.codes().cpu().t().contiguous()),
            "qzeros": pack(z.t().to(torch.uint8).contiguous()),
            "scales": s.t().half().contiguous()}
