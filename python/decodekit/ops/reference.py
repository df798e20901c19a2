"""Pure-PyTorch semantics of every decodekit op: the test oracle and the benchmark peer.

Each function returns new tensors (no mutation) and computes in float32 unless the
caller passes float64 inputs, which is how tests build an exact oracle. The compiled
kernels must match these to within the per-dtype tolerance in tests/conftest.py.
"""
from __future__ import annotations

import functools
import math

import torch


def rms_norm(x: torch.Tensor,       # [..., hidden]
             weight: torch.Tensor,  # [hidden]
             eps: float) -> torch.Tensor:  # [..., hidden]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(acc)
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * inv * weight.to(acc)).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor,         # [..., hidden]
                       residual: torch.Tensor,  # [..., hidden]
                       weight: torch.Tensor,    # [hidden]
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual) where new_residual = x + residual (summed in fp32)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    z = x.to(acc) + residual.to(acc)
    inv = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    return (z * inv * weight.to(acc)).to(x.dtype), z.to(residual.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [..., 2d] -> [..., d]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    d = x.shape[-1] // 2
    xf = x.to(acc)
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def dense_gemm(a: torch.Tensor,               # [M, K]
               weight: torch.Tensor,          # [N, K]
               bias: torch.Tensor | None = None) -> torch.Tensor:  # [M, N]
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    out = a.to(acc) @ weight.to(acc).t()
    if bias is not None:
        out = out + bias.to(acc)
    return out.to(a.dtype)


def rope_inv_freq(rot_dim: int, theta: float, scaling: dict | None = None,
                  context_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies [rot_dim // 2] in float64, with optional Llama-3 scaling.

    scaling: {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} as in a Llama-3.1 config.json; or "linear"
    ({"factor"}); or "yarn" ({"factor", "original_max_position_embeddings"}, optional "beta_fast" (32),
    "beta_slow" (1), "truncate" (true): YaRN's blend of interpolated and extrapolated frequencies, as
    transformers computes it; its attention factor scales the cos | sin table: rope_attention_factor); or
    "longrope" (Phi-3: {"short_factor", "long_factor" (rot_dim // 2 divisors each),
    "original_max_position_embeddings"}): the long factors when context_len (a sequence's length) exceeds
    the original context, else the short ones (transformers' rule; rope_cos_sin_cache holds both sets).
    None or {"rope_type": "default"} means plain RoPE.
    """
    inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled)
    if kind == "yarn":
        factor = float(scaling["factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

        def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` turns in old_len
            return rot_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = dim_of(beta_fast), dim_of(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rot_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolate = 1 - ramp      # 1: the original frequency (high frequencies), 0: interpolated by factor
        return inv / factor * (1 - extrapolate) + inv * extrapolate
    if kind == "longrope":
        long = context_len is not None and context_len > int(scaling["original_max_position_embeddings"])
        ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
        if ext.shape != inv.shape:
            raise ValueError(f"rope_scaling {'long' if long else 'short'}_factor has {ext.numel()} entries, the "
                             f"rotary dimension {rot_dim} has {inv.numel()} frequencies")
        return inv / ext
    raise ValueError(f"rope scaling type {kind!r} is not supported (allowed: default, linear, llama3, yarn, "
                     f"longrope)")


def rope_attention_factor(scaling: dict | None) -> float:
    """The factor YaRN scales cos and sin by (so q.k by its square): attention_factor, or from the factor and
    mscale / mscale_all_dim as transformers derives it (0.1 * m * ln(factor) + 1); LongRoPE's: attention_factor,
    or sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) for a factor > 1 (short and long sets alike);
    1 for other scalings."""
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind == "longrope":
        if scaling.get("attention_factor") is not None:
            return float(scaling["attention_factor"])
        factor, old = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
    if kind != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale(float(m)) / mscale(float(m_all)) if m and m_all else mscale(1.0)


def rope_cos_sin_cache(max_position: int, rot_dim: int, theta: float,
                       scaling: dict | None = None,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [max_position (x 2), rot_dim]
    """cos | sin table for rotary_embedding, computed in float64 then rounded once (YaRN, LongRoPE: times their
    attention factor, as transformers scales its cos and sin).

    LongRoPE: 2 x max_position rows. Row p < max_position: position p with the short factors below the
    original context and the long ones from it; row max_position + p: position p with the long factors.
    Transformers takes the long factors for a forward whose sequence is longer than the original context:
    a sequence that fits it reads the first half, a longer one the second (LlamaModel.rope_long_for)."""
    pos = torch.arange(max_position, dtype=torch.float64)[:, None]
    if is_longrope(scaling):
        orig = int(scaling["original_max_position_embeddings"])
        short, long = (rope_inv_freq(rot_dim, theta, scaling, c) for c in (orig, orig + 1))
        ang = torch.cat([torch.where(pos < orig, pos * short, pos * long), pos * long])
    else:
        ang = pos * rope_inv_freq(rot_dim, theta, scaling)[None, :]
    return (torch.cat([ang.cos(), ang.sin()], dim=-1) * rope_attention_factor(scaling)).to(dtype)


def is_longrope(scaling: dict | None) -> bool:
    return (scaling or {}).get("rope_type", (scaling or {}).get("type")) == "longrope"


def _rope_one(x: torch.Tensor,      # [T, H, D]
              cs: torch.Tensor,     # [T, rot_dim]
              is_neox: bool) -> torch.Tensor:
    rot = cs.shape[-1]
    half = rot // 2
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    xr = x[..., :rot]
    if is_neox:
        x1, x2 = xr[..., :half], xr[..., half:]
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        out = torch.cat([o1, o2], dim=-1)
    else:
        out = torch.stack([o1, o2], dim=-1).flatten(-2)
    return torch.cat([out, x[..., rot:]], dim=-1)


def rotary_embedding(positions: torch.Tensor,        # [T] int64
                     query: torch.Tensor,            # [T, Hq * D] or [T, Hq, D]
                     key: torch.Tensor | None,       # [T, Hk * D] or [T, Hk, D]
                     cos_sin_cache: torch.Tensor,    # [max_position, rot_dim]
                     head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    cs = cos_sin_cache[positions].to(acc)

    def apply(t):
        if t is None:
            return None
        shaped = t.reshape(t.shape[0], -1, head_size).to(acc)
        return _rope_one(shaped, cs, is_neox).reshape(t.shape).to(t.dtype)

    return apply(query), apply(key)


# --- paged KV cache and attention --------------------------------------------------------
# KV cache layout (one tensor each for K and V, per layer):
#   [num_blocks, num_kv_heads, block_size, head_dim]   ("HND": a block of one head is contiguous)
# A slot is block * block_size + offset; slot_mapping < 0 marks padding (skipped).


FP8_E4M3_MAX = 448.0


def _scale_rows(scale: torch.Tensor | None, num_kv_heads: int, like: torch.Tensor) -> torch.Tensor:
    """An fp8 cache's scale (None = 1; [1] per tensor or [Hk] per KV head) as [Hk, 1, 1]-broadcastable."""
    if scale is None:
        return torch.ones(num_kv_heads, 1, 1, dtype=torch.float32, device=like.device)
    return scale.float().reshape(-1, 1, 1).expand(num_kv_heads, 1, 1).to(like.device)


def quantize_fp8_kv(x: torch.Tensor,              # [..., Hk, D]
                    scale: torch.Tensor | None,   # [1] or [Hk] float32, or None (= 1)
                    ) -> torch.Tensor:            # [..., Hk, D] float8_e4m3fn
    """x / scale in float32, saturated to +-448, rounded to nearest even (NaN stays NaN)."""
    Hk = x.shape[-2]
    return _to_fp8(x, _scale_rows(scale, Hk, x)[:, :, 0])  # scale [Hk, 1]


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8(x / scale): fp32 division, saturated to +-448, round to nearest even (common/fp8.h)."""
    return (x.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize_cache(cache: torch.Tensor,         # [num_blocks, Hk, block_size, D]
                     scale: torch.Tensor | None,  # fp8 cache: [1] or [Hk] float32, or None (= 1)
                     dtype: torch.dtype) -> torch.Tensor:
    """The cache's values as `dtype` (fp8: float(q) * scale, computed in `dtype`)."""
    if cache.dtype != torch.float8_e4m3fn:
        return cache.to(dtype)
    s = _scale_rows(scale, cache.shape[1], cache).to(dtype)  # [Hk, 1, 1]
    return cache.to(dtype) * s


def reshape_and_cache(key: torch.Tensor,          # [T, Hk, D]
                      value: torch.Tensor,        # [T, Hk, D]
                      key_cache: torch.Tensor,    # [num_blocks, Hk, block_size, D]
                      value_cache: torch.Tensor,  # [num_blocks, Hk, block_size, D]
                      slot_mapping: torch.Tensor,  # [T] int64
                      k_scale: torch.Tensor | None = None,  # fp8 cache: [1] or [Hk] float32
                      v_scale: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns copies of the caches with the new rows written at slot_mapping (an fp8 cache
    stores quantize_fp8_kv(row, scale))."""
    kc, vc = key_cache.clone(), value_cache.clone()
    bs = kc.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blk, off = slots // bs, slots % bs
    if kc.dtype == torch.float8_e4m3fn:
        kc[blk, :, off] = quantize_fp8_kv(key[keep], k_scale)
        vc[blk, :, off] = quantize_fp8_kv(value[keep], v_scale)
    else:
        kc[blk, :, off] = key[keep].to(kc.dtype)
        vc[blk, :, off] = value[keep].to(vc.dtype)
    return kc, vc


def paged_attention(query: torch.Tensor,            # [T, Hq, D], all sequences' new tokens packed
                    key_cache: torch.Tensor,        # [num_blocks, Hk, block_size, D]
                    value_cache: torch.Tensor,      # [num_blocks, Hk, block_size, D]
                    block_tables: torch.Tensor,     # [S, max_blocks] int32
                    seq_lens: torch.Tensor,         # [S] context length incl. the new tokens
                    query_start_loc: torch.Tensor,  # [S + 1] cumulative new-token counts
                    scale: float,
                    k_scale: torch.Tensor | None = None,  # fp8 cache: [1] or [Hk] float32
                    v_scale: torch.Tensor | None = None,
                    sliding_window: int = 0,
                    ) -> tuple[torch.Tensor, torch.Tensor]:  # out [T, Hq, D], lse [T, Hq]
    """Causal attention of each sequence's new tokens over its cached context.

    Sequence s owns query rows [query_start_loc[s], query_start_loc[s+1]); its n new
    tokens sit at positions seq_lens[s] - n .. seq_lens[s] - 1 and are already in the
    cache. Query i attends to keys 0 .. p = seq_lens[s] - n + i, or with sliding_window
    W > 0 to keys max(0, p - W + 1) .. p only (transformers' sliding mask: key > p - W; the
    table's blocks before that are not read). Computed in float32 (or float64 for float64
    inputs); lse is the natural-log sum of exp(scaled scores). An fp8 cache is read as
    float(q) * k_scale / v_scale.
    """
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or not 0 <= sliding_window < 2**31:
        raise ValueError(f"paged_attention: 'sliding_window' must be an int in [0, 2**31), got {sliding_window!r}")
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    T, Hq, D = query.shape
    Hk, bs = key_cache.shape[1], key_cache.shape[2]
    group = Hq // Hk
    out = torch.zeros(T, Hq, D, dtype=acc, device=query.device)
    lse = torch.full((T, Hq), float("-inf"), dtype=acc, device=query.device)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s in range(len(lens)):
        q0, q1, ctx = qsl[s], qsl[s + 1], lens[s]
        n = q1 - q0
        if n == 0:
            continue
        nb = (ctx + bs - 1) // bs
        # keys from the first new token's window on (its blocks; the table's earlier entries are not read)
        b0 = max(0, ctx - n - sliding_window + 1) // bs if sliding_window > 0 else 0
        k0 = b0 * bs
        blocks = block_tables[s, b0:nb].long()
        shape = (Hk, (nb - b0) * bs, D)
        k = dequantize_cache(key_cache[blocks], k_scale, acc).permute(1, 0, 2, 3).reshape(shape)[:, :ctx - k0]
        v = dequantize_cache(value_cache[blocks], v_scale, acc).permute(1, 0, 2, 3).reshape(shape)[:, :ctx - k0]
        k = k.repeat_interleave(group, dim=0)  # [Hq, ctx - k0, D]
        v = v.repeat_interleave(group, dim=0)
        q = query[q0:q1].to(acc).transpose(0, 1)  # [Hq, n, D]
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hq, n, ctx - k0]
        qpos = torch.arange(ctx - n, ctx, device=query.device)[:, None]
        kpos = torch.arange(k0, ctx, device=query.device)[None, :]
        mask = kpos > qpos
        if sliding_window > 0:
            mask |= kpos <= qpos - sliding_window
        scores = scores.masked_fill(mask, float("-inf"))
        m = torch.logsumexp(scores, dim=-1, keepdim=True)  # [Hq, n, 1]
        p = torch.exp(scores - m)
        out[q0:q1] = torch.matmul(p, v).transpose(0, 1)
        lse[q0:q1] = m[..., 0].transpose(0, 1)
    return out.to(query.dtype), lse


def copy_blocks(key_caches: list[torch.Tensor],    # per layer [num_blocks, ...]
                value_caches: list[torch.Tensor],  # per layer [num_blocks, ...]
                block_mapping: torch.Tensor,       # [N, 2] int64 (src, dst)
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Copies of the caches with block src copied onto block dst for every pair (all pairs read
    the original contents, so a destination may also be a source). A destination given two
    different sources is a ValueError."""
    src, dst = block_mapping[:, 0].long().cpu(), block_mapping[:, 1].long().cpu()
    pairs = {}
    for s_, d_ in zip(src.tolist(), dst.tolist()):
        if pairs.setdefault(d_, s_) != s_:
            raise ValueError(f"copy_blocks: 'block_mapping' copies blocks {pairs[d_]} and {s_} onto the same "
                             f"destination block {d_} (each destination must have one source)")
    outs = ([], [])
    for caches, out in ((key_caches, outs[0]), (value_caches, outs[1])):
        for c in caches:
            n = c.clone()
            n[dst.to(c.device)] = c[src.to(c.device)]
            out.append(n)
    return outs


def swap_blocks(src: torch.Tensor,            # [num_src_blocks, ...]
                dst: torch.Tensor,            # [num_dst_blocks, ...] same block shape
                block_mapping: torch.Tensor,  # [N, 2] int64
                ) -> torch.Tensor:
    """A copy of dst with block mapping[i, 1] replaced by src's block mapping[i, 0]."""
    out = dst.clone()
    m = block_mapping.long().cpu()
    out[m[:, 1].to(dst.device)] = src[m[:, 0].to(src.device)].to(dst.device)
    return out


def int4_dequantize(qweight: torch.Tensor,  # [N, K/2] uint8 (group-split nibbles)
                    scales: torch.Tensor,   # [N, K/G] float16
                    mins: torch.Tensor,     # [N, K/G] float16
                    group_size: int) -> torch.Tensor:  # [N, K] float32
    """w = scale * q + min in float32 (scale * q is exact, so one rounding), see
    include/decodekit/gemm/int4.h for the nibble order."""
    N, half = qweight.shape
    codes = _int4_codes(qweight, group_size).float()               # [N, K/G, G]
    return (codes * scales.float()[:, :, None] + mins.float()[:, :, None]).reshape(N, 2 * half)


def _int4_codes(qweight: torch.Tensor, group_size: int) -> torch.Tensor:  # [N, K/G, G] uint8
    """The 4-bit codes per group in element order (int4.h: byte i of a group holds elements i and i + G/2)."""
    N, half = qweight.shape
    q = qweight.view(N, 2 * half // group_size, group_size // 2)
    return torch.cat([q & 15, q >> 4], dim=2)


def int4_gemm(a: torch.Tensor,            # [M, K]
              qweight: torch.Tensor,      # [N, K/2] uint8
              scales: torch.Tensor,       # [N, K/G] float16
              mins: torch.Tensor,         # [N, K/G] float16
              group_size: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # [M, N] in a's dtype (float64 for float64 a)
    w = int4_dequantize(qweight, scales, mins, group_size).to(a.dtype)
    out = a @ w.T
    return out if bias is None else out + bias.to(out.dtype)


# ---- the CPU's repacked INT4 copy for int4_gemm's 1..16-row AMX kernel (include/decodekit/gemm/amx_rows_layout.h)

def amx_rows_strips(n: int) -> int:
    return -(-n // 32) * 2


def amx_rows_packed_bytes(n: int, k: int, group_size: int) -> int:
    S = amx_rows_strips(n)
    return S * (k // 32) * 256 + 2 * S * (k // group_size) * 32


def int4_amx_rows_pack(qweight: torch.Tensor,  # [N, K/2] uint8 (int4.h's layout)
                       scales: torch.Tensor,   # [N, K/G] float16
                       mins: torch.Tensor,     # [N, K/G] float16
                       group_size: int,
                       ) -> torch.Tensor:      # [amx_rows_packed_bytes(N, K, G)] uint8
    """Strips of 16 weight rows (an even number, zero rows past N) x blocks of 32 features: 256 bytes each,
    byte p = tile byte p | tile byte 256 + p << 4, tile byte 64 j + 4 n + i = q[16 s + n][32 b + 4 j + i];
    then scales, then mins as [strips][K / G][16] float16."""
    N, half = qweight.shape
    K, G = 2 * half, group_size
    S, nb = amx_rows_strips(N), K // 32
    q = torch.zeros(S * 16, K, dtype=torch.uint8)
    q[:N] = _int4_codes(qweight.cpu(), G).reshape(N, K)
    tile = q.view(S, 16, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(S, nb, 512)  # [s][b][j][n][i]
    codes = (tile[:, :, :256] | (tile[:, :, 256:] << 4)).reshape(-1)
    parts = [codes]
    for t in (scales, mins):
        v = torch.zeros(S * 16, K // G, dtype=torch.float16)
        v[:N] = t.cpu()
        parts.append(v.view(S, 16, K // G).permute(0, 2, 1).reshape(-1).view(torch.uint8))
    return torch.cat(parts).to(qweight.device)


def int4_amx_rows_unpack(packed: torch.Tensor,  # [amx_rows_packed_bytes(n, k, G)] uint8
                         n: int, k: int, group_size: int,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # qweight [n, k/2], scales, mins
    """The inverse of int4_amx_rows_pack: int4.h's qweight (group-split nibbles), scales / mins [n, k/G] float16."""
    G, S, nb = group_size, amx_rows_strips(n), k // 32
    p = packed.cpu()
    cb, sb = S * nb * 256, S * (k // G) * 32
    codes = p[:cb].view(S, nb, 256)
    tile = torch.cat([codes & 15, codes >> 4], dim=2)  # [s][b][512] B-tile bytes
    q = tile.view(S, nb, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(S * 16, k)[:n]
    q = q.view(n, k // G, 2, G // 2)  # within a group: low nibbles are the first half
    qweight = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2)
    parts = [p[cb + i * sb:cb + (i + 1) * sb].view(torch.float16).view(S, k // G, 16).permute(0, 2, 1)
             .reshape(S * 16, k // G)[:n] for i in range(2)]
    return qweight.contiguous().to(packed.device), parts[0].contiguous(), parts[1].contiguous()


def amx_rows_int8_packed_bytes(n: int, k: int, group_size: int) -> int:
    S = amx_rows_strips(n)
    return S * (k // 32) * 512 + S * (k // group_size) * 32


def int8_amx_rows_pack(qweight: torch.Tensor,  # [N, K] int8
                       scales: torch.Tensor,   # [N, K/G] float16
                       group_size: int,
                       ) -> torch.Tensor:      # [amx_rows_int8_packed_bytes(N, K, G)] uint8
    """Strips of 16 rows x blocks of 32 features, 512 bytes each: byte 64 j + 4 n + i = q[16 s + n][32 b + 4 j + i];
    then scales as [strips][K / G][16] float16 (zero rows past N)."""
    N, K = qweight.shape
    G, S, nb = group_size, amx_rows_strips(N), K // 32
    q = torch.zeros(S * 16, K, dtype=torch.int8)
    q[:N] = qweight.cpu()
    codes = q.view(S, 16, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(-1).view(torch.uint8)
    v = torch.zeros(S * 16, K // G, dtype=torch.float16)
    v[:N] = scales.cpu()
    return torch.cat([codes, v.view(S, 16, K // G).permute(0, 2, 1).reshape(-1).view(torch.uint8)]).to(qweight.device)


def int8_amx_rows_unpack(packed: torch.Tensor,  # [amx_rows_int8_packed_bytes(n, k, G)] uint8
                         n: int, k: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:  # qweight, scales
    """The inverse of int8_amx_rows_pack: qweight [n, k] int8, scales [n, k/G] float16."""
    G, S, nb = group_size, amx_rows_strips(n), k // 32
    p = packed.cpu()
    cb = S * nb * 512
    q = p[:cb].view(torch.int8).view(S, nb, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(S * 16, k)[:n]
    sc = p[cb:].view(torch.float16).view(S, k // G, 16).permute(0, 2, 1).reshape(S * 16, k // G)[:n]
    return q.contiguous().to(packed.device), sc.contiguous()


# ---- the packed layout of the CUDA Marlin-style INT4 kernel (include/decodekit/gemm/int4_marlin_pack.h)

MARLIN_UNIT = 128  # output and input features of a unit


def int4_marlin_unit_bytes(group_size: int) -> int:
    return MARLIN_UNIT * MARLIN_UNIT // 2 + 4 * MARLIN_UNIT * (MARLIN_UNIT // group_size)


def int4_marlin_packed_bytes(n: int, k: int, group_size: int) -> int:
    return -(-n // MARLIN_UNIT) * -(-k // MARLIN_UNIT) * int4_marlin_unit_bytes(group_size)


@functools.lru_cache(maxsize=1)
def _marlin_code_src() -> torch.Tensor:  # [8192] int64: row * 64 + byte of packed code byte i
    i = torch.arange(MARLIN_UNIT * MARLIN_UNIT // 2)
    w, t, lane, c, j = i >> 11, (i >> 9) & 3, (i >> 4) & 31, (i >> 2) & 3, i & 3
    row = w * 32 + 8 * t + (lane >> 2)
    byte = 16 * c + 2 * (lane & 3) + 8 * (j & 1) + (j >> 1)
    return row * 64 + byte


def int4_marlin_pack(qweight: torch.Tensor,  # [N, K/2] uint8 (int4.h's layout)
                     scales: torch.Tensor,   # [N, K/G] float16
                     mins: torch.Tensor,     # [N, K/G] float16
                     group_size: int,
                     dtype: torch.dtype,     # the activations' type: float16 / bfloat16
                     ) -> torch.Tensor:      # [int4_marlin_packed_bytes / 2] of dtype
    """Units of 128 x 128 (k-fastest per 128-row column), each its 8192 code bytes in the kernel's lane
    order, then its (scale, min) pairs [128 / G][128 rows] in dtype; rows past N / features past K zero."""
    N, half = qweight.shape
    K, G, U = 2 * half, group_size, MARLIN_UNIT
    nt, kt, gu = -(-N // U), -(-K // U), U // G
    q = torch.zeros(nt * U, kt * U // 2, dtype=torch.uint8)
    q[:N, :half] = qweight.cpu()
    codes = q.view(nt, U, kt, U // 2).permute(0, 2, 1, 3).reshape(nt, kt, -1)[:, :, _marlin_code_src()]
    pairs = torch.zeros(nt * U, kt * gu, 2, dtype=torch.int16)
    for j, t in enumerate((scales, mins)):
        pairs[:N, :K // G, j] = t.cpu().to(dtype).view(torch.int16)
    pairs = pairs.view(nt, U, kt, gu, 2).permute(0, 2, 3, 1, 4).reshape(nt, kt, -1).view(torch.uint8)
    return torch.cat([codes, pairs], dim=2).reshape(-1).view(dtype).to(qweight.device)


def int4_marlin_unpack(packed: torch.Tensor,  # [int4_marlin_packed_bytes / 2] float16 / bfloat16
                       n: int, k: int, group_size: int,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # qweight, scales, mins (packed's dtype)
    """The inverse of int4_marlin_pack: qweight [n, k/2] uint8, scales / mins [n, k/G] in packed's dtype."""
    G, U = group_size, MARLIN_UNIT
    nt, kt, gu = -(-n // U), -(-k // U), U // G
    units = packed.cpu().view(torch.uint8).view(nt, kt, int4_marlin_unit_bytes(G))
    q = torch.empty(nt, kt, U * U // 2, dtype=torch.uint8)
    q[:, :, _marlin_code_src()] = units[:, :, :U * U // 2]
    qweight = q.view(nt, kt, U, U // 2).permute(0, 2, 1, 3).reshape(nt * U, kt * U // 2)[:n, :k // 2]
    pairs = units[:, :, U * U // 2:].contiguous().view(torch.int16).view(nt, kt, gu, U, 2).permute(0, 3, 1, 2, 4)
    pairs = pairs.reshape(nt * U, kt * gu, 2)[:n, :k // G].view(packed.dtype)
    return qweight.contiguous(), pairs[:, :, 0].contiguous(), pairs[:, :, 1].contiguous()


def _round_once(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 -> dtype (float16 / bfloat16) rounded once to nearest even (torch rounds through float32: twice):
    to float32 with round-to-odd, whose spare bits keep the second rounding exact."""
    f = w.float()
    inexact = f.double() != w
    u = f.view(torch.int32)
    u = torch.where(inexact & (f.double().abs() > w.abs()), u - 1, u)  # toward zero: the truncation
    return torch.where(inexact, u | 1, u).view(torch.float32).to(dtype)


def int4_marlin_dequantize(packed: torch.Tensor,  # [int4_marlin_packed_bytes / 2] float16 / bfloat16
                           n: int, k: int, group_size: int,
                           row0: int = 0, rows: int | None = None,
                           ) -> torch.Tensor:  # [rows, k] of packed's dtype
    """Rows [row0, row0 + rows) of the weight held in `packed`: w = round_T(s_T * q + m_T), rounded once (the
    Marlin-style kernel's fused multiply-add in T; q s + m is exact in float64)."""
    rows = n - row0 if rows is None else rows
    qweight, s, m = int4_marlin_unpack(packed, n, k, group_size)
    r = slice(row0, row0 + rows)
    codes = _int4_codes(qweight[r], group_size).double()
    w = (codes * s[r].double()[:, :, None] + m[r].double()[:, :, None]).reshape(rows, k)
    return _round_once(w, packed.dtype).to(packed.device)


def int4_gemm_marlin(a: torch.Tensor,       # [M, K] float16 / bfloat16 (or float64: the oracle, weights as below)
                     packed: torch.Tensor,  # [int4_marlin_packed_bytes / 2] float16 / bfloat16
                     n: int, k: int, group_size: int,
                     bias: torch.Tensor | None = None) -> torch.Tensor:  # [M, N] in a's dtype
    """a @ w^T with w = round_T(s_T * q + m_T) (T = packed's dtype: the kernel's one fused multiply-add)."""
    w = int4_marlin_dequantize(packed, n, k, group_size)
    out = a @ w.to(device=a.device, dtype=a.dtype).T
    return out if bias is None else out + bias.to(out.dtype)


def int8_dequantize(qweight: torch.Tensor,  # [N, K] int8
                    scales: torch.Tensor,   # [N, K/G] float16
                    group_size: int) -> torch.Tensor:  # [N, K] float32: scale * q (exact)
    N, K = qweight.shape
    return (qweight.float().view(N, K // group_size, group_size) * scales.float()[:, :, None]).reshape(N, K)


def int8_gemm(a: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:  # [M, N] in a's dtype
    out = a @ int8_dequantize(qweight, scales, group_size).to(a.dtype).T
    return out if bias is None else out + bias.to(out.dtype)


# ---- fp8 e4m3 W8A8 (include/decodekit/gemm/fp8_gemm.h)

def fp8_dynamic_scale(amax: torch.Tensor) -> torch.Tensor:  # float32
    """amax / 448 (amax > 0), 1 for amax == 0, NaN for NaN: the scale that maps amax to 448."""
    amax = amax.float()
    return torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.where(amax == 0, torch.ones_like(amax), amax))


def quantize_fp8(x: torch.Tensor                     # [M, K]
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] float8_e4m3fn, [M] float32)
    """Per-row (token) dynamic quantization: scale = max|x| / 448, codes = fp8(x / scale) (fp32
    division, saturated, round to nearest even)."""
    xf = x.float()
    # K = 0: no element, amax 0 (amax over an empty dim raises in torch)
    amax = xf.abs().amax(dim=1) if xf.shape[1] > 0 else xf.new_zeros(xf.shape[0])
    amax = torch.where(xf.isnan().any(dim=1), torch.full_like(amax, float("nan")), amax)
    scale = fp8_dynamic_scale(amax)
    return _to_fp8(xf, scale[:, None]), scale


def fp8_gemm(a: torch.Tensor,         # [M, K] float8_e4m3fn
             a_scale: torch.Tensor,   # [M] float32
             weight: torch.Tensor,    # [N, K] float8_e4m3fn
             w_scale: torch.Tensor,   # [N] float32
             bias: torch.Tensor | None = None,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:  # [M, N]
    """(a @ w^T) * a_scale[m] * w_scale[n] + bias, computed in `dtype` (float64 for the oracle)."""
    out = (a.to(dtype) @ weight.to(dtype).T) * a_scale.to(dtype)[:, None] * w_scale.to(dtype)[None, :]
    return out if bias is None else out + bias.to(dtype)


# ---- stable descending sort (include/decodekit/sampling/sort_desc.h)

def sort_desc_stable(x: torch.Tensor,  # [B, V] float32
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, V] float32, [B, V] int64)
    """Rows in descending order with their positions: ties in position order, NaNs first, -0.0 == +0.0."""
    return torch.sort(x, dim=-1, descending=True, stable=True)


# ---- Gumbel-max sampling (include/decodekit/sampling/gumbel_max.h)

def argmax_rows(scores: torch.Tensor) -> torch.Tensor:  # [B, V] float -> [B] int64
    """The greedy token: the largest value, ties -> the lowest index, the first NaN beats everything,
    -0.0 == +0.0 (torch.argmax's rule, spelled out so the oracle does not depend on torch's kernel)."""
    x = scores.double()
    nan = x.isnan()
    best = torch.where(nan, torch.full_like(x, float("inf")), x).max(dim=-1, keepdim=True).values
    hit = nan | ((x == best) & ~nan.any(dim=-1, keepdim=True))
    idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(hit, idx, torch.full_like(idx, x.shape[-1])).min(dim=-1).values


def gumbel_argmax(scores: torch.Tensor,     # [B, V] float32 (-inf: never drawn)
                  seeds: torch.Tensor,      # [B] int64
                  positions: torch.Tensor,  # [B] int64
                  stream: int = 0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [B] int64
    """argmax_v scores[b, v] + g(seeds[b], positions[b], v) (Philox ``stream``; ties -> the lowest v),
    the keys computed in ``dtype`` from the same uniforms (float64 for the oracle)."""
    from decodekit.sampling.philox import gumbel_from_uniform, token_uniforms
    u = token_uniforms(seeds, positions, scores.shape[1], stream).to(dtype)
    return (scores.to(dtype) + gumbel_from_uniform(u)).argmax(dim=-1)


# ---- speculative-decoding verification (include/decodekit/sampling/rejection.h)

def _spec_accept_uniform(seeds, positions):  # [B] float32
    from decodekit.sampling.philox import MASK32, philox4x32, seed_to_key, uniform
    k0, k1 = seed_to_key(seeds)
    w = philox4x32((0, positions & MASK32, (positions >> 32) & MASK32, 1), (k0, k1))
    return uniform(w[0])


def _spec_sample(w, seeds, positions):  # w [B, V] >= 0 -> [B] int64 (-1: all zero)
    from decodekit.sampling.philox import gumbel_from_uniform, token_uniforms
    g = gumbel_from_uniform(token_uniforms(seeds, positions, w.shape[1], stream=2))
    key = torch.where(w > 0, torch.log(w) + g, torch.full_like(w, float("-inf")))
    idx = key.argmax(dim=1)
    return torch.where(torch.isinf(key.max(dim=1).values), torch.full_like(idx, -1), idx)


def rejection_sample(draft_tokens: torch.Tensor,        # [B, k] int64
                     num_draft: torch.Tensor,           # [B] int32
                     draft_probs: torch.Tensor | None,  # [B, k, V] float32 (None: one-hot drafts)
                     target_probs: torch.Tensor,        # [B, k+1, V] float32
                     seeds: torch.Tensor,               # [B] int64
                     positions: torch.Tensor,           # [B] int64
                     greedy: bool,
                     variant: str | None = None,        # tests only: a deliberately broken rule
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, k+1] int64, [B] int32)
    """The verification rule of include/decodekit/sampling/rejection.h, vectorised over requests.
    variant (to show the statistical tests catch them): "resample_from_p" (at a rejection sample p
    instead of max(p - q, 0)), "bonus_wrong_row" (bonus from row n - 1), "accept_if_p_ge_q"
    (accept iff p(x) >= q(x), no randomness)."""
    B, k = draft_tokens.shape
    V = target_probs.shape[2]
    p = target_probs.float()
    seeds, positions = seeds.long(), positions.long()
    nd = num_draft.long()
    out = torch.full((B, k + 1), -1, dtype=torch.int64)
    emitted = torch.zeros(B, dtype=torch.int32)
    active = torch.ones(B, dtype=torch.bool)
    for i in range(k + 1):
        pos = positions + i
        pi = p[:, i]
        last = active & (nd == i)
        if last.any():
            row = p[:, i - 1] if variant == "bonus_wrong_row" and i > 0 else pi
            tok = row.argmax(dim=1) if greedy else _spec_sample(row, seeds, pos)
            out[last, i] = tok[last]
            emitted[last] = i + 1
            active &= ~last
        if i == k:
            break
        has = active & (nd > i)
        x = draft_tokens[:, i]
        if greedy:
            t = pi.argmax(dim=1)
            out[has, i] = t[has]
            rej = has & (t != x)
        else:
            in_vocab = (x >= 0) & (x < V)
            xc = x.clamp(0, V - 1)
            px = torch.where(in_vocab, pi.gather(1, xc[:, None])[:, 0], torch.zeros(B))
            if draft_probs is not None:
                qi = draft_probs[:, i].float()
                qx = torch.where(in_vocab, qi.gather(1, xc[:, None])[:, 0], torch.zeros(B))
            else:
                qi = torch.nn.functional.one_hot(xc, V).float() * in_vocab[:, None]
                qx = torch.ones(B)
            if variant == "accept_if_p_ge_q":
                acc = has & in_vocab & (px >= qx)
            else:
                acc = has & in_vocab & (qx > 0) & (_spec_accept_uniform(seeds, pos) * qx < px)
            rej = has & ~acc
            resid = pi if variant == "resample_from_p" else (pi - qi).clamp_min(0)
            t = _spec_sample(resid, seeds, pos)
            t = torch.where(t < 0, _spec_sample(pi, seeds, pos), t)
            out[acc, i] = x[acc]
            out[rej, i] = t[rej]
        emitted[rej] = i + 1
        active &= ~rej
    return out, emitted



def custom_all_reduce(inputs: list[torch.Tensor]) -> torch.Tensor:  # each [...] -> [...]
    """The ranks' inputs summed in rank order (fp32 accumulation, float64 for float64 inputs)."""
    acc = torch.float64 if inputs[0].dtype == torch.float64 else torch.float32
    s = inputs[0].to(acc)
    for x in inputs[1:]:
        s = s + x.to(acc)
    return s.to(inputs[0].dtype)


def _linear_partial(x: torch.Tensor,  # [M, K_r]
                    w,                # [N, K_r]: a tensor, or packed (duck-typed: decodekit.quant's Int4Weight, Fp8Weight)
                    acc: torch.dtype) -> torch.Tensor:  # [M, N] in acc
    """x @ w^T in `acc`: packed INT4 decoded (act-order: x's columns in the stored order first); fp8
    W8A8 with x quantized per token as the kernels do."""
    if isinstance(w, torch.Tensor):
        return x.to(acc) @ w.to(acc).T
    if w.qweight.dtype == torch.float8_e4m3fn:
        q, s = quantize_fp8(x)
        return fp8_gemm(q, s, w.qweight, w.scales, None, acc)
    if getattr(w, "perm", None) is not None:
        x = x.index_select(1, w.perm)
    return x.to(acc) @ int4_dequantize(w.qweight, w.scales, w.mins, w.group_size).to(acc).T


def gemm_allreduce(a: list[torch.Tensor],        # per rank [M, K_r]
                   weight: list,                 # per rank [N, K_r]: tensors, or Int4Weight / Fp8Weight shards
                   bias: torch.Tensor | None = None,          # [N]
                   residual: torch.Tensor | None = None,      # [M, N]
                   norm_weight: torch.Tensor | None = None,   # [N]
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, new_residual): out = sum_r a_r @ w_r^T (+ bias); with residual and norm_weight,
    new_residual = out + residual and out = rms_norm(new_residual) * norm_weight (else None)."""
    acc = torch.float64 if a[0].dtype == torch.float64 else torch.float32
    y = sum(_linear_partial(x, w, acc) for x, w in zip(a, weight))
    if bias is not None:
        y = y + bias.to(acc)
    if residual is None:
        return y.to(a[0].dtype), None
    out, new_residual = fused_add_rms_norm(y, residual.to(acc), norm_weight.to(acc), eps)
    return out.to(a[0].dtype), new_residual.to(a[0].dtype)


# ---- decoder_layer / decoder_layers (csrc/decoder_layer.cpp): composites of the above, ops/reference_layers.py
from .reference_layers import decoder_layer, decoder_layers  # noqa: E402,F401
