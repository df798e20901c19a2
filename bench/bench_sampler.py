#!/usr/bin/env python3
"""The sampler's draw (Sampler.tokens: temperature, top-k / top-p filters, Gumbel-max) on a decode step's
logits, with the gumbel_argmax op (include/decodekit/sampling/gumbel_max.h: only the keys that can still
win are drawn) against the same sampler drawing the Philox Gumbel noise of the whole vocabulary in torch
ops (reference.gumbel_argmax, what the sampler did before the op), in the same process on the same
logits. Both must give the same tokens (up to float32 near-ties of the keys, counted in the notes).

Logits: N(0, s^2) with s = 2 (flat, like a high-entropy step) or 6 (peaked). The floor is one read of
the [B, V] float32 logits at the measured copy bandwidth (frac_of_ceiling); on the CPU the filters and
the temperature divide add passes of their own, so the fraction stays far below 1.

    python bench/bench_sampler.py --out bench/results            # CPU (or --device cuda)
    python bench/bench_sampler.py --e2e                           # + LLM.generate on the embedded model

Also sort_desc_stable (include/decodekit/sampling/sort_desc.h: the radix sort the CPU filters use for rows that
keep more than 1024 tokens) against torch.sort(x, descending=True, stable=True), whose order it must equal bit
for bit; the floor is reading x and writing the values and int64 indices once.

--e2e: the same A/B through LLM.generate on the embedded SmolLM2 GGUF (128 tokens per request, seeded,
ignore_eos; 1 and 4 requests; T=0.8 top_p=0.95 and T=1), alternated twice, tokens compared.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

try:
    import decodekit  # noqa: F401
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from decodekit.bench import BenchContext, Result, add_common_args
from decodekit import ops
from decodekit.ops import reference
import decodekit.sampling.sampler as sampler_mod
from decodekit.sampling import Sampler, SamplingMetadata, SamplingParams

NAME = "sampler"
CONFIGS = {"T=1": dict(temperature=1.0), "T=0.7 top_p=0.95": dict(temperature=0.7, top_p=0.95),
           "top_k=50": dict(top_k=50),
           "T=0.7, top_p=0.95 on even rows": dict(temperature=0.7)}   # a batch of mixed requests


def _torch_noise(scores, seeds, positions, stream=0):
    return reference.gumbel_argmax(scores, seeds, positions, stream)


def case(ctx: BenchContext, B: int, V: int, scale: float, cfg: str) -> Result:
    g = torch.Generator().manual_seed(B * 31 + V + int(scale))
    logits = (torch.randn(B, V, generator=g) * scale).to(ctx.device)
    mixed = cfg.endswith("even rows")
    params = [SamplingParams(seed=11 + b, **CONFIGS[cfg], **({"top_p": 0.95} if mixed and b % 2 == 0 else {}))
              for b in range(B)]
    md = SamplingMetadata.build(params, [[1, 2]] * B, [[3]] * B, [11 + b for b in range(B)], [17] * B, None,
                                ctx.device, V)
    s = Sampler()
    op = sampler_mod.ops.gumbel_argmax
    try:
        tok = s.tokens(logits, md)
        t = ctx.time(lambda x: s.tokens(x, md), [(logits,)])
        sampler_mod.ops.gumbel_argmax = _torch_noise
        tok_peer = s.tokens(logits, md)
        tp = ctx.time(lambda x: s.tokens(x, md), [(logits,)])
    finally:
        sampler_mod.ops.gumbel_argmax = op
    differ = int((tok != tok_peer).sum())
    if differ > max(1, B // 50):
        raise AssertionError(f"{cfg} B={B} V={V}: {differ} of {B} tokens differ from the torch-noise sampler")
    return Result.from_timings("sampler.tokens", f"{cfg} B={B} V={V} s={scale:g}", torch.float32, ctx.device, t,
                               nbytes=B * V * 4, peer="same sampler, torch Philox noise over the vocabulary",
                               peer_timing=tp, notes=f"{differ} of {B} tokens differ (near-ties)" if differ else "")


def sort_case(ctx: BenchContext, B: int, V: int) -> Result:
    g = torch.Generator().manual_seed(B * 7 + V)
    x = (torch.randn(B, V, generator=g) * 2).to(ctx.device)
    v, i = ops.sort_desc_stable(x)
    rv, ri = torch.sort(x, dim=-1, descending=True, stable=True)
    if not (torch.equal(i, ri) and torch.equal(v, rv)):
        raise AssertionError(f"sort_desc_stable B={B} V={V}: order differs from torch.sort")
    t = ctx.time(ops.sort_desc_stable, [(x,)])
    tp = ctx.time(lambda y: torch.sort(y, dim=-1, descending=True, stable=True), [(x,)])
    return Result.from_timings("sort_desc_stable", f"B={B} V={V}", torch.float32, ctx.device, t,
                               nbytes=B * V * (4 + 4 + 8), peer="torch.sort(descending, stable)", peer_timing=tp)


def _torch_rejection(d, nd, q, p):
    """The verification in plain torch ops, vectorised the usual way (every row's residual drawn with an
    exponential race, the row picked after): the same distribution as the op (all num_draft == k here),
    other random numbers, so the peer for time only."""
    B, k = d.shape
    pd = p[:, :k].gather(2, d[..., None]).squeeze(2)
    qd = q[:, :k].gather(2, d[..., None]).squeeze(2) if q is not None else torch.ones_like(pd)
    acc = torch.rand_like(pd) * qd < pd
    n_acc = acc.int().cumprod(1).sum(1)                                          # [B]
    qk = q if q is not None else torch.nn.functional.one_hot(d, p.shape[-1]).to(p.dtype)
    rows = torch.cat([(p[:, :k] - qk).clamp_min(0), p[:, k:]], 1)                # [B, k+1, V]
    tok = (rows / torch.empty_like(rows).exponential_()).argmax(-1)              # [B, k+1]
    return tok.gather(1, n_acc[:, None]), n_acc + 1


def rejection_case(ctx: BenchContext, B: int, V: int, k: int, sharp: float, with_q: bool) -> Result:
    """rejection_sample on a verification step's shapes: target softmax(sharp * randn) (1: flat, every token
    drawn; 8: peaked), drafts random (so nearly always rejected at the first: the residual is drawn), with
    draft probabilities or one-hot drafts. Checked against the torch reference (same tokens but near-ties)."""
    g = torch.Generator().manual_seed(B * 13 + V + k)
    p = torch.softmax(torch.randn(B, k + 1, V, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(B, k, V, generator=g) * sharp, -1) if with_q else None
    d = torch.randint(0, V, (B, k), generator=g)
    nd = torch.full((B,), k, dtype=torch.int32)
    seeds = torch.arange(B, dtype=torch.int64) * 977 + 5
    pos = torch.arange(B, dtype=torch.int64) + 100
    ro, rn = reference.rejection_sample(d, nd, q, p, seeds, pos, False)
    dev = ctx.device
    args = [t.to(dev) if t is not None else None for t in (d, nd, q, p, seeds, pos)]
    o, n = ops.rejection_sample(*args, greedy=False)
    differ = int((o.cpu() != ro).any(1).sum())
    if differ > max(1, B // 50) or not torch.equal(n.cpu(), rn):
        raise AssertionError(f"rejection_sample B={B} V={V}: {differ} of {B} requests differ from the reference")
    t = ctx.time(lambda *a: ops.rejection_sample(*a, greedy=False), [tuple(args)])
    tp = ctx.time(lambda d_, nd_, q_, p_, s_, po_: _torch_rejection(d_, nd_, q_, p_), [tuple(args)])
    return Result.from_timings("rejection_sample", f"B={B} k={k} V={V} {'q' if with_q else 'one-hot'} "
                               f"{'flat' if sharp < 4 else 'peaked'}", torch.float32, dev, t,
                               nbytes=B * V * 4 * (2 if with_q else 1),
                               peer="torch ops: every row's residual, exponential race", peer_timing=tp,
                               notes=f"{differ} of {B} requests differ (near-ties)" if differ else "")


def e2e(device: str) -> None:
    import time

    from decodekit import LLM
    from decodekit.loader._common import embedded_model_path
    llm = LLM(model=embedded_model_path(), device=device)
    op = sampler_mod.ops.gumbel_argmax
    prompts = ["Tell me a story about a dragon.", "What is the capital of France?", "Write a poem.",
               "Explain gravity."]
    print("LLM.generate tok/s (alternated): torch noise (before) | gumbel_argmax op (after)")
    try:
        for name, kw in {"T=0.8 top_p=0.95": dict(temperature=0.8, top_p=0.95), "T=1": dict(temperature=1.0)}.items():
            for B in (1, 4):
                res: dict[str, list] = {"torch": [], "op": []}
                for _ in range(2):
                    for which, fn in (("torch", _torch_noise), ("op", op)):
                        sampler_mod.ops.gumbel_argmax = fn
                        ps = [SamplingParams(max_tokens=128, ignore_eos=True, seed=3 + i, **kw) for i in range(B)]
                        t = time.perf_counter()
                        outs = llm.generate(prompts[:B], ps)
                        dt = time.perf_counter() - t
                        res[which].append((sum(len(o.outputs[0].token_ids) for o in outs) / dt,
                                           [tuple(o.outputs[0].token_ids) for o in outs]))
                same = all(r[1] == res["torch"][0][1] for v in res.values() for r in v)
                print(f"  {name} requests={B}: " + " | ".join(", ".join(f"{r[0]:.1f}" for r in res[k])
                                                              for k in ("torch", "op"))
                      + f"; tokens identical: {same}", flush=True)
    finally:
        sampler_mod.ops.gumbel_argmax = op


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--e2e", action="store_true", help="also LLM.generate on the embedded model (see the docstring)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    ctx = BenchContext(args, NAME)
    ctx.copy_ceiling()
    cpu = ctx.device.type == "cpu"
    batches = [1, 4] if cpu else [1, 64]
    for V in ([49152] if ctx.quick else [49152, 128256] if cpu else [128256]):
        for B in batches:
            for scale in (2.0, 6.0):
                for cfg in (["T=1"] if ctx.quick else list(CONFIGS)):
                    ctx.add(case(ctx, B, V, scale, cfg))
            ctx.add(sort_case(ctx, B, V))
    # speculative verification (issue 6: under 2% of a decode step), one-hot (n-gram) and model drafts
    for V in ([49152] if cpu else [128256, 151936]):
        for B in ([1, 8] if cpu else [1, 8, 64]):
            for sharp in (1.0, 8.0):
                for with_q in (False, True):
                    if ctx.quick and (with_q or sharp > 1):
                        continue
                    ctx.add(rejection_case(ctx, B, V, 4, sharp, with_q))
    results = ctx.finish()
    if args.e2e:
        e2e(str(ctx.device))
    return results


if __name__ == "__main__":
    main()
