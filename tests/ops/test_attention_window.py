"""paged_attention with a sliding window (Mistral, Qwen2's sliding layers): each token sees only its
last `sliding_window` keys. The reference is checked against a naive per-row float64 loop; the kernels
against the reference, with the table's blocks before each sequence's first window pointing at a NaN
block (or holding invalid ids) so that any read of them shows."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, randn
from decodekit import ops
from decodekit.ops import reference as ref


def _windowed_batch(ctx_lens, new_lens, hq, hk, d, bs, dtype, device, gen, window, before="nan"):
    """A random paged batch whose table entries before each sequence's first window are the NaN block
    (before="nan", the cache's last block) or invalid ids (before="invalid": -1 and 10**6)."""
    need = [(c + bs - 1) // bs for c in ctx_lens]
    num_blocks = sum(need) + 4
    nan_block = num_blocks - 1
    perm = torch.randperm(num_blocks - 1, generator=gen).tolist()
    maxb = max(need) + 1
    bt = torch.full((len(ctx_lens), maxb), -7, dtype=torch.int32)
    used = 0
    for s, (c, n) in enumerate(zip(ctx_lens, new_lens)):
        skip = max(0, c - n - window + 1) // bs if n > 0 and window > 0 else 0  # blocks before the first window
        for b in range(need[s]):
            bt[s, b] = perm[used] if b >= skip else (nan_block if before == "nan" else (-1, 10**6)[b % 2])
            used += 1
    kc = randn((num_blocks, hk, bs, d), dtype, device, gen)
    vc = randn((num_blocks, hk, bs, d), dtype, device, gen)
    kc[nan_block] = float("nan")
    vc[nan_block] = float("nan")
    q = randn((sum(new_lens), hq, d), dtype, device, gen)
    qsl = torch.tensor([0] + list(torch.tensor(new_lens).cumsum(0)), dtype=torch.int32)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    return q, kc, vc, bt.to(device), lens.to(device), qsl.to(device)


def _naive(q, kc, vc, bt, lens, qsl, scale, window):
    """Row by row in float64: softmax over keys p - window < k <= p of the token at position p."""
    T, Hq, D = q.shape
    Hk, bs = kc.shape[1], kc.shape[2]
    out = torch.zeros(T, Hq, D, dtype=torch.float64)
    lse = torch.zeros(T, Hq, dtype=torch.float64)
    for s in range(len(lens)):
        n, c = int(qsl[s + 1] - qsl[s]), int(lens[s])
        for i in range(n):
            t, p = int(qsl[s]) + i, c - n + i
            keys = [k for k in range(p + 1) if k > p - window] if window else list(range(p + 1))
            rows = [(int(bt[s, k // bs]), k % bs) for k in keys]
            for h in range(Hq):
                kh = h // (Hq // Hk)
                K = torch.stack([kc[b, kh, o].double() for b, o in rows])
                V = torch.stack([vc[b, kh, o].double() for b, o in rows])
                sc = K @ q[t, h].double() * scale
                lse[t, h] = torch.logsumexp(sc, 0)
                out[t, h] = torch.softmax(sc, 0) @ V
    return out, lse


CASES = {  # name: (context lengths incl. new tokens, new tokens per sequence, window)
    "decode": ([15, 100, 1000, 41, 3], [1, 1, 1, 1, 1], 40),
    "decode-w1": ([7, 300], [1, 1], 1),
    "decode-long-split": ([5000, 20], [1, 1], 700),
    "prefill": ([300], [300], 50),
    "chunk": ([500, 61, 5], [77, 20, 1], 100),
    "chunk-block-window": ([200, 64], [64, 64], 32),
    "window-past-ctx": ([30, 12], [5, 12], 1000),
    "spec-verify": ([333, 90], [5, 8], 64),
}


def test_reference_is_the_naive_window(gen):
    for name, (ctx, new, w) in CASES.items():
        if max(ctx) > 400:
            continue  # (the naive loop is slow)
        q, kc, vc, bt, lens, qsl = _windowed_batch(ctx, new, 6, 2, 16, 16, torch.float32, "cpu", gen, w)
        got, got_lse = ref.paged_attention(q.double(), kc.double(), vc.double(), bt, lens, qsl, 0.25,
                                           sliding_window=w)
        want, want_lse = _naive(q, kc, vc, bt, lens, qsl, 0.25, w)
        torch.testing.assert_close(got, want, msg=name)
        torch.testing.assert_close(got_lse, want_lse, msg=name)
    # a window at least the context is plain causal attention
    q, kc, vc, bt, lens, qsl = _windowed_batch([40, 9], [3, 9], 4, 4, 16, 16, torch.float32, "cpu", gen, 0)
    full, _ = ref.paged_attention(q.double(), kc.double(), vc.double(), bt, lens, qsl, 0.25)
    for w in (40, 41, 10**6):
        torch.testing.assert_close(ref.paged_attention(q.double(), kc.double(), vc.double(), bt, lens, qsl, 0.25,
                                                       sliding_window=w)[0], full)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [(9, 3, 64, 16), (32, 8, 128, 16), (8, 8, 128, 32), (6, 2, 96, 5)],
                         ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_window(case, config, dtype, device, gen):
    ctx, new, window = CASES[case]
    hq, hk, d, bs = config
    if device == "cuda" and d not in (64, 128, 256):
        pytest.skip("head_dim 96: CPU kernel only")
    q, kc, vc, bt, lens, qsl = _windowed_batch(ctx, new, hq, hk, d, bs, dtype, device, gen, window)
    scale = d ** -0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], hq), float("nan"), device=device)
    ops.paged_attention(q, kc, vc, bt, lens, qsl, scale, out=out, lse=lse, sliding_window=window)
    want, want_lse = ref.paged_attention(q.double(), kc.double(), vc.double(), bt.cpu(), lens.cpu(), qsl.cpu(), scale,
                                         sliding_window=window)
    assert not torch.isnan(want).any()  # the NaN block lies outside every window
    assert_close(out, want, dtype, f"paged_attention window {case}")
    assert_close(lse, want_lse, torch.float32, f"lse window {case}")


@pytest.mark.parametrize("device", DEVICES)
def test_window_fp8_cache(device, gen):
    hq, hk, d, bs, w = 9, 3, 64, 16, 30
    q, kc, vc, bt, lens, qsl = _windowed_batch([200, 40, 77], [65, 1, 1], hq, hk, d, bs, torch.bfloat16, device, gen,
                                               w)
    k_scale = torch.rand(hk, generator=gen).add_(0.05).to(device)
    v_scale = torch.rand(hk, generator=gen).add_(0.05).to(device)
    kq = ref.quantize_fp8_kv(kc.float().permute(0, 2, 1, 3), k_scale).permute(0, 2, 1, 3).contiguous()
    vq = ref.quantize_fp8_kv(vc.float().permute(0, 2, 1, 3), v_scale).permute(0, 2, 1, 3).contiguous()
    out = torch.full_like(q, float("nan"))
    ops.paged_attention(q, kq, vq, bt, lens, qsl, 0.125, out=out, k_scale=k_scale, v_scale=v_scale, sliding_window=w)
    want, _ = ref.paged_attention(q.double(), kq, vq, bt.cpu(), lens.cpu(), qsl.cpu(), 0.125, k_scale.cpu(),
                                  v_scale.cpu(), sliding_window=w)
    assert_close(out, want, torch.bfloat16, "fp8 window")


def test_blocks_before_the_window_are_not_read_or_checked(gen):
    """The CPU launcher validates the table entries it reads: those before the first window may hold
    anything (an engine may release those blocks)."""
    q, kc, vc, bt, lens, qsl = _windowed_batch([300, 70], [1, 9], 8, 2, 64, 16, torch.float32, "cpu", gen, 40,
                                               before="invalid")
    out = ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, sliding_window=40)
    want, _ = ref.paged_attention(q.double(), kc.double(), vc.double(), bt, lens, qsl, 0.125, sliding_window=40)
    assert_close(out, want, torch.float32, "invalid ids before the window")
    with pytest.raises(RuntimeError, match=r"'block_tables'\[0, 0\] = -1 is outside"):
        ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125)  # without the window they are read


@pytest.mark.parametrize("window", [1, 16, 37])
def test_multi_token_rows_equal_one_token_steps_bitwise(window, gen):
    """As without a window (test_attention.py): speculative verification rows equal plain decode steps."""
    ctx, new = 301, 7
    q, kc, vc, bt, lens, qsl = _windowed_batch([ctx], [new], 9, 3, 64, 16, torch.float32, "cpu", gen, window)
    out = ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, sliding_window=window)
    for t in range(new):
        one = ops.paged_attention(q[t:t + 1].contiguous(), kc, vc, bt,
                                  torch.tensor([ctx - new + 1 + t], dtype=torch.int32),
                                  torch.tensor([0, 1], dtype=torch.int32), 0.125, sliding_window=window)
        assert torch.equal(one[0], out[t]), (t, (one[0] - out[t]).abs().max())


def test_window_errors(gen):
    q, kc, vc, bt, lens, qsl = _windowed_batch([20], [2], 4, 2, 64, 16, torch.float32, "cpu", gen, 0)
    for bad in (-1, 2**31):
        with pytest.raises(RuntimeError, match=r"'sliding_window'.*\[0, 2147483647\]"):
            ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, sliding_window=bad)
    for bad in (True, False, 3.0, "8"):  # (torch's int argument would take a bool as 0 / 1)
        with pytest.raises(ValueError, match="'sliding_window' must be an int in"):
            ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, sliding_window=bad)
        with pytest.raises(ValueError, match="'sliding_window' must be an int in"):
            ref.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, sliding_window=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_window(device, gen):
    q, kc, vc, bt, lens, qsl = _windowed_batch([50, 9], [3, 9], 8, 2, 64, 16, torch.float16, device, gen, 12)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], device=device)
    opcheck(torch.ops.decodekit.paged_attention.default, (out, q, kc, vc, bt, lens, qsl, 0.125, lse, None, None, 12))
