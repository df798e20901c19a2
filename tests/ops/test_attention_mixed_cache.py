"""A float32 model's KV cache in bfloat16 / float16 (CPU, `--kv-cache-dtype bfloat16|float16`):
reshape_and_cache rounds each fp32 row to nearest even (bit-exact against torch's conversion, the
reference's), paged_attention reads the 16-bit cache under fp32 queries (against the float64 reference
on the same cache values: the only rounding left is the kernel's fp32 arithmetic), the combinations
the kernels do not take give errors naming the field, and the engine runs with such a cache."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import assert_close, randn
from decodekit import ops
from decodekit.ops import reference as ref

HALF16 = [torch.bfloat16, torch.float16]


def _tables(ctx, bs, gen, spare=3):
    """Block tables [S, max_blocks] (int32, shuffled pages, columns past a sequence's blocks -5) and
    the number of cache blocks."""
    need = [(c + bs - 1) // bs for c in ctx]
    nb = sum(need) + spare
    perm = torch.randperm(nb, generator=gen)
    bt = torch.full((len(ctx), max(need) + 1), -5, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[used:used + n].to(torch.int32)
        used += n
    return bt, nb


@pytest.mark.parametrize("cdtype", HALF16)
def test_reshape_and_cache_rounds_fp32_rows(cdtype, gen):
    hk, d, bs, nb, T = 3, 80, 16, 7, 41
    kc = torch.full((nb, hk, bs, d), float("nan")).to(cdtype)  # NaN marks unwritten rows
    vc = kc.clone()
    kv = randn((T, 2 * hk + 1, d), torch.float32, "cpu", gen, scale=3.0)  # token stride 2 hk + 1 heads
    kv[0, :2 * hk, :8] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 7e4, -7e4, 1e-41, -0.0])
    k, v = kv[:, :hk], kv[:, hk:2 * hk]   # ties to even in both 16-bit formats, fp16 overflow, subnormals
    slots = torch.randperm(nb * bs, generator=gen)[:T].clone()
    slots[[0, 9]] = slots[[9, 0]]
    slots[[4, 30]] = -1  # padding
    want_k, want_v = ref.reshape_and_cache(k, v, kc, vc, slots)
    ops.reshape_and_cache(k, v, kc, vc, slots)
    for got, want in ((kc, want_k), (vc, want_v)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), \
            f"{(got.view(torch.int16) != want.view(torch.int16)).sum()} elements differ from torch's rounding"
    assert int((~kc.isnan()).sum()) == (T - 2) * hk * d  # the poison stayed everywhere else


@pytest.mark.parametrize("cdtype", HALF16)
@pytest.mark.parametrize("config", [(9, 3, 64, 16), (32, 8, 128, 32), (8, 8, 80, 16), (12, 4, 256, 16)],
                         ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", ["decode", "mixed", "window"])
def test_paged_attention_fp32_query_16bit_cache(case, config, cdtype, gen):
    hq, hk, d, bs = config
    ctx, new = {"decode": ([1, 15, 16, 17, 1000, 4097], [1] * 6),
                "mixed": ([37, 300, 17, 5], [13, 45, 17, 1]),
                "window": ([700, 33], [20, 1])}[case]
    window = 100 if case == "window" else 0
    bt, nb = _tables(ctx, bs, gen)
    kc = (torch.randn((nb, hk, bs, d), generator=gen) * 2).to(cdtype)
    vc = (torch.randn((nb, hk, bs, d), generator=gen) * 2).to(cdtype)
    T = sum(new)
    q = randn((T, hq, d), torch.float32, "cpu", gen)
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(ctx, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((T, hq), float("nan"))
    ops.paged_attention(q, kc, vc, bt, lens, qsl, d ** -0.5, out=out, lse=lse, sliding_window=window)
    want, want_lse = ref.paged_attention(q.double(), kc, vc, bt, lens, qsl, d ** -0.5, sliding_window=window)
    assert_close(out, want, torch.float32, f"fp32 query over a {cdtype} cache, {case}")
    assert_close(lse, want_lse, torch.float32, f"lse, {cdtype} cache, {case}")


@pytest.mark.parametrize("cdtype", HALF16)
def test_write_then_attend_matches_fp32_cache_within_rounding(cdtype, gen):
    """The same K/V written into an fp32 cache and a 16-bit one: the attention outputs differ by about the
    cache's rounding (2^-9 bf16, 2^-12 fp16 relative per element), not more."""
    hq, hk, d, bs, n = 6, 2, 64, 16, 50
    bt, nb = _tables([n], bs, gen)
    k = randn((n, hk, d), torch.float32, "cpu", gen)
    v = randn((n, hk, d), torch.float32, "cpu", gen)
    slots = torch.tensor([int(bt[0, t // bs]) * bs + t % bs for t in range(n)])
    outs = []
    for c in (torch.float32, cdtype):
        kc = torch.zeros((nb, hk, bs, d), dtype=c)
        vc = torch.zeros_like(kc)
        ops.reshape_and_cache(k, v, kc, vc, slots)
        q = randn((n, hq, d), torch.float32, "cpu", torch.Generator().manual_seed(5))
        outs.append(ops.paged_attention(q, kc, vc, bt, torch.tensor([n], dtype=torch.int32),
                                        torch.tensor([0, n], dtype=torch.int32), d ** -0.5))
    eps = 2.0 ** (-8 if cdtype == torch.bfloat16 else -11)
    err = (outs[0] - outs[1]).abs().max().item()
    assert 0 < err < 8 * eps, f"{cdtype} cache moved the output by {err} (cache rounding {eps})"


def test_mixed_cache_errors(gen):
    hk, d, bs = 3, 64, 16
    k16 = torch.zeros((4, hk, bs, d), dtype=torch.bfloat16)
    k32 = torch.zeros((4, hk, bs, d), dtype=torch.float32)
    slots = torch.tensor([0, 1])
    kb = randn((2, hk, d), torch.bfloat16, "cpu", gen)
    # 16-bit activations take their own dtype (or fp8) only
    with pytest.raises(RuntimeError, match="'key_cache' is Float but 'key' is BFloat16"):
        ops.reshape_and_cache(kb, kb, k32, k32.clone(), slots)
    with pytest.raises(RuntimeError, match="'key_cache' is Half but 'key' is BFloat16"):
        ops.reshape_and_cache(kb, kb, k16.half(), k16.half(), slots)
    # fp8 scales stay fp8-only
    k = randn((2, hk, d), torch.float32, "cpu", gen)
    with pytest.raises(RuntimeError, match="only for an fp8"):
        ops.reshape_and_cache(k, k, k16, k16.clone(), slots, k_scale=torch.ones(1))
    # the two caches must agree
    with pytest.raises(RuntimeError, match="'value_cache' has dtype"):
        ops.reshape_and_cache(k, k, k16, k16.half(), slots)
    q = randn((1, 9, d), torch.float16, "cpu", gen)
    bt = torch.zeros((1, 1), dtype=torch.int32)
    one = torch.ones(1, dtype=torch.int32)
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="'key_cache' is Float but 'query' is Half"):
        ops.paged_attention(q, k32, k32, bt, one, qsl, 0.1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mixed_cache_rejected_on_cuda(gen):
    """The CUDA kernels take 16-bit queries over their own dtype or fp8 only: a clear error."""
    kc = torch.zeros((2, 1, 16, 64), dtype=torch.bfloat16, device="cuda")
    k = torch.randn((1, 1, 64), device="cuda")
    with pytest.raises(RuntimeError, match="'key_cache' is BFloat16 but 'key' is Float"):
        ops.reshape_and_cache(k, k, kc, kc.clone(), torch.zeros(1, dtype=torch.long, device="cuda"))


@pytest.mark.parametrize("cdtype", HALF16)
def test_mixed_cache_opcheck(cdtype, gen):
    hk, d, bs = 3, 64, 16
    kc = torch.randn((5, hk, bs, d), generator=gen).to(cdtype)
    vc = torch.randn((5, hk, bs, d), generator=gen).to(cdtype)
    q = randn((5, 9, d), torch.float32, "cpu", gen)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    lens = torch.tensor([20, 5], dtype=torch.int32)
    qsl = torch.tensor([0, 4, 5], dtype=torch.int32)
    opcheck(torch.ops.decodekit.paged_attention.default,
            (torch.empty_like(q), q, kc, vc, bt, lens, qsl, 0.125, torch.empty(5, 9), None, None, 0))
    opcheck(torch.ops.decodekit.reshape_and_cache.default,
            (q[:, :3], q[:, 3:6], kc.clone(), vc.clone(), torch.tensor([3, 7, -1, 40, 2]), None, None))
