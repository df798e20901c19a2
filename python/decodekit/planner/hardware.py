"""Hardware for the planner: GPU presets, the measured CPU, and calibration from bench/results.

Units: bytes, bytes/s, FLOP/s, seconds. Memory sizes are decimal (80 GB = 80e9 bytes), as on
the spec sheets and in the seed documents ("an 80 GB GPU has about 64 GB left" after 16 GB).

Calibration reads the JSON rows our own benchmarks write (`decodekit.bench.write_results`:
bench, case, dtype, device_name, frac_of_ceiling, ceiling_kind, ceiling; the `*_ceilings.json`
records; `decodekit bench latency` results) and keeps, per device name:

* copy_gbps: the measured copy ceiling (median over runs), the bandwidth every fraction is of;
* weight_frac[family]: median frac_of_ceiling of one-row (M=1; else M<=8) weight GEMV rows
  (`int4_gemm`, `int8_gemm`, `fp8_gemm`), preferring rows in the activation dtype, dropping
  rows above 1 (inputs left in cache);
* attn_frac: median frac_of_ceiling of `paged_attention` decode rows (bf16 KV);
* matmul_tflops: the measured dense matmul ceiling; gemm_frac: GEMM rows against it;
* engine_decode_frac: `decodekit bench latency`'s decode weight bytes/s over copy bandwidth
  (largest model measured), used for dense weights when no dense GEMV rows exist, and for every
  format when no GEMV rows exist at all;
* allreduce_latency_s / allreduce_busbw: from `all_reduce` rows when present, at the largest
  world size measured: the smallest message's best time (used as the whole latency of one
  AllReduce at any TP), the largest message's bus bandwidth (given, or 2(N-1)/N * bytes / time).

Rows of the C++ harness (`frac_of_copy` against a memcpy ceiling counted differently) are not used.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import statistics


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator (per-device figures) and its interconnect.

    mem_bytes: device memory (bytes); mem_bw: memory bandwidth (bytes/s); flops: dense FLOP/s
    by compute kind ("bf16", "fp8", "fp32"); link_bw: interconnect bandwidth per device per
    direction (bytes/s; None: no interconnect, TP/PP impossible); link_latency_s: latency of
    one AllReduce step (s); act_dtype: activation dtype (AllReduce payloads, default KV dtype);
    node_gpus / net_bw / net_latency_s: GPUs per NVLink domain and the network beyond it.
    """
    name: str
    mem_bytes: float
    mem_bw: float
    flops: dict
    link_bw: float | None
    link_latency_s: float
    act_dtype: str = "bf16"
    device_names: tuple = ()
    note: str = ""
    node_gpus: int = 8
    net_bw: float = 50e9
    net_latency_s: float = 5e-6

    def link(self, ranks: int) -> tuple[float | None, float]:
        """(bytes/s, s per step) for a group of `ranks` GPUs: NVLink within a node of node_gpus,
        the network (net_bw per GPU: 400 Gb/s InfiniBand) once the group spans nodes."""
        if self.link_bw is None or ranks <= self.node_gpus:
            return self.link_bw, self.link_latency_s
        return self.net_bw, self.net_latency_s

    def flops_for(self, kind: str) -> float:
        """FLOP/s for a compute kind; falls back to the activation dtype's rate (e.g. fp8 on A100)."""
        if kind in self.flops:
            return self.flops[kind]
        return self.flops.get(self.act_dtype) or max(self.flops.values())

    @property
    def ridge(self) -> float:
        """Roofline ridge point, FLOP/byte, at the activation dtype's rate."""
        return self.flops_for(self.act_dtype) / self.mem_bw


PRESETS: dict[str, Hardware] = {
    "h100": Hardware("H100 SXM 80GB", 80e9, 3.35e12, {"bf16": 989.5e12, "fp8": 1979e12}, 450e9, 2e-6,
                     device_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
                     note="NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction"),
    "h200": Hardware("H200 141GB", 141e9, 4.8e12, {"bf16": 989.5e12, "fp8": 1979e12}, 450e9, 2e-6,
                     device_names=("NVIDIA H200",), note="H100 compute with HBM3e"),
    "a100": Hardware("A100 SXM 80GB", 80e9, 2.039e12, {"bf16": 312e12}, 300e9, 2.5e-6,
                     device_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
                     note="no fp8 tensor cores: fp8 weights compute at the bf16 rate"),
}
_ALIASES = {"h100sxm": "h100", "h10080gb": "h100", "h100sxm80gb": "h100", "h200141gb": "h200",
            "a10080gb": "a100", "a100sxm": "a100", "a100sxm80gb": "a100"}
HARDWARE_CHOICES = (*PRESETS, "cpu-calibrated")


def _key(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def norm_device_name(s: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'Intel(R) Xeon(R) Processor (2 cpus)' -> 'intel xeon processor'."""
    s = re.sub(r"\([^)]*\)", " ", s.lower().replace("cpu:", " ").replace("nvidia", " "))
    return " ".join(re.sub(r"[^a-z0-9.]+", " ", s).split())


# ------------------------------------------------------------------------------ calibration
@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured efficiencies for one device (see the module docstring for where each comes from)."""
    device_name: str
    copy_gbps: float | None = None
    matmul_tflops: float | None = None
    weight_frac: dict = dataclasses.field(default_factory=dict)
    attn_frac: float | None = None
    gemm_frac: float | None = None
    engine_decode_frac: float | None = None
    allreduce_latency_s: float | None = None
    allreduce_busbw: float | None = None
    n_rows: int = 0
    sources: tuple = ()

    @property
    def empty(self) -> bool:
        return self.n_rows == 0 and self.copy_gbps is None


def default_results_dir() -> str:
    """$DECODEKIT_BENCH_RESULTS, else this checkout's bench/results."""
    env = os.environ.get("DECODEKIT_BENCH_RESULTS")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "bench", "results"))


def _rows_of(path: str) -> list[dict]:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return []
    if isinstance(d, list):
        return [r for r in d if isinstance(r, dict)]
    if isinstance(d, dict):
        if "bench" in d or "decode_frac_of_copy_bw" in d:
            return [d]
        if "rows" in d and isinstance(d["rows"], list):
            return [r for r in d["rows"] if isinstance(r, dict)]
    return []


def _dtype(s) -> str:
    s = str(s or "").replace("torch.", "")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(s, s)


def _m_of(case: str) -> int | None:
    m = re.search(r"\bM=(\d+)", case or "")
    return int(m.group(1)) if m else None


_GEMV_FAMILY = {"int4_gemm": "int4", "int8_gemm": "int8", "fp8_gemm": "fp8", "linear": "dense",
                "dense_gemm": "dense", "gemv": "dense"}
_ATTN = ("paged_attention", "decode_attention", "attention")


def _bytes_of(case: str) -> float | None:
    m = re.search(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|kB|KB|MB|GB)\b", case)
    if not m:
        return None
    mult = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    return float(m.group(1)) * mult[m.group(2)]


def _ranks_of(case: str) -> int | None:
    m = re.search(r"\b(?:world|world_size|ws|tp|ranks|n)\s*=\s*(\d+)", case) or re.search(r"(\d+)\s*ranks", case)
    return int(m.group(1)) if m else None


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def load_calibration(device_name: str | tuple | list, source: str | None = None,
                     act_dtype: str | None = None) -> Calibration:
    """Calibration for a device from every JSON file in `source` (a directory, default
    bench/results, or one file). device_name: one name or several (matched after
    normalisation). act_dtype: prefer GEMV rows measured in this activation dtype."""
    names = [device_name] if isinstance(device_name, str) else list(device_name)
    want = {norm_device_name(n) for n in names}
    source = source or default_results_dir()
    if os.path.isdir(source):
        files = sorted(glob.glob(os.path.join(source, "*.json")))
    elif os.path.exists(source):
        files = [source]
    else:
        raise FileNotFoundError(f"calibration: no such file or directory {source!r}")
    copy, matmul, attn, gemm, eng, ar = [], [], [], [], [], []
    gemv: dict[str, list] = {}
    used, n = set(), 0
    for path in files:
        for r in _rows_of(path):
            dev = r.get("device_name") or (r.get("device") if "decode_frac_of_copy_bw" in r else None)
            if not dev or norm_device_name(str(dev)) not in want:
                continue
            hit = False
            kind, bench = r.get("kind"), str(r.get("bench") or "")
            if kind in ("copy_gbps", "matmul_tflops") and r.get("value"):  # *_ceilings.json
                (copy if kind == "copy_gbps" else matmul).append((path, float(r["value"])))
                hit = True
            elif "decode_frac_of_copy_bw" in r and r.get("bench") == "latency":  # decodekit bench latency
                if r.get("copy_bandwidth_gb_s"):
                    copy.append((path, float(r["copy_bandwidth_gb_s"])))
                eng.append((float(r.get("weight_bytes") or 0), float(r["decode_frac_of_copy_bw"])))
                hit = True
            elif r.get("ceiling_kind") in ("copy_gbps", "matmul_tflops") and r.get("frac_of_ceiling") is not None:
                frac, ck = float(r["frac_of_ceiling"]), r["ceiling_kind"]
                if r.get("ceiling"):
                    (copy if ck == "copy_gbps" else matmul).append((path, float(r["ceiling"])))
                if ck == "copy_gbps" and bench in _GEMV_FAMILY and frac <= 1.0:
                    row = (_m_of(r.get("case", "")), _dtype(r.get("dtype")), frac)
                    gemv.setdefault(_GEMV_FAMILY[bench], []).append(row)
                    hit = True
                elif ck == "copy_gbps" and bench in _ATTN and frac <= 1.0 and "fp8" not in str(r.get("case")):
                    attn.append(frac)
                    hit = True
                elif ck == "matmul_tflops" and bench.split(" ")[0] in _GEMV_FAMILY:
                    gemm.append(frac)
                    hit = True
            if bench in ("all_reduce", "allreduce", "custom_all_reduce") and r.get("time_us"):
                case = str(r.get("case") or "")
                nbytes = r.get("bytes") or r.get("nbytes") or r.get("message_bytes") or _bytes_of(case)
                ranks = r.get("world_size") or r.get("ranks") or r.get("tp") or _ranks_of(case)
                bw = r.get("busbw_gbps") or r.get("bus_gbps")
                ar.append((float(nbytes or 0), int(ranks or 0), float(r["time_us"]) * 1e-6,
                           float(bw) * 1e9 if bw else None))
                hit = True
            if hit:
                n += 1
                used.add(os.path.basename(path))
    # one copy / matmul ceiling per file (a run), median over runs
    per_file = lambda xs: _median([statistics.median(v for p, v in xs if p == f) for f in {p for p, _ in xs}])  # noqa
    weight_frac = {}
    for fam, rows in gemv.items():
        sel = [r for r in rows if r[0] == 1] or [r for r in rows if r[0] is not None and r[0] <= 8] or rows
        if act_dtype and any(r[1] == act_dtype for r in sel):
            sel = [r for r in sel if r[1] == act_dtype]
        weight_frac[fam] = statistics.median(r[2] for r in sel)
    eng_frac = None
    if eng:
        big = max(w for w, _ in eng)
        eng_frac = _median([f for w, f in eng if w == big])
    ar_lat = ar_bw = None
    if ar:  # the largest world size measured; the best algorithm at each size
        ws = max(w for _, w, _, _ in ar)
        ar = [x for x in ar if x[1] == ws]
        small, large = min(x[0] for x in ar), max(x[0] for x in ar)
        ar_lat = min(t for b, _, t, _ in ar if b == small)
        explicit = [w for b, _, _, w in ar if b == large and w]
        t_large = min(t for b, _, t, _ in ar if b == large)
        # bus bandwidth: what the ring model's 2(N-1)/N * S / bw needs to match the measured time
        ar_bw = max(explicit) if explicit else ((2 * (ws - 1) / ws if ws > 1 else 1) * large / t_large
                                                 if large > 0 else None)
    return Calibration(device_name=names[0], copy_gbps=per_file(copy) if copy else None,
                       matmul_tflops=per_file(matmul) if matmul else None, weight_frac=weight_frac,
                       attn_frac=_median(attn), gemm_frac=_median(gemm), engine_decode_frac=eng_frac,
                       allreduce_latency_s=ar_lat, allreduce_busbw=ar_bw, n_rows=n, sources=tuple(sorted(used)))


# --------------------------------------------------------------------------------- the CPU
def cpu_device_name() -> str:
    """This CPU's name as benchmark rows record it (decodekit.bench.timing.device_name('cpu') calls this)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cpus)"
    except OSError:
        pass
    import platform
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cpus)"


def _mem_total() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16e9


def cpu_calibrated(measure: bool = False, source: str | None = None) -> tuple[Hardware, Calibration]:
    """This CPU as a device: copy bandwidth and fp32 matmul rate from bench/results rows for
    this CPU (median over runs), or measured now (`measure=True`, or when no rows exist) with
    decodekit.bench.timing (torch; a few seconds). The "peak" figures are these measured
    ceilings, so the ideal plan is the copy-bandwidth floor and the calibrated plan applies
    the measured kernel fractions (GEMV, attention) on top."""
    name = cpu_device_name()
    try:
        cal = load_calibration(name, source, act_dtype="fp32")
    except FileNotFoundError:
        cal = Calibration(name)
    copy, mm = cal.copy_gbps, cal.matmul_tflops
    measured = []
    if measure or copy is None or mm is None:
        from decodekit.bench.timing import measure_copy_bandwidth, measure_matmul_tflops
        if measure or copy is None:
            copy = measure_copy_bandwidth("cpu")
            measured.append(f"copy {copy:.1f} GB/s")
        if measure or mm is None:
            mm = measure_matmul_tflops("cpu")
            measured.append(f"fp32 matmul {mm * 1e3:.0f} GFLOP/s")
    cal = dataclasses.replace(cal, copy_gbps=copy, matmul_tflops=mm,
                              sources=cal.sources + (("measured now: " + ", ".join(measured),) if measured else ()))
    hw = Hardware(f"CPU {name}", _mem_total(), copy * 1e9, {"fp32": mm * 1e12}, None, 0.0, act_dtype="fp32",
                  device_names=(name,), note="peak = measured copy bandwidth and fp32 matmul rate")
    return hw, cal


def load_hardware(spec: str, *, measure: bool = False) -> Hardware:
    """A preset (h100, h200, a100, cpu-calibrated; spelling-insensitive), or a calibration
    file (`*_ceilings.json` etc.) whose device name matches a preset."""
    if spec in PRESETS:
        return PRESETS[spec]
    if spec == "cpu-calibrated":
        return cpu_calibrated(measure)[0]
    k = _key(spec)
    k = _ALIASES.get(k, k)
    if k in PRESETS:
        return PRESETS[k]
    if spec.endswith(".json"):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"gpu: no such calibration file {spec!r}")
        names = {str(r.get("device_name")) for r in _rows_of(spec) if r.get("device_name")}
        for hw in PRESETS.values():
            if any(norm_device_name(n) in {norm_device_name(x) for x in hw.device_names} for n in names):
                return hw
        raise ValueError(f"gpu: {spec} measures {', '.join(sorted(names)) or 'no named device'}, "
                         f"which matches no preset ({', '.join(HARDWARE_CHOICES)})")
    raise ValueError(f"gpu: unknown hardware {spec!r}; allowed: {', '.join(HARDWARE_CHOICES)} "
                     "or a bench/results calibration .json")
