"""fp8 e4m3 W8A8: quantize_fp8 (per-token dynamic scales) equals the reference bit for bit, and
fp8_gemm matches the float64 product of the same codes and scales; Fp8Weight through linear;
opcheck; errors. CUDA variants run the tensor-core kernel (skipped without a GPU)."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, TOL, cuda_kernel_names, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant.fp8 import Fp8Weight, quantize_fp8_weight


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, K", [(1, 64), (7, 96), (33, 576), (130, 32)])
def test_quantize_fp8(M, K, dtype, device, gen):
    buf = randn((M, K + 5), dtype, device, gen, scale=3.0)
    x = buf[:, 2:K + 2]  # row-strided
    if M > 3:
        x[3] = 0           # an all-zero row: scale 1, zero codes
        x[1, 7] = 1e4      # one large value: the row's scale follows it, small values flush
    q, s = ops.quantize_fp8(x)
    rq, rs = ref.quantize_fp8(x.cpu())
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8))
    if M > 3:
        assert s[3].item() == 1.0 and not q[3].float().any()


def _check(out, a, a_s, w, bias, dtype):
    want = ref.fp8_gemm(a.cpu(), a_s.cpu(), w.qweight.cpu(), w.scales.cpu(), None if bias is None else bias.cpu())
    mag = ref.fp8_gemm(a.cpu().float().abs().to(torch.float8_e4m3fn), a_s.cpu(), w.qweight.cpu().float().abs()
                       .to(torch.float8_e4m3fn), w.scales.cpu()).abs()
    got = out.cpu().double()
    assert not got.isnan().any(), "unwritten (NaN-poisoned) outputs"
    # fp32 accumulation: 2e-6 |a||w|. Hopper's fp8 tensor cores (QGMMA, fp8 mma.sync) add inside a
    # promotion interval (4 x 32 = 128 products, then into fp32 registers) keeping ~14 mantissa bits
    # (DeepSeek-V3 report, sec. 3.3.2): up to 4 additions x 2^-14 of the interval's |a||w| = 2^-12 |a||w|.
    # Seen on the H200: 1.06x the fp32 bound at K = 1024 (M=128 N=256, fp16 out); still a tight bound
    # against a wrong scale, tile or K step (errors of order |a||w|).
    acc = 2e-6 if out.device.type == "cpu" else 2.0 ** -12
    tol = TOL[dtype]["atol"] + TOL[dtype]["rtol"] * want.abs() + acc * mag
    assert ((got - want).abs() <= tol).all(), ((got - want).abs() / tol).max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, N, K", [(1, 64, 64), (5, 191, 96), (16, 65, 576), (17, 33, 32), (100, 130, 160)])
def test_fp8_gemm(M, N, K, dtype, device, gen):
    x = randn((M, K), dtype, device, gen)
    w = quantize_fp8_weight(randn((N, K), torch.float32, device, gen, scale=0.05))
    a, a_s = ops.quantize_fp8(x)
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = ops.fp8_gemm(a, a_s, w, bias, dtype)
    _check(out, a, a_s, w, bias, dtype)


# CUDA: the CUTLASS sm90 fp8 GEMM (QGMMA; a_scale x w_scale and bias in the epilogue,
# include/decodekit/gemm/sm90_gemm.cuh) takes fp16 / bf16 outputs with N and K multiples of 16, from M = 16
# (DECODEKIT_SM90_GEMM=auto) or at any M ("always"); fp32 outputs and N % 16 != 0 stay on the mma.sync
# kernel. M tails of the 128-row tile, N tails (144, 272), K tails of the 128-deep tile (160, 576);
# NaN-poisoned output.
@pytest.mark.parametrize("policy", ["always", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 5, 16, 128, 300])
@pytest.mark.parametrize("N, K", [(144, 160), (272, 576), (130, 64), (256, 1024)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_fp8_gemm_sm90(M, N, K, dtype, policy, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", policy)
    x = randn((M, K), dtype, device, gen)
    w = quantize_fp8_weight(randn((N, K), torch.float32, device, gen, scale=0.05))
    a, a_s = ops.quantize_fp8(x)
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias))
    _check(out, a, a_s, w, bias, dtype)
    took = any("device_kernel" in n for n in names)  # cutlass::device_kernel<...>
    eligible = dtype != torch.float32 and N % 16 == 0 and K % 16 == 0
    assert took == (eligible and (policy == "always" or M >= 16)), names


# CUDA split-K of the mma.sync kernel (gemm/mma_plan.h): long K against small M and N, so the plan splits
# (4 to 14 ways here; uneven ranges of the 64-byte steps), scales and bias applied once after the sum.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [9, 16, 17])
@pytest.mark.parametrize("N, K", [(136, 4096), (200, 2336)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_fp8_gemm_split_k(M, N, K, dtype, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    x = randn((M, K), dtype, device, gen)
    w = quantize_fp8_weight(randn((N, K), torch.float32, device, gen, scale=0.05))
    a, a_s = ops.quantize_fp8(x)
    bias = randn((N,), dtype, device, gen) if M != 16 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias))
    _check(out, a, a_s, w, bias, dtype)
    assert any("splitk_reduce_kernel" in n for n in names), names


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_fp8_gemm_sm90_graph(device, monkeypatch, gen):
    """The sm90 fp8 path captured in a CUDA graph replays like eager on new inputs."""
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "always")
    w = quantize_fp8_weight(randn((272, 320), torch.float32, device, gen, scale=0.05))
    x = randn((200, 320), torch.bfloat16, device, gen)
    a, a_s = ops.quantize_fp8(x)
    out = torch.empty(200, 272, dtype=torch.bfloat16, device=device)
    torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, None)  # warm-up outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, None)
    a2, s2 = ops.quantize_fp8(randn((200, 320), torch.bfloat16, device, gen))
    a.copy_(a2)
    a_s.copy_(s2)
    g.replay()
    graphed = out.clone()
    assert torch.equal(graphed, ops.fp8_gemm(a, a_s, w, None, torch.bfloat16))
    _check(graphed, a, a_s, w, None, torch.bfloat16)


# CUDA: the sm90 fp8 GEMM under CUTLASS's stream-K scheduler (DECODEKIT_SM90_SCHEDULE=stream-k, gemm/mma_plan.h
# Sm90Schedule): few output tiles against a long K, so the K ranges of each tile are spread over the SMs and
# their partial tiles reduced (M tails of the 128-row tile, N tails, K not a multiple of the 128-deep tile);
# NaN-poisoned output; deterministic (a second call is bitwise equal); within the same bound as the persistent
# schedule; inside a CUDA graph (the scheduler's workspace zeroed in the capture) it replays like eager; a bad
# schedule name is a clear error.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 16, 129, 300])
@pytest.mark.parametrize("N, K", [(256, 4096), (144, 2336), (1040, 8192)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_fp8_gemm_sm90_stream_k(M, N, K, dtype, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "always")
    monkeypatch.setenv("DECODEKIT_SM90_SCHEDULE", "stream-k")
    x = randn((M, K), dtype, device, gen)
    w = quantize_fp8_weight(randn((N, K), torch.float32, device, gen, scale=0.05))
    a, a_s = ops.quantize_fp8(x)
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias))
    assert any("device_kernel" in n for n in names), names
    _check(out, a, a_s, w, bias, dtype)
    again = torch.full_like(out, float("nan"))
    torch.ops.decodekit.fp8_gemm(again, a, a_s, w.qweight, w.scales, bias)
    assert torch.equal(again, out)
    if M == 129 and N == 256:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias)
        a2, s2 = ops.quantize_fp8(randn((M, K), dtype, device, gen))
        a.copy_(a2)
        a_s.copy_(s2)
        g.replay()
        graphed = out.clone()
        _check(graphed, a, a_s, w, bias, dtype)
        torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias)
        assert torch.equal(graphed, out)
        monkeypatch.setenv("DECODEKIT_SM90_SCHEDULE", "sometimes")
        with pytest.raises(RuntimeError, match="DECODEKIT_SM90_SCHEDULE = 'sometimes' must be 'persistent' or 'stream-k'"):
            torch.ops.decodekit.fp8_gemm(out, a, a_s, w.qweight, w.scales, bias)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_fp8_close_to_float(device, gen):
    """W8A8 through linear: within fp8's precision (3 mantissa bits) of the float product."""
    x = randn((9, 256), torch.float32, device, gen)
    wf = randn((80, 256), torch.float32, device, gen, scale=0.05)
    w = quantize_fp8_weight(wf)
    assert isinstance(w, Fp8Weight) and w.qweight.dtype == torch.float8_e4m3fn
    y = ops.linear(x, w).double().cpu()
    want = (x.double() @ wf.double().T).cpu()
    rel = (y - want).norm() / want.norm()
    assert rel < 0.06, rel  # two e4m3 roundings (2^-4 relative each), averaged over K


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_opcheck(device, gen):
    x = randn((5, 64), torch.bfloat16, device, gen)
    q = torch.empty(5, 64, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(5, device=device)
    # test_schema compares tensors with torch ops that have no Float8_e4m3fn kernels (as for the
    # fp8 KV cache ops); the rest of opcheck runs.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    opcheck(torch.ops.decodekit.quantize_fp8.default, (q, s, x), test_utils=utils)
    w = quantize_fp8_weight(randn((40, 64), torch.float32, device, gen))
    out = torch.empty(5, 40, dtype=torch.bfloat16, device=device)
    opcheck(torch.ops.decodekit.fp8_gemm.default, (out, q, s, w.qweight, w.scales, None), test_utils=utils)


def test_fp8_errors(gen):
    x = randn((4, 48), torch.float32, "cpu", gen)
    q, s = ops.quantize_fp8(x)
    w = quantize_fp8_weight(randn((8, 48), torch.float32, "cpu", gen))
    out = torch.empty(4, 8)
    with pytest.raises(RuntimeError, match="K = 48 must be a multiple of 32"):
        torch.ops.decodekit.fp8_gemm(out, q, s, w.qweight, w.scales, None)
    q2, s2 = ops.quantize_fp8(randn((4, 64), torch.float32, "cpu", gen))
    with pytest.raises(RuntimeError, match="'a' .*dtype"):
        torch.ops.decodekit.fp8_gemm(out, q2.float(), s2, w.qweight, w.scales, None)
    with pytest.raises(RuntimeError, match="'a_scale'"):
        torch.ops.decodekit.fp8_gemm(torch.empty(4, 8), q2, s2[:3], quantize_fp8_weight(torch.randn(8, 64)).qweight,
                                     torch.ones(8), None)
    with pytest.raises(ValueError, match="Fp8Weight.scales must be float32"):
        Fp8Weight(w.qweight, w.scales.double())
