"""Timing helper shared by every Python microbenchmark of decodekit.

What it gives:

* ``bench(fn, rotate=[args, ...])``: warm-up, then many timed calls; the median and the
  10th / 90th percentiles. On the CPU each call is timed with ``time.perf_counter_ns``;
  on CUDA either with a pair of CUDA events around each call, or (``cuda_graph=True``)
  by capturing K calls into one CUDA graph and timing each replay with events (the
  per-call time of a replay is its time / K). Call k uses ``rotate[k % len(rotate)]``, so
  with enough input sets each call reads data that is not in the L2 / last-level cache.
* ``rotating_copies(args, ...)``: N copies of one argument tuple, N chosen so the copies
  together exceed ``factor`` x the cache (L2 on CUDA, LLC on the CPU), capped in bytes.
* ``measure_copy_bandwidth(device)`` and ``measure_matmul_tflops(device, dtype)``: the two
  ceilings (memoized per process), measured in the same run as the benchmarks.
* ``Result`` (one row: our time, the peer's time, GB/s or TFLOP/s, fraction of the
  ceiling, speedup) and ``write_results(results, dir, name)`` -> JSON + markdown table.
* ``add_common_args`` / ``BenchContext`` / ``check_close``: what every bench script shares.

Every figure is reported as a fraction of the measured ceiling and against a peer (torch's
own implementation of the same op) timed in the same process with the same method.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import json
import math
import os
import re
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import torch

# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def gbps(nbytes: float, seconds: float) -> float:
    """Bytes over seconds, in GB/s (1e9 bytes)."""
    return float(nbytes) / seconds / 1e9 if seconds > 0 else float("nan")


def tflops(flops: float, seconds: float) -> float:
    """Floating-point operations over seconds, in TFLOP/s (1e12)."""
    return float(flops) / seconds / 1e12 if seconds > 0 else float("nan")


def _as_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def tensor_bytes(*objs: Any) -> int:
    """Total bytes of the tensors among objs (nested tuples/lists are walked)."""
    total = 0
    for o in objs:
        if isinstance(o, torch.Tensor):
            total += o.numel() * o.element_size()
        elif isinstance(o, (tuple, list)):
            total += tensor_bytes(*o)
    return total


def _first_tensor_device(sets: Sequence[Sequence[Any]]) -> torch.device:
    for args in sets[:1]:
        for a in args:
            if isinstance(a, torch.Tensor):
                return a.device
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _cpu_llc_bytes() -> int:
    """Largest CPU cache (the LLC) from sysfs; 32 MiB when unreadable."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    s = f.read().strip().upper()
                m = re.match(r"(\d+)([KMG]?)", s)
                if m:
                    best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])
            except OSError:
                continue
    except OSError:
        pass
    return best or (32 << 20)


def cache_bytes(device: str | torch.device | None) -> int:
    """L2 size on CUDA (from the device properties), the largest CPU cache otherwise."""
    dev = _as_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return int(getattr(props, "L2_cache_size", 0) or (50 << 20))
    return _cpu_llc_bytes()


@functools.lru_cache(maxsize=None)
def device_name(device: str | torch.device | None = None) -> str:
    dev = _as_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from decodekit.planner.hardware import cpu_device_name  # torch-free, shared with the planner
    return cpu_device_name()


def device_slug(device: str | torch.device | None = None) -> str:
    """Short file-name-safe device tag: 'H200' for 'NVIDIA H200', 'cpu' for the CPU."""
    dev = _as_device(device)
    if dev.type != "cuda":
        return "cpu"
    name = device_name(dev).replace("NVIDIA", "").strip()
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "cuda"


def run_stamp(now: _dt.datetime | None = None) -> str:
    """The DATE part of result file names: YYYYMMDD-HHMM (local time)."""
    return (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M")


def result_name(bench_name: str, device: str | torch.device | None, stamp: str | None = None) -> str:
    """DATE_DEVICE_bench, the base name write_results uses for a run's files."""
    return f"{stamp or run_stamp()}_{device_slug(device)}_{bench_name}"


def synchronize(device: str | torch.device | None) -> None:
    if _as_device(device).type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------
# rotating input sets
# --------------------------------------------------------------------------------------


def rotation_count(bytes_per_set: int, device: str | torch.device | None, *, factor: float = 2.0,
                   max_bytes: int | None = None, max_copies: int = 4096) -> int:
    """How many copies of a set of `bytes_per_set` make more than factor x the cache.

    Capped so the copies take at most max_bytes (default 2 GiB on CUDA, 512 MiB on the
    CPU) and at most max_copies; at least 1.
    """
    dev = _as_device(device)
    if max_bytes is None:
        max_bytes = (2 << 30) if dev.type == "cuda" else (512 << 20)
    bytes_per_set = max(1, int(bytes_per_set))
    want = math.ceil(factor * cache_bytes(dev) / bytes_per_set) + 1
    cap = max(1, max_bytes // bytes_per_set)
    return int(max(1, min(want, cap, max_copies)))


def rotating_copies(args: Sequence[Any], *, device: str | torch.device | None = None,
                    factor: float = 2.0, max_bytes: int | None = None, max_copies: int = 4096,
                    keep: Iterable[int] = (), count: int | None = None) -> list[tuple]:
    """N argument tuples for bench(rotate=...), built from one example tuple `args`.

    Every tensor in args whose index is not in `keep` is copied N times into one stacked
    allocation (copies are contiguous views of it; the values are those of the example,
    so they are as random as it is). Non-tensors and the `keep` tensors (shared tables,
    say) are passed as they are. N = count, or rotation_count(bytes of the copied tensors).
    """
    keep = set(keep)
    if device is None:
        device = _first_tensor_device([args])
    copied = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in keep]
    per_set = tensor_bytes(*[args[i] for i in copied])
    n = count if count is not None else rotation_count(per_set, device, factor=factor, max_bytes=max_bytes,
                                                        max_copies=max_copies)
    stacks = {}
    for i in copied:
        t = args[i]
        stacks[i] = t.detach().unsqueeze(0).expand(n, *t.shape).contiguous()
    sets = []
    for k in range(n):
        sets.append(tuple(stacks[i][k] if i in stacks else a for i, a in enumerate(args)))
    return sets


# --------------------------------------------------------------------------------------
# the timer
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    min_s: float
    samples: int            # timed samples behind the statistics
    calls_per_sample: int   # calls in one sample (K calls per graph replay, else 1)
    method: str             # cpu-perf_counter | cuda-events | cuda-graph
    rotate_sets: int        # distinct argument tuples cycled through
    note: str = ""

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def _summarize(per_call_s: list[float], calls: int, method: str, nsets: int, note: str = "") -> Timing:
    xs = sorted(per_call_s)
    return Timing(median_s=statistics.median(xs), p10_s=_percentile(xs, 0.10), p90_s=_percentile(xs, 0.90),
                  mean_s=statistics.fmean(xs), min_s=xs[0], samples=len(xs), calls_per_sample=calls,
                  method=method, rotate_sets=nsets, note=note)


def bench(fn: Callable[..., Any], *, warmup: int = 10, repeats: int = 100,
          rotate: Sequence[Sequence[Any]] | None = None, device: str | torch.device | None = None,
          cuda_graph: bool = False, graph_calls: int = 256, max_time_s: float | None = None,
          min_repeats: int = 5) -> Timing:
    """Time fn(*rotate[k % len(rotate)]) over many calls; return median / p10 / p90 per call.

    Calls go round the sets in order, warm-up first, the timed calls going on from there.

    warmup: untimed calls first (and untimed graph replays in graph mode).
    repeats: timed samples (calls; graph replays in graph mode).
    rotate: argument tuples to cycle through (default: one empty tuple, fn()).
    device: where fn runs; default the device of the first tensor in rotate[0].
    cuda_graph: on CUDA, capture min(len(rotate), graph_calls) calls (at least 1) into one
        graph and time each replay; falls back to per-call events if capture fails (the
        Timing's note says so). Ignored on the CPU.
    max_time_s: stop taking samples after this much wall time (at least min_repeats taken).
    """
    sets = list(rotate) if rotate else [()]
    dev = _as_device(device) if device is not None else _first_tensor_device(sets)
    n = len(sets)
    note = ""

    if dev.type != "cuda":
        for k in range(warmup):
            fn(*sets[k % n])
        times = []
        t_start = time.perf_counter()
        for k in range(repeats):
            args = sets[(warmup + k) % n]  # go on from where the warm-up stopped: its sets are the warm ones
            t0 = time.perf_counter_ns()
            fn(*args)
            times.append((time.perf_counter_ns() - t0) * 1e-9)
            if max_time_s is not None and k + 1 >= min_repeats and time.perf_counter() - t_start > max_time_s:
                break
        return _summarize(times, 1, "cpu-perf_counter", n)

    with torch.cuda.device(dev):
        if cuda_graph:
            try:
                return _bench_graph(fn, sets, warmup, repeats, graph_calls, max_time_s, min_repeats)
            except Exception as e:  # noqa: BLE001  (some callables cannot be captured)
                note = f"graph capture failed ({type(e).__name__}: {str(e)[:80]}); per-call events"
                torch.cuda.synchronize()
        for k in range(warmup):
            fn(*sets[k % n])
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        done = 0
        t_start = time.perf_counter()
        for k in range(repeats):
            args = sets[(warmup + k) % n]
            starts[k].record()
            fn(*args)
            ends[k].record()
            done = k + 1
            if max_time_s is not None and done >= min_repeats and time.perf_counter() - t_start > max_time_s:
                break
        torch.cuda.synchronize()
        times = [starts[k].elapsed_time(ends[k]) * 1e-3 for k in range(done)]
        return _summarize(times, 1, "cuda-events", n, note)


def _bench_graph(fn, sets, warmup, repeats, graph_calls, max_time_s, min_repeats) -> Timing:
    n = len(sets)
    calls = max(1, min(n, graph_calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # eager warm-up on a side stream, as capture wants
        for k in range(max(calls, 3)):
            fn(*sets[k % n])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(calls):
            fn(*sets[k])
    torch.cuda.synchronize()
    for _ in range(max(1, warmup // calls + 1)):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    done = 0
    t_start = time.perf_counter()
    for k in range(repeats):
        starts[k].record()
        graph.replay()
        ends[k].record()
        done = k + 1
        if max_time_s is not None and done >= min_repeats and time.perf_counter() - t_start > max_time_s:
            break
    torch.cuda.synchronize()
    times = [starts[k].elapsed_time(ends[k]) * 1e-3 / calls for k in range(done)]
    del graph
    return _summarize(times, calls, "cuda-graph", calls)


# --------------------------------------------------------------------------------------
# ceilings
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ceiling:
    kind: str      # copy_gbps | matmul_tflops
    value: float   # GB/s or TFLOP/s (median)
    device: str
    detail: str    # what was measured

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_CEILINGS: dict[tuple, Ceiling] = {}


def measure_copy_bandwidth(device: str | torch.device | None = "cuda", *, nbytes: int | None = None,
                           repeats: int | None = None) -> float:
    """Copy bandwidth in GB/s, counting bytes read + bytes written, median of many copies.

    CUDA: a 2 GiB device-to-device copy (dst.copy_(src)), timed with CUDA events.
    CPU: a 256 MiB torch copy_ with all cores as intra-op threads (restored after).
    Memoized per (device, nbytes); ceiling_details(device) has the Ceiling records.
    """
    dev = _as_device(device)
    key = ("copy", str(dev), nbytes)
    if key in _CEILINGS:
        return _CEILINGS[key].value
    if nbytes is None:
        nbytes = (2 << 30) if dev.type == "cuda" else (256 << 20)
        nbytes = max(nbytes, 4 * cache_bytes(dev)) if dev.type == "cuda" else nbytes
    n = nbytes // 4
    old_threads = torch.get_num_threads()
    try:
        if dev.type == "cpu":
            torch.set_num_threads(os.cpu_count() or old_threads)
        if dev.type == "cuda":
            src = torch.empty(n, dtype=torch.float32, device=dev).uniform_(-1.0, 1.0)  # never zeros
        else:  # arange: nonzero, distinct, and far quicker to fill than random numbers on a few cores
            src = torch.arange(1, n + 1, dtype=torch.float32)
        dst = torch.empty_like(src).fill_(1.0)
        reps = repeats or (20 if dev.type == "cuda" else 8)
        t = bench(lambda: dst.copy_(src), warmup=3, repeats=reps, device=dev)
        synchronize(dev)
        assert torch.equal(dst[:: max(1, n // 4096)], src[:: max(1, n // 4096)]), "copy check failed"
        value = gbps(2 * n * 4, t.median_s)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    detail = (f"{2 * n * 4 / 1e9:.2f} GB moved per copy (read+write), median of {t.samples} "
              f"({t.median_s * 1e3:.3f} ms, {t.method}" + (f", {threads} threads" if dev.type == "cpu" else "") + ")")
    _CEILINGS[key] = Ceiling("copy_gbps", value, str(dev), detail)
    del src, dst
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return value


def measure_matmul_tflops(device: str | torch.device | None = "cuda", dtype: torch.dtype = torch.bfloat16, *,
                          n: int | None = None, repeats: int | None = None) -> float:
    """Dense matmul rate in TFLOP/s (2*n^3 per product), median, on random data (never zeros).

    CUDA: n=8192 in `dtype` (bf16 by default), 10 timed products after 3 warm-ups.
    CPU: float32 whatever dtype says (CPU bf16 matmul is not the ceiling that matters),
    n grown from 512 until one product takes >= 50 ms (at most 4096), 5 timed products,
    all cores as threads; well under 5 s.
    """
    dev = _as_device(device)
    if dev.type == "cpu":
        dtype = torch.float32
    key = ("matmul", str(dev), dtype, n)
    if key in _CEILINGS:
        return _CEILINGS[key].value
    gen = torch.Generator(device=dev).manual_seed(1234)
    old_threads = torch.get_num_threads()
    try:
        if dev.type == "cpu":
            torch.set_num_threads(os.cpu_count() or old_threads)
            if n is None:
                n = 512
                while n < 4096:
                    a = torch.randn(n, n, dtype=dtype, generator=gen)
                    t0 = time.perf_counter()
                    a @ a
                    if time.perf_counter() - t0 >= 0.05:
                        break
                    n *= 2
        n = n or 8192
        a = torch.randn(n, n, dtype=dtype, device=dev, generator=gen)
        b = torch.randn(n, n, dtype=dtype, device=dev, generator=gen)
        c = torch.empty(n, n, dtype=dtype, device=dev)
        reps = repeats or (10 if dev.type == "cuda" else 5)
        t = bench(lambda: torch.matmul(a, b, out=c), warmup=3 if dev.type == "cuda" else 1, repeats=reps, device=dev)
        synchronize(dev)
        assert torch.isfinite(c[:4, :4]).all() and c[:4, :4].abs().sum() > 0, "matmul check failed"
        value = tflops(2.0 * n ** 3, t.median_s)
    finally:
        torch.set_num_threads(old_threads)
    detail = (f"{n}x{n}x{n} {str(dtype).replace('torch.', '')} matmul on random data, median of {t.samples} "
              f"({t.median_s * 1e3:.3f} ms, {t.method})")
    _CEILINGS[key] = Ceiling("matmul_tflops", value, str(dev), detail)
    del a, b, c
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return value


def ceiling_details(device: str | torch.device | None = None) -> list[Ceiling]:
    """The Ceiling records measured so far in this process (for one device, or all)."""
    out = list(_CEILINGS.values())
    if device is not None:
        d = str(_as_device(device))
        out = [c for c in out if c.device == d]
    return out


# --------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """One benchmark row: our op and its peer on the same inputs, same run, same method."""
    bench: str                       # family / op, e.g. "rms_norm"
    case: str                        # shape description, e.g. "T=16 H=4096"
    dtype: str
    device: str                      # "cuda:0" / "cpu"
    time_us: float                   # median per call
    p10_us: float = float("nan")
    p90_us: float = float("nan")
    gbps: float | None = None        # bytes / time (bytes = the fewest the op must move)
    tflops: float | None = None      # flops / time, for compute-bound ops
    ceiling_kind: str = ""           # copy_gbps | matmul_tflops
    ceiling: float | None = None     # the measured ceiling, same units
    frac_of_ceiling: float | None = None
    peer: str = ""                   # e.g. "torch.nn.functional.rms_norm"
    peer_time_us: float | None = None
    peer_gbps: float | None = None
    peer_tflops: float | None = None
    speedup_vs_peer: float | None = None  # peer_time / time (>1: we are faster)
    bytes: int | None = None
    flops: float | None = None
    method: str = ""                 # timing method (cpu-perf_counter, cuda-events, cuda-graph)
    rotate_sets: int = 1
    rotate_bytes: int | None = None  # bytes the rotated sets span (vs cache_bytes)
    cache_bytes: int | None = None
    max_rel_err: float | None = None  # our output vs the float64 reference
    peer_rel_err: float | None = None
    date: str = ""
    device_name: str = ""
    torch_version: str = ""
    notes: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_timings(cls, bench_name: str, case: str, dtype: torch.dtype | str, device: str | torch.device,
                     timing: Timing, *, nbytes: int | None = None, flops: float | None = None,
                     peer: str = "", peer_timing: Timing | None = None,
                     rotate_bytes: int | None = None, **extra: Any) -> "Result":
        """Derive GB/s or TFLOP/s, the fraction of the measured ceiling and the speedup.

        Memory-bound rows (nbytes given, no flops) use the copy-bandwidth ceiling;
        rows with flops use the matmul ceiling (measured in bf16 on CUDA, fp32 on CPU).
        """
        dev = _as_device(device)
        t = timing.median_s
        r = cls(bench=bench_name, case=case, dtype=str(dtype).replace("torch.", ""), device=str(dev),
                time_us=t * 1e6, p10_us=timing.p10_s * 1e6, p90_us=timing.p90_s * 1e6, bytes=nbytes, flops=flops,
                method=timing.method, rotate_sets=timing.rotate_sets, rotate_bytes=rotate_bytes,
                cache_bytes=cache_bytes(dev), date=_dt.datetime.now().isoformat(timespec="seconds"),
                device_name=device_name(dev), torch_version=torch.__version__, peer=peer, notes=timing.note)
        if nbytes:
            r.gbps = gbps(nbytes, t)
        if flops:
            r.tflops = tflops(flops, t)
            r.ceiling_kind = "matmul_tflops"
            r.ceiling = measure_matmul_tflops(dev)
            r.frac_of_ceiling = r.tflops / r.ceiling
        elif nbytes:
            r.ceiling_kind = "copy_gbps"
            r.ceiling = measure_copy_bandwidth(dev)
            r.frac_of_ceiling = r.gbps / r.ceiling
        if peer_timing is not None:
            pt = peer_timing.median_s
            r.peer_time_us = pt * 1e6
            r.speedup_vs_peer = pt / t
            if nbytes:
                r.peer_gbps = gbps(nbytes, pt)
            if flops:
                r.peer_tflops = tflops(flops, pt)
            if peer_timing.note:
                r.notes = (r.notes + "; peer: " + peer_timing.note).strip("; ")
        for k, v in extra.items():
            setattr(r, k, v)
        return r


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def format_table(results: Sequence[Result | dict], markdown: bool = True) -> str:
    """A table of the rows: time, GB/s (or TFLOP/s), % of ceiling, peer time, speedup."""
    rows = [r.to_dict() if isinstance(r, Result) else dict(r) for r in results]
    head = ["bench", "case", "dtype", "time us (p10-p90)", "GB/s (or TF)", "% ceil", "peer us", "speedup"]
    body = []
    for r in rows:
        rate = (f"{_fmt(r.get('tflops'), '.1f')} TF" if r.get("tflops") else f"{_fmt(r.get('gbps'), '.1f')}")
        frac = r.get("frac_of_ceiling")
        body.append([
            r.get("bench", ""), r.get("case", ""), r.get("dtype", ""),
            f"{_fmt(r.get('time_us'), '.2f')} ({_fmt(r.get('p10_us'), '.2f')}-{_fmt(r.get('p90_us'), '.2f')})",
            rate, "-" if frac is None else f"{100 * frac:.1f}", _fmt(r.get("peer_time_us"), ".2f"),
            "-" if r.get("speedup_vs_peer") is None else f"{r['speedup_vs_peer']:.2f}x",
        ])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*map(str, row)) for row in body])


def write_results(results: Sequence[Result | dict], out_dir: str, name: str, *,
                  ceilings: Sequence[Ceiling] | None = None, title: str | None = None) -> tuple[str, str]:
    """Write out_dir/name.json (a list of dicts, one per row) and out_dir/name.md (a table).

    name is usually result_name(bench, device) = DATE_DEVICE_bench. Returns both paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    rows = [r.to_dict() if isinstance(r, Result) else dict(r) for r in results]
    jpath = os.path.join(out_dir, name + ".json")
    mpath = os.path.join(out_dir, name + ".md")
    with open(jpath, "w") as f:
        json.dump(rows, f, indent=1, default=str)
        f.write("\n")
    if ceilings is None:
        devs = {r.get("device") for r in rows}
        ceilings = [c for c in ceiling_details() if c.device in devs]
    lines = [f"# {title or name}", ""]
    if rows:
        r0 = rows[0]
        lines.append(f"{r0.get('date', '')[:10]}, {r0.get('device_name', '')}, torch {r0.get('torch_version', '')}, "
                     f"timing: {', '.join(sorted({str(r.get('method')) for r in rows}))}")
        lines.append("")
    for c in ceilings:
        unit = "GB/s" if c.kind == "copy_gbps" else "TFLOP/s"
        lines.append(f"- ceiling {c.kind}: **{c.value:.4g} {unit}** on {c.device} ({c.detail})")
    if ceilings:
        lines.append("")
    lines.append("Peers are torch's own implementation of the same op, timed in the same run; "
                 "speedup = peer time / our time; % ceil = our GB/s over the measured copy bandwidth.")
    lines.append("")
    lines.append(format_table(rows, markdown=True))
    with open(mpath, "w") as f:
        f.write("\n".join(lines) + "\n")
    return jpath, mpath


def emit_json(res: dict, path: str | None) -> None:
    """A standalone benchmark's result: printed, and written to `path` (its --json) when given."""
    import json
    print(json.dumps(res, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def summarize(results: Sequence[Result | dict]) -> dict:
    """Per-bench summary: cases, median % of ceiling, geometric-mean / min / max speedup."""
    rows = [r.to_dict() if isinstance(r, Result) else dict(r) for r in results]
    out: dict[str, dict] = {}
    for r in rows:
        s = out.setdefault(r["bench"], {"cases": 0, "fracs": [], "speedups": []})
        s["cases"] += 1
        if r.get("frac_of_ceiling") is not None:
            s["fracs"].append(r["frac_of_ceiling"])
        if r.get("speedup_vs_peer"):
            s["speedups"].append(r["speedup_vs_peer"])
    for s in out.values():
        fr, sp = s.pop("fracs"), s.pop("speedups")
        s["median_frac"] = statistics.median(fr) if fr else None
        s["max_frac"] = max(fr) if fr else None
        s["geomean_speedup"] = math.exp(statistics.fmean(math.log(x) for x in sp)) if sp else None
        s["min_speedup"] = min(sp) if sp else None
        s["max_speedup"] = max(sp) if sp else None
    return out


# --------------------------------------------------------------------------------------
# what every bench script shares
# --------------------------------------------------------------------------------------

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out has a NaN/inf that ref has not."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(o.device, torch.float64)
    if not torch.isfinite(o).all() and torch.isfinite(r).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den > 0 else num


def check_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str,
                tol: float | None = None) -> float:
    """Assert ||out - ref|| / ||ref|| <= tol(dtype) (ref in float64) and no NaN; return the error."""
    tol = TOLERANCE.get(dtype, 1e-2) if tol is None else tol
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g} ({dtype})"
    return err


def add_common_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="fewer shapes and shorter timing (smoke run)")
    p.add_argument("--out", default=None, help="directory for DATE_DEVICE_bench.json/.md (none: print only)")
    p.add_argument("--dtype", default="bf16", help="comma list of bf16,fp16,fp32 (default bf16)")
    p.add_argument("--no-graph", action="store_true", help="CUDA: time each call with events, not graph replay")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--max-time", type=float, default=None, help="seconds of sampling per timing at most")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU: torch intra-op threads for the op and its peer (default: torch's own)")
    p.add_argument("--quiet", action="store_true", help="no per-case lines")
    return p


class BenchContext:
    """Parsed common args plus the run's timing settings and ceilings."""

    def __init__(self, args: argparse.Namespace, bench_name: str):
        self.args = args
        self.bench_name = bench_name
        self.device = torch.device(args.device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit(f"{bench_name}: --device cuda but torch.cuda.is_available() is False")
            self.device = _as_device(self.device)
        self.quick = args.quick
        if getattr(args, "threads", None):
            torch.set_num_threads(args.threads)
        self.dtypes = []
        for name in str(args.dtype).split(","):
            name = name.strip()
            if name not in DTYPES:
                raise SystemExit(f"{bench_name}: unknown dtype {name!r} (allowed: {', '.join(DTYPES)})")
            self.dtypes.append(DTYPES[name])
        cuda = self.device.type == "cuda"
        self.warmup = args.warmup if args.warmup is not None else (10 if cuda else 3)
        self.repeats = args.repeats if args.repeats is not None else ((30 if args.quick else 100) if cuda else
                                                                      (20 if args.quick else 50))
        self.max_time_s = args.max_time if args.max_time is not None else (
            (0.5 if args.quick else 2.0) if cuda else (0.15 if args.quick else 1.0))
        self.cuda_graph = cuda and not args.no_graph
        # CPU quick: less rotation (the LLC may be hundreds of MiB) so the smoke run stays short.
        self.rotate_factor = 2.0
        self.rotate_max_bytes = None if (cuda or not args.quick) else (64 << 20)
        self.results: list[Result] = []

    def copy_ceiling(self) -> float:
        """Measured copy bandwidth (GB/s) of this run's device; prints it unless --quiet."""
        v = measure_copy_bandwidth(self.device)
        if not self.args.quiet:
            print(f"bench_{self.bench_name} on {self.device} ({device_name(self.device)}): "
                  f"copy ceiling {v:.1f} GB/s, timing {'cuda-graph' if self.cuda_graph else 'per call'}", flush=True)
        return v

    def time(self, fn: Callable[..., Any], sets: Sequence[Sequence[Any]]) -> Timing:
        return bench(fn, warmup=self.warmup, repeats=self.repeats, rotate=sets, device=self.device,
                     cuda_graph=self.cuda_graph, max_time_s=self.max_time_s)

    def rotate(self, args: Sequence[Any], keep: Iterable[int] = ()) -> list[tuple]:
        return rotating_copies(args, device=self.device, factor=self.rotate_factor,
                               max_bytes=self.rotate_max_bytes, keep=keep)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        if not self.args.quiet:
            sp = "-" if result.speedup_vs_peer is None else f"{result.speedup_vs_peer:.2f}x"
            fr = "-" if result.frac_of_ceiling is None else f"{100 * result.frac_of_ceiling:.1f}%"
            rate = f"{1e3 * result.tflops:8.1f} GF/s" if result.tflops else f"{_fmt(result.gbps, '8.1f')} GB/s"
            print(f"  {result.bench:<20} {result.case:<28} {result.dtype:<8} {result.time_us:9.2f} us "
                  f"{rate} {fr:>7} of ceil | peer {_fmt(result.peer_time_us, '9.2f')} us "
                  f"speedup {sp}", flush=True)
            if result.notes:
                print(f"    note: {result.notes}", flush=True)
        return result

    def finish(self) -> list[Result]:
        if self.args.out:
            paths = write_results(self.results, self.args.out, result_name(self.bench_name, self.device),
                                  title=f"decodekit {self.bench_name} ({self.device})")
            if not self.args.quiet:
                print(f"  wrote {paths[0]} and {paths[1]}")
        return self.results
