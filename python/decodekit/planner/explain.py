"""`decodekit plan explain`: the derivation for one shape, step by step, with units."""
from __future__ import annotations

import math

from decodekit.planner import roofline as rf
from decodekit.planner.hardware import Hardware
from decodekit.planner.models import DTYPE_BYTES, ModelSpec, WeightFormat
from decodekit.planner.shapes import Constraints, Workload, context_problem, tp_problem


def fmt_bytes(b: float) -> str:
    """Decimal units (GB = 1e9 B), as the spec sheets."""
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= s:
            return f"{b / s:.4g} {unit}"
    return f"{b:.4g} B"


def fmt_time(s: float) -> str:
    if math.isinf(s):
        return "inf"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def fmt_rate(x: float, unit: str) -> str:
    for p, s in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if x >= s:
            return f"{x / s:.4g} {p}{unit}"
    return f"{x:.4g} {unit}"


def fmt_count(x: float) -> str:
    return f"{x:.4g}" if x < 1e4 else f"{x:.4e}".replace("e+0", "e").replace("e+", "e")


def explain(model: ModelSpec, hw: Hardware, wf: WeightFormat, workload: Workload, constraints: Constraints, *,
            tp: int = 1, pp: int = 1, replicas: int | None = None, batch: int = 1, kv_dtype: str = "bf16",
            spec: rf.SpecDecode | None = None, eff_ideal: rf.Efficiency | None = None,
            eff_cal: rf.Efficiency | None = None, reserve_bytes: float | None = None,
            prefill_attention: bool = False) -> str:
    """Text walking through memory, decode, AllReduce, PP, prefill, speculation and calibration."""
    if context_problem(model, workload):
        raise ValueError(context_problem(model, workload))
    eff = eff_ideal or rf.ideal()
    reps = replicas if replicas is not None else max(1, constraints.gpus // (tp * pp))
    L = []
    out = L.append
    n_gpu = tp * pp * reps
    out(f"{model.name} on {n_gpu} x {hw.name}: TP={tp} PP={pp} replicas={reps}, batch {batch} per replica, "
        f"prompt {workload.prompt_len} + output {workload.output_len} tokens")
    problem = tp_problem(model, hw, tp, pp)
    if problem:
        out(f"  infeasible shape: {problem}")
    if n_gpu > constraints.gpus:
        out(f"  note: this shape needs {n_gpu} GPUs, more than the cluster's {constraints.gpus}")

    # 1. model
    wb = wf.bytes_by_class(model)
    W = sum(wb.values())
    out("\n1. Model")
    out(f"   parameters P = embedding {fmt_count(model.params_embed)} + LM head {fmt_count(model.params_lm_head)}"
        f"{' (tied)' if model.tied_embeddings else ''} + {model.n_layers} layers x "
        f"{fmt_count(model.params_per_layer_linear)} + norms {fmt_count(model.params_norm)} = "
        f"{fmt_count(model.params)}")
    if wf.name == "stored":
        out(f"   weights as stored = {', '.join(f'{k} {fmt_bytes(v)}' for k, v in wb.items())} = {fmt_bytes(W)}")
    elif wf.linear_bits == wf.embed_bits:
        out(f"   weights ({wf.name}: {wf.linear_bits:.4g} bits/param) = {fmt_count(model.params)} x "
            f"{wf.linear_bits / 8:.4g} B = {fmt_bytes(W)}")
    else:
        out(f"   weights ({wf.name}) = projections {fmt_count(model.params_linear)} x {wf.linear_bits / 8:.4g} B + "
            f"embeddings {fmt_count(model.params_embed + model.params_lm_head)} x {wf.embed_bits / 8:.4g} B + "
            f"norms x {wf.norm_bits / 8:.4g} B = {fmt_bytes(W)}")
    if wf.note:
        out(f"   ({wf.note})")
    kvb = DTYPE_BYTES[kv_dtype]
    kv_tok = model.kv_bytes_per_token(kv_dtype)
    out(f"   KV per token = 2 (K, V) x {model.n_layers} layers x {model.n_kv_heads} KV heads x {model.cache_head_dim} dims"
        f"{'' if model.cache_head_dim == model.head_dim else f' (head_dim {model.head_dim}, zero-padded for the CUDA kernels)'} "
        f"x {kvb} B ({kv_dtype}) = {kv_tok:,} B ({kv_tok / 1024:.4g} KiB)")
    if model.sliding_window:
        out(f"   sliding window {model.sliding_window} tokens on {model.window_layers} of {model.n_layers} layers: "
            f"they read at most that many keys" + (", and a sequence keeps only a window (+ a block) of KV"
                                                   if model.window_layers == model.n_layers else ""))

    # 2. hardware
    out("\n2. Hardware (per GPU)")
    link = (f"link {fmt_rate(hw.link_bw, 'B/s')} per direction, {fmt_time(hw.link_latency_s)} per AllReduce step "
            f"within {hw.node_gpus} GPUs, network {fmt_rate(hw.net_bw, 'B/s')} and {fmt_time(hw.net_latency_s)} beyond"
            if hw.link_bw else "no interconnect")
    rates = ", ".join(f"{k} {fmt_rate(v, 'FLOP/s')}" for k, v in hw.flops.items())
    out(f"   memory {fmt_bytes(hw.mem_bytes)}, bandwidth {fmt_rate(hw.mem_bw, 'B/s')}, {rates}; {link}")
    out(f"   ridge = {fmt_rate(hw.flops_for(hw.act_dtype), 'FLOP/s')} / {fmt_rate(hw.mem_bw, 'B/s')} = "
        f"{hw.ridge:.1f} FLOP/byte")
    out(f"   batch-1 floor, one device: {fmt_bytes(W)} / {fmt_rate(hw.mem_bw, 'B/s')} = "
        f"{fmt_time(rf.weight_read_time(model, hw, wf, eff))} -> {1 / rf.weight_read_time(model, hw, wf, eff):.4g} "
        f"tokens/s; at least {rf.min_devices(model, hw, wf)} device(s) hold the weights")

    # 3. memory
    cap = rf.capacity(model, hw, wf, context=workload.max_context, tp=tp, pp=pp, kv_dtype=kv_dtype,
                      reserve_bytes=reserve_bytes)
    out("\n3. Memory per GPU")
    out(f"   weights / (TP x PP) = {fmt_bytes(W)} / {tp * pp} = {fmt_bytes(cap.weight_bytes)}")
    if reserve_bytes is None:
        out(f"   activation reserve = 2048 tokens x (4 x {model.hidden} + 3 x {model.intermediate} / {tp}) x "
            f"{DTYPE_BYTES[hw.act_dtype]} B = {fmt_bytes(cap.reserve_bytes)}")
    else:
        out(f"   activation reserve = {fmt_bytes(cap.reserve_bytes)} (given)")
    out(f"   KV budget = {fmt_bytes(hw.mem_bytes)} - {fmt_bytes(cap.weight_bytes)} - {fmt_bytes(cap.reserve_bytes)}"
        f" = {fmt_bytes(cap.kv_budget_bytes)}")
    out(f"   KV per token per GPU = {kv_tok:,} B / (min(TP={tp}, {model.n_kv_heads} KV heads) x PP={pp}) = "
        f"{cap.kv_bytes_per_token:,.0f} B")
    if cap.kv_replication > 1:
        out(f"   TP={tp} > {model.n_kv_heads} KV heads: each head's K/V is replicated {cap.kv_replication:g}x, "
            f"capacity {cap.max_batch} sequences instead of {cap.max_batch_no_replication} "
            f"({cap.replication_loss:.0%} lost)")
    if cap.fits_weights:
        out(f"   max tokens = {fmt_bytes(cap.kv_budget_bytes)} / {cap.kv_bytes_per_token:,.0f} B = {cap.max_tokens:,}; "
            f"max batch at {workload.max_context} tokens"
            + (f" (holding {model.held_context(workload.max_context):g})"
               if model.held_context(workload.max_context) != workload.max_context else "")
            + f" = {cap.max_batch} sequences per replica, "
            f"{cap.max_batch * reps} over {reps} replica(s)")
    else:
        out("   the weights do not fit: no room for KV")
    if batch > cap.max_batch:
        out(f"   batch {batch} does NOT fit (max {cap.max_batch})")

    # 4. decode
    ctx = workload.mean_context
    out(f"\n4. Decode step (batch {batch}, mean context {ctx:g} tokens = prompt + output / 2)")
    if problem and hw.link_bw is None:
        out("   (not computed: the shape needs an interconnect)")
        return "\n".join(L)
    s = rf.decode_step(model, hw, wf, batch=batch, context=ctx, tp=tp, pp=pp, kv_dtype=kv_dtype, eff=eff)
    b = s.batch / s.microbatches
    if pp > 1:
        out(f"   PP={pp}: {s.microbatches} microbatch(es) of {b:g} sequences; each stage holds "
            f"{math.ceil(model.n_layers / pp)} layers")
    out(f"   weight bytes per GPU = {fmt_bytes(s.weight_bytes)} -> / {fmt_rate(hw.mem_bw, 'B/s')} = "
        f"{fmt_time(s.t_weights)}")
    actx = model.attended_context(ctx)
    out(f"   KV bytes per GPU = {b:g} x {actx:g} tokens"
        + (f" (attended of {ctx:g}: window {model.sliding_window})" if actx != ctx else "")
        + f" x {cap.kv_bytes_per_token:,.0f} B = {fmt_bytes(s.kv_bytes)} -> "
        f"{fmt_time(s.t_kv)}")
    fr = hw.flops_for(wf.compute)
    out(f"   FLOPs per GPU = {b:g} x (2 x {fmt_count(model.params)} + 4 x {model.n_layers} x {actx:g} x "
        f"{model.q_dim}) / "
        f"{tp * pp} = {fmt_rate(s.flops, 'FLOP')} -> / {fmt_rate(fr, 'FLOP/s')} = {fmt_time(s.t_compute)}")
    out(f"   {s.bound}-bound: max({fmt_time(s.t_mem)}, {fmt_time(s.t_compute)}) = "
        f"{fmt_time(max(s.t_mem, s.t_compute))}; intensity {s.intensity:.1f} FLOP/byte vs ridge {hw.ridge:.1f}")
    x0 = rf.crossover_batch(model, hw, wf, context=0, tp=tp, kv_dtype=kv_dtype, eff=eff)
    xc = rf.crossover_batch(model, hw, wf, context=ctx, tp=tp, kv_dtype=kv_dtype, eff=eff)
    out(f"   crossover to compute-bound: batch {x0:.0f} counting weights only"
        f", {'never (KV bytes grow as fast as FLOPs)' if math.isinf(xc) else f'{xc:.0f}'} at this context")
    if tp > 1:
        ar = rf.allreduce(s.allreduce_bytes, tp, hw, eff)
        bw0, lat = hw.link(tp)
        bw = eff.allreduce_bw or bw0
        out(f"   AllReduce: 2 per layer x {math.ceil(model.n_layers / pp)} layers = {s.n_allreduce} per step, each "
            f"{b:g} x {model.hidden} x {DTYPE_BYTES[hw.act_dtype]} B = {fmt_bytes(s.allreduce_bytes)}")
        if tp > hw.node_gpus:
            out(f"      TP={tp} spans nodes of {hw.node_gpus} GPUs: network {fmt_rate(bw0, 'B/s')}, "
                f"{fmt_time(lat)} per step")
        out(f"      one-shot = {fmt_time(lat)} + {tp - 1} x {fmt_bytes(s.allreduce_bytes)} / "
            f"{fmt_rate(bw, 'B/s')} = {fmt_time(ar.one_shot_s)}")
        out(f"      ring = {2 * (tp - 1)} x {fmt_time(lat)} + 2 x {tp - 1}/{tp} x "
            f"{fmt_bytes(s.allreduce_bytes)} / {fmt_rate(bw, 'B/s')} = {fmt_time(ar.ring_s)}")
        out(f"      -> {ar.algo}: {s.n_allreduce} x {fmt_time(ar.time_s)} = {fmt_time(s.t_allreduce)} per stage")
    out(f"   stage time = {fmt_time(max(s.t_mem, s.t_compute))} + AllReduce {fmt_time(s.t_allreduce)} = "
        f"{fmt_time(s.stage_time)}")
    if pp > 1:
        out(f"   TPOT = PP x stage + PP hops = {pp} x {fmt_time(s.stage_time)} + {fmt_time(s.t_pp_hops)} = "
            f"{fmt_time(s.tpot)}; bubble (PP - microbatches) / PP = {s.bubble:.0%} of stages idle")
    else:
        out(f"   TPOT = {fmt_time(s.tpot)}")
    one = rf.decode_step(model, hw, wf, batch=batch, context=ctx, tp=1, pp=1, kv_dtype=kv_dtype, eff=eff)
    out(f"   -> {1 / s.tpot:.4g} tokens/s per sequence, {s.tokens_per_s:.4g} per replica, "
        f"{s.tokens_per_s * reps:.4g} over {reps} replica(s) = {s.tokens_per_s * reps / n_gpu:.4g} per GPU "
        f"(TP=1 PP=1 at this batch: {fmt_time(one.tpot)}, {one.tokens_per_s:.4g} tokens/s per GPU)")

    # 5. prefill
    pre = rf.prefill(model, hw, wf, workload.prompt_len, tp=tp, pp=pp, eff=eff, attention=prefill_attention)
    out(f"\n5. Prefill ({workload.prompt_len} tokens, compute-bound)")
    att = (f" + attention 2 x {model.n_layers} x {workload.prompt_len}^2 x {model.q_dim}" if prefill_attention else "")
    out(f"   FLOPs = 2 x {fmt_count(model.params)} x {workload.prompt_len}{att} = {fmt_rate(pre.flops, 'FLOP')}"
        + ("" if prefill_attention else f" (causal attention, {fmt_rate(pre.attention_flops, 'FLOP')} = "
                                         f"{pre.attention_flops / pre.flops:.1%} more, not counted)"))
    out(f"   compute = {fmt_rate(pre.flops, 'FLOP')} / ({tp} x {fmt_rate(fr, 'FLOP/s')} x {pre.mfu:.0%}) = "
        f"{fmt_time(pre.t_compute)}; one weight read {fmt_time(pre.t_weights)}")
    if tp > 1:
        msg = workload.prompt_len * model.hidden * DTYPE_BYTES[hw.act_dtype]
        out(f"   AllReduce: {2 * model.n_layers} x {fmt_bytes(msg)}"
            f" ({pre.allreduce_algo}) = {fmt_time(pre.t_allreduce)}")
    if pp > 1:
        out(f"   PP={pp}, {pre.chunks} chunk(s): TTFT = (chunks + PP - 1) stage times; bubble {pre.bubble:.0%}")
    out(f"   TTFT = {fmt_time(pre.ttft)}")

    # 6. speculation
    if spec is not None and spec.k > 0:
        sp = rf.decode_step(model, hw, wf, batch=batch, context=ctx, tp=tp, pp=pp, kv_dtype=kv_dtype, eff=eff,
                            spec=spec)
        out(f"\n6. Speculative decoding (k={spec.k}, a={spec.accept:g}, draft cost {spec.draft_cost:g} of a step)")
        out(f"   tokens per target step = (1 - a^(k+1)) / (1 - a) = (1 - {spec.accept:g}^{spec.k + 1}) / "
            f"(1 - {spec.accept:g}) = {spec.expected_tokens:.4g}")
        out(f"   step = {spec.k} drafts x {spec.draft_cost:g} x {fmt_time(s.tpot)} + verify {spec.k + 1} tokens per "
            f"sequence; TPOT = step / {spec.expected_tokens:.4g} = {fmt_time(sp.tpot)}: {sp.spec_speedup:.3g}x "
            f"(memory-bound limit {spec.ideal_speedup:.3g}x)")
        s = sp

    # 7. calibrated
    if eff_cal is not None:
        c = rf.decode_step(model, hw, wf, batch=batch, context=ctx, tp=tp, pp=pp, kv_dtype=kv_dtype, eff=eff_cal,
                           spec=spec)
        cp = rf.prefill(model, hw, wf, workload.prompt_len, tp=tp, pp=pp, eff=eff_cal, attention=prefill_attention)
        out(f"\n7. Calibrated: {eff_cal.label}")
        out(f"   weights at {eff_cal.weight_frac(wf.family):.1%} of {fmt_rate(hw.mem_bw, 'B/s')} "
            f"(embeddings {eff_cal.weight_frac(wf.embed_family):.1%}), KV at {eff_cal.kv_bw:.1%}, "
            f"matmul {eff_cal.decode_mfu:.1%} of peak, prefill {eff_cal.prefill_mfu:.1%}")
        out(f"   TPOT {fmt_time(c.tpot)} ({c.tokens_per_s * reps / n_gpu:.4g} tokens/s per GPU) vs ideal "
            f"{fmt_time(s.tpot)}; TTFT {fmt_time(cp.ttft)} vs ideal {fmt_time(pre.ttft)}")
        s, pre = c, cp

    # verdict
    reasons = []
    if constraints.tpot_s is not None and s.tpot > constraints.tpot_s:
        reasons.append(f"TPOT {fmt_time(s.tpot)} > {fmt_time(constraints.tpot_s)}")
    if constraints.ttft_s is not None and pre.ttft > constraints.ttft_s:
        reasons.append(f"TTFT {fmt_time(pre.ttft)} > {fmt_time(constraints.ttft_s)}")
    if batch > cap.max_batch:
        reasons.append(f"batch {batch} > memory max {cap.max_batch}")
    if problem:
        reasons.append(problem)
    out("\nVerdict: " + ("feasible" if not reasons else "infeasible: " + "; ".join(reasons)))
    return "\n".join(L)
