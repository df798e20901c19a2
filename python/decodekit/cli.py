"""The `decodekit` command line.

    decodekit demo      run every op on this machine against its reference and time it
    decodekit info      what this build contains (CPU / CUDA kernels, versions)

The engine commands (generate, chat, serve, bench, plan) arrive with their issues.
"""
from __future__ import annotations

import argparse
import sys
import time


def _info(args) -> int:
    import torch

    import decodekit
    print(f"decodekit {decodekit.__version__}  torch {torch.__version__}  python {sys.version.split()[0]}")
    print(f"CPU kernels: yes   CUDA kernels: {'yes' if decodekit.has_cuda_kernels() else 'no'}   "
          f"GPU visible: {torch.cuda.is_available()}")
    ops = sorted(n for n in dir(torch.ops.decodekit) if not n.startswith("_") and n not in ("name", "op"))
    print("ops:", ", ".join(o for o in ops if hasattr(getattr(torch.ops.decodekit, o), "default")))
    return 0


def _demo(args) -> int:
    """Runs each op once on fresh random inputs, checks it against the float64 reference
    and prints its time next to the pure-PyTorch reference's (until the engine lands,
    this is the demo the README runs)."""
    import torch

    from decodekit import ops
    from decodekit.ops import reference as ref

    device = args.device
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(args.seed)
    T, H = args.tokens, 576  # SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536
    x = torch.randn(T, H, generator=g).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype).to(device)
    r = torch.randn(T, H, generator=g).to(dtype).to(device)
    qkv = torch.randn(T, (9 + 6) * 64, generator=g).to(dtype).to(device)
    gate_up = torch.randn(T, 2 * 1536, generator=g).to(dtype).to(device)
    pos = torch.arange(T, device=device)
    cache = ref.rope_cos_sin_cache(max(T, 1), 64, theta=100000.0).to(device)

    def timed(fn, reps=20):
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps * 1e6

    rows = []

    def check(name, got, want, fn_op, fn_ref):
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        rows.append((name, err, timed(fn_op), timed(fn_ref)))

    check("rms_norm", ops.rms_norm(x, w), ref.rms_norm(x.double(), w.double(), 1e-6),
          lambda: ops.rms_norm(x, w), lambda: ref.rms_norm(x, w, 1e-6))
    xs, rs = x.clone(), r.clone()
    want, _ = ref.fused_add_rms_norm(x.double(), r.double(), w.double(), 1e-6)
    ops.fused_add_rms_norm(xs, rs, w)
    check("fused_add_rms_norm", xs, want, lambda: ops.fused_add_rms_norm(x.clone(), r.clone(), w),
          lambda: ref.fused_add_rms_norm(x, r, w, 1e-6))
    q, k = qkv[:, :576].clone(), qkv[:, 576:768].clone()
    wq, wk = ref.rotary_embedding(pos, q.double(), k.double(), cache.double(), 64, True)
    ops.rotary_embedding(pos, q, k, cache, 64, True)
    check("rotary_embedding", torch.cat([q, k], 1), torch.cat([wq, wk], 1),
          lambda: ops.rotary_embedding(pos, q, k, cache, 64, True),
          lambda: ref.rotary_embedding(pos, q, k, cache, 64, True))
    check("silu_and_mul", ops.silu_and_mul(gate_up), ref.silu_and_mul(gate_up.double()),
          lambda: ops.silu_and_mul(gate_up), lambda: ref.silu_and_mul(gate_up))

    print(f"decodekit ops on {device}, {args.dtype}, {T} tokens at SmolLM2-135M sizes")
    print(f"{'op':<20} {'rel. error':>11} {'decodekit us':>13} {'torch ref us':>13} {'speed-up':>9}")
    for name, err, t_op, t_ref in rows:
        print(f"{name:<20} {err:>11.2e} {t_op:>13.1f} {t_ref:>13.1f} {t_ref / t_op:>8.1f}x")
    bad = [n for n, e, *_ in rows if not e < {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]]
    if bad:
        print("MISMATCH vs reference:", ", ".join(bad))
        return 1
    print("all ops match the float64 reference")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decodekit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run every op against its reference and time it")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default cpu)")
    d.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"],
                   help="activation dtype (default bfloat16)")
    d.add_argument("--tokens", type=int, default=256, help="number of tokens in the batch (default 256)")
    d.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    d.set_defaults(fn=_demo)
    i = sub.add_parser("info", help="show what this build contains")
    i.set_defaults(fn=_info)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "tokens", 1) < 1:
        print("decodekit: --tokens must be >= 1", file=sys.stderr)
        return 2
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
