"""fp8 e4m3 KV cache: reshape_and_cache quantization (bit-exact against the reference, which
uses torch's own float8_e4m3fn conversion) and paged_attention over fp8 caches (against the
float64 reference on the dequantized cache)."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, randn
from decodekit import ops
from decodekit.ops import reference as ref

FP8 = torch.float8_e4m3fn


def _scales(kind, hk, device, gen):
    """(k_scale, v_scale): None, per tensor [1], or per KV head [hk] (positive, awkward)."""
    if kind == "none":
        return None, None
    n = 1 if kind == "tensor" else hk
    ks = (torch.rand(n, generator=gen) * 0.5 + 0.05).to(device)
    vs = (torch.rand(n, generator=gen) * 0.5 + 0.05).to(device)
    return ks, vs


def _poisoned_cache(shape, device):
    return torch.full(shape, float("nan"), device=device).to(FP8)  # NaN marks unwritten rows


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", ["none", "tensor", "head"])
def test_reshape_and_cache_fp8(scales, dtype, device, gen):
    hk, d, bs, nb, T = 3, 64, 16, 9, 37
    kc, vc = _poisoned_cache((nb, hk, bs, d), device), _poisoned_cache((nb, hk, bs, d), device)
    qkv = randn((T, (9 + 2 * hk) * d), dtype, device, gen, scale=40.0)  # some |x / scale| > 448: saturate
    qkv[::5, : 9 * d] *= 1e-4  # and some tiny values (fp8 subnormals, zeros)
    k = qkv[:, 9 * d:(9 + hk) * d].view(T, hk, d)
    v = qkv[:, (9 + hk) * d:].view(T, hk, d)
    if scales == "none":  # exact ties between neighbouring fp8 values: round to even
        ties = torch.tensor([1.0625, 1.1875, -3.375, 0.0029296875, 464.0, -0.0009765625] * (d // 6 + 1))[:d]
        k[0, 0] = ties.to(dtype).to(device)
    ks, vs = _scales(scales, hk, device, gen)
    slots = torch.randperm(nb * bs, generator=gen)[:T].clone()
    slots[[3, 20]] = -1  # padding
    want_k, want_v = ref.reshape_and_cache(k, v, kc, vc, slots.to(device), ks, vs)
    ops.reshape_and_cache(k, v, kc, vc, slots.to(device), k_scale=ks, v_scale=vs)
    for got, want in ((kc, want_k), (vc, want_v)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), \
            f"{(got.view(torch.uint8) != want.view(torch.uint8)).sum()} fp8 bytes differ"
    written = ~want_k.float().isnan()
    assert int(written.sum()) == (T - 2) * hk * d  # the poison stayed everywhere else


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", ["none", "tensor", "head"])
@pytest.mark.parametrize("config", [(9, 3, 64, 16), (32, 8, 128, 16), (8, 8, 128, 32)],
                         ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", ["decode", "mixed"])
def test_paged_attention_fp8(case, config, scales, dtype, device, gen):
    hq, hk, d, bs = config
    ctx, new = {"decode": ([1, 15, 16, 17, 1000], [1] * 5), "mixed": ([37, 300, 17], [13, 45, 17])}[case]
    need = [(c + bs - 1) // bs for c in ctx]
    nb = sum(need) + 2
    perm = torch.randperm(nb, generator=gen)
    bt = torch.full((len(ctx), max(need)), -5, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[used:used + n].to(torch.int32)
        used += n
    kc = (torch.randn((nb, hk, bs, d), generator=gen) * 3).to(FP8).to(device)
    vc = (torch.randn((nb, hk, bs, d), generator=gen) * 3).to(FP8).to(device)
    ks, vs = _scales(scales, hk, device, gen)
    T = sum(new)
    q = randn((T, hq, d), dtype, device, gen)
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32, device=device)
    lens = torch.tensor(ctx, dtype=torch.int32, device=device)
    bt = bt.to(device)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((T, hq), float("nan"), device=device)
    ops.paged_attention(q, kc, vc, bt, lens, qsl, d ** -0.5, out=out, lse=lse, k_scale=ks, v_scale=vs)
    want, want_lse = ref.paged_attention(q.double().cpu(), kc.cpu(), vc.cpu(), bt.cpu(), lens.cpu(), qsl.cpu(),
                                         d ** -0.5, None if ks is None else ks.cpu(), None if vs is None else vs.cpu())
    assert_close(out, want, dtype, f"fp8 paged_attention {case}")
    assert_close(lse, want_lse, torch.float32, f"fp8 lse {case}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128, 96])
def test_paged_attention_fp8_every_code(d, qdtype, device, gen):
    """Every finite e4m3 code (subnormals, zeros, +-448) as a key and as a value element, read by
    each kernel path (vector head dims 64/128, the scalar one for 96; CUDA fp16 / bf16 queries: the
    tensor-core decode kernel, its raw tiles widened in shared memory, bf16 queries in fp16 rescaled); a NaN
    code in one used value element makes exactly that element of that sequence's KV-head outputs NaN, as in
    the reference."""
    if device == "cuda" and d == 96:
        pytest.skip("the CUDA kernel takes head_dim 64 / 128 / 256 (96 is a CPU path)")
    hq, hk, bs = 6, 2, 16
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    n = finite.numel()  # 254 codes
    ctx = [n, 37]
    nb = sum((c + bs - 1) // bs for c in ctx)
    codes = finite[torch.randint(0, n, (nb, hk, bs, d), generator=gen)]
    codes.view(nb, hk, bs * d)[:, 0, :n] = finite[torch.randperm(n, generator=gen)]  # each code at least once
    kc = codes.view(FP8).contiguous()
    vc = codes[torch.randperm(nb, generator=gen)].view(FP8).contiguous()
    kc.view(torch.uint8)[..., 0] = 0  # keep the scores moderate: key elements small enough ...
    q = randn((2, hq, d), qdtype, "cpu", gen, scale=1e-3)  # ... and queries tiny
    need = [(c + bs - 1) // bs for c in ctx]
    bt = torch.full((2, max(need)), -5, dtype=torch.int32)
    bt[0, :need[0]] = torch.arange(need[0], dtype=torch.int32)
    bt[1, :need[1]] = torch.arange(need[0], need[0] + need[1], dtype=torch.int32)
    lens = torch.tensor(ctx, dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    ks, vs = torch.tensor([0.75, 0.5]), torch.tensor([0.25, 1.5])
    args = [t.to(device) for t in (q, kc, vc, bt, lens, qsl)]
    out = torch.full_like(args[0], float("nan"))
    ops.paged_attention(*args, d ** -0.5, out=out, k_scale=ks.to(device), v_scale=vs.to(device))
    want, _ = ref.paged_attention(q.double(), kc, vc, bt, lens, qsl, d ** -0.5, ks, vs)
    assert_close(out, want, qdtype, f"fp8 every code d={d}")
    # a NaN code in sequence 1's used value rows, KV head 1
    blk = int(bt[1, 1])
    vc.view(torch.uint8)[blk, 1, 3, 5] = 0xFF
    args[2] = vc.to(device)
    out.fill_(0.0)
    ops.paged_attention(*args, d ** -0.5, out=out, k_scale=ks.to(device), v_scale=vs.to(device))
    out = out.cpu()
    nan = torch.zeros_like(out, dtype=torch.bool)
    nan[1, 3:, 5] = True  # element 5 of the KV head's query heads, in that sequence only
    assert torch.equal(out.isnan(), nan), f"NaN at {out.isnan().nonzero().tolist()}"


def test_fp8_dequantize_matches_torch():
    """The reference's dequantization is torch's exact float8 -> float conversion times the scale."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).reshape(1, 1, 16, 16)
    s = torch.tensor([0.375])
    got = ref.dequantize_cache(codes, s, torch.float64)
    want = codes.to(torch.float64) * 0.375
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_errors(device, gen):
    hk, d, bs = 3, 64, 16
    kc, vc = _poisoned_cache((4, hk, bs, d), device), _poisoned_cache((4, hk, bs, d), device)
    k = randn((2, hk, d), torch.bfloat16, device, gen)
    slots = torch.tensor([0, 1], device=device)
    with pytest.raises(RuntimeError, match="'k_scale' must have 1 or num_kv_heads = 3 elements"):
        ops.reshape_and_cache(k, k, kc, vc, slots, k_scale=torch.ones(2, device=device))
    with pytest.raises(RuntimeError, match="'k_scale' has dtype"):
        ops.reshape_and_cache(k, k, kc, vc, slots, k_scale=torch.ones(1, dtype=torch.float64, device=device))
    # k_scale per tensor with v_scale per KV head is valid (each is [1] or [num_kv_heads]; the mix is
    # tested against the reference in test_ops_contract_audit.py)
    ops.reshape_and_cache(k, k, kc, vc, slots, k_scale=torch.ones(1, device=device),
                          v_scale=torch.ones(3, device=device))
    bf = torch.zeros((4, hk, bs, d), dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match="only for an fp8"):
        ops.reshape_and_cache(k, k, bf, bf.clone(), slots, k_scale=torch.ones(1, device=device))
    with pytest.raises(RuntimeError, match="'key_cache' is BFloat16 but 'key' is Half"):
        ops.reshape_and_cache(k.half(), k.half(), bf, bf.clone(), slots)
    q = randn((1, 9, d), torch.float16, device, gen)
    bt = torch.zeros((1, 1), dtype=torch.int32, device=device)
    one = torch.ones(1, dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="'key_cache' is BFloat16 but 'query' is Half"):
        ops.paged_attention(q, bf, bf, bt, one, qsl, 0.1)
    with pytest.raises(RuntimeError, match="'v_scale' must have 1 or num_kv_heads"):
        ops.paged_attention(q, kc, vc, bt, one, qsl, 0.1, v_scale=torch.ones(4, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_opcheck(device, gen):
    hk, d, bs = 3, 64, 16
    kc = (torch.randn((5, hk, bs, d), generator=gen)).to(FP8).to(device)
    vc = (torch.randn((5, hk, bs, d), generator=gen)).to(FP8).to(device)
    ks, vs = _scales("head", hk, device, gen)
    q = randn((5, 9, d), torch.bfloat16, device, gen)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32, device=device)
    lens = torch.tensor([20, 5], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 4, 5], dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    lse = torch.empty(5, 9, device=device)
    # test_schema compares tensors with arithmetic torch lacks for float8 on CPU; the schema's
    # aliasing annotations are checked with bf16 caches in test_attention.py's opcheck.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    opcheck(torch.ops.decodekit.paged_attention.default, (out, q, kc, vc, bt, lens, qsl, 0.125, lse, ks, vs),
            test_utils=utils)
    slots = torch.tensor([3, 7, -1, 40, 2], device=device)
    opcheck(torch.ops.decodekit.reshape_and_cache.default,
            (q[:, :3], q[:, 3:6], kc.clone(), vc.clone(), slots, ks, vs), test_utils=utils)
