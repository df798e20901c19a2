"""Contract audit of the public ops on odd inputs: a valid input gives the reference's result (CPU
kernel vs the float64 reference), an invalid one raises a clear exception naming the argument --
never a crash or a silent wrong answer. Each test here failed before its fix:

* row_stride (csrc/check.h) took a size-1 second-to-last dim as "rows are packed": x[:, None, :h]
  of a wider buffer was read / written with row stride h (wrong rows in rms_norm,
  fused_add_rms_norm, silu_and_mul); size-1 leading dims with arbitrary strides were refused.
* paged_attention: num_kv_heads 0 / block_size 0 divided by zero (SIGFPE), 0 query heads read
  before a vector (SIGSEGV); reshape_and_cache took a 0-KV-head / 0-block-size cache.
* fp8 KV cache: k_scale per KV head with v_scale per tensor (both documented forms) was refused.
* copy_blocks: a destination that is also a source (chains) was copied in the kernel's order
  (the reference reads every source before any write); two sources for one destination raced.
* fused_add_rms_norm / rotary_embedding wrote in place through overlapping views (expanded rows,
  input is residual, query is key) and returned garbage; now refused.
* reference.quantize_fp8 raised on K = 0 (the kernel gives scale 1).

Crash-prone cases run in a subprocess so a regression fails the test instead of killing pytest.
"""
import subprocess
import sys
import textwrap

import pytest
import torch

from dk_testing import assert_close, randn
from decodekit import ops
from decodekit.ops import reference as ref

O = torch.ops.decodekit


def _run_isolated(code: str) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (decodekit imported) so a segfault / SIGFPE is a result."""
    src = "import torch, decodekit\nO = torch.ops.decodekit\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)


# ---- row-strided inputs whose second-to-last dim has size 1 (csrc/check.h row_stride) ----------

def _size1_middle(rows, cols, dtype, gen, pad=11):
    """x [rows, 1, cols] viewing a NaN-padded [rows, 1, cols + pad] buffer: row stride cols + pad."""
    buf = torch.full((rows, 1, cols + pad), float("nan"), dtype=dtype)
    buf[:, :, :cols] = randn((rows, 1, cols), dtype, "cpu", gen)
    return buf[:, :, :cols], buf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_size1_dim_row_stride(dtype, gen):
    x, _ = _size1_middle(5, 19, dtype, gen)
    w = randn((19,), dtype, "cpu", gen)
    out = torch.full((5, 1, 19), float("nan"), dtype=dtype)
    ops.rms_norm(x, w, 1e-5, out=out)
    assert_close(out, ref.rms_norm(x.double(), w.double(), 1e-5), dtype, "rms_norm x[:, None, :h]")


def test_rms_norm_size1_leading_dims_any_stride(gen):
    """[5, 1, 1, h] permuted from [1, 5, 1, h]: the size-1 dims' strides are arbitrary (valid input)."""
    x = randn((1, 5, 1, 17), torch.float32, "cpu", gen).permute(1, 0, 2, 3)
    w = randn((17,), torch.float32, "cpu", gen)
    out = torch.full(x.shape, float("nan"))
    O.rms_norm(out, x, w, 1e-6)
    assert_close(out, ref.rms_norm(x.double(), w.double(), 1e-6), torch.float32, "rms_norm permuted")


def test_rms_norm_transposed_still_refused(gen):
    x = randn((5, 4, 17), torch.float32, "cpu", gen).transpose(0, 1)
    with pytest.raises(RuntimeError, match="'input' has strides that do not collapse"):
        O.rms_norm(torch.empty(4, 5, 17), x, torch.ones(17), 1e-6)


def test_fused_add_rms_norm_size1_dim_row_stride(gen):
    x, xbuf = _size1_middle(4, 23, torch.float32, gen)
    r, rbuf = _size1_middle(4, 23, torch.float32, gen, pad=5)
    w = randn((23,), torch.float32, "cpu", gen)
    want, want_r = ref.fused_add_rms_norm(x.double(), r.double(), w.double(), 1e-5)
    O.fused_add_rms_norm(x, r, w, 1e-5)
    assert_close(x, want, torch.float32, "fused normed")
    assert_close(r, want_r, torch.float32, "fused residual")
    assert xbuf[:, :, 23:].isnan().all() and rbuf[:, :, 23:].isnan().all(), "wrote into the padding"


def test_silu_and_mul_size1_dim_row_stride(gen):
    x, _ = _size1_middle(6, 2 * 13, torch.float16, gen)
    out = torch.full((6, 1, 13), float("nan"), dtype=torch.float16)
    ops.silu_and_mul(x, out=out)
    assert_close(out, ref.silu_and_mul(x.double()), torch.float16, "silu_and_mul x[:, None, :2d]")


# ---- in-place ops on overlapping views ------------------------------------------------------------

def test_fused_add_rms_norm_refuses_overlapping_writes(gen):
    x = randn((4, 9), torch.float32, "cpu", gen)
    w = torch.ones(9)
    with pytest.raises(RuntimeError, match="'residual' is written in place but its rows overlap"):
        O.fused_add_rms_norm(x, torch.randn(1, 9).expand(4, 9), w, 1e-6)
    with pytest.raises(RuntimeError, match="'input' and 'residual' are the same memory"):
        O.fused_add_rms_norm(x, x, w, 1e-6)


def test_rotary_embedding_refuses_overlapping_writes():
    cs = ref.rope_cos_sin_cache(8, 64, 10000.0)
    pos = torch.tensor([0, 1, 2])
    with pytest.raises(RuntimeError, match="'query' is written in place but its rows overlap"):
        O.rotary_embedding(pos, torch.randn(1, 128).expand(3, 128), None, cs, 64, True)
    with pytest.raises(RuntimeError, match="'key' is written in place but its heads overlap"):
        k = torch.randn(3, 64 + 16).as_strided((3, 2, 64), (80, 16, 1))
        O.rotary_embedding(pos, torch.randn(3, 2, 64), k, cs, 64, True)
    q = torch.randn(3, 2, 64)
    with pytest.raises(RuntimeError, match="'query' and 'key' are the same memory"):
        O.rotary_embedding(pos, q, q, cs, 64, True)


def test_rotary_embedding_strided_views_still_fine(gen):
    """Heads of a fused qkv buffer (token stride > heads * head_size) and a one-token batch with any
    token stride stay valid."""
    cs = ref.rope_cos_sin_cache(50, 32, 10000.0)
    qkv = randn((5, 3 * 40 + 7), torch.float32, "cpu", gen)
    q, k = qkv[:, :80].view(5, 2, 40), qkv[:, 80:120]
    pos = torch.tensor([0, 49, 3, 3, 17])
    wq, wk = ref.rotary_embedding(pos, q.double(), k.double(), cs, 40, False)
    O.rotary_embedding(pos, q, k, cs, 40, False)
    assert_close(q, wq, torch.float32, "rope q")
    assert_close(k, wk, torch.float32, "rope k")


# ---- paged attention / KV cache degenerate shapes -------------------------------------------------

_META = ("bt = torch.zeros(1, 1, dtype=torch.int32); lens = torch.tensor([1], dtype=torch.int32); "
         "qsl = torch.tensor([0, 1], dtype=torch.int32)\n")


@pytest.mark.parametrize("cache_shape, hq, what", [
    ((4, 0, 16, 64), 3, "'key_cache.size(1) (num_kv_heads)' must be in [1,"),
    ((4, 1, 0, 64), 1, "'key_cache.size(2) (block_size)' must be in [1,"),
    ((4, 1, 16, 0), 1, "'key_cache.size(3) (head_dim)' must be in [1,"),
])
def test_paged_attention_degenerate_cache_raises(cache_shape, hq, what):
    d = cache_shape[3]
    r = _run_isolated(f"""
        kc = torch.randn{cache_shape}; vc = kc.clone(); q = torch.randn(1, {hq}, {d}); out = torch.empty_like(q)
        {_META.strip()}
        try:
            O.paged_attention(out, q, kc, vc, bt, lens, qsl, 0.1)
        except RuntimeError as e:
            print("RAISED", e)
        """)
    assert r.returncode == 0, f"crashed (rc {r.returncode}): {r.stderr[-500:]}"
    assert "RAISED" in r.stdout and what in r.stdout, r.stdout


def test_reshape_and_cache_degenerate_cache_raises():
    with pytest.raises(RuntimeError, match=r"'key_cache.size\(2\) \(block_size\)' must be in \[1,"):
        O.reshape_and_cache(torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.zeros(4, 1, 0, 8),
                            torch.zeros(4, 1, 0, 8), torch.tensor([-1]))
    with pytest.raises(RuntimeError, match=r"'key_cache.size\(1\) \(num_kv_heads\)' must be in \[1,"):
        O.reshape_and_cache(torch.randn(2, 0, 8), torch.randn(2, 0, 8), torch.zeros(4, 0, 4, 8),
                            torch.zeros(4, 0, 4, 8), torch.tensor([1, 2]))


def test_paged_attention_zero_query_heads():
    """T tokens with 0 query heads: an empty, valid batch (the reference gives an empty result)."""
    r = _run_isolated("""
        kc = torch.randn(3, 2, 16, 64); vc = kc.clone(); q = torch.randn(2, 0, 64); out = torch.empty_like(q)
        lse = torch.empty(2, 0)
        bt = torch.tensor([[0]], dtype=torch.int32); lens = torch.tensor([5], dtype=torch.int32)
        qsl = torch.tensor([0, 2], dtype=torch.int32)
        O.paged_attention(out, q, kc, vc, bt, lens, qsl, 0.1, lse)
        print("OK", tuple(out.shape))
        """)
    assert r.returncode == 0, f"crashed (rc {r.returncode}): {r.stderr[-500:]}"
    assert "OK (2, 0, 64)" in r.stdout


def _paged(ctx, new, hq, hk, d, bs, gen):
    need = [(c + bs - 1) // bs for c in ctx]
    nb = sum(need) + 2
    perm = torch.randperm(nb, generator=gen)
    bt = torch.full((len(ctx), max(need) + 1), 10 ** 6, dtype=torch.int32)  # unused entries: garbage
    used = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[used:used + n].int()
        used += n
    kc, vc = randn((nb, hk, bs, d), torch.float32, "cpu", gen), randn((nb, hk, bs, d), torch.float32, "cpu", gen)
    q = randn((sum(new), hq, d), torch.float32, "cpu", gen)
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    return q, kc, vc, bt, torch.tensor(ctx, dtype=torch.int32), qsl


@pytest.mark.parametrize("per_head", ["k", "v"])
def test_fp8_cache_mixed_scale_granularity(per_head, gen):
    """k_scale [Hk] with v_scale [1] (or the reverse): each is documented as [1] or [num_kv_heads]."""
    hq, hk, d, bs = 6, 3, 96, 5
    q, kc, vc, bt, lens, qsl = _paged([37, 1, 12], [3, 1, 12], hq, hk, d, bs, gen)
    kc8 = torch.zeros(kc.shape, dtype=torch.float8_e4m3fn)
    vc8 = torch.zeros(vc.shape, dtype=torch.float8_e4m3fn)
    heads = torch.tensor([0.5, 2.0, 1.25])
    one = torch.tensor([0.75])
    ks, vs = (heads, one) if per_head == "k" else (one, heads)
    # write the cache through reshape_and_cache (every slot of every used block)
    T = kc.shape[0] * bs
    slots = torch.arange(T)
    ops.reshape_and_cache(kc.permute(0, 2, 1, 3).reshape(T, hk, d), vc.permute(0, 2, 1, 3).reshape(T, hk, d),
                          kc8, vc8, slots, ks, vs)
    wk, wv = ref.reshape_and_cache(kc.permute(0, 2, 1, 3).reshape(T, hk, d), vc.permute(0, 2, 1, 3).reshape(T, hk, d),
                                   torch.zeros_like(kc8), torch.zeros_like(vc8), slots, ks, vs)
    assert torch.equal(kc8.view(torch.uint8), wk.view(torch.uint8))
    assert torch.equal(vc8.view(torch.uint8), wv.view(torch.uint8))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], hq), float("nan"))
    ops.paged_attention(q, kc8, vc8, bt, lens, qsl, d ** -0.5, out=out, lse=lse, k_scale=ks, v_scale=vs)
    want, want_lse = ref.paged_attention(q.double(), kc8, vc8, bt, lens, qsl, d ** -0.5, ks, vs)
    assert_close(out, want, torch.float32, "fp8 mixed scales out")
    assert_close(lse, want_lse, torch.float32, "fp8 mixed scales lse")


# ---- copy_blocks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mapping", [
    [[0, 1], [1, 2]],                         # chain: block 2 gets block 1's old contents
    [[1, 0], [0, 1]],                         # swap
    [[i, i + 1] for i in range(40)],          # long chain (parallel path sizes)
    [[3, 3], [2, 4]],                         # self-copy next to an ordinary pair
])
def test_copy_blocks_reads_original_contents(mapping, gen):
    big = len(mapping) > 10
    shape = (48, 4, 16, 64) if big else (6, 2, 4, 8)
    kcs = [randn(shape, torch.float32, "cpu", gen) for _ in range(2)]
    vcs = [randn(shape, torch.bfloat16, "cpu", gen).float() for _ in range(2)]
    m = torch.tensor(mapping, dtype=torch.int64)
    wk, wv = ref.copy_blocks(kcs, vcs, m)
    ops.copy_blocks(kcs, vcs, m)
    for got, want in zip(kcs + vcs, wk + wv):
        assert torch.equal(got, want)


def test_copy_blocks_two_sources_one_destination_raises():
    kc, vc = [torch.randn(6, 2, 4, 8)], [torch.randn(6, 2, 4, 8)]
    before = kc[0].clone()
    with pytest.raises(RuntimeError, match="onto the same destination block 5"):
        O.copy_blocks(kc, vc, torch.tensor([[0, 5], [1, 5]]))
    assert torch.equal(kc[0], before), "copied before raising"
    with pytest.raises(ValueError, match="onto the same destination block 5"):
        ref.copy_blocks(kc, vc, torch.tensor([[0, 5], [1, 5]]))
    O.copy_blocks(kc, vc, torch.tensor([[0, 5], [0, 5]]))  # the same pair twice is well defined
    assert torch.equal(kc[0][5], before[0])


# ---- reference edge cases -------------------------------------------------------------------------

def test_quantize_fp8_k0_matches_reference():
    x = torch.randn(3, 0)
    q = torch.empty(3, 0, dtype=torch.float8_e4m3fn)
    s = torch.full((3,), float("nan"))
    O.quantize_fp8(q, s, x)
    rq, rs = ref.quantize_fp8(x)
    assert rq.shape == (3, 0) and torch.equal(s, rs) and torch.equal(rs, torch.ones(3))


def test_wrappers_take_any_layout(gen):
    """The public wrappers accept views of any layout (column-major activations, slices of larger buffers,
    head-major query / key views) and give the contiguous call's result bit for bit; the raw ops stay strict
    (the wrappers refused these before: "'a' must have a contiguous last dim", "'target_probs' must be
    contiguous", "'query' must have contiguous heads")."""
    from decodekit.quant.int4 import quantize_rtn
    from decodekit.quant.int8 import quantize_int8
    from decodekit.quant.fp8 import quantize_fp8_weight

    def same(f, *views):
        a, b = f(*views), f(*(v.contiguous() if isinstance(v, torch.Tensor) else v for v in views))
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(x, y) if not x.is_floating_point() else torch.equal(x.view(-1), y.view(-1))

    at = randn((96, 5), torch.float32, "cpu", gen).t()          # [5, 96] column-major
    w4, w8 = quantize_rtn(randn((40, 96), torch.float32, "cpu", gen), 32), quantize_int8(randn((40, 96), torch.float32, "cpu", gen), 32)
    dense = randn((96, 40), torch.float32, "cpu", gen).t()      # a transposed dense weight too
    same(lambda a: ops.int4_gemm(a, w4), at)
    same(lambda a: ops.int8_gemm(a, w8), at)
    same(lambda a: ops.linear(a, w4), at)
    same(lambda a, w: ops.linear(a, w), at, dense)
    same(lambda a, w: ops.dense_gemm(a, w), at, dense)
    same(ops.quantize_fp8, at)
    q, s = ops.quantize_fp8(at)
    wf = quantize_fp8_weight(randn((40, 96), torch.float32, "cpu", gen))
    same(lambda q, s: ops.fp8_gemm(q, s, wf), torch.cat([q, q], 1)[:, :96], torch.stack([s, s], 1)[:, 0])
    x3 = randn((7, 3, 64), torch.float32, "cpu", gen).transpose(0, 1)   # [3, 7, 64]: rows that do not collapse
    same(lambda x: ops.rms_norm(x, torch.ones(64)), x3)
    same(ops.silu_and_mul, x3)
    scores = randn((50, 3), torch.float32, "cpu", gen).t()
    sp = torch.tensor([[1, 5], [2, 9], [3, 4]])
    same(ops.argmax_rows, scores)
    same(ops.sort_desc_stable, scores)
    same(lambda x, s, p: ops.gumbel_argmax(x, s, p), scores, sp[:, 0], sp[:, 1])
    probs = torch.softmax(randn((2, 6, 50), torch.float32, "cpu", gen), -1)
    drafts = torch.randint(0, 50, (2, 5), generator=gen)
    nd, seeds, pos = torch.tensor([2, 1], dtype=torch.int32), torch.tensor([1, 2]), torch.tensor([5, 9])
    for greedy in (False, True):
        same(lambda d, p: ops.rejection_sample(d, nd, None, p, seeds, pos, greedy), drafts[:, 1:3], probs[:, :3])
    hk, hq, d, bs = 2, 6, 64, 16
    kc, vc = randn((3, hk, bs, d), torch.float32, "cpu", gen), randn((3, hk, bs, d), torch.float32, "cpu", gen)
    meta = (torch.tensor([[0, 2]], dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
            torch.tensor([0, 4], dtype=torch.int32), 0.125)
    same(lambda qv: ops.paged_attention(qv, kc, vc, *meta), randn((hq, 4, d), torch.float32, "cpu", gen).transpose(0, 1))
    kv = randn((hk, 4, d), torch.float32, "cpu", gen).transpose(0, 1)
    caches = []
    for key in (kv, kv.contiguous()):
        k2, v2 = kc.clone(), vc.clone()
        ops.reshape_and_cache(key, key, k2, v2, torch.tensor([0, 1, 17, -1]))
        caches.append((k2, v2))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    with pytest.raises(RuntimeError, match="'a' must have a contiguous last dim"):
        O.int4_gemm(torch.empty(5, 40), at, *w4.operands(), 32, None)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_fp8_kv_scales_must_be_finite_positive(bad, gen):
    """An fp8 KV cache stores x / scale: a scale of 0, < 0, NaN or inf is refused naming the field and the index
    (CPU; it used to fill the cache with +-448 / NaN codes silently)."""
    T, hk, d, bs = 3, 2, 64, 16
    kc = torch.zeros(2, hk, bs, d, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    key = randn((T, hk, d), torch.float32, "cpu", gen)
    good = torch.ones(hk)
    scales = torch.tensor([1.0, bad])
    with pytest.raises(RuntimeError, match=r"'k_scale'\[1\] must be a finite scale > 0"):
        ops.reshape_and_cache(key, key, kc, vc, torch.arange(T), scales, good)
    with pytest.raises(RuntimeError, match=r"'v_scale'\[1\] must be a finite scale > 0"):
        ops.paged_attention(randn((T, 2 * hk, d), torch.float32, "cpu", gen), kc, vc,
                            torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([T], dtype=torch.int32),
                            torch.tensor([0, T], dtype=torch.int32), 0.125, k_scale=good, v_scale=scales)


def test_int4_weight_perm_must_be_a_permutation():
    """An act-order weight's perm is checked when the weight is made (CPU): out-of-range or repeated entries
    are a clear error naming perm (they used to fail inside index_select, or were taken silently)."""
    from decodekit.quant import Int4Weight
    q, s = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.float16)
    Int4Weight(q, s, s, 32, torch.randperm(64))
    for perm in (torch.zeros(64, dtype=torch.int64), torch.cat([torch.arange(63), torch.tensor([64])]),
                 torch.cat([torch.tensor([-1]), torch.arange(1, 64)])):
        with pytest.raises(ValueError, match="perm must be a permutation of 0 .. 63"):
            Int4Weight(q, s, s, 32, perm)
