"""Roofline model of prefill and decode: bytes, FLOPs, step times, KV capacity, AllReduce, PP, speculation.

Units: bytes, FLOPs, seconds, bytes/s, FLOP/s throughout; results are dataclasses.

Decode step (per replica, one token per sequence):
    bytes  = weights/(TP*PP) + B * context * kv_per_token / (min(TP, kv_heads) * PP)   (per GPU)
    FLOPs  = B * (2 * P + 4 * layers * context * heads * head_dim) / (TP * PP)        (per GPU)
    t      = max(bytes / (BW * eff_bw), FLOPs / (FLOP/s * eff_mm)) + AllReduce        (per stage)
KV is sharded by KV head: past TP = kv_heads each rank holds a whole head, replicated TP/kv_heads
times. With a sliding window (Mistral v0.1, Qwen2's windowed layers) `context` above is the attended context
(ModelSpec.attended_context: a windowed layer reads at most its window), and a sequence holds only a window's
KV when every layer is windowed (ModelSpec.held_context). Seed conventions (they reproduce the seed documents' numbers within 2%): P counts every
parameter, the input embedding included, and every weight byte is read once per step; prefill
FLOPs are 2 * P * T (the causal attention term 2 * layers * T^2 * heads * head_dim is left out
unless `prefill_attention=True`) at `prefill_mfu` (0.5: "65 ms at 50% of peak").

AllReduce (Megatron TP: two per layer, after attention and after the MLP, of B*hidden
activations): one-shot = a + (TP-1) * S / link_bw (every rank reads its peers' buffers),
ring = 2(TP-1) * a + 2(TP-1)/TP * S / link_bw; "auto" takes the faster. Past one node
(8 GPUs) the network's bandwidth and latency replace NVLink's.

PP: a replica's batch is cut into m = min(B, PP) microbatches; a token walks all PP stages,
so TPOT = PP * stage_time(B/m) + PP hops, throughput = B / TPOT, and (PP - m)/PP of the
stages idle (the bubble). Prefill of a prompt cut into c chunks: TTFT = (c + PP - 1) * t_chunk_stage.
"""
from __future__ import annotations

import dataclasses
import math

from decodekit.planner.hardware import Hardware
from decodekit.planner.models import DTYPE_BYTES, ModelSpec, WeightFormat


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the hardware's peak figures.

    weight_bw: fraction of mem_bw reached reading weights, by format family (dense, int4, int8,
    fp8) with "all" as the fallback; kv_bw: reading the KV cache (decode attention);
    decode_mfu / prefill_mfu: fractions of the FLOP rate; allreduce_latency_s / allreduce_bw:
    measured AllReduce figures replacing the link model when set.
    """
    label: str = "ideal"
    weight_bw: dict = dataclasses.field(default_factory=lambda: {"all": 1.0})
    kv_bw: float = 1.0
    decode_mfu: float = 1.0
    prefill_mfu: float = 0.5
    allreduce_latency_s: float | None = None
    allreduce_bw: float | None = None

    def weight_frac(self, family: str) -> float:
        return self.weight_bw.get(family, self.weight_bw.get("all", 1.0))


IDEAL = Efficiency()


def ideal(prefill_mfu: float = 0.5) -> Efficiency:
    """Peak bandwidth and FLOP/s; prefill at `prefill_mfu` of peak (the seeds' 50%)."""
    return Efficiency("ideal", prefill_mfu=prefill_mfu)


def calibrated(hw: Hardware, cal, prefill_mfu: float | None = None) -> Efficiency | None:
    """Efficiency from a Calibration: every bandwidth fraction is measured against the copy
    ceiling, so it is rescaled by copy_gbps / mem_bw (the copy ceiling's share of the spec
    bandwidth); matmul rates by matmul_tflops / peak x the GEMM rows' fraction of that ceiling
    (decode when compute-bound, and prefill). Weights: each family's GEMV rows; dense weights without
    dense GEMV rows take the engine's measured decode fraction when there is one; other families missing
    rows, the median family ("all"). None if the calibration has nothing."""
    if cal is None or cal.empty:
        return None
    base = min(1.0, cal.copy_gbps * 1e9 / hw.mem_bw) if cal.copy_gbps else 1.0
    fr = dict(cal.weight_frac)
    if fr:
        fallback = sorted(fr.values())[len(fr) // 2]
    elif cal.engine_decode_frac:
        fallback = cal.engine_decode_frac
    else:
        fallback = 1.0
    weight_bw = {k: base * v for k, v in fr.items()}
    weight_bw["all"] = base * fallback
    if "dense" not in fr and cal.engine_decode_frac:
        # no dense GEMV rows: the engine's own decode (bench latency, normally a bf16 model) measures dense weights;
        # a quantized kernel's fraction (int4 / int8 dequantize) says little about a plain bf16 read
        weight_bw["dense"] = base * cal.engine_decode_frac
    kv = base * (cal.attn_frac if cal.attn_frac is not None else fallback)
    mm = min(1.0, cal.matmul_tflops * 1e12 / hw.flops_for(hw.act_dtype)) if cal.matmul_tflops else None
    gemm = (mm or 1.0) * (cal.gemm_frac if cal.gemm_frac is not None else 1.0)
    return Efficiency(label=f"calibrated ({cal.device_name}: {cal.n_rows} rows)", weight_bw=weight_bw, kv_bw=kv,
                      decode_mfu=gemm,
                      prefill_mfu=prefill_mfu if prefill_mfu is not None else (gemm if (mm or cal.gemm_frac) else 0.5),
                      allreduce_latency_s=cal.allreduce_latency_s, allreduce_bw=cal.allreduce_busbw)


# ---------------------------------------------------------------------------- weights and KV
def weight_read_time(model: ModelSpec, hw: Hardware, wf: WeightFormat, eff: Efficiency = IDEAL,
                     shards: int = 1) -> float:
    """Seconds to read every weight once (per GPU, weights split over `shards` GPUs)."""
    b = wf.bytes_by_class(model)
    t = (b["linear"] + b["norm"]) / (hw.mem_bw * eff.weight_frac(wf.family))
    t += (b["embed"] + b["lm_head"]) / (hw.mem_bw * eff.weight_frac(wf.embed_family))
    return t / shards


def decode_floor(model: ModelSpec, hw: Hardware, wf: WeightFormat, eff: Efficiency = IDEAL) -> tuple[float, float]:
    """(seconds per token, tokens/s) of a batch-1 decode on one device, weights only."""
    t = weight_read_time(model, hw, wf, eff)
    return t, 1.0 / t


def min_devices(model: ModelSpec, hw: Hardware, wf: WeightFormat) -> int:
    """Fewest devices whose memory holds the weights, before any KV cache or activations."""
    return max(1, math.ceil(wf.total_bytes(model) / hw.mem_bytes))


def kv_shard_heads(model: ModelSpec, tp: int) -> int:
    """How many ways the KV cache splits over TP ranks: min(TP, kv_heads) (replicated beyond)."""
    return min(tp, model.n_kv_heads)


def activation_reserve(model: ModelSpec, hw: Hardware, tp: int = 1, tokens: int = 2048) -> float:
    """Bytes kept free for activations: a prefill chunk of `tokens` (the engine's
    max_num_batched_tokens) holding residual, norm, attention and MLP buffers at once,
    tokens * (4 * hidden + 3 * intermediate / TP) * activation bytes."""
    return tokens * (4 * model.hidden + 3 * model.intermediate / tp) * DTYPE_BYTES[hw.act_dtype]


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Memory of one GPU of a (TP, PP) replica. Bytes; tokens; sequences."""
    mem_bytes: float
    weight_bytes: float
    reserve_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float          # per GPU
    kv_bytes_per_token_sharded: float  # per GPU if KV split over all TP ranks (no replication)
    kv_replication: float              # TP / min(TP, kv_heads)
    max_tokens: int
    max_batch: int                     # sequences of `context` tokens
    max_batch_no_replication: int
    context: int

    @property
    def fits_weights(self) -> bool:
        return self.kv_budget_bytes > 0

    @property
    def replication_loss(self) -> float:
        """Fraction of sequences lost to KV replication past the KV-head count."""
        return 1 - self.kv_bytes_per_token_sharded / self.kv_bytes_per_token


def capacity(model: ModelSpec, hw: Hardware, wf: WeightFormat, *, context: int, tp: int = 1, pp: int = 1,
             kv_dtype: str = "bf16", reserve_bytes: float | None = None) -> Capacity:
    """KV capacity per GPU: memory - weights/(TP*PP) - activation reserve, over the KV bytes one
    token leaves on this GPU; max_batch = floor(max_tokens / context) (the tokens a sequence holds: a
    window and a block when every layer is windowed, ModelSpec.held_context)."""
    if reserve_bytes is None:
        reserve_bytes = activation_reserve(model, hw, tp)
    w = wf.total_bytes(model) / (tp * pp)
    budget = hw.mem_bytes - w - reserve_bytes
    kv_tok = model.kv_bytes_per_token(kv_dtype)
    per = kv_tok / (kv_shard_heads(model, tp) * pp)
    ideal_per = kv_tok / (tp * pp)
    tokens = int(budget // per) if budget > 0 else 0
    ctx = max(1, int(model.held_context(context)))
    return Capacity(hw.mem_bytes, w, reserve_bytes, budget, per, ideal_per, tp / kv_shard_heads(model, tp), tokens,
                    tokens // ctx, int(budget // ideal_per) // ctx if budget > 0 else 0, context)


# ---------------------------------------------------------------------------- AllReduce
@dataclasses.dataclass(frozen=True)
class AllReduceCost:
    """One AllReduce of `nbytes` over `ranks` GPUs: seconds by algorithm and the chosen one."""
    nbytes: float
    ranks: int
    one_shot_s: float
    ring_s: float
    algo: str
    time_s: float


def allreduce(nbytes: float, ranks: int, hw: Hardware, eff: Efficiency = IDEAL, algo: str = "auto") -> AllReduceCost:
    """one-shot: a + (N-1) S / bw; ring: 2(N-1) a + 2(N-1)/N S / bw. A measured latency
    (eff.allreduce_latency_s) replaces a for one-shot and the ring's whole latency term; a
    measured bus bandwidth replaces bw."""
    if ranks <= 1:
        return AllReduceCost(nbytes, ranks, 0.0, 0.0, "none", 0.0)
    if hw.link_bw is None:
        return AllReduceCost(nbytes, ranks, math.inf, math.inf, "none", math.inf)
    bw0, a = hw.link(ranks)
    bw, n = eff.allreduce_bw or bw0, ranks
    if eff.allreduce_latency_s is not None:
        one = eff.allreduce_latency_s + (n - 1) * nbytes / bw
        ring = eff.allreduce_latency_s + 2 * (n - 1) / n * nbytes / bw
    else:
        one = a + (n - 1) * nbytes / bw
        ring = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw
    if algo not in ("auto", "one-shot", "ring"):
        raise ValueError(f"allreduce algo must be auto, one-shot or ring (got {algo!r})")
    pick = algo if algo != "auto" else ("one-shot" if one <= ring else "ring")
    return AllReduceCost(nbytes, n, one, ring, pick, one if pick == "one-shot" else ring)


# ---------------------------------------------------------------------------- decode
@dataclasses.dataclass(frozen=True)
class DecodeStep:
    """One decode step of a replica (TP x PP GPUs, `batch` sequences at `context` tokens).

    Per GPU and stage: weight_bytes, kv_bytes, flops, t_weights, t_kv, t_mem, t_compute,
    t_allreduce (n_allreduce of allreduce_bytes each), stage_time. Per token: tpot (s),
    tokens_per_s for the replica (x accepted tokens with speculation), bound, bubble."""
    batch: float
    context: float
    tp: int
    pp: int
    microbatches: int
    weight_bytes: float
    kv_bytes: float
    flops: float
    t_weights: float
    t_kv: float
    t_mem: float
    t_compute: float
    n_allreduce: int
    allreduce_bytes: float
    t_allreduce: float
    allreduce_algo: str
    t_pp_hops: float
    stage_time: float
    tpot: float
    tokens_per_s: float
    bound: str
    bubble: float
    tokens_per_step: float = 1.0
    spec_speedup: float = 1.0

    @property
    def intensity(self) -> float:
        """FLOP per byte read (per GPU)."""
        return self.flops / (self.weight_bytes + self.kv_bytes)


def decode_flops_per_seq(model: ModelSpec, context: float) -> float:
    """2 * P (every parameter one multiply-add) + attention 4 * layers * context * heads * head_dim (a windowed
    layer's context capped at its window)."""
    return 2 * model.params + 4 * model.n_layers * model.attended_context(context) * model.q_dim


def _stage(model, hw, wf, eff, b, context, tp, pp, kv_dtype, tokens_per_seq=1.0, algo="auto"):
    """Per-GPU bytes/FLOPs/times of one stage processing a microbatch of b sequences."""
    wbytes = wf.total_bytes(model) / (tp * pp)
    t_w = weight_read_time(model, hw, wf, eff, tp * pp)
    kv = b * model.attended_context(context) * model.kv_bytes_per_token(kv_dtype) / (kv_shard_heads(model, tp) * pp)
    t_kv = kv / (hw.mem_bw * eff.kv_bw)
    flops = b * tokens_per_seq * decode_flops_per_seq(model, context) / (tp * pp)
    t_c = flops / (hw.flops_for(wf.compute) * eff.decode_mfu)
    n_ar = 2 * math.ceil(model.n_layers / pp) if tp > 1 else 0
    ar_bytes = b * tokens_per_seq * model.hidden * DTYPE_BYTES[hw.act_dtype]
    ar = allreduce(ar_bytes, tp, hw, eff, algo)
    t_mem = t_w + t_kv
    return dict(weight_bytes=wbytes, kv_bytes=kv, flops=flops, t_weights=t_w, t_kv=t_kv, t_mem=t_mem,
                t_compute=t_c, n_allreduce=n_ar, allreduce_bytes=ar_bytes, t_allreduce=n_ar * ar.time_s,
                allreduce_algo=ar.algo, stage_time=max(t_mem, t_c) + n_ar * ar.time_s,
                bound="memory" if t_mem >= t_c else "compute")


def pp_hop_time(model: ModelSpec, hw: Hardware, b: float, gpus: int = 2) -> float:
    """One pipeline hop: link latency + b * hidden activations over the link (the network
    when the replica's `gpus` span more than one node)."""
    if hw.link_bw is None:
        return math.inf
    bw, a = hw.link(gpus)
    return a + b * model.hidden * DTYPE_BYTES[hw.act_dtype] / bw


def decode_step(model: ModelSpec, hw: Hardware, wf: WeightFormat, *, batch: float = 1, context: float = 0,
                tp: int = 1, pp: int = 1, kv_dtype: str = "bf16", eff: Efficiency = IDEAL,
                spec: "SpecDecode | None" = None, algo: str = "auto") -> DecodeStep:
    """Time per output token of a replica running `batch` sequences at `context` tokens."""
    if batch <= 0:
        raise ValueError(f"batch must be > 0 (got {batch})")
    if context < 0:
        raise ValueError(f"context must be >= 0 (got {context})")
    m = max(1, min(int(math.ceil(batch)), pp))
    b = batch / m
    s = _stage(model, hw, wf, eff, b, context, tp, pp, kv_dtype, 1.0, algo)
    hops = pp * pp_hop_time(model, hw, b, tp * pp) if pp > 1 else 0.0
    tpot = pp * s["stage_time"] + hops
    tokens_per_step, speedup = 1.0, 1.0
    if spec is not None and spec.k > 0:
        v = _stage(model, hw, wf, eff, b, context, tp, pp, kv_dtype, spec.k + 1, algo)
        t_verify = pp * v["stage_time"] + hops
        tokens_per_step = spec.expected_tokens
        t_step = spec.k * spec.draft_cost * tpot + t_verify
        new_tpot = t_step / tokens_per_step
        speedup = tpot / new_tpot
        tpot = new_tpot
    return DecodeStep(batch=batch, context=context, tp=tp, pp=pp, microbatches=m, t_pp_hops=hops, tpot=tpot,
                      tokens_per_s=batch / tpot, bubble=(pp - m) / pp, tokens_per_step=tokens_per_step,
                      spec_speedup=speedup, **s)


def crossover_batch(model: ModelSpec, hw: Hardware, wf: WeightFormat, *, context: float = 0, tp: int = 1,
                    kv_dtype: str = "bf16", eff: Efficiency = IDEAL) -> float:
    """Batch at which decode turns compute-bound (t_mem = t_compute); inf if never.
    At context 0 and 2-byte weights this is the ridge FLOP/s / bandwidth (H100: 295)."""
    s = _stage(model, hw, wf, eff, 1.0, context, tp, 1, kv_dtype)
    per_seq_compute = s["t_compute"]
    denom = per_seq_compute - s["t_kv"]
    if denom <= 0:
        return math.inf
    return s["t_weights"] / denom


# ---------------------------------------------------------------------------- prefill
@dataclasses.dataclass(frozen=True)
class Prefill:
    """One prompt of `tokens` through a (TP, PP) replica. FLOPs for the whole model; times in s."""
    tokens: int
    flops: float
    attention_flops: float
    t_compute: float
    t_weights: float
    t_allreduce: float
    allreduce_algo: str
    chunks: int
    bubble: float
    ttft: float
    mfu: float


def prefill(model: ModelSpec, hw: Hardware, wf: WeightFormat, tokens: int, *, tp: int = 1, pp: int = 1,
            eff: Efficiency = IDEAL, attention: bool = False, chunk_tokens: int = 2048,
            algo: str = "auto") -> Prefill:
    """Compute-bound: FLOPs = 2 * P * T (+ causal attention 2 * layers * T^2 * heads * head_dim if
    `attention`; windowed layers' queries past the window count W keys) over TP GPUs at eff.prefill_mfu of peak; never faster than one weight read.
    With PP the prompt goes in c = ceil(T / chunk_tokens) chunks: TTFT = (c + PP - 1) stage times."""
    if tokens < 1:
        raise ValueError(f"prompt length must be >= 1 (got {tokens})")
    # 4 * heads * head_dim per (query, key) pair (QK^T and PV); ~T^2/2 causal pairs per layer, a windowed layer's
    # queries past the window see W keys each
    W, T, nw = model.sliding_window, tokens, model.window_layers
    pairs_win = T ** 2 / 2 if T <= W else W ** 2 / 2 + (T - W) * W
    attn = 4 * model.q_dim * ((model.n_layers - nw) * T ** 2 / 2 + nw * pairs_win)
    flops = 2 * model.params * tokens + (attn if attention else 0.0)
    t_c = flops / (tp * hw.flops_for(wf.compute) * eff.prefill_mfu)
    t_w = weight_read_time(model, hw, wf, eff, tp)
    c = max(1, math.ceil(tokens / chunk_tokens)) if pp > 1 else 1
    ar = allreduce(tokens / c * model.hidden * DTYPE_BYTES[hw.act_dtype], tp, hw, eff, algo)
    n_ar = 2 * model.n_layers if tp > 1 else 0
    t_ar = n_ar * ar.time_s  # all chunks over all stages: 2 * layers * chunks AllReduces of 1/c the size
    one_pass = max(t_c, t_w) + t_ar * c
    if pp > 1:
        stage = max(t_c / (c * pp), t_w / pp) + t_ar / pp
        ttft = (c + pp - 1) * stage + (pp - 1) * pp_hop_time(model, hw, tokens / c, tp * pp)
    else:
        ttft = one_pass
    return Prefill(tokens, flops, attn, t_c, t_w, t_ar * c, ar.algo, c, (pp - 1) / (c + pp - 1), ttft,
                   eff.prefill_mfu)


# ---------------------------------------------------------------------------- speculation
@dataclasses.dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding: k drafted tokens, per-token acceptance a in [0, 1), draft cost per
    drafted token as a fraction of one target decode step."""
    k: int
    accept: float
    draft_cost: float = 0.0

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"spec k must be an integer >= 0 (got {self.k!r})")
        if not (0.0 <= self.accept < 1.0):
            raise ValueError(f"spec acceptance a must be in [0, 1) (got {self.accept!r})")
        if not (self.draft_cost >= 0.0):
            raise ValueError(f"spec draft cost must be >= 0 (got {self.draft_cost!r})")

    @property
    def expected_tokens(self) -> float:
        """Tokens per target step: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1)."""
        return expected_tokens(self.k, self.accept)

    @property
    def ideal_speedup(self) -> float:
        """Expected tokens / (k * draft_cost + 1): the speed-up when verifying k+1 tokens costs
        what one decode step costs (memory-bound)."""
        return self.expected_tokens / (self.k * self.draft_cost + 1)


def expected_tokens(k: int, a: float) -> float:
    """(1 - a^(k+1)) / (1 - a): expected tokens per step with k drafts accepted w.p. a each."""
    if not (0.0 <= a < 1.0):
        raise ValueError(f"spec acceptance a must be in [0, 1) (got {a!r})")
    if k < 0:
        raise ValueError(f"spec k must be >= 0 (got {k!r})")
    return (1 - a ** (k + 1)) / (1 - a)
