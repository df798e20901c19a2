"""reshape_and_cache and paged_attention vs the float64 reference."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref

# (num_q_heads, num_kv_heads, head_dim, block_size): GQA group 3 / 4 / 1 (MHA) / 8,
# both head dims and both block sizes, each case below run on each.
CONFIGS = [(9, 3, 64, 16), (32, 8, 128, 16), (8, 8, 128, 32), (64, 8, 64, 32), (9, 3, 128, 32)]


def _batch(ctx_lens, new_lens, hq, hk, d, bs, dtype, device, gen, num_blocks=None):
    """A random paged batch: scattered block tables, a filled cache, and queries."""
    need = [(c + bs - 1) // bs for c in ctx_lens]
    num_blocks = num_blocks or sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables, used = [], 0
    for n in need:
        tables.append(perm[used:used + n].tolist())
        used += n
    maxb = max(need) + 1
    bt = torch.full((len(ctx_lens), maxb), -7, dtype=torch.int32)  # unused entries are garbage
    for i, t in enumerate(tables):
        bt[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    kc = randn((num_blocks, hk, bs, d), dtype, device, gen)
    vc = randn((num_blocks, hk, bs, d), dtype, device, gen)
    T = sum(new_lens)
    q = randn((T, hq, d), dtype, device, gen)
    qsl = torch.tensor([0] + list(torch.tensor(new_lens).cumsum(0)), dtype=torch.int32)
    return q, kc, vc, bt.to(device), torch.tensor(ctx_lens, dtype=torch.int32, device=device), qsl.to(device)


CASES = {  # name: (context lengths incl. new tokens, new tokens per sequence)
    "decode-1": ([1], [1]),
    "decode-mixed": ([15, 16, 17, 1000, 4097], [1, 1, 1, 1, 1]),
    "prefill": ([83], [83]),
    "chunk-mid-block": ([37, 50], [13, 50]),     # 24 cached tokens then a chunk starting mid-block
    "mixed": ([1, 300, 17, 64], [1, 45, 17, 1]),
    "batch-37": ([int(x) for x in torch.linspace(1, 700, 37)], [1] * 30 + [3, 5, 7, 1, 2, 9, 4]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention(case, config, dtype, device, gen):
    ctx, new = CASES[case]
    hq, hk, head_dim, block_size = config
    q, kc, vc, bt, lens, qsl = _batch(ctx, new, hq, hk, head_dim, block_size, dtype, device, gen)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], hq), float("nan"), device=device)
    ops.paged_attention(q, kc, vc, bt, lens, qsl, scale, out=out, lse=lse)
    want, want_lse = ref.paged_attention(q.double(), kc.double(), vc.double(), bt.cpu(), lens.cpu(), qsl.cpu(), scale)
    assert_close(out, want, dtype, f"paged_attention {case}")
    assert_close(lse, want_lse, torch.float32, f"lse {case}")


@pytest.mark.parametrize("new", [7, 5, 33])
@pytest.mark.parametrize("config", [(9, 3, 64, 16), (32, 8, 128, 16)], ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
def test_multi_token_rows_equal_one_token_steps_bitwise(new, config, gen):
    """A speculative verification attends k+1 new tokens at once; plain decoding attends each alone
    with the context up to it. The CPU kernel gives each row the same arithmetic however its work is
    tiled (query tiles shrink when there are few work items) or grouped, so greedy speculation can
    reproduce plain decoding token for token: the rows are bitwise equal."""
    hq, hk, d, bs = config
    ctx = 301
    q, kc, vc, bt, lens, qsl = _batch([ctx], [new], hq, hk, d, bs, torch.float32, "cpu", gen)
    out = ops.paged_attention(q, kc, vc, bt, lens, qsl, d ** -0.5)
    for t in range(new):
        one = ops.paged_attention(q[t:t + 1].contiguous(), kc, vc, bt, torch.tensor([ctx - new + 1 + t], dtype=torch.int32),
                                  torch.tensor([0, 1], dtype=torch.int32), d ** -0.5)
        assert torch.equal(one[0], out[t]), (t, (one[0] - out[t]).abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(dtype, device, gen):
    hk, d, bs, nb = 3, 64, 16, 9
    kc = torch.full((nb, hk, bs, d), float("nan"), dtype=dtype, device=device)
    vc = kc.clone()
    T = 37
    # key/value as strided views of a fused qkv buffer
    qkv = randn((T, (9 + 2 * hk) * d), dtype, device, gen)
    k = qkv[:, 9 * d:(9 + hk) * d].view(T, hk, d)
    v = qkv[:, (9 + hk) * d:].view(T, hk, d)
    slots = torch.randperm(nb * bs, generator=gen)[:T].clone()
    slots[[3, 20]] = -1  # padding
    want_k, want_v = ref.reshape_and_cache(k, v, kc, vc, slots.to(device))
    ops.reshape_and_cache(k, v, kc, vc, slots.to(device))
    assert torch.equal(kc.isnan(), want_k.isnan()) and torch.equal(vc.isnan(), want_v.isnan())
    m = ~kc.isnan()
    assert torch.equal(kc[m], want_k[m]) and torch.equal(vc[m], want_v[m])


def test_attention_errors():
    q, kc, vc, bt, lens, qsl = _batch([20], [4], 9, 3, 64, 16, torch.float32, "cpu", torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="'seq_lens'\\[0\\] = 2 is smaller than its 4 new tokens"):
        ops.paged_attention(q, kc, vc, bt, torch.tensor([2], dtype=torch.int32), qsl, 0.1)
    bad = bt.clone(); bad[0, 1] = 99
    with pytest.raises(RuntimeError, match="'block_tables'\\[0, 1\\] = 99 is outside"):
        ops.paged_attention(q, kc, vc, bad, lens, qsl, 0.1)
    with pytest.raises(RuntimeError, match="'query' has 8 heads, not a multiple"):
        ops.paged_attention(q[:, :8], kc, vc, bt, lens, qsl, 0.1)
    with pytest.raises(RuntimeError, match="'block_tables' has dtype"):
        ops.paged_attention(q, kc, vc, bt.long(), lens, qsl, 0.1)
    with pytest.raises(RuntimeError, match="'slot_mapping'\\[0\\] = 1000 is outside"):
        ops.reshape_and_cache(q[:, :3], q[:, :3], kc, vc, torch.tensor([1000, 0, 1, 2]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype, device, gen):
    q, kc, vc, bt, lens, qsl = _batch([20, 5], [4, 1], 9, 3, 64, 16, dtype, device, gen)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], 9, device=device)
    opcheck(torch.ops.decodekit.paged_attention.default, (out, q, kc, vc, bt, lens, qsl, 0.125, lse))
    opcheck(torch.ops.decodekit.paged_attention.default, (out, q, kc, vc, bt, lens, qsl, 0.125, None))
    slots = torch.tensor([3, 7, -1, 40, 2], device=device)
    opcheck(torch.ops.decodekit.reshape_and_cache.default, (q[:, :3], q[:, 3:6], kc.clone(), vc.clone(), slots))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [(32, 8, 128, 16), (9, 3, 64, 32)], ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
def test_paged_attention_cuda_graph(config, dtype, device, gen):
    """paged_attention captured in a CUDA graph: the launch reads no metadata on the host, so
    replays after the inputs' contents change (same shapes) match eager runs bit for bit."""
    hq, hk, d, bs = config
    S, T, max_blocks, num_blocks = 4, 8, 40, 160
    batches = [  # (context lengths, new tokens): S sequences, T tokens each time
        ([5, 300, 17, 64], [1, 4, 2, 1]),
        ([600, 1, 33, 129], [2, 1, 4, 1]),
        ([8, 1, 1, 1], [5, 1, 1, 1]),
    ]
    scale = d ** -0.5
    q_s = torch.empty((T, hq, d), dtype=dtype, device=device)
    kc_s = torch.empty((num_blocks, hk, bs, d), dtype=dtype, device=device)
    vc_s = torch.empty_like(kc_s)
    bt_s = torch.empty((S, max_blocks), dtype=torch.int32, device=device)
    lens_s = torch.empty(S, dtype=torch.int32, device=device)
    qsl_s = torch.empty(S + 1, dtype=torch.int32, device=device)
    out = torch.empty_like(q_s)
    lse = torch.empty((T, hq), device=device)

    def load(ctx, new):
        q, kc, vc, bt, lens, qsl = _batch(ctx, new, hq, hk, d, bs, dtype, device, gen, num_blocks=num_blocks)
        q_s.copy_(q)
        kc_s.copy_(kc)
        vc_s.copy_(vc)
        bt_s.fill_(-7)
        bt_s[:, :bt.shape[1]].copy_(bt)
        lens_s.copy_(lens)
        qsl_s.copy_(qsl)

    def run(o, l):
        ops.paged_attention(q_s, kc_s, vc_s, bt_s, lens_s, qsl_s, scale, out=o, lse=l)

    load(*batches[0])
    side = torch.cuda.Stream()  # warm up off the capture stream, as torch recommends
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(out, lse)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(out, lse)

    for i, (ctx, new) in enumerate(batches):
        load(ctx, new)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        eager_out, eager_lse = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
        run(eager_out, eager_lse)
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), f"batch {i}: replay != eager"
        want, want_lse = ref.paged_attention(q_s.double(), kc_s.double(), vc_s.double(), bt_s.cpu(), lens_s.cpu(),
                                             qsl_s.cpu(), scale)
        assert_close(out, want, dtype, f"graph replay, batch {i}")
        assert_close(lse, want_lse, torch.float32, f"graph replay lse, batch {i}")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_attention_errors_cuda(device):
    q, kc, vc, bt, lens, qsl = _batch([20], [4], 4, 2, 96, 16, torch.float16, device, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="head_dim 96 is not supported by the CUDA kernel \\(supported: 64, 128, 256\\)"):
        ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.1)
    q, kc, vc, bt, lens, qsl = _batch([20], [4], 4, 2, 64, 16, torch.float16, device, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="'block_tables' is on cpu but must be on the same device as 'query'"):
        ops.paged_attention(q, kc, vc, bt.cpu(), lens, qsl, 0.1)


_DECODE_KERNEL_SCRIPT = r"""
import sys, torch
sys.path[:0] = sys.argv[1:]
from decodekit import ops
from decodekit.ops import reference as ref
from dk_testing import assert_close, randn
from test_attention import _batch
gen = torch.Generator().manual_seed(5)
for hq, hk, d, bs in [(32, 8, 128, 16), (9, 3, 64, 16), (8, 8, 64, 32), (64, 8, 128, 16), (40, 2, 128, 64)]:
    for ctx in ([1], [4097], [15, 16, 17, 1000, 33], [int(x) for x in torch.linspace(1, 700, 37)]):
        for dtype in (torch.bfloat16, torch.float16):
            q, kc, vc, bt, lens, qsl = _batch(ctx, [1] * len(ctx), hq, hk, d, bs, dtype, "cuda", gen)
            out = torch.full_like(q, float("nan"))
            lse = torch.full((q.shape[0], hq), float("nan"), device="cuda")
            ops.paged_attention(q, kc, vc, bt, lens, qsl, d ** -0.5, out=out, lse=lse)
            want, want_lse = ref.paged_attention(q.double(), kc.double(), vc.double(), bt.cpu(), lens.cpu(), qsl.cpu(),
                                                 d ** -0.5)
            assert_close(out, want, dtype, f"decode h{hq}x{hk} d{d} b{bs} ctx {ctx[:3]}")
            assert_close(lse, want_lse, torch.float32, "lse")
print("OK")
"""


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
@pytest.mark.parametrize("kernel", ["tc", "simt"])
def test_cuda_decode_kernels(kernel, device, tmp_path):
    """Both CUDA decode kernels for half / bf16 queries -- the tensor-core one (decode_tc.cuh, the default)
    and the SIMT one (DECODEKIT_DECODE_ATTN=simt; read once per process, hence a subprocess each) -- match
    the float64 reference on decode batches: GQA groups 4, 3, 1, 8 and 20 (two 16-head chunks), head_dim
    64 / 128, block sizes 16 / 32 / 64, one sequence of 1 or 4097 keys (split-KV) and mixed batches."""
    _run_kernel_script(tmp_path, _DECODE_KERNEL_SCRIPT, {"DECODEKIT_DECODE_ATTN": kernel}, 600)


def _run_kernel_script(tmp_path, text: str, env: dict, timeout: int) -> None:
    """Runs a test script in a fresh process (the kernel choices are read once per process) with `env` added;
    it must print OK."""
    import os
    import subprocess
    import sys
    script = tmp_path / "kernel_script.py"
    script.write_text(text)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, str(script), here, os.path.join(here, "..")], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


_PREFILL_KERNEL_SCRIPT = r"""
import sys, torch
sys.path[:0] = sys.argv[1:]
from decodekit import ops
from decodekit.ops import reference as ref
from dk_testing import assert_close, randn
from test_attention import _batch
gen = torch.Generator().manual_seed(6)
FP8 = torch.float8_e4m3fn
# (ctx, new): long prefills (many 128-row CTAs, the ring of key tiles wrapping), a chunk after a cached prefix
# ending mid-block, a mixed batch (decodes among chunks: 64-row CTAs), a prefill past a 64-key multiple by one
batches = [([700], [700]), ([3001, 64], [300, 64]), ([37, 300, 17, 1000, 5], [13, 45, 17, 1, 5]), ([129], [129])]
for hq, hk, d, bs in [(32, 8, 128, 16), (9, 3, 64, 16), (8, 8, 64, 32), (40, 2, 128, 64), (8, 1, 128, 16)]:
    for ctx, new in batches:
        for dtype in (torch.bfloat16, torch.float16):
            for fp8 in (False, True):
                q, kc, vc, bt, lens, qsl = _batch(ctx, new, hq, hk, d, bs, dtype, "cuda", gen)
                ks = vs = None
                if fp8:
                    kc, vc = (kc.float() * 3).to(FP8), (vc.float() * 3).to(FP8)
                    ks = torch.rand(hk, generator=gen).add(0.5).cuda()
                    vs = torch.rand(hk, generator=gen).add(0.5).cuda()
                out = torch.full_like(q, float("nan"))
                lse = torch.full((q.shape[0], hq), float("nan"), device="cuda")
                ops.paged_attention(q, kc, vc, bt, lens, qsl, d ** -0.5, out=out, lse=lse, k_scale=ks, v_scale=vs)
                want, want_lse = ref.paged_attention(
                    q.double().cpu(), kc.cpu() if fp8 else kc.double().cpu(), vc.cpu() if fp8 else vc.double().cpu(),
                    bt.cpu(), lens.cpu(), qsl.cpu(), d ** -0.5, None if ks is None else ks.cpu(),
                    None if vs is None else vs.cpu())
                what = f"prefill h{hq}x{hk} d{d} b{bs} ctx {ctx[:3]} {dtype} fp8={fp8}"
                assert_close(out, want.to(out.device), dtype, what)
                assert_close(lse, want_lse.to(lse.device), torch.float32, what + " lse")
print("OK")
"""


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
@pytest.mark.parametrize("kernel", ["mma", "wgmma"])
def test_cuda_prefill_kernels(kernel, device, tmp_path):
    """Both products of the CUDA prefill kernel -- mma.sync (the default) and sm_90a warpgroup MMAs
    (DECODEKIT_PREFILL_ATTN=wgmma; read once per process, hence a subprocess each) -- match the float64
    reference on prefill, chunked-prefill and mixed batches: GQA 4 / 3 / 1 / 20 / 8, head_dim 64 / 128, blocks
    16 / 32 / 64, bf16 and fp16, bf16/fp16 and fp8 caches (per-head scales)."""
    _run_kernel_script(tmp_path, _PREFILL_KERNEL_SCRIPT, {"DECODEKIT_PREFILL_ATTN": kernel}, 900)
