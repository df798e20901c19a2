#!/usr/bin/env python3
"""Custom AllReduce and gemm_allreduce (decodekit.distributed.custom_allreduce) against torch.distributed.

Spawns --world-size processes (a gloo group; CPU: /dev/shm buffers; CUDA: IPC buffers, one GPU per rank
when there are enough, else every rank on the same GPU, which time-slices them: those rows are named
"all_reduce_shared_gpu" / "gemm_allreduce_shared_gpu", correct but kept out of the planner's calibration)
and times, with the same fixed number of calls on every rank (a collective cannot stop early on one rank):

* bench "all_reduce": messages of 4 KiB .. 4 MiB (CPU) / 64 MiB (CUDA), one-shot and two-shot, against
  torch.distributed.all_reduce (gloo on the CPU; NCCL on CUDA when every rank has its own GPU, else gloo);
* bench "gemm_allreduce": the Llama-3-70B row-parallel layers (o_proj K = 8192 / tp, N = 8192; down_proj
  K = 28672 / tp, N = 8192; the CPU runs them scaled down 8x) at M = 1 .. 256, fused against the plain
  GEMM (ops.linear: our dense path on the CPU, cuBLAS on CUDA) + torch.distributed.all_reduce; and at
  world size 1 (no communication) the fused op against the plain GEMM alone: the overhead (< 3 % wanted).

Rows (decodekit.bench.Result + world_size, algo) carry time_us (rank 0's median), bytes (the message; for
gemm_allreduce the weight shard + activations + output), the world size and algorithm (also in the case:
"4096 B ws=2 algo=one_shot") and the peer's time. Each case is first checked
against a float64 all-reduce of the same inputs.

    python bench/bench_allreduce.py --device cpu --quick --world-size 2
    python bench/bench_allreduce.py --device cuda --world-size 2 --out bench/results
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

try:
    import decodekit
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import decodekit

from decodekit.bench import DTYPES, TOLERANCE, BenchContext, Result, Timing, add_common_args, rel_err
from decodekit.ops import reference

NAME = "allreduce"
KIB, MIB = 1 << 10, 1 << 20
SIZES = {"cpu": [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB],
         "cuda": [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]}
SIZES_QUICK = {"cpu": [4 * KIB, 64 * KIB, MIB], "cuda": [4 * KIB, 256 * KIB, 4 * MIB, 64 * MIB]}
M_ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
M_QUICK = [1, 16, 256]
# (name, K at tp = 1, N): Llama-3-70B row-parallel layers; the CPU uses them / 8
LAYERS = [("o_proj", 8192, 8192), ("down_proj", 28672, 8192)]
CPU_SCALE = 8


@dataclasses.dataclass
class CommResult(Result):
    """A Result row with the fields the planner's calibration reads besides bytes and time_us."""
    world_size: int = 1
    algo: str = ""  # one_shot | two_shot | fused


def _timing(per_call_s: list[float], method: str, calls: int) -> Timing:
    xs = sorted(per_call_s)
    q = lambda f: xs[min(len(xs) - 1, max(0, round(f * (len(xs) - 1))))]  # noqa: E731
    return Timing(median_s=statistics.median(xs), p10_s=q(0.1), p90_s=q(0.9), mean_s=statistics.fmean(xs),
                  min_s=xs[0], samples=len(xs), calls_per_sample=calls, method=method, rotate_sets=1)


class _Clock:
    """Times `calls` back-to-back calls per sample, the same count on every rank."""

    def __init__(self, device: torch.device, dist, samples: int, quick: bool):
        self.device, self.dist, self.samples, self.quick = device, dist, samples, quick

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def calls_for(self, nbytes: int) -> int:
        cap = 8 if self.quick else 32
        return max(1, min(cap, (MIB if self.device.type == "cpu" else 64 * MIB) // max(nbytes, 1)))

    def graphed(self, fn, calls: int) -> list[float]:
        """CUDA: `calls` calls captured in one graph, each replay timed (no launch gaps); else __call__."""
        if self.device.type != "cuda":
            return self(fn, calls)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return [t / calls for t in self(graph.replay, 1)]

    def __call__(self, fn, calls: int, warmup: int = 2) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        self.dist.barrier()
        out = []
        for _ in range(self.samples):
            if self.device.type == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(calls):
                    fn()
                e1.record()
                e1.synchronize()
                out.append(e0.elapsed_time(e1) * 1e-3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
        return out


def _worker(rank: int, ws: int, port: int, cfg: dict, out_path: str) -> None:
    import torch.distributed as dist

    from decodekit import ops
    from decodekit.distributed.custom_allreduce import CustomAllReduce
    dev_type = cfg["device"]
    if dev_type == "cuda":
        ngpu = torch.cuda.device_count()
        torch.cuda.set_device(rank % ngpu)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ws))
        device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    peer_group, peer_name = None, "torch.distributed (gloo)"
    if dev_type == "cuda" and torch.cuda.device_count() >= ws and dist.is_nccl_available():
        peer_group, peer_name = dist.new_group(backend="nccl"), "torch.distributed (nccl)"
    dtype = DTYPES[cfg["dtype"]]
    # ranks sharing one GPU take turns (time slices): correct, but not timings to plan with, so these
    # rows get their own bench names (the planner's calibration reads "all_reduce" rows)
    shared_gpu = dev_type == "cuda" and torch.cuda.device_count() < ws
    shared = "; ranks share one GPU (time-sliced): not for calibration" if shared_gpu else ""
    suffix = "_shared_gpu" if shared_gpu else ""
    clock = _Clock(device, dist, cfg["samples"], cfg["quick"])
    gen = torch.Generator().manual_seed(7 + rank)
    rows = []
    max_bytes = max(cfg["sizes"] + [cfg["max_gemm_out_bytes"]])
    car = CustomAllReduce(device=device, max_bytes=max_bytes, timeout_s=120)

    def rand(shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)

    def reduced64(t):  # float64 sum over the ranks (the reference)
        r = t.double()
        dist.all_reduce(r)
        return r

    for nbytes in cfg["sizes"]:
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = rand((n,))
        out = torch.empty_like(x)
        ref = reduced64(x)
        peer_out = x.clone()
        dist.all_reduce(peer_out, group=peer_group)
        peer_err = rel_err(peer_out, ref)
        calls = clock.calls_for(nbytes)
        t_peer = clock(lambda: dist.all_reduce(peer_out, group=peer_group), calls)
        for algo in ("one_shot", "two_shot"):
            car.all_reduce(x, out=out, algo=algo)
            err = rel_err(out, ref)
            assert err <= TOLERANCE[dtype], f"all_reduce {nbytes} B {algo}: rel err {err:.3g}"
            t = clock(lambda: car.all_reduce(x, out=out, algo=algo), calls)
            rows.append(dict(bench="all_reduce" + suffix, case=f"{nbytes} B ws={ws} algo={algo}", ws=ws,
                             algo=algo, nbytes=nbytes, t=t, t_peer=t_peer, calls=calls, err=err, peer_err=peer_err,
                             peer=peer_name,
                             notes=f"world_size={ws} algo={algo} message_bytes={nbytes}{shared}"))

    for (name, k_full, n_out), kind in itertools.product(cfg["layers"], cfg["weights"]):
        K = k_full // ws
        w = weight(kind, rand((n_out, K), 0.02))
        for M in m_rows_for(kind, cfg["m_rows"]):
            a = rand((M, K))
            out = torch.empty((M, n_out), dtype=dtype, device=device)
            ref = reduced64(reference._linear_partial(a, w, torch.float64))
            car.gemm_allreduce(a, w, out=out)
            err = rel_err(out, ref)
            assert err <= 2 * TOLERANCE[dtype], f"gemm_allreduce {kind} {name} M={M}: rel err {err:.3g}"

            def peer():
                y = ops.linear(a, w)
                dist.all_reduce(y, group=peer_group)
                return y
            peer_err = rel_err(peer(), ref)
            calls = clock.calls_for(weight_bytes(w))
            t = clock(lambda: car.gemm_allreduce(a, w, out=out), calls)
            t_peer = clock(peer, calls)
            nb = weight_bytes(w) + (a.numel() + out.numel()) * a.element_size()
            rows.append(dict(bench="gemm_allreduce" + suffix,
                             case=f"{name} M={M} K={K} N={n_out} ws={ws} algo=fused{case_weights(kind)}",
                             ws=ws, algo="fused", nbytes=nb, flops=2.0 * M * K * n_out, t=t, t_peer=t_peer,
                             calls=calls, err=err,
                             peer_err=peer_err, peer=f"ops.linear + {peer_name}",
                             notes=f"world_size={ws} algo=fused tp_shard_K={K} weights={kind}{shared}"))
    car.close()

    # world size 1: the fused op without communication against the plain GEMM (its overhead)
    solo_group = dist.new_group([0])
    if rank == 0:
        if dev_type == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)  # the other ranks wait in a barrier
        solo = CustomAllReduce(solo_group, device=device, max_bytes=cfg["max_gemm_out_bytes"], timeout_s=120)
        solo_clock = _Clock(device, _NoBarrier(), 3 * cfg["samples"], cfg["quick"])  # small differences: more samples
        for (name, k_full, n_out), kind in itertools.product(cfg["layers"], cfg["weights"]):
            K = k_full // cfg["overhead_tp"]
            w = weight(kind, rand((n_out, K), 0.02))
            for M in m_rows_for(kind, cfg["m_rows"]):
                a = rand((M, K))
                out = torch.empty((M, n_out), dtype=dtype, device=device)
                solo.gemm_allreduce(a, w, out=out)
                ref = reference._linear_partial(a, w, torch.float64)
                err = rel_err(out, ref)
                assert err <= 2 * TOLERANCE[dtype], f"gemm_allreduce ws=1 {kind} {name} M={M}: rel err {err:.3g}"
                calls = solo_clock.calls_for(weight_bytes(w))
                t = solo_clock.graphed(lambda: solo.gemm_allreduce(a, w, out=out), calls)
                t_peer = solo_clock.graphed(lambda: ops.linear(a, w), calls)
                nb = weight_bytes(w) + (a.numel() + out.numel()) * a.element_size()
                over = statistics.median(t) / statistics.median(t_peer) - 1
                rows.append(dict(bench="gemm_allreduce",
                                 case=f"{name} M={M} K={K} N={n_out} ws=1 algo=fused{case_weights(kind)}",
                                 ws=1, algo="fused", nbytes=nb, flops=2.0 * M * K * n_out, t=t, t_peer=t_peer,
                                 calls=calls, err=err, graph=dev_type == "cuda",
                                 peer_err=rel_err(ops.linear(a, w), ref), peer="ops.linear (plain GEMM)",
                                 notes=f"world_size=1 weights={kind} overhead_vs_plain_gemm={100 * over:+.1f}%"))
        solo.close()
    dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def weight(kind: str, w: torch.Tensor):  # [N, K] dense -> the layer's weight in `kind`'s format
    if kind == "int4":
        from decodekit.quant import quantize_rtn
        return quantize_rtn(w, next(g for g in (128, 64, 32) if w.shape[1] % g == 0))
    if kind == "fp8":
        from decodekit.quant.fp8 import quantize_fp8_weight
        return quantize_fp8_weight(w)
    return w


def m_rows_for(kind: str, m_rows: list[int]) -> list[int]:
    """Dense: every M; INT4 / fp8: the decode sizes (M <= 16: the fused kernels) plus the largest M,
    which keeps the GPU run inside its time budget."""
    return m_rows if kind == "dense" else sorted({m for m in m_rows if m <= 16} | {max(m_rows)})


def weight_bytes(w) -> int:  # a tensor's or a packed weight's (PackedWeight.nbytes) bytes
    return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes


def case_weights(kind: str) -> str:  # dense cases keep their names (the planner's calibration reads them)
    return "" if kind == "dense" else f" weights={kind}"


class _NoBarrier:
    def barrier(self):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> list[Result]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: CPU 2; CUDA the visible GPUs, at least 2, all on one GPU if only one)")
    p.add_argument("--samples", type=int, default=None, help="timed samples per case (default 15, quick 5)")
    p.add_argument("--weights", default="dense,int4,fp8",
                   help="gemm_allreduce weight formats, comma-separated: dense, int4 (RTN, g128 where K allows), fp8 (W8A8)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"bench_{NAME}: ignoring options it does not know: {' '.join(unknown)}")
    kinds = [k for k in args.weights.split(",") if k]
    if not kinds or any(k not in ("dense", "int4", "fp8") for k in kinds):
        raise SystemExit(f"bench_allreduce: --weights takes dense, int4 and fp8 (comma-separated), got {args.weights!r}")
    ctx = BenchContext(args, NAME)
    dev = ctx.device.type
    if dev == "cuda" and not decodekit.has_cuda_kernels():
        raise SystemExit("bench_allreduce: decodekit was built without CUDA kernels (rebuild with DECODEKIT_CUDA=1)")
    ws = args.world_size or (2 if dev == "cpu" else max(2, torch.cuda.device_count()))
    scale = CPU_SCALE if dev == "cpu" else 1
    layers = [(n, k // scale, nn // scale) for n, k, nn in LAYERS]
    m_rows = M_QUICK if ctx.quick else M_ROWS
    if dev == "cpu":
        m_rows = [m for m in m_rows if m <= 64]
    sizes = (SIZES_QUICK if ctx.quick else SIZES)[dev]
    ctx.copy_ceiling()
    import torch.multiprocessing as mp
    for dtype_name, dtype in DTYPES.items():
        if dtype not in ctx.dtypes:
            continue
        cfg = dict(device=dev, dtype=dtype_name, quick=ctx.quick, sizes=sizes, layers=layers, m_rows=m_rows,
                   weights=kinds, samples=args.samples or (5 if ctx.quick else 15), overhead_tp=8 if dev == "cpu" else 1,
                   max_gemm_out_bytes=max(m_rows) * max(n for _, _, n in layers) * dtype.itemsize)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rows.json")
            t0 = time.time()
            mp.start_processes(_worker, args=(ws, _free_port(), cfg, path), nprocs=ws, join=True,
                               start_method="spawn")
            rows = json.load(open(path))
            if not args.quiet:
                print(f"  ({ws} ranks, {dtype_name}: {time.time() - t0:.1f} s)", flush=True)
        device = str(ctx.device)
        for r in rows:
            method = ("cpu-perf_counter" if dev == "cpu" else "cuda-graph" if r.get("graph") else "cuda-events") + \
                f", {r['calls']} calls per sample"
            res = CommResult.from_timings(r["bench"], r["case"], dtype, device, _timing(r["t"], method, r["calls"]),
                                          nbytes=r["nbytes"], flops=r.get("flops"), peer=r["peer"],
                                          peer_timing=_timing(r["t_peer"], method, r["calls"]),
                                          max_rel_err=r["err"], peer_rel_err=r["peer_err"], world_size=r["ws"],
                                          algo=r["algo"])
            res.notes = (res.notes + "; " if res.notes else "") + r["notes"]
            if math.isnan(res.time_us):
                raise AssertionError(f"{r['case']}: no timing")
            ctx.add(res)
    return ctx.finish()


if __name__ == "__main__":
    main()
