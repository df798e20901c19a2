"""INT4 weight-only GEMM (int4_gemm, int4_dequantize) against float64 on decoded weights, and the
GGUF Q4_0 / Q4_1 converters against the gguf package's own dequantization."""
import numpy as np
import pytest
import torch
from torch.library import opcheck

from dk_testing import random_int4_weight, random_int8_weight, DEVICES, DTYPES, TOL, cuda_kernel_names, cuda_only, randn, strided_rows
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight, from_gguf_q4_0, from_gguf_q4_1, to_gguf_q4_1

gguf = pytest.importorskip("gguf")


_weight = random_int4_weight


def _check_gemm(out, a, w, bias, dtype):
    """|out - ref| <= tol * (1 + |a| @ |w|^T): the error bound of a dot product accumulated in fp32,
    plus the output's rounding (TOL[dtype]). w: a packed Int4Weight or Int8Weight."""
    if isinstance(w, Int4Weight):
        wd = ref.int4_dequantize(w.qweight.cpu(), w.scales.cpu(), w.mins.cpu(), w.group_size).double()
    else:
        wd = ref.int8_dequantize(w.qweight.cpu(), w.scales.cpu(), w.group_size).double()
    want = a.cpu().double() @ wd.T
    mag = a.cpu().double().abs() @ wd.abs().T
    if bias is not None:
        want += bias.cpu().double()
        mag += bias.cpu().double().abs()
    got = out.cpu().double()
    assert not got.isnan().any(), "unwritten (NaN-poisoned) outputs"
    tol = TOL[dtype]["rtol"] + 2e-6  # fp32 accumulation over K terms, relative to |a| |w|
    err = ((got - want).abs() / (TOL[dtype]["atol"] + tol * mag)).max().item()
    assert err <= 1.0, f"{type(w).__name__} GEMM error {err:.3f} of the tolerance"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 2, 3, 5, 7, 8, 16, 17, 100])  # CUDA: GEMV up to 8 rows, then tensor cores (fp16/bf16)
@pytest.mark.parametrize("N, K, G", [(576, 576, 32), (67, 192, 64), (130, 1024, 128), (1536, 576, 32), (33, 96, 32)])
def test_int4_gemm(N, K, G, M, dtype, device, gen):
    w = _weight(N, K, G, device, gen)
    buf = randn((M, K + 7), dtype, device, gen)  # a row-strided view
    a = buf[:, 3:K + 3]
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.int4_gemm(a, w, bias, out=out)
    _check_gemm(out, a, w, bias, dtype)


# The CPU's larger-M path (include/decodekit/gemm/int4_tiled.h): 12-row blocks (awkward tails),
# 32-column strips (N not a multiple: masked rows), K blocks of <= 256 (K = 640: 3 blocks of 256,
# 256, 128 with G = 128), rows of a strided into a NaN-padded buffer, output NaN-poisoned.
TILED_SHAPES = [(191, 576, 32), (577, 256, 64), (96, 640, 128), (33, 1536, 32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("M", [9, 13, 37, 100, 257])
@pytest.mark.parametrize("N, K, G", TILED_SHAPES)
def test_int4_gemm_tiled(N, K, G, M, with_bias, dtype, device, gen):
    w = _weight(N, K, G, device, gen)
    a, _ = strided_rows(M, K, dtype, device, gen)
    bias = randn((N,), dtype, device, gen) if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.int4_gemm(a, w, bias, out=out)
    _check_gemm(out, a, w, bias, dtype)


# CUDA: the CUTLASS sm90 mixed-input GEMM (include/decodekit/gemm/sm90_gemm.cuh) takes G = 64 / 128,
# fp16 / bf16, N a multiple of 8, from M = 33 where K <= 8192 else 128 (DECODEKIT_SM90_GEMM=auto) or at any M ("always");
# N % 8 != 0 and G = 32 fall back to the mma.sync kernel (still exact to the same bound). M tails of the
# 128-token tile (1, 3, 127, 300), N tails of the 128-row tile (136, 264), several K tiles, a row-strided
# view into a NaN-padded buffer, bias, NaN-poisoned output.
SM90_SHAPES = [(136, 256, 64), (264, 384, 128), (520, 1024, 128), (130, 256, 64), (96, 256, 32)]


@pytest.mark.parametrize("policy", ["always", "auto"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 40, 127, 128, 300])
@pytest.mark.parametrize("N, K, G", SM90_SHAPES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_sm90(N, K, G, M, dtype, policy, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", policy)
    monkeypatch.setenv("DECODEKIT_INT4_LARGE_M", "kernel")  # (the default decodes past 64 rows: cuBLAS)
    w = _weight(N, K, G, device, gen)
    a, _ = strided_rows(M, K, dtype, device, gen)
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: ops.int4_gemm(a, w, bias, out=out))
    _check_gemm(out, a, w, bias, dtype)
    took = any("int4_sm90_interleave_kernel" in n for n in names)
    eligible = G in (64, 128) and N % 8 == 0
    # auto: from M = 33 where K <= 8192, else from 128 (csrc/cuda/gemm_launch.cpp, measured on the H200)
    assert took == (eligible and (policy == "always" or M >= (33 if K <= 8192 else 128))), names


# CUDA split-K of the mma.sync kernel (gemm/mma_plan.h: more CTAs when the grid is small; partial sums
# reduced in order): long K against small M and N, so the plan splits (2 to 14 ways here; uneven group ranges).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [9, 16, 17])
@pytest.mark.parametrize("N, K, G", [(130, 4096, 128), (200, 2304, 64), (72, 8192, 32)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_split_k(N, K, G, M, dtype, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "never")  # (M <= 64 would take the Marlin kernel)
    w = _weight(N, K, G, device, gen)
    a, _ = strided_rows(M, K, dtype, device, gen)
    bias = randn((N,), dtype, device, gen) if M != 16 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: ops.int4_gemm(a, w, bias, out=out))
    _check_gemm(out, a, w, bias, dtype)
    assert any("splitk_reduce_kernel" in n for n in names), names  # the plan split these
    g = torch.cuda.CUDAGraph()  # the partial-sum workspace inside a capture
    with torch.cuda.graph(g):
        ops.int4_gemm(a, w, bias, out=out)
    eager = out.clone()
    out.fill_(float("nan"))
    g.replay()
    assert torch.equal(out, eager)


# CUDA: the Marlin-style kernel (gemm/int4_marlin.cuh) for M <= 64 with 16-byte aligned rows of a: every m16
# tile count (M 1..16, ..32, ..64), N tails of the 128-feature column (200, 72), K tails of the 128-deep unit
# (576, 96), real shapes whose columns split over several CTAs and are reduced in-kernel (Llama-3-8B
# 4096 x 14336, 14336 x 4096); rows strided into a NaN-padded buffer; NaN-poisoned output; deterministic (a
# second call is bitwise equal); agrees with the other kernels (DECODEKIT_INT4_MARLIN=never) to the same bound.
MARLIN_SHAPES = [(576, 576, 32), (1536, 576, 32), (200, 4096, 128), (4096, 14336, 128), (14336, 4096, 64), (72, 96, 32)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 7, 16, 17, 33, 64])
@pytest.mark.parametrize("N, K, G", MARLIN_SHAPES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_marlin(N, K, G, M, dtype, device, monkeypatch, gen):
    # never: auto takes the sm90 kernel from M = 33 where K <= 8192 (test_int4_gemm_sm90 checks that choice)
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    w = _weight(N, K, G, device, gen)
    buf = torch.full((M, K + 16), float("nan"), dtype=dtype, device=device)
    a = buf[:, 8:K + 8]  # 16-byte aligned rows, stride K + 16
    a.copy_(randn((M, K), dtype, device, gen))
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: ops.int4_gemm(a, w, bias, out=out))
    assert any("int4_gemm_marlin_kernel" in n for n in names), names
    _check_gemm(out, a, w, bias, dtype)
    assert torch.equal(ops.int4_gemm(a, w, bias), out)  # deterministic in-kernel reduction
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "never")
    names = cuda_kernel_names(lambda: ops.int4_gemm(a, w, bias, out=out))
    assert not any("marlin" in n for n in names), names
    _check_gemm(out, a, w, bias, dtype)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_marlin_graph_streams_and_policy(device, monkeypatch, gen):
    """The Marlin kernel captured in a CUDA graph on a fresh stream (its counters made during the capture; int4.h's
    layout: no packed copy exists yet) replays like eager (the packed layout: bitwise the same) on new inputs, many
    times (the counters are left zero); two streams at once give the eager results; unaligned rows of a fall back
    to another kernel; a bad DECODEKIT_INT4_MARLIN is an error."""
    w = _weight(4096, 4096, 128, device, gen)
    a = randn((5, 4096), torch.bfloat16, device, gen)
    out = torch.empty(5, 4096, dtype=torch.bfloat16, device=device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.int4_gemm(a, w, None, out=out)
    for _ in range(3):
        a.copy_(randn((5, 4096), torch.bfloat16, device, gen))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ops.int4_gemm(a, w, None))
    _check_gemm(out, a, w, None, torch.bfloat16)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    want = [ops.int4_gemm(a[i:i + 1].contiguous(), w, None) for i in range(2)]
    got = [None, None]
    torch.cuda.synchronize()
    for _ in range(20):
        for i, s in enumerate((s1, s2)):
            with torch.cuda.stream(s):
                got[i] = ops.int4_gemm(a[i:i + 1].contiguous(), w, None)
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    buf = randn((5, 4096 + 1), torch.bfloat16, device, gen)
    names = cuda_kernel_names(lambda: ops.int4_gemm(buf[:, 1:], w, None, out=out))
    assert not any("marlin" in n for n in names), names
    _check_gemm(out, buf[:, 1:], w, None, torch.bfloat16)
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "sometimes")  # decodekit.ops reads it first (the packed route)
    with pytest.raises(ValueError, match="DECODEKIT_INT4_MARLIN = 'sometimes' must be 'auto', 'both', 'unpacked' or 'never'"):
        ops.int4_gemm(a, w, None)
    with pytest.raises(RuntimeError, match="DECODEKIT_INT4_MARLIN = 'sometimes' must be 'auto', 'both', 'unpacked' or 'never'"):
        torch.ops.decodekit.int4_gemm(out, a, w.qweight, w.scales, w.mins, w.group_size, None)


# CUDA: the sm90 mixed-input GEMM under CUTLASS's stream-K scheduler (DECODEKIT_SM90_SCHEDULE=stream-k): few tiles
# of the transposed problem (N weight rows x M tokens) against a long K, so each tile's K range is spread over
# SMs and partial tiles are reduced; the group scales of a K range start mid-weight (its k tiles' groups);
# M / N tails; row-strided a; NaN-poisoned output; deterministic; a CUDA graph replays like eager.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 40, 130])
@pytest.mark.parametrize("N, K, G", [(264, 4096, 128), (136, 2880, 64), (1032, 8192, 128)])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_sm90_stream_k(N, K, G, M, dtype, device, monkeypatch, gen):
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "always")
    monkeypatch.setenv("DECODEKIT_SM90_SCHEDULE", "stream-k")
    monkeypatch.setenv("DECODEKIT_INT4_LARGE_M", "kernel")
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN", "never")
    w = _weight(N, K, G, device, gen)
    a, _ = strided_rows(M, K, dtype, device, gen)
    bias = randn((N,), dtype, device, gen) if M % 2 == 0 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    names = cuda_kernel_names(lambda: ops.int4_gemm(a, w, bias, out=out))
    assert any("int4_sm90_interleave_kernel" in n for n in names), names
    _check_gemm(out, a, w, bias, dtype)
    assert torch.equal(ops.int4_gemm(a, w, bias), out)
    if M == 40 and G == 128 and N == 264:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ops.int4_gemm(a, w, bias, out=out)
        a.copy_(randn((M, K), dtype, device, gen))
        g.replay()
        graphed = out.clone()
        _check_gemm(graphed, a, w, bias, dtype)
        assert torch.equal(graphed, ops.int4_gemm(a, w, bias))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_int4_gemm_sm90_graph_and_policy(device, monkeypatch, gen):
    """The sm90 path inside a CUDA graph (its workspace from the caching allocator) replays like eager on new
    inputs, agrees with the mma.sync kernel ("never"); a bad DECODEKIT_SM90_GEMM value is a clear error."""
    w = _weight(264, 512, 128, device, gen)
    a = randn((256, 512), torch.bfloat16, device, gen)
    out = torch.empty(256, 264, dtype=torch.bfloat16, device=device)
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "always")
    monkeypatch.setenv("DECODEKIT_INT4_LARGE_M", "kernel")
    ops.int4_gemm(a, w, None, out=out)  # warm-up (CUTLASS's smem attribute) outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.int4_gemm(a, w, None, out=out)
    a.copy_(randn((256, 512), torch.bfloat16, device, gen))
    g.replay()
    graphed = out.clone()
    eager = ops.int4_gemm(a, w, None)
    assert torch.equal(graphed, eager)
    _check_gemm(graphed, a, w, None, torch.bfloat16)
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    other = ops.int4_gemm(a, w, None)
    _check_gemm(other, a, w, None, torch.bfloat16)
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "sometimes")
    with pytest.raises(RuntimeError, match="DECODEKIT_SM90_GEMM = 'sometimes' must be one of 'auto', 'always'"):
        ops.int4_gemm(a, w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 40])  # decoded on the fly / tiled (CPU) or decoded once then dense (CUDA)
def test_linear_with_int4_weight(M, device, gen):
    w = _weight(96, 256, 64, device, gen)
    a = randn((M, 256), torch.bfloat16, device, gen)
    _check_gemm(ops.linear(a, w), a, w, None, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("G", [32, 64, 128])
def test_int4_dequantize_exact(G, dtype, device, gen):
    w = _weight(21, 4 * G, G, device, gen)
    got = ops.int4_dequantize(w, dtype)
    want = ref.int4_dequantize(w.qweight, w.scales, w.mins, G).to(dtype)
    assert torch.equal(got.cpu(), want.cpu())
    # the code order: element g*G + i in the low nibble of byte g*G/2 + i, element g*G + G/2 + i in the high one
    codes = w.codes().cpu()
    assert int(codes[0, 1]) == int(w.qweight[0, 1]) & 15 and int(codes[0, G // 2 + 1]) == int(w.qweight[0, 1]) >> 4


def test_gguf_q4_1_roundtrip_and_values(gen):
    """Converted embedded-model tensors decode exactly as the gguf package dequantizes them, and
    convert back to the same bytes."""
    from decodekit.loader import embedded_model_path
    from decodekit.loader.gguf import read_gguf_tensors
    infos = [t for t in read_gguf_tensors(embedded_model_path()) if t.type_name == "Q4_1"][:3]
    assert infos, "the embedded model has Q4_1 tensors"
    for t in infos:
        raw = t.raw_bytes()
        w = from_gguf_q4_1(raw, t.shape)
        assert np.array_equal(to_gguf_q4_1(w), raw)
        want = t.dequantize(torch.float32)
        got = ops.int4_dequantize(w, torch.float32)
        assert torch.equal(got, want), f"{t.name}: {(got != want).sum()} values differ from gguf's dequantize"


def test_gguf_q4_0_values(gen):
    x = torch.randn(37, 320, generator=gen).numpy()
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(37, 320))
    got = ops.int4_dequantize(from_gguf_q4_0(raw, (37, 320)), torch.float32)
    assert torch.equal(got, want.float())


def test_int4_errors(gen):
    w = _weight(8, 64, 32, "cpu", gen)
    a = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="'group_size' must be 32, 64 or 128, got 48"):
        torch.ops.decodekit.int4_gemm(torch.empty(2, 8), a, w.qweight, w.scales, w.mins, 48, None)
    with pytest.raises(RuntimeError, match="'scales' has dtype"):
        torch.ops.decodekit.int4_gemm(torch.empty(2, 8), a, w.qweight, w.scales.float(), w.mins, 32, None)
    with pytest.raises(RuntimeError, match="'qweight' must have size 48 \\(K / 2\\) in dim 1"):
        torch.ops.decodekit.int4_gemm(torch.empty(2, 8), torch.randn(2, 96), w.qweight, w.scales, w.mins, 32, None)
    with pytest.raises(ValueError, match="inconsistent INT4 weight"):
        Int4Weight(w.qweight, w.scales[:, :1], w.mins, 32)


@pytest.mark.parametrize("device", DEVICES)
def test_int4_opcheck(device, gen):
    w = _weight(40, 128, 64, device, gen)
    a = randn((3, 128), torch.bfloat16, device, gen)
    opcheck(torch.ops.decodekit.int4_gemm.default,
            (torch.empty(3, 40, dtype=torch.bfloat16, device=device), a, w.qweight, w.scales, w.mins, 64, None))
    opcheck(torch.ops.decodekit.int4_dequantize.default,
            (torch.empty(40, 128, device=device), w.qweight, w.scales, w.mins, 64))


# ---- INT8 weight-only (GGUF Q8_0) ---------------------------------------------------------

_weight8 = random_int8_weight


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("N, K, G", [(576, 576, 32), (77, 256, 64), (49, 384, 128), (51, 96, 32)])
def test_int8_gemm(N, K, G, M, dtype, device, gen):
    w = _weight8(N, K, G, device, gen)
    a = randn((M, K + 5), dtype, device, gen)[:, 2:K + 2]
    bias = randn((N,), dtype, device, gen) if M == 5 else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.int8_gemm(a, w, bias, out=out)
    _check_gemm(out, a, w, bias, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("M", [9, 13, 37, 100, 257])
@pytest.mark.parametrize("N, K, G", TILED_SHAPES)
def test_int8_gemm_tiled(N, K, G, M, with_bias, dtype, device, gen):
    w = _weight8(N, K, G, device, gen)
    a, _ = strided_rows(M, K, dtype, device, gen)
    bias = randn((N,), dtype, device, gen) if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
    ops.int8_gemm(a, w, bias, out=out)
    _check_gemm(out, a, w, bias, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_int8_embedding_and_linear(device, gen):
    w = _weight8(300, 64, 32, device, gen)
    ids = torch.tensor([5, 0, 299, 5, 17], device=device)
    want = ref.int8_dequantize(w.qweight.cpu(), w.scales.cpu(), 32)[ids.cpu()]
    assert torch.equal(ops.int8_embedding(ids, w, torch.float32).cpu(), want)
    assert torch.equal(ops.int8_dequantize(w, torch.float32).cpu(), ref.int8_dequantize(w.qweight.cpu(), w.scales.cpu(), 32))
    a = randn((20, 64), torch.float32, device, gen)  # M > 8: tiled (CPU) / decoded once, then dense (CUDA)
    torch.testing.assert_close(ops.linear(a, w).cpu().double(),
                               a.cpu().double() @ ref.int8_dequantize(w.qweight.cpu(), w.scales.cpu(), 32).double().T,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="'ids'\\[1\\] = 300 is outside \\[0, 300\\)"):
        torch.ops.decodekit.int8_dequantize_rows(torch.empty(2, 64), w.qweight.cpu(), w.scales.cpu(), 32,
                                                 torch.tensor([1, 300]))


def test_gguf_q8_0_values_and_roundtrip():
    from decodekit.loader import embedded_model_path
    from decodekit.loader.gguf import read_gguf_tensors
    from decodekit.quant import from_gguf_q8_0, to_gguf_q8_0
    t = next(t for t in read_gguf_tensors(embedded_model_path()) if t.type_name == "Q8_0")
    raw = t.raw_bytes()
    w = from_gguf_q8_0(raw, t.shape)
    assert np.array_equal(to_gguf_q8_0(w), raw)
    ids = torch.tensor([0, 1, 100, t.shape[0] - 1])
    assert torch.equal(ops.int8_embedding(ids, w, torch.float32), t.dequantize(torch.float32)[ids])


@pytest.mark.parametrize("device", DEVICES)
def test_int8_opcheck(device, gen):
    w = _weight8(40, 128, 64, device, gen)
    a = randn((3, 128), torch.bfloat16, device, gen)
    opcheck(torch.ops.decodekit.int8_gemm.default,
            (torch.empty(3, 40, dtype=torch.bfloat16, device=device), a, w.qweight, w.scales, 64, None))
    opcheck(torch.ops.decodekit.int8_dequantize_rows.default,
            (torch.empty(2, 128, device=device), w.qweight, w.scales, 64, torch.tensor([3, 1], device=device)))


def test_quantize_rtn(gen):
    from decodekit.quant import quantize_rtn
    w = torch.randn(37, 256, generator=gen) * 0.1
    w[3, :32] = 0.25  # a constant group: scale clamps, every code decodes back to the value
    q = quantize_rtn(w, 32)
    deq = ops.int4_dequantize(q, torch.float32)
    step = q.scales.float().repeat_interleave(32, dim=1)
    # each weight within half a step of its decoded value (plus fp16 rounding of min and scale)
    assert ((deq - w).abs() <= step * 0.5 + 1e-3 * w.abs().max()).all()
    assert torch.allclose(deq[3, :32], w[3, :32], atol=1e-3)
    codes = q.codes()
    assert int(codes.max()) <= 15 and (codes == 0).any() and (codes == 15).any()
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        quantize_rtn(torch.randn(4, 48), 32)


# ---- row invariance: speculative verification must reproduce plain decoding bit for bit ----------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("N, K, G", [(576, 576, 32), (77, 256, 64), (49, 384, 128), (130, 1536, 32)])
def test_cpu_rows_do_not_depend_on_the_row_count(N, K, G, kind, dtype, gen):
    """On the CPU, rows 1 .. 8 at a time (decode batches, a verification pass of up to 7 drafts) give
    each row exactly the bits it gets alone: same per-element arithmetic as the one-row GEMV."""
    w = _weight(N, K, G, "cpu", gen) if kind == "int4" else _weight8(N, K, G, "cpu", gen)
    a = randn((8, K), dtype, "cpu", gen)
    bias = randn((N,), dtype, "cpu", gen)
    fn = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    alone = torch.cat([fn(a[i:i + 1], w, bias) for i in range(8)])
    for M in range(2, 9):
        assert torch.equal(fn(a[:M], w, bias), alone[:M]), f"M={M}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 3, 9, 17])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quant_gemm_empty_k(kind, M, device, gen):
    """K = 0 (a [M, 0], weight [N, 0]): every sum is empty, so out = bias (or 0), every element written. An empty
    qweight has no storage (a null pointer), which the CPU kernel once took for a weight held as its AMX copy
    alone: it recursed until the stack overflowed."""
    from decodekit.quant import Int8Weight
    from decodekit.ops import _CUDA_QUANT_GEMV_MAX_M
    dtype = torch.float32 if device == "cpu" or M <= _CUDA_QUANT_GEMV_MAX_M else torch.bfloat16
    N = 5
    if kind == "int4":
        w = Int4Weight(torch.zeros(N, 0, dtype=torch.uint8, device=device),
                       torch.zeros(N, 0, dtype=torch.float16, device=device),
                       torch.zeros(N, 0, dtype=torch.float16, device=device), 32)
    else:
        w = Int8Weight(torch.zeros(N, 0, dtype=torch.int8, device=device),
                       torch.zeros(N, 0, dtype=torch.float16, device=device), 32)
    gemm = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    a = torch.zeros(M, 0, dtype=dtype, device=device)
    for bias in (randn((N,), dtype, device, gen), None):
        out = torch.full((M, N), float("nan"), dtype=dtype, device=device)
        gemm(a, w, bias, out=out)
        want = torch.zeros(M, N, dtype=dtype, device=device) if bias is None else bias.expand(M, N)
        assert torch.equal(out, want)
    for dt in ((torch.bfloat16, torch.float16) if device == "cpu" else ()):  # the CPU's other routes
        bias = randn((N,), dt, device, gen)
        for decode_rows in (-1, 0, M):
            got = ops.linear(torch.zeros(M, 0, dtype=dt), w, bias, decode_rows=decode_rows)
            assert torch.equal(got, bias.expand(M, N))
