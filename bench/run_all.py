#!/usr/bin/env python3
"""Run every Python microbenchmark (bench/bench_*.py) in one process and print one short table.

Each bench_<family>.py has main(argv) -> list[Result]; every option not listed here is passed
on to each (--device, --quick, --dtype, --no-graph, --threads, --repeats, ...). The copy
ceiling is measured once (memoized) and shared by all families. A family that fails (a
correctness check, an exception) is reported and the others still run; exit status 1 then.

    python bench/run_all.py --device cuda --out bench/results          # DATE_DEVICE_py_bench.json/.md
    python bench/run_all.py --device cpu --quick --only norm,activation
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import decodekit  # noqa: F401
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import decodekit  # noqa: F401

import torch  # noqa: E402

from decodekit.bench import (  # noqa: E402
    ceiling_details, measure_copy_bandwidth, result_name, summarize, write_results)


def families() -> dict[str, str]:
    """family name -> script path, for every bench/bench_<family>.py with main(argv) -> list[Result]
    (bench_beam.py, bench_guided.py, ... are standalone engine scripts with their own command lines)."""
    out = {}
    for f in sorted(os.listdir(HERE)):
        if f.startswith("bench_") and f.endswith(".py"):
            with open(os.path.join(HERE, f)) as fh:
                if "\ndef main(argv" not in fh.read():
                    continue
            out[f[len("bench_"):-len(".py")]] = os.path.join(HERE, f)
    return out


def load(family: str, path: str):
    # imported as bench_<family> with bench/ on sys.path: worker processes it spawns (bench_allreduce)
    # unpickle their target function by that module name
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location(f"bench_{family}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses (Python 3.12) look the module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    p.add_argument("--only", default="", help="comma list of families (default: all found)")
    p.add_argument("--out", default=None, help="directory for DATE_DEVICE_py_bench.json/.md")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--list", action="store_true", help="list the families and exit")
    args, rest = p.parse_known_args(argv)

    found = families()
    if args.list:
        print("\n".join(found))
        return 0
    wanted = [f.strip() for f in args.only.split(",") if f.strip()] or list(found)
    status: list[tuple[str, str, float, dict]] = []
    for fam in wanted:
        if fam not in found:
            print(f"run_all: skipping {fam!r}: no bench/bench_{fam}.py (have: {', '.join(found)})", flush=True)
            status.append((fam, "skipped", 0.0, {}))

    all_results = []
    name = result_name("py_bench", args.device)
    t_all = time.time()
    if any(f in found for f in wanted):
        copy = measure_copy_bandwidth(args.device)
        print(f"run_all: device {args.device}, copy ceiling {copy:.1f} GB/s", flush=True)
    for fam in wanted:
        if fam not in found:
            continue
        t0 = time.time()
        try:
            res = load(fam, found[fam]).main(["--device", args.device] + rest)
            all_results += res
            status.append((fam, "ok", time.time() - t0, summarize(res)))
        except SystemExit as e:  # argparse errors, "built without CUDA kernels", ...
            print(f"run_all: {fam} exited: {e}", flush=True)
            status.append((fam, "FAIL", time.time() - t0, {}))
        except Exception:  # noqa: BLE001  (a failed correctness check, a kernel error)
            traceback.print_exc()
            status.append((fam, "FAIL", time.time() - t0, {}))
        if args.out and all_results:  # after every family: a run stopped by a time limit keeps what it measured
            paths = write_results(all_results, args.out, name,
                                  title=f"decodekit Python microbenchmarks ({args.device})")
            print(f"run_all: wrote {paths[0]} and {paths[1]} ({len(all_results)} cases so far)", flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()

    # one short table: one line per op (a family can have several ops)
    print()
    for c in ceiling_details(args.device):
        print(f"ceiling {c.kind}: {c.value:.4g} ({c.detail})")
    head = f"{'family':<11} {'op':<20} {'status':<8} {'cases':>5} {'med %ceil':>9} {'max %ceil':>9} " \
           f"{'geo speedup':>11} {'min..max speedup':>17} {'s':>6}"
    print(head)
    print("-" * len(head))
    for fam, st, secs, summ in status:
        if not summ:
            print(f"{fam:<11} {'-':<20} {st:<8} {0:>5} {'-':>9} {'-':>9} {'-':>11} {'-':>17} {secs:6.1f}")
        for op, s in summ.items():
            rng = "-" if s["min_speedup"] is None else f"{s['min_speedup']:.2f}..{s['max_speedup']:.2f}x"
            print(f"{fam:<11} {op:<20} {st:<8} {s['cases']:>5} {_pct(s['median_frac']):>9} {_pct(s['max_frac']):>9} "
                  f"{_x(s['geomean_speedup']):>11} {rng:>17} {secs:6.1f}")
    ok = all(st != "FAIL" for _, st, _, _ in status)
    sp = [r.speedup_vs_peer for r in all_results if r.speedup_vs_peer]
    geo = math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None
    print(f"run_all: {'OK' if ok else 'FAILED'}: {len(all_results)} cases in {time.time() - t_all:.1f} s, "
          f"geomean speedup vs peers {_x(geo)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
