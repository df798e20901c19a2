"""The packed layout of the Marlin-style CUDA INT4 kernel (include/decodekit/gemm/int4_marlin_pack.h):
int4_marlin_pack (CPU and CUDA equal to the reference byte for byte, an exact round trip) and
int4_gemm_marlin (the CPU op decodes each weight as the CUDA kernel rounds it; the CUDA kernel on the packed
layout) against float64, plus the route decodekit.ops takes on CUDA."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import check_marlin_gemm, random_int4_weight, DEVICES, TOL, cuda_kernel_names, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight

HALF_TYPES = [torch.float16, torch.bfloat16]
# N and K tails of the 128 x 128 unit (200, 72, 67; K = 96, 192, 576), one unit, several columns and k tiles
PACK_SHAPES = [(200, 576, 32), (72, 96, 32), (67, 192, 64), (130, 1024, 128), (128, 128, 128), (300, 1536, 32)]


_weight = random_int4_weight


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("N, K, G", PACK_SHAPES)
def test_int4_marlin_pack(N, K, G, dtype, device, gen):
    w = _weight(N, K, G, device, gen)
    packed = ops.int4_marlin_pack(w, dtype)
    assert packed.dtype == dtype and packed.device.type == device
    assert packed.numel() * 2 == ref.int4_marlin_packed_bytes(N, K, G)
    want = ref.int4_marlin_pack(w.qweight.cpu(), w.scales.cpu(), w.mins.cpu(), G, dtype)
    assert torch.equal(packed.cpu().view(torch.int16), want.view(torch.int16))
    q, s, m = ref.int4_marlin_unpack(packed, N, K, G)  # exact round trip (scale pairs in dtype)
    assert torch.equal(q, w.qweight.cpu())
    assert torch.equal(s.view(torch.int16), w.scales.cpu().to(dtype).view(torch.int16))
    assert torch.equal(m.view(torch.int16), w.mins.cpu().to(dtype).view(torch.int16))
    # padding (rows past N, features past K) is zero: the same bytes as the pack of the zero-padded weight
    Np, Kp = -(-N // 128) * 128, -(-K // 128) * 128
    q = torch.zeros(Np, Kp // 2, dtype=torch.uint8)
    s, m = torch.zeros(Np, Kp // G, dtype=torch.float16), torch.zeros(Np, Kp // G, dtype=torch.float16)
    q[:N, :K // 2], s[:N, :K // G], m[:N, :K // G] = w.qweight.cpu(), w.scales.cpu(), w.mins.cpu()
    assert torch.equal(ref.int4_marlin_pack(q, s, m, G, dtype).view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("M", [1, 3, 16, 17, 33, 64])
@pytest.mark.parametrize("N, K, G", PACK_SHAPES[:4])
def test_int4_gemm_marlin_op(N, K, G, M, dtype, device, gen):
    w = _weight(N, K, G, device, gen)
    packed = ops.int4_marlin_pack(w, dtype)
    buf = torch.full((M, K + 16), float("nan"), dtype=dtype, device=device)
    a = buf[:, 8:K + 8]  # 16-byte aligned rows, stride K + 16, NaN around them
    a.copy_(randn((M, K), dtype, device, gen))
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.int4_gemm_marlin(a, packed, N, K, G, bias, out=out)
    check_marlin_gemm(out, a, packed, N, K, G, bias, dtype)
    if device == "cuda":  # deterministic, and the same numbers as the kernel on int4.h's layout
        assert torch.equal(ops.int4_gemm_marlin(a, packed, N, K, G, bias), out)


@pytest.mark.parametrize("device", DEVICES)
def test_int4_marlin_opcheck(device, gen):
    w = _weight(200, 192, 64, device, gen)
    packed = torch.empty(ref.int4_marlin_packed_bytes(200, 192, 64) // 2, dtype=torch.bfloat16, device=device)
    opcheck(torch.ops.decodekit.int4_marlin_pack, (packed, w.qweight, w.scales, w.mins, 64))
    a = randn((5, 192), torch.bfloat16, device, gen)
    out = torch.empty(5, 200, dtype=torch.bfloat16, device=device)
    opcheck(torch.ops.decodekit.int4_gemm_marlin, (out, a, packed, 200, 192, 64, None))
    packed = ops.int4_marlin_pack(w, torch.bfloat16)
    opcheck(torch.ops.decodekit.int4_gemm, (out, a, w.qweight, w.scales, w.mins, 64, None, packed))
    with pytest.raises(RuntimeError, match="'packed'"):  # int4_gemm's optional copy is checked too
        torch.ops.decodekit.int4_gemm(out, a, w.qweight, w.scales, w.mins, 64, None, packed[:-8])


@pytest.mark.parametrize("device", DEVICES)
def test_int4_marlin_bad_input(device, gen):
    w = _weight(200, 192, 64, device, gen)
    packed = ops.int4_marlin_pack(w, torch.float16)
    a = randn((3, 192), torch.float16, device, gen)
    out = torch.empty(3, 200, dtype=torch.float16, device=device)
    g = torch.ops.decodekit.int4_gemm_marlin
    with pytest.raises(RuntimeError, match="'packed'"):  # packed for another shape
        g(out, a, packed[:-8], 200, 192, 64, None)
    with pytest.raises(RuntimeError, match="'packed'"):  # packed for another dtype
        g(out, a, packed.view(torch.bfloat16), 200, 192, 64, None)
    with pytest.raises(RuntimeError, match="'group_size' must be 32, 64 or 128"):
        g(out, a, packed, 200, 192, 48, None)
    with pytest.raises(RuntimeError, match="'n'"):
        g(out, a, packed, 0, 192, 64, None)
    with pytest.raises(RuntimeError, match="k = 160 must be a multiple of group_size = 64"):
        g(out, a, packed, 200, 160, 64, None)
    with pytest.raises(RuntimeError, match="'a'"):  # fp32 activations
        g(out.float(), a.float(), packed, 200, 192, 64, None)
    with pytest.raises(RuntimeError, match="'out'"):
        g(out[:, :100], a, packed, 200, 192, 64, None)
    with pytest.raises(RuntimeError, match="'out'"):  # pack into a wrong-sized buffer
        torch.ops.decodekit.int4_marlin_pack(packed[:-8].clone(), w.qweight, w.scales, w.mins, 64)
    with pytest.raises(ValueError, match="dtype must be float16 or bfloat16"):
        ops.int4_marlin_pack(w, torch.float32)


def test_int4_marlin_packed_cache(gen):
    """One packed copy per weight and dtype; act-order weights keep it on their one stored() object."""
    w = _weight(72, 96, 32, "cpu", gen)
    p = ops.int4_marlin_packed(w, torch.float16)
    assert ops.int4_marlin_packed(w, torch.float16) is p
    assert ops.int4_marlin_packed(w, torch.bfloat16) is not p
    perm = torch.randperm(96, generator=gen)
    wa = Int4Weight(w.qweight, w.scales, w.mins, 32, perm)
    assert wa.stored() is wa.stored() and wa.stored().perm is None


@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_linear_takes_packed_marlin_on_cuda(dtype, device, monkeypatch, gen):
    """decodekit.ops.linear on CUDA: M <= 64 runs the packed kernel (bitwise the unpacked one: the same decode
    and sums); DECODEKIT_INT4_MARLIN=unpacked the kernel on int4.h's layout; act-order through stored();
    inside a CUDA graph capture without a packed copy made before: the unpacked kernel; M = 65: another."""
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    monkeypatch.delenv("DECODEKIT_INT4_MARLIN", raising=False)
    N, K, G = 4096, 4096, 128
    w = _weight(N, K, G, device, gen)
    a = randn((5, K), dtype, device, gen)
    names = cuda_kernel_names(lambda: ops.linear(a, w))
    assert any("int4_gemm_marlin_kernel" in n and ", true," in n for n in names), names
    got = ops.linear(a, w)
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "unpacked")
    names = cuda_kernel_names(lambda: ops.linear(a, w))
    assert any("int4_gemm_marlin_kernel" in n and ", false," in n for n in names), names
    assert torch.equal(ops.linear(a, w), got)
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "auto")
    perm = torch.randperm(K, generator=gen).to(device)
    wa = Int4Weight(w.qweight, w.scales, w.mins, G, perm)
    assert torch.equal(ops.linear(a, wa), ops.linear(a.index_select(1, perm), w))
    fresh = _weight(N, K, G, device, gen)
    out = torch.empty(5, N, dtype=dtype, device=device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.int4_gemm(a, fresh, None, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ops.int4_gemm(a, fresh, None))  # eager now packs: the same numbers
    a65 = randn((65, K), dtype, device, gen)
    names = cuda_kernel_names(lambda: ops.linear(a65, w))
    assert not any("marlin" in n for n in names), names
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "sometimes")
    with pytest.raises(ValueError, match="DECODEKIT_INT4_MARLIN = 'sometimes' must be 'auto', 'both', 'unpacked' or 'never'"):
        ops.linear(a, w)


@pytest.mark.parametrize("M", [65, 300])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_large_m_dense_route_on_cuda(M, device, monkeypatch, gen):
    """Past 64 rows on CUDA, ops.linear decodes the INT4 weight (int4_dequantize, chunks of <= 64 MiB) and runs
    cuBLAS (DECODEKIT_INT4_LARGE_M=dense, the default); =kernel keeps the INT4 kernels; both within the bound;
    a bad value is a clear error."""
    N, K, G = 4096, 14336, 128  # 117 MB decoded in bf16: two chunks
    w = _weight(N, K, G, device, gen)
    a = randn((M, K), torch.bfloat16, device, gen)
    bias = randn((N,), torch.bfloat16, device, gen)
    names = cuda_kernel_names(lambda: ops.linear(a, w, bias))
    assert any("int4_dequantize" in n for n in names) and not any("marlin" in n or "int4_sm90" in n for n in names), names
    dense = ops.linear(a, w, bias)
    wd = ref.int4_dequantize(w.qweight.cpu(), w.scales.cpu(), w.mins.cpu(), G).double()
    want = a.cpu().double() @ wd.T + bias.cpu().double()
    mag = a.cpu().double().abs() @ wd.abs().T + bias.cpu().double().abs()
    tol = TOL[torch.bfloat16]
    for got in (dense, None):
        if got is None:
            monkeypatch.setenv("DECODEKIT_INT4_LARGE_M", "kernel")
            names = cuda_kernel_names(lambda: ops.linear(a, w, bias))
            assert not any("int4_dequantize" in n for n in names), names
            got = ops.linear(a, w, bias)
        err = ((got.cpu().double() - want).abs() / (tol["atol"] + (tol["rtol"] + 2e-6) * mag)).max().item()
        assert err <= 1.0, f"INT4 M={M} error {err:.3f} of the tolerance"
    monkeypatch.setenv("DECODEKIT_INT4_LARGE_M", "sometimes")
    with pytest.raises(ValueError, match="DECODEKIT_INT4_LARGE_M = 'sometimes' must be 'dense' or 'kernel'"):
        ops.linear(a, w, bias)
