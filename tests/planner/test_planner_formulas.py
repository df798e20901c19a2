"""Each formula of decodekit.planner against values worked out by hand."""
import json
import math

import pytest

from decodekit import planner as P
from decodekit.planner.hardware import Hardware, norm_device_name

BF16 = P.weight_format("bf16")
# a toy GPU with round numbers: 100 GB, 1 TB/s, 100 TFLOP/s, link 100 GB/s, 1 us per step
TOY = Hardware("toy", 100e9, 1e12, {"bf16": 100e12}, 100e9, 1e-6)
# a toy model: 4 layers, d=1024, 8 heads of 128, 2 KV heads, MLP 4096, vocab 1000
TOYM = P.ModelSpec("toy", vocab=1000, hidden=1024, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=128,
                   intermediate=4096)


def test_parameter_count_by_hand():
    d, L, V, I, kv = 1024, 4, 1000, 4096, 256
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * I
    assert TOYM.params_per_layer_linear == per_layer
    assert TOYM.params == 2 * V * d + L * per_layer + (2 * L + 1) * d
    assert TOYM.kv_bytes_per_token("bf16") == 2 * L * 2 * 128 * 2
    assert TOYM.kv_bytes_per_token("fp8") == 2 * L * 2 * 128
    tied = P.ModelSpec("t", 1000, 1024, 4, 8, 2, 128, 4096, tied_embeddings=True)
    assert tied.params == TOYM.params - V * d


def test_qwen_has_qkv_bias_and_published_size():
    q = P.load_model("Qwen2.5-7B")
    assert q.qkv_bias and q.params == pytest.approx(7.62e9, rel=0.005)
    assert P.load_model("qwen2.5-72b").params == pytest.approx(72.7e9, rel=0.005)
    assert P.load_model("llama3-405b").params == pytest.approx(405.8e9, rel=0.005)
    assert P.load_model("SmolLM2-135M").params == pytest.approx(134.5e6, rel=0.005)
    q3 = P.load_model("Qwen3-8B")       # 8.19B: head_dim 128, untied, no bias (the q / k norms: 9k parameters)
    assert not q3.qkv_bias and q3.head_dim == 128 and q3.params == pytest.approx(8.19e9, rel=0.005)


def test_qwen3_config_head_dim_default(tmp_path):
    """A Qwen3 config.json without head_dim: transformers' default 128 (not hidden / heads), as the loader reads it."""
    import json
    cfg = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 1024, "num_hidden_layers": 2,
           "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert P.load_model(str(tmp_path / "config.json")).head_dim == 128
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2"}))
    assert P.load_model(str(tmp_path / "config.json")).head_dim == 64


def test_allreduce_one_shot_vs_ring_by_hand():
    S = 16384.0  # bytes
    c = P.allreduce(S, 8, TOY)
    assert c.one_shot_s == pytest.approx(1e-6 + 7 * S / 100e9)
    assert c.ring_s == pytest.approx(14 * 1e-6 + 2 * 7 / 8 * S / 100e9)
    assert c.algo == "one-shot" and c.time_s == c.one_shot_s
    big = P.allreduce(64e6, 8, TOY)               # large messages: ring's 2(N-1)/N beats one-shot's N-1
    assert big.algo == "ring" and big.time_s == pytest.approx(14e-6 + 1.75 * 64e6 / 100e9)
    assert P.allreduce(S, 8, TOY, algo="ring").time_s == c.ring_s
    assert P.allreduce(S, 1, TOY).time_s == 0
    with pytest.raises(ValueError, match="algo"):
        P.allreduce(S, 8, TOY, algo="tree")
    # a measured latency replaces the per-step latency
    eff = P.Efficiency(allreduce_latency_s=5e-6)
    assert P.allreduce(S, 8, TOY, eff).one_shot_s == pytest.approx(5e-6 + 7 * S / 100e9)


def test_allreduce_beyond_one_node_uses_the_network():
    hw = P.load_hardware("h100")
    S = 1e6
    assert P.allreduce(S, 8, hw, algo="ring").time_s == pytest.approx(14 * 2e-6 + 1.75 * S / 450e9)
    assert P.allreduce(S, 16, hw, algo="ring").time_s == pytest.approx(30 * 5e-6 + 2 * 15 / 16 * S / 50e9)


def test_decode_step_tp_adds_two_allreduces_per_layer():
    s = P.decode_step(TOYM, TOY, BF16, batch=4, context=100, tp=2)
    ar = P.allreduce(4 * 1024 * 2, 2, TOY)
    assert s.n_allreduce == 8 and s.allreduce_bytes == 4 * 1024 * 2
    assert s.t_allreduce == pytest.approx(8 * ar.time_s)
    W = BF16.total_bytes(TOYM)
    kv = 4 * 100 * TOYM.kv_bytes_per_token("bf16") / 2
    assert s.t_weights == pytest.approx(W / 2 / 1e12) and s.t_kv == pytest.approx(kv / 1e12)
    flops = 4 * (2 * TOYM.params + 4 * 4 * 100 * 1024) / 2
    assert s.flops == pytest.approx(flops) and s.t_compute == pytest.approx(flops / 100e12)
    assert s.tpot == pytest.approx(max(s.t_weights + s.t_kv, s.t_compute) + s.t_allreduce)


def test_tp_scaling_flattens():
    """Amdahl: the AllReduce does not shrink with TP, so the speed-up per doubling falls."""
    m, hw = P.load_model("llama3-70b"), P.load_hardware("h100")
    t = [P.decode_step(m, hw, BF16, batch=1, context=1000, tp=tp).tpot for tp in (1, 2, 4, 8)]
    gains = [t[i] / t[i + 1] for i in range(3)]
    assert all(g < 2 for g in gains) and gains[0] > gains[1] > gains[2]


def test_kv_replicated_beyond_kv_heads():
    # TOYM: 2 KV heads. TP=2 shards KV in two; TP=8 cannot split further: 4x replication.
    c2 = P.capacity(TOYM, TOY, BF16, context=1000, tp=2, reserve_bytes=0)
    c8 = P.capacity(TOYM, TOY, BF16, context=1000, tp=8, reserve_bytes=0)
    kv = TOYM.kv_bytes_per_token("bf16")
    assert c2.kv_bytes_per_token == kv / 2 and c2.kv_replication == 1 and c2.replication_loss == 0
    assert c8.kv_bytes_per_token == kv / 2 and c8.kv_bytes_per_token_sharded == kv / 8
    assert c8.kv_replication == 4 and c8.replication_loss == pytest.approx(0.75)
    budget = 100e9 - BF16.total_bytes(TOYM) / 8
    assert c8.max_tokens == int(budget // (kv / 2)) and c8.max_batch == c8.max_tokens // 1000
    assert c8.max_batch_no_replication == int(budget // (kv / 8)) // 1000
    s = P.decode_step(TOYM, TOY, BF16, batch=1, context=1000, tp=8)
    assert s.kv_bytes == 1000 * kv / 2


def test_capacity_by_hand():
    hw = Hardware("g", 10e9, 1e12, {"bf16": 1e14}, 1e11, 1e-6)
    W = BF16.total_bytes(TOYM)
    c = P.capacity(TOYM, hw, BF16, context=512, reserve_bytes=1e9)
    assert c.weight_bytes == W and c.kv_budget_bytes == 10e9 - W - 1e9
    assert c.max_tokens == int((10e9 - W - 1e9) // TOYM.kv_bytes_per_token("bf16"))
    assert c.max_batch == c.max_tokens // 512
    # default reserve: 2048 tokens x (4 d + 3 I / TP) x 2 bytes
    assert P.activation_reserve(TOYM, hw, tp=2) == 2048 * (4 * 1024 + 3 * 4096 / 2) * 2
    tiny = Hardware("tiny", W / 2, 1e12, {"bf16": 1e14}, None, 0)
    assert not P.capacity(TOYM, tiny, BF16, context=1).fits_weights
    assert P.capacity(TOYM, tiny, BF16, context=1).max_batch == 0


def test_sliding_window_caps_attended_and_held_context(tmp_path):
    """A windowed layer reads at most its window's keys (KV bytes, attention FLOPs); a sequence holds a window
    and a block of KV only when every layer is windowed (the engine frees the rest); from config.json as the
    engine's loader reads it (Mistral: every layer, default 4096; Qwen2: use_sliding_window, max_window_layers)."""
    import dataclasses
    hw = Hardware("g", 80e9, 3e12, {"bf16": 1e15}, 1e11, 1e-6)
    m = P.load_model("mistral-7b-v0.1")
    full = dataclasses.replace(m, sliding_window=0, window_layers=0)
    assert (m.sliding_window, m.window_layers) == (4096, 32) and m.params == full.params
    for ctx in (100, 4096, 30000):
        a, b = (P.decode_step(x, hw, BF16, batch=8, context=ctx) for x in (m, full))
        assert a.kv_bytes == pytest.approx(b.kv_bytes * min(ctx, 4096) / ctx)
        assert a.flops - 8 * 2 * m.params == pytest.approx((b.flops - 8 * 2 * m.params) * min(ctx, 4096) / ctx)
        ca, cb = (P.capacity(x, hw, BF16, context=ctx) for x in (m, full))
        assert ca.max_tokens == cb.max_tokens and ca.max_batch == ca.max_tokens // min(ctx, 4096 + 16)
    pa, pb = (P.prefill(x, hw, BF16, 10000, attention=True) for x in (m, full))
    assert pb.attention_flops == 2 * 32 * 10000 ** 2 * m.q_dim
    assert pa.attention_flops == 4 * m.q_dim * 32 * (4096 ** 2 / 2 + (10000 - 4096) * 4096)
    assert P.prefill(m, hw, BF16, 4000, attention=True).attention_flops == P.prefill(
        full, hw, BF16, 4000, attention=True).attention_flops
    half = dataclasses.replace(m, window_layers=16)     # mixed layers: the KV is kept, half the layers read less
    assert half.attended_context(10000) == (16 * 10000 + 16 * 4096) / 32 and half.held_context(10000) == 10000
    with pytest.raises(ValueError, match="window_layers"):
        dataclasses.replace(m, window_layers=33)
    with pytest.raises(ValueError, match="window_layers"):
        dataclasses.replace(m, sliding_window=0)
    base = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 32000}
    for extra, want in [({"model_type": "mistral"}, (4096, 32)), ({"model_type": "mistral", "sliding_window": None}, (0, 0)),
                        ({"model_type": "mistral", "sliding_window": 1024}, (1024, 32)),
                        ({"model_type": "qwen2", "sliding_window": 512}, (0, 0)),
                        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 512,
                          "max_window_layers": 20}, (512, 12)),
                        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 512,
                          "layer_types": ["full_attention", "sliding_attention"] * 16}, (512, 16)),
                        ({"model_type": "llama", "sliding_window": 512}, (0, 0))]:
        (tmp_path / "config.json").write_text(json.dumps({**base, **extra}))
        got = P.load_model(str(tmp_path / "config.json"))
        assert (got.sliding_window, got.window_layers) == want, extra
    (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": "mistral", "sliding_window": -3}))
    with pytest.raises(ValueError, match="sliding_window"):
        P.load_model(str(tmp_path / "config.json"))


def test_pipeline_bubble_and_latency():
    s1 = P.decode_step(TOYM, TOY, BF16, batch=1, context=0, pp=4)
    assert s1.microbatches == 1 and s1.bubble == 0.75
    stage = s1.stage_time
    hop = 1e-6 + 1 * 1024 * 2 / 100e9
    assert s1.tpot == pytest.approx(4 * stage + 4 * hop)
    assert stage == pytest.approx(BF16.total_bytes(TOYM) / 4 / 1e12)
    s8 = P.decode_step(TOYM, TOY, BF16, batch=8, context=0, pp=4)  # 4 microbatches of 2: pipeline full
    assert s8.microbatches == 4 and s8.bubble == 0
    assert s8.tokens_per_s == pytest.approx(8 / s8.tpot)
    # PP does not make a token faster than one GPU reading all the weights
    assert s1.tpot > P.decode_step(TOYM, TOY, BF16, batch=1, context=0).tpot
    # prefill: c chunks through p stages take (c + p - 1) stage times
    pre = P.prefill(TOYM, TOY, BF16, 4096, pp=2, chunk_tokens=1024)
    assert pre.chunks == 4 and pre.bubble == pytest.approx(1 / 5)
    t_c = 2 * TOYM.params * 4096 / (100e12 * 0.5)
    stage = max(t_c / 8, BF16.total_bytes(TOYM) / 1e12 / 2)
    assert pre.ttft == pytest.approx(5 * stage + (1e-6 + 1024 * 1024 * 2 / 100e9))


def test_prefill_attention_flops_optional():
    p0 = P.prefill(TOYM, TOY, BF16, 1000)
    p1 = P.prefill(TOYM, TOY, BF16, 1000, attention=True)
    att = 2 * 4 * 1000 ** 2 * 1024
    assert p0.attention_flops == att and p1.flops == pytest.approx(p0.flops + att)
    assert p0.ttft == pytest.approx(max(p0.flops / 50e12, BF16.total_bytes(TOYM) / 1e12))


def test_crossover_batch_by_hand():
    # context 0: B* = t_weights / t_compute(1 seq) = (W / BW) / (2 P / F)
    want = (BF16.total_bytes(TOYM) / 1e12) / (2 * TOYM.params / 100e12)
    assert P.crossover_batch(TOYM, TOY, BF16) == pytest.approx(want)
    # KV bytes per sequence that outrun its FLOPs: never compute-bound
    assert math.isinf(P.crossover_batch(P.load_model("llama3-70b"), P.load_hardware("h100"), BF16, context=4000))


def test_speculative_decoding():
    assert P.expected_tokens(0, 0.5) == 1
    assert P.expected_tokens(3, 0.0) == 1
    assert P.expected_tokens(2, 0.5) == pytest.approx(1 + 0.5 + 0.25)
    sp = P.SpecDecode(4, 0.8, 0.05)
    assert sp.ideal_speedup == pytest.approx(3.3616 / 1.2)
    base = P.decode_step(TOYM, TOY, BF16, batch=1, context=100)
    s = P.decode_step(TOYM, TOY, BF16, batch=1, context=100, spec=sp)
    verify = P.decode_step(TOYM, TOY, BF16, batch=1, context=100)  # memory-bound: 5 tokens cost one read
    assert s.tpot == pytest.approx((4 * 0.05 * base.tpot + verify.tpot) / 3.3616)
    assert s.spec_speedup == pytest.approx(base.tpot / s.tpot)
    for bad in (dict(k=-1, accept=0.5), dict(k=2, accept=1.0), dict(k=2, accept=-0.1),
                dict(k=2, accept=0.5, draft_cost=-1)):
        with pytest.raises(ValueError, match="spec"):
            P.SpecDecode(**bad)


def test_weight_formats():
    m = P.load_model("smollm2-135m")
    q = P.weight_format("q4_1")
    b = q.bytes_by_class(m)
    # the engine's own count for the embedded GGUF (bench/results *_cpu_engine_latency_*.json)
    assert sum(b.values()) == pytest.approx(96_576_768)
    assert b["lm_head"] == 0
    assert P.weight_format("int4", group_size=32).linear_bits == 4.5
    with pytest.raises(ValueError, match="weights"):
        P.weight_format("int3")
    with pytest.raises(ValueError, match="group_size"):
        P.weight_format("int4", group_size=-1)
    with pytest.raises(ValueError, match="stored"):
        P.weight_format("stored").total_bytes(m)


def test_unknown_presets_name_the_field():
    with pytest.raises(ValueError, match="model.*allowed"):
        P.load_model("gpt-5")
    with pytest.raises(ValueError, match="gpu.*allowed"):
        P.load_hardware("tpu-v9")
    with pytest.raises(ValueError, match="gpus"):
        P.Constraints(0)
    with pytest.raises(ValueError, match="prompt_len"):
        P.Workload(-1, 10)
    with pytest.raises(ValueError, match="batch"):
        P.decode_step(TOYM, TOY, BF16, batch=0)


def test_hf_config_and_gguf(tmp_path, gguf_path):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = P.load_model(str(tmp_path))
    assert m.params == P.load_model("llama3-8b").params and m.head_dim == 128
    del cfg["hidden_size"]
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_size"):
        P.load_model(str(tmp_path / "bad.json"))
    g = P.load_model(gguf_path)
    s = P.load_model("smollm2-135m")
    assert (g.hidden, g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim, g.intermediate, g.vocab, g.tied_embeddings) == \
           (s.hidden, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.intermediate, s.vocab, s.tied_embeddings)
    stored = P.weight_format("stored", model=g)
    assert stored.total_bytes(g) == 96_576_768 == pytest.approx(P.weight_format("q4_1").total_bytes(s))
    assert stored.family == "int4"


def test_calibration_from_rows(tmp_path):
    dev = "NVIDIA H100 80GB HBM3"
    rows = [
        {"kind": "copy_gbps", "value": 3000.0, "device_name": dev},
        {"kind": "matmul_tflops", "value": 791.6, "device_name": dev},
        {"bench": "int4_gemm", "case": "M=1 4096x4096 g128", "dtype": "bfloat16", "device_name": dev,
         "ceiling_kind": "copy_gbps", "ceiling": 3000.0, "frac_of_ceiling": 0.6},
        {"bench": "int4_gemm", "case": "M=1 14336x4096 g128", "dtype": "bfloat16", "device_name": dev,
         "ceiling_kind": "copy_gbps", "ceiling": 3000.0, "frac_of_ceiling": 0.8},
        {"bench": "int4_gemm", "case": "M=64 4096x4096 g128", "dtype": "bfloat16", "device_name": dev,
         "ceiling_kind": "copy_gbps", "ceiling": 3000.0, "frac_of_ceiling": 0.1},    # not a GEMV: ignored
        {"bench": "int4_gemm", "case": "M=1 64x64 g128", "dtype": "bfloat16", "device_name": dev,
         "ceiling_kind": "copy_gbps", "ceiling": 3000.0, "frac_of_ceiling": 1.7},    # in cache: ignored
        {"bench": "paged_attention", "case": "S=1 ctx=2048", "dtype": "bfloat16", "device_name": dev,
         "ceiling_kind": "copy_gbps", "ceiling": 3000.0, "frac_of_ceiling": 0.5},
        {"bench": "all_reduce", "case": "tp=8 16 KiB", "bytes": 16384, "time_us": 6.0, "device_name": dev},
        {"bench": "all_reduce", "case": "tp=8 64 MiB", "bytes": 64 << 20, "time_us": 400.0, "busbw_gbps": 300.0,
         "device_name": dev},
        {"bench": "int4_gemm", "case": "M=1", "device_name": "NVIDIA H200", "ceiling_kind": "copy_gbps",
         "frac_of_ceiling": 0.1},                                                     # other device: ignored
    ]
    (tmp_path / "x_H100_rows.json").write_text(json.dumps(rows))
    (tmp_path / "junk.json").write_text("{not json")
    cal = P.load_calibration(dev, str(tmp_path))
    assert cal.copy_gbps == 3000.0 and cal.matmul_tflops == 791.6
    assert cal.weight_frac == {"int4": pytest.approx(0.7)} and cal.attn_frac == 0.5
    assert cal.allreduce_latency_s == pytest.approx(6e-6) and cal.allreduce_busbw == 300e9
    hw = P.load_hardware("h100")
    eff = P.calibrated(hw, cal)
    base = 3000e9 / 3.35e12
    assert eff.weight_frac("int4") == pytest.approx(base * 0.7) and eff.kv_bw == pytest.approx(base * 0.5)
    assert eff.decode_mfu == pytest.approx(791.6 / 989.5) and eff.allreduce_latency_s == 6e-6
    m = P.load_model("llama3-8b")
    wf = P.weight_format("int4")
    ideal = P.decode_step(m, hw, wf, batch=1)
    cal_step = P.decode_step(m, hw, wf, batch=1, eff=eff)
    assert cal_step.tpot == pytest.approx(ideal.tpot / (base * 0.7))
    assert P.load_calibration("NVIDIA B200", str(tmp_path)).empty
    assert P.calibrated(hw, P.load_calibration("NVIDIA B200", str(tmp_path))) is None
    assert (norm_device_name("Intel(R) Xeon(R) Processor (2 cpus)")
            == norm_device_name("cpu: Intel(R) Xeon(R) Processor (2 threads)"))


def test_allreduce_rows_without_bus_bandwidth(tmp_path):
    dev = "NVIDIA H200"
    rows = [{"bench": "all_reduce", "case": f"{algo} ws=8 {size}", "time_us": t, "device_name": dev}
            for algo, size, t in (("one_shot", "16 KiB", 5.0), ("two_shot", "16 KiB", 9.0),
                                  ("one_shot", "64 MiB", 900.0), ("two_shot", "64 MiB", 400.0))]
    rows.append({"bench": "all_reduce", "case": "one_shot ws=2 16 KiB", "time_us": 2.0, "device_name": dev})
    (tmp_path / "ar.json").write_text(json.dumps(rows))
    cal = P.load_calibration(dev, str(tmp_path))
    assert cal.allreduce_latency_s == pytest.approx(5e-6)               # world size 8, best algorithm
    assert cal.allreduce_busbw == pytest.approx(2 * 7 / 8 * (64 << 20) / 400e-6)


def test_repository_calibration_reads_h200_and_this_cpu():
    """bench/results holds an H200 run (ceilings, engine) and CPU kernel runs."""
    cal = P.load_calibration("NVIDIA H200")
    if cal.empty:
        pytest.skip("no H200 results in bench/results")
    assert 3000 < cal.copy_gbps < 4800 and cal.engine_decode_frac is not None
    eff = P.calibrated(P.load_hardware("h200"), cal)
    assert 0 < eff.weight_frac("dense") < 1


def test_kv_bytes_count_the_padded_cache_row():
    """A head_dim the CUDA attention lacks (Phi-3-mini: 96) is zero-padded to the next of 64 / 128 / 256 in the
    engine's KV cache (models/llama.py cache_head_dim): the planner counts those bytes."""
    from decodekit.planner.models import ModelSpec
    phi3 = ModelSpec("Phi-3-mini", 32064, 3072, 32, 32, 32, 96, 8192, False, False)
    assert phi3.cache_head_dim == 128
    assert phi3.kv_bytes_per_token("bf16") == 2 * 32 * 32 * 128 * 2
    assert P.MODEL_PRESETS["llama3-8b"].cache_head_dim == 128 and P.MODEL_PRESETS["smollm2-135m"].cache_head_dim == 64
