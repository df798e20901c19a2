#!/usr/bin/env python3
"""Which quantized-GEMM kernel faults on the GPU, and where (device machine, after gpu_check.sh
put the extension in place; run with PYTHONPATH=/tmp/site:python):

    python3 tools/gpu_diag_quant.py [--sanitizer] [--timeout S]

Each case runs in its own process (a kernel fault poisons a process's CUDA context), all at once:
one int4 / int8 / fp8 GEMM per kernel route (DECODEKIT_INT4_MARLIN / DECODEKIT_SM90_GEMM pick it),
checked against a float64 reference, printing 'ok err=...' (max |out-ref| / (1e-2 + r |a||w|), r = 1e-2,
0.07 for fp8's e4m3 activations)
or the error. --sanitizer reruns the first faulting case under compute-sanitizer, which names the
kernel and the faulting instruction's PC (read it against `cuobjdump -sass` here).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import subprocess
import sys
import time

# name, kind, M, N, K, G, dtype, environment
CASES = [
    ("int4 marlin M=1", "int4", 1, 576, 576, 32, "bfloat16", {"DECODEKIT_INT4_MARLIN": "auto"}),
    ("int4 marlin M=16", "int4", 16, 4096, 4096, 128, "float16", {"DECODEKIT_INT4_MARLIN": "auto"}),
    ("int4 marlin M=64", "int4", 64, 1536, 576, 32, "bfloat16", {"DECODEKIT_INT4_MARLIN": "auto"}),
    ("int4 gemv M=1", "int4", 1, 6144, 4096, 128, "bfloat16", {"DECODEKIT_INT4_MARLIN": "never"}),
    ("int4 gemv M=8", "int4", 8, 576, 576, 32, "float16", {"DECODEKIT_INT4_MARLIN": "never"}),
    ("int4 mma M=16", "int4", 16, 4096, 4096, 128, "bfloat16",
     {"DECODEKIT_INT4_MARLIN": "never", "DECODEKIT_SM90_GEMM": "never"}),
    ("int4 sm90 M=128", "int4", 128, 4096, 4096, 128, "bfloat16", {"DECODEKIT_SM90_GEMM": "always"}),
    ("int8 M=1", "int8", 1, 576, 576, 32, "bfloat16", {}),
    ("fp8 M=1", "fp8", 1, 6144, 4096, 0, "bfloat16", {}),
    ("fp8 mma M=16", "fp8", 16, 4096, 4096, 0, "bfloat16", {"DECODEKIT_SM90_GEMM": "never"}),
    ("fp8 sm90 M=128", "fp8", 128, 4096, 4096, 0, "bfloat16", {"DECODEKIT_SM90_GEMM": "always"}),
]

CHILD = r"""
import sys, torch
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight, quantize_int8
from decodekit.quant.fp8 import quantize_fp8_weight
kind, M, N, K, G, dt = sys.argv[1], *map(int, sys.argv[2:6]), getattr(torch, sys.argv[6])
import os
dev = os.environ.get("DK_DIAG_DEVICE", "cuda")  # cpu: to try this script without a GPU
g = torch.Generator().manual_seed(0)
a = torch.randn(M, K, generator=g).to(dt).to(dev)
if kind == "int4":
    q = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    s = (torch.rand(N, K // G, generator=g) * 0.05 + 0.005).half()
    m = (torch.randn(N, K // G, generator=g) * 0.2).half()
    w = Int4Weight(q.to(dev), s.to(dev), m.to(dev), G)
    wd = ref.int4_dequantize(q, s, m, G).double()
    out = ops.int4_gemm(a, w)
elif kind == "int8":
    w = quantize_int8(torch.randn(N, K, generator=g) * 0.05, G)
    wd = ref.int8_dequantize(w.qweight, w.scales, w.group_size).double()
    w = type(w)(w.qweight.to(dev), w.scales.to(dev), w.group_size)
    out = ops.int8_gemm(a, w)
else:
    wf = torch.randn(N, K, generator=g) * 0.05
    w = quantize_fp8_weight(wf)
    wd = w.dequantize(torch.float64)
    out = ops.linear(a, w.to(dev))
if dev == "cuda":
    torch.cuda.synchronize()
want = a.cpu().double() @ wd.T
mag = a.cpu().double().abs() @ wd.abs().T
rel = 0.07 if kind == "fp8" else 1e-2  # fp8 (e4m3) activations: 2^-4 relative per element
err = ((out.cpu().double() - want).abs() / (1e-2 + rel * mag)).max().item()
print(f"ok err={err:.3g}{'' if err <= 1 else '  (ABOVE 1: wrong values)'}")
"""


def run_case(case, timeout, prefix=()):
    name, kind, M, N, K, G, dt, env = case
    e = dict(os.environ, **env)
    t0 = time.time()
    try:
        p = subprocess.run([*prefix, sys.executable, "-c", CHILD, kind, str(M), str(N), str(K), str(G), dt],
                           env=e, capture_output=True, text=True, timeout=timeout)
        lines = (p.stdout + p.stderr).strip().splitlines()
        ok = p.returncode == 0 and lines and lines[-1].startswith("ok")
        msg = lines[-1] if ok else " | ".join(l for l in lines if "Error" in l or "error" in l or "=====" in l)[-1500:]
        return name, ok, f"{msg or 'rc=%d' % p.returncode} ({time.time() - t0:.1f} s)", lines
    except subprocess.TimeoutExpired:
        return name, False, f"timeout after {timeout} s", []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sanitizer", action="store_true")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    with cf.ThreadPoolExecutor(len(CASES)) as ex:
        results = list(ex.map(lambda c: run_case(c, args.timeout), CASES))
    bad = []
    for (name, ok, msg, _), case in zip(results, CASES):
        print(f"{name:<18} {'OK  ' if ok else 'FAIL'} {msg}", flush=True)
        if not ok:
            bad.append(case)
    if args.sanitizer and bad:
        cs = shutil.which("compute-sanitizer") or next(
            (p for p in ("/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda-13.0/bin/compute-sanitizer")
             if os.path.exists(p)), None)
        if cs is None:
            print("compute-sanitizer: not found")
        else:
            print(f"== compute-sanitizer on '{bad[0][0]}'", flush=True)
            _, _, msg, lines = run_case(bad[0], 2 * args.timeout, prefix=(cs, "--print-limit", "3"))
            print("\n".join(l for l in lines if l.startswith("=========") or "Error" in l)[:6000])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
