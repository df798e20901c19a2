#!/usr/bin/env python3
"""paged_attention (decode and prefill) through decodekit.ops, against torch's SDPA.

Decode: S sequences of ctx tokens, one new token each, heads of Llama-3-8B (32 query / 8 KV
heads of 128) and SmolLM2-135M (9 / 3 of 64), block size 16. The KV cache (per layer
[num_blocks, num_kv_heads, block_size, head_dim]) is written with reshape_and_cache; each
sequence's blocks are a random, shuffled set of block ids. Bytes counted: the KV rows the
op must read (sum over sequences of seq_len * num_kv_heads * head_dim * 2 (K and V) *
element size; fp8 caches: 1 byte), plus the query read and the output written. Llama-head
cases also run over an fp8 e4m3 cache (kv=fp8, per-head scales). CUDA: batch 1/8/64/256 x
context 512/4096/32768 (combinations whose KV exceeds 8 GiB skipped); CPU: batch 1/16 x
context 512/2048.

Sliding window (Mistral-style, sliding_window=W): decode over the last W keys of a longer context
(CUDA: batch 1/16, context 32768, W 4096; CPU: batch 4, context 2048, W 512); bytes counted are the
window's KV rows, and the peer runs SDPA on the gathered window only.

Prefill: 4 sequences of n new tokens (n = 512; 4096 on CUDA), causal, no cached prefix,
reported in TFLOP/s (4 * S * n^2 / 2 * Hq * D) against the measured matmul rate.

Peer: torch.nn.functional.scaled_dot_product_attention on the same KV gathered from the
paged cache into contiguous [S, H, ctx, D] tensors (gathered, and repeated per GQA group
when this torch has no enable_gqa, outside the timed region; every sequence of a case has
the same length, so SDPA needs no mask; is_causal=True for prefill). Each case is checked
against the float64 reference (decodekit.ops.reference.paged_attention) on a few sequences
(prefill: the first and last 64 tokens of one sequence) before it is timed.

    python bench/bench_attention.py --device cuda --out bench/results
    python bench/bench_attention.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.nn.functional as F

try:
    import decodekit
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import decodekit

from decodekit import ops
from decodekit.bench import (BenchContext, Result, add_common_args, check_close, rel_err, rotation_count,
                             tensor_bytes)
from decodekit.ops import reference

NAME = "attention"
BLOCK_SIZE = 16
HEADS = [(32, 8, 128), (9, 3, 64)]  # (query heads, KV heads, head dim): Llama-3-8B, SmolLM2-135M
# decode (batches, contexts) per device; combinations whose KV exceeds MAX_KV_BYTES are skipped
DECODE = {"cuda": ([1, 8, 64, 256], [512, 4096, 32768]), "cpu": ([1, 16], [512, 2048])}
DECODE_QUICK = {"cuda": ([1, 64], [512, 4096]), "cpu": ([1, 4], [128, 512])}
PREFILL = {"cuda": (4, 4096), "cpu": (4, 512)}  # (sequences, new tokens each)
# sliding-window decode (batches, context, window)
WINDOW = {"cuda": ([1, 16], 32768, 4096), "cpu": ([4], 2048, 512)}
WINDOW_QUICK = {"cuda": ([1], 8192, 1024), "cpu": ([4], 512, 128)}
PREFILL_QUICK = {"cuda": (4, 512), "cpu": (4, 128)}
MAX_KV_BYTES = 8 << 30
CHECK_SEQS = 3     # decode: sequences checked against the float64 reference
CHECK_TOKENS = 64  # prefill: first and last tokens of one sequence checked


def _rand(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


@functools.lru_cache(maxsize=None)
def _sdpa_has_gqa() -> bool:
    """Whether this torch's SDPA takes enable_gqa (KV heads shared by groups of query heads)."""
    try:
        q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def _sdpa(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    """SDPA on q [S, Hq, n, D] and k, v [S, Hk, ctx, D] (Hk = Hq when repeated for GQA)."""
    if q.shape[1] != k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _rotate(ctx: BenchContext, args, keep=()) -> list[tuple]:
    """ctx.rotate, but the arguments themselves (no copy) when a single set is past the rotation cap."""
    per_set = tensor_bytes(*[a for i, a in enumerate(args) if i not in set(keep)])
    if rotation_count(per_set, ctx.device, factor=ctx.rotate_factor, max_bytes=ctx.rotate_max_bytes) == 1:
        return [tuple(args)]
    return ctx.rotate(args, keep=keep)


class PagedBatch:
    """S sequences of ctx_len tokens (new_tokens of them new) in a shuffled paged KV cache."""

    def __init__(self, dev: torch.device, S: int, ctx_len: int, new_tokens: int, hq: int, hk: int, D: int,
                 dtype: torch.dtype, seed: int, fp8: bool = False, window: int = 0):
        self.S, self.ctx_len, self.n, self.hq, self.hk, self.D = S, ctx_len, new_tokens, hq, hk, D
        self.window = window  # sliding window (0: none; decode batches only)
        self.scale = D ** -0.5
        nb = (ctx_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(S * nb, generator=gen).to(torch.int32)
        self.block_tables = perm.view(S, nb).to(dev)                    # [S, max_blocks] int32, random ids
        self.seq_lens = torch.full((S,), ctx_len, dtype=torch.int32, device=dev)  # [S]
        self.query_start_loc = torch.arange(0, S * new_tokens + 1, new_tokens, dtype=torch.int32,
                                            device=dev)                 # [S + 1]
        kv_dtype = torch.float8_e4m3fn if fp8 else dtype
        self.k_cache = torch.zeros(S * nb, hk, BLOCK_SIZE, D, dtype=kv_dtype, device=dev)  # [num_blocks, Hk, bs, D]
        self.v_cache = torch.zeros_like(self.k_cache)
        # fp8: per-KV-head scales (randn values, |x| < ~5, land well inside e4m3's range)
        self.k_scale = torch.linspace(0.015, 0.03, hk, device=dev) if fp8 else None  # [Hk] float32
        self.v_scale = torch.linspace(0.02, 0.01, hk, device=dev) if fp8 else None
        # every sequence's rows written through reshape_and_cache, in chunks of <= 64 MiB of fp32 K+V
        pos = torch.arange(ctx_len, device=dev)
        slots = (self.block_tables[:, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE).reshape(-1)
        chunk = max(1, (64 << 20) // (2 * hk * D * 4))
        for t0 in range(0, slots.numel(), chunk):
            t1 = min(slots.numel(), t0 + chunk)
            ops.reshape_and_cache(_rand((t1 - t0, hk, D), dtype, dev), _rand((t1 - t0, hk, D), dtype, dev),
                                  self.k_cache, self.v_cache, slots[t0:t1], self.k_scale, self.v_scale)
        self.query = _rand((S * new_tokens, hq, D), dtype, dev)          # [T, Hq, D]

    def kv_bytes(self) -> int:
        """K and V rows the op must read: every sequence's seq_len rows (or its window's) of every KV head."""
        rows = self.seq_lens.clamp(max=self.window) if self.window else self.seq_lens
        return int(rows.sum().item()) * self.hk * self.D * 2 * self.k_cache.element_size()

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SDPA's inputs: q [S, Hq, n, D], k and v [S, Hk, ctx, D] (or [S, Hq, ctx, D] without enable_gqa)."""
        S, n, nb = self.S, self.n, self.block_tables.shape[1]
        idx = self.block_tables.long()
        out = [self.query.view(S, n, self.hq, self.D).transpose(1, 2).contiguous()]
        for cache, sc in ((self.k_cache, self.k_scale), (self.v_cache, self.v_scale)):
            g = reference.dequantize_cache(cache[idx].flatten(0, 1), sc, self.query.dtype).view(
                cache[idx].shape)                                       # [S, nb, Hk, bs, D] in the query's dtype
            g = g.permute(0, 2, 1, 3, 4).reshape(S, self.hk, nb * BLOCK_SIZE, self.D)[:, :, :self.ctx_len]
            if self.window:  # decode: the token sees the last `window` keys
                g = g[:, :, max(0, self.ctx_len - self.window):]
            if not _sdpa_has_gqa():
                g = g.repeat_interleave(self.hq // self.hk, dim=1)
            out.append(g.contiguous())
            del g
        return out[0], out[1], out[2]

    def run(self, out: torch.Tensor) -> torch.Tensor:
        return ops.paged_attention(self.query, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                                   self.query_start_loc, self.scale, out=out, k_scale=self.k_scale,
                                   v_scale=self.v_scale, sliding_window=self.window)

    def reference_rows(self, rows: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 reference for (sequence, first token, last token + 1) row ranges of the batch:
        returns the packed query row indices and the reference output for them [R, Hq, D]."""
        q0 = self.query_start_loc.tolist()
        idx, lens, starts = [], [], [0]
        for s, a, b in rows:  # tokens a .. b-1 of sequence s: a prefix of its window, seq_len shortened
            idx += list(range(q0[s] + a, q0[s] + b))
            lens.append(self.ctx_len - self.n + b)
            starts.append(starts[-1] + b - a)
        dev = self.query.device
        sel = torch.tensor([s for s, _, _ in rows], device=dev)
        ref, _ = reference.paged_attention(self.query[idx].double(), self.k_cache, self.v_cache,
                                           self.block_tables[sel], torch.tensor(lens, dtype=torch.int32, device=dev),
                                           torch.tensor(starts, dtype=torch.int32, device=dev), self.scale,
                                           self.k_scale, self.v_scale, self.window)
        return torch.tensor(idx, device=dev), ref


def _check(b: PagedBatch, out: torch.Tensor, peer_out: torch.Tensor, rows, dtype: torch.dtype,
           what: str) -> tuple[float, float]:
    """Our output (every element written) and the peer's against the float64 reference on `rows`."""
    assert torch.isfinite(out).all(), f"{what}: output has NaN/inf (not every element written?)"
    idx, ref = b.reference_rows(rows)
    err = check_close(out[idx], ref, dtype, what)
    peer = peer_out.transpose(1, 2).reshape(out.shape)  # [S, Hq, n, D] -> [T, Hq, D]
    return err, rel_err(peer[idx], ref)


def _peer_name(causal: bool) -> str:
    return ("F.scaled_dot_product_attention" + ("(is_causal=True)" if causal else "") +
            (" enable_gqa" if _sdpa_has_gqa() else " repeat_interleave KV") + ", gathered KV")


def case_decode(ctx: BenchContext, S: int, n_ctx: int, hq: int, hk: int, D: int, dtype: torch.dtype,
                fp8: bool = False, window: int = 0) -> Result:
    dev = ctx.device
    b = PagedBatch(dev, S, n_ctx, 1, hq, hk, D, dtype, seed=S * 100003 + n_ctx, fp8=fp8, window=window)
    case = f"S={S} ctx={n_ctx} {hq}/{hk}x{D}" + (" kv=fp8" if fp8 else "") + (f" window={window}" if window else "")
    out = torch.full_like(b.query, float("nan"))  # [S, Hq, D], poisoned: every element must be written
    b.run(out)
    qp, kp, vp = b.gathered()
    peer_out = _sdpa(qp, kp, vp, b.scale, False)
    check = sorted({0, S // 2, S - 1})[:CHECK_SEQS]
    err, peer_err = _check(b, out, peer_out, [(s, 0, 1) for s in check], dtype, f"paged_attention decode {case}")
    del peer_out

    # block tables, lengths and query starts are shared (the step's metadata); q, KV and out rotate
    sets = _rotate(ctx, (b.query, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc, out),
                   keep=(3, 4, 5))
    scale, ks, vs = b.scale, b.k_scale, b.v_scale
    w = b.window
    t = ctx.time(lambda q, kc, vc, bt, sl, qs, o: ops.paged_attention(q, kc, vc, bt, sl, qs, scale, out=o,
                                                                       k_scale=ks, v_scale=vs, sliding_window=w),
                 sets)
    psets = _rotate(ctx, (qp, kp, vp))
    tp = ctx.time(lambda q, k, v: _sdpa(q, k, v, scale, False), psets)
    e = b.query.element_size()
    nbytes = b.kv_bytes() + 2 * b.query.numel() * e  # KV read + q read + out written
    return Result.from_timings("paged_attention", case, dtype, dev, t, nbytes=nbytes, peer=_peer_name(False),
                               peer_timing=tp, rotate_bytes=tensor_bytes(sets), max_rel_err=err,
                               peer_rel_err=peer_err)


def case_prefill(ctx: BenchContext, S: int, n: int, hq: int, hk: int, D: int, dtype: torch.dtype) -> Result:
    dev = ctx.device
    b = PagedBatch(dev, S, n, n, hq, hk, D, dtype, seed=S * 100003 + n + 1)
    case = f"S={S} n={n} {hq}/{hk}x{D} causal"
    out = torch.full_like(b.query, float("nan"))  # [S * n, Hq, D]
    b.run(out)
    qp, kp, vp = b.gathered()
    peer_out = _sdpa(qp, kp, vp, b.scale, True)
    m = min(n, CHECK_TOKENS)
    err, peer_err = _check(b, out, peer_out, [(S - 1, 0, m), (S - 1, n - m, n)], dtype,
                           f"paged_attention prefill {case}")
    del peer_out

    sets = _rotate(ctx, (b.query, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc, out),
                   keep=(3, 4, 5))
    scale = b.scale
    t = ctx.time(lambda q, kc, vc, bt, sl, qs, o: ops.paged_attention(q, kc, vc, bt, sl, qs, scale, out=o), sets)
    psets = _rotate(ctx, (qp, kp, vp))
    tp = ctx.time(lambda q, k, v: _sdpa(q, k, v, scale, True), psets)
    e = b.query.element_size()
    flops = 4.0 * S * n * n / 2 * hq * D  # QK^T and PV, causal half
    return Result.from_timings("paged_attn_prefill", case, dtype, dev, t, flops=flops,
                               nbytes=b.kv_bytes() + 2 * b.query.numel() * e, peer=_peer_name(True),
                               peer_timing=tp, rotate_bytes=tensor_bytes(sets), max_rel_err=err,
                               peer_rel_err=peer_err)


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--no-prefill", action="store_true", help="decode cases only")
    args, unknown = p.parse_known_args(argv)  # run_all.py passes every family's options to all
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    if ctx.device.type == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_attention: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    kind = ctx.device.type
    batches, contexts = (DECODE_QUICK if ctx.quick else DECODE)[kind]
    ctx.copy_ceiling()
    for dtype in ctx.dtypes:
        e = torch.empty((), dtype=dtype).element_size()
        for hq, hk, D in HEADS:
            for n_ctx in contexts:
                for S in batches:
                    kv = S * n_ctx * hk * D * 2 * e
                    if kind == "cuda" and kv > MAX_KV_BYTES:
                        if not args.quiet:
                            print(f"  skipping decode S={S} ctx={n_ctx} {hq}/{hk}x{D} {dtype}: "
                                  f"KV {kv / 2**30:.0f} GiB > {MAX_KV_BYTES >> 30} GiB")
                        continue
                    ctx.add(case_decode(ctx, S, n_ctx, hq, hk, D, dtype))
                    if dtype != torch.float32 and hq == HEADS[0][0] and (kind == "cuda" or S > 1):
                        # the same shape over an fp8 cache: half the KV bytes (peer: SDPA on the
                        # dequantized KV in the query's dtype)
                        ctx.add(case_decode(ctx, S, n_ctx, hq, hk, D, dtype, fp8=True))
                    if kind == "cuda":
                        torch.cuda.empty_cache()
        batches_w, n_ctx, window = (WINDOW_QUICK if ctx.quick else WINDOW)[kind]
        for S in batches_w:
            ctx.add(case_decode(ctx, S, n_ctx, *HEADS[0], dtype, window=window))
        if not args.no_prefill:
            S, n = (PREFILL_QUICK if ctx.quick else PREFILL)[kind]
            hq, hk, D = HEADS[0]
            ctx.add(case_prefill(ctx, S, n, hq, hk, D, dtype))
    return ctx.finish()


if __name__ == "__main__":
    main()
