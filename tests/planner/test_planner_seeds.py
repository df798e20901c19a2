"""The seed documents' numbers (../shared/seeds), each pinned within 2%.

Seed 004: Llama 3 8B on one H100 (989.5 TFLOP/s BF16, 3.35 TB/s, 80 GB). Seed 000: Llama-3-70B,
TP=8 vs replicas, the ridge, speculative decoding. The planner's conventions (every parameter
read once per step, prefill 2*P*T at 50% of peak, decimal GB, 4-bit = 4 bits with group_size=0)
are the ones these documents use.
"""
import pytest

from decodekit import planner as P

REL = 0.02


def near(got, want, rel=REL):
    return got == pytest.approx(want, rel=rel)


@pytest.fixture(scope="module")
def h100():
    return P.load_hardware("h100")


@pytest.fixture(scope="module")
def m8():
    return P.load_model("llama3-8b")


@pytest.fixture(scope="module")
def m70():
    return P.load_model("llama3-70b")


BF16 = P.weight_format("bf16")


def test_hardware_and_parameter_counts(h100, m8, m70):
    assert h100.mem_bw == 3.35e12 and h100.flops["bf16"] == 989.5e12 and h100.mem_bytes == 80e9
    assert near(m8.params, 8.03e9, 0.001)
    assert near(BF16.total_bytes(m8), 16e9)          # "Llama 3 8B in BF16 is 16 GB"
    assert near(BF16.total_bytes(m70), 140e9)        # "70B model at bf16 is 140 GB"


def test_8b_prefill_65ms_at_half_peak(h100, m8):
    p = P.prefill(m8, h100, BF16, 2000, eff=P.ideal(0.5))
    assert near(p.flops, 2 * 8.03e9 * 2000, 0.001)
    assert near(p.ttft, 65e-3)


def test_8b_decode_floors(h100, m8):
    t, tok = P.decode_floor(m8, h100, BF16)
    assert near(t, 4.8e-3) and near(tok, 209)
    assert near(P.decode_floor(m8, h100, P.weight_format("int8"))[1], 417)
    assert near(P.decode_floor(m8, h100, P.weight_format("fp8"))[1], 417)
    assert near(P.decode_floor(m8, h100, P.weight_format("int4", group_size=0))[1], 834)


@pytest.mark.parametrize("batch,ms,tok_s", [(1, 4.9, 205), (8, 5.4, 1472), (32, 7.4, 4349), (64, 9.9, 6450)])
def test_8b_batching_table_at_2048_context(h100, m8, batch, ms, tok_s):
    s = P.decode_step(m8, h100, BF16, batch=batch, context=2048)
    assert near(s.tpot * 1e3, ms)
    assert near(s.tokens_per_s, tok_s)
    assert s.bound == "memory"


def test_8b_kv_per_token_and_sequences_that_fit(h100, m8):
    assert m8.kv_bytes_per_token("bf16") == 128 * 1024
    c = P.capacity(m8, h100, BF16, context=8192)                  # default activation reserve
    assert near(c.max_batch, 60) and c.max_batch <= 60
    c0 = P.capacity(m8, h100, BF16, context=8192, reserve_bytes=0)  # the seed's "about 64 GB left"
    assert near(c0.kv_budget_bytes, 64e9) and near(c0.max_batch, 60)


def test_70b_kv_per_token(m70):
    assert m70.kv_bytes_per_token("bf16") == 327_680


def test_70b_one_gpu_42ms(h100, m70):
    t, tok = P.decode_floor(m70, h100, BF16)
    assert near(t, 42e-3) and near(tok, 24)


def test_70b_tp8_about_5_2ms_plus_allreduce(h100, m70):
    s = P.decode_step(m70, h100, BF16, batch=1, context=0, tp=8)
    assert near(s.t_weights, 5.2e-3)
    assert s.t_allreduce > 0 and s.n_allreduce == 160
    assert s.tpot == pytest.approx(s.t_weights + s.t_allreduce, rel=1e-9)  # + KV(0) + nothing else
    # TP=8 divides the per-token time by ~8 but not the per-GPU throughput
    one = P.decode_floor(m70, h100, BF16)[0]
    assert near(one / s.t_weights, 8, 1e-9)


def test_70b_needs_two_h100s_and_21ms_on_two(h100, m70):
    assert P.min_devices(m70, h100, BF16) == 2
    s = P.decode_step(m70, h100, BF16, batch=1, context=0, tp=2)
    assert near(s.t_weights, 21e-3)
    assert s.tpot > s.t_weights            # "plus communication between them"
    assert 1 / s.tpot < 50                 # "under 50 tokens per second per sequence"


def test_70b_int4_fits_one_gpu_at_10_4ms_not_21(h100, m70):
    """Seed 000 says 35 GB / 3350 GB/s is 21 ms: the arithmetic gives 10.4 ms (seed 004 agrees)."""
    wf = P.weight_format("int4", group_size=0)
    assert near(wf.total_bytes(m70), 35e9)
    assert P.min_devices(m70, h100, wf) == 1
    t = P.decode_floor(m70, h100, wf)[0]
    assert near(t, 10.4e-3)
    assert t < 0.6 * 21e-3
    assert P.capacity(m70, h100, wf, context=2048).max_batch > 0  # room for KV cache


def test_int4_group_scales_cost_what_they_say(h100, m70):
    g128 = P.weight_format("int4", group_size=128)
    assert g128.linear_bits == 4 + 16 / 128
    assert P.decode_floor(m70, h100, g128)[0] == pytest.approx(70_553_706_496 * 4.125 / 8 / 3.35e12)


def test_crossover_batch_h100_295_h200_206(h100, m70, m8):
    assert near(P.crossover_batch(m70, h100, BF16), 295)
    assert near(P.crossover_batch(m8, h100, BF16), 295)
    assert near(P.crossover_batch(m70, P.load_hardware("h200"), BF16), 206)
    # just below the crossover decode is memory-bound, just above compute-bound
    assert P.decode_step(m70, h100, BF16, batch=280).bound == "memory"
    assert P.decode_step(m70, h100, BF16, batch=310).bound == "compute"


def test_speculation_a08_k4_gives_3_36_tokens():
    assert P.expected_tokens(4, 0.8) == pytest.approx(3.36, rel=1e-3)
    assert P.SpecDecode(4, 0.8).expected_tokens == pytest.approx(3.3616)
