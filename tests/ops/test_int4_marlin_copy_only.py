"""INT4 weights held as the Marlin-style CUDA kernel's packed copy alone (decodekit.ops.prepare_marlin(...,
drop_stored=True), what a CUDA fp16 / bf16 model holds: one copy of its INT4 weights, not two):
int4_marlin_dequantize (reference, CPU, CUDA: each weight rounded once as the kernel's fused multiply-add in T),
int4_gemm on such a weight (the Marlin kernel to 64 rows, decoded chunks past them, any activation dtype / stride /
out view), the dropped fields rebuilt from the copy, and a CUDA model holding its weights that way."""
import pickle

import pytest
import torch
from torch.library import opcheck

from dk_testing import check_marlin_gemm, random_int4_weight, DEVICES, cuda_kernel_names, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight

HALF_TYPES = [torch.float16, torch.bfloat16]
PRECISION = {torch.float16: (10, -14), torch.bfloat16: (7, -126)}  # explicit mantissa bits, least normal exponent


def _held(N, K, G, dtype, device, gen):
    w = random_int4_weight(N, K, G, device, gen)
    held = Int4Weight(w.qweight.clone(), w.scales.clone(), w.mins.clone(), G)
    ops.prepare_marlin(held, dtype, drop_stored=True)
    return w, held


def _exact_weights(w: Int4Weight, dtype) -> torch.Tensor:  # [N, K] float64: s_T q + m_T, unrounded
    s = w.scales.cpu().to(dtype).double()
    m = w.mins.cpu().to(dtype).double()
    codes = ref.int4_dequantize(w.qweight.cpu(), torch.ones_like(w.scales.cpu()), torch.zeros_like(w.mins.cpu()),
                                w.group_size).double()
    N, K = w.shape
    G = w.group_size
    return (codes.view(N, K // G, G) * s[:, :, None] + m[:, :, None]).reshape(N, K)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("N, K, G", [(200, 576, 32), (67, 192, 64), (130, 1024, 128), (1, 128, 128)])
def test_int4_marlin_dequantize(N, K, G, dtype, device, gen):
    """Rows [row0, row0 + R) bit for bit the reference's, each the T value nearest s_T q + m_T (float64: the
    error at most half T's spacing at that magnitude); poisoned outputs all written; row ranges of every kind."""
    w = random_int4_weight(N, K, G, device, gen)
    packed = ops.int4_marlin_pack(w, dtype)
    exact = _exact_weights(w, dtype)
    bits, emin = PRECISION[dtype]
    for row0, rows in [(0, N), (N // 3, N - N // 3), (N - 1, 1), (N // 2, 0)]:
        out = torch.full((rows, K), float("nan"), dtype=dtype, device=device)
        ops.int4_marlin_dequantize(packed, N, K, G, row0, rows, out=out)
        want = ref.int4_marlin_dequantize(packed.cpu(), N, K, G, row0, rows)
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16)), (row0, rows)
        e = exact[row0:row0 + rows]
        spacing = torch.exp2(torch.floor(torch.log2(e.abs().clamp_min(2.0 ** emin))) - bits)
        assert ((out.cpu().double() - e).abs() <= spacing / 2).all()


def test_round_once_is_correctly_rounded():
    """reference._round_once: float64 -> float16 / bfloat16 rounded once (torch 2.14 rounds through float32:
    wrong on values just past a tie); float16 against numpy's direct conversion, both against the definition."""
    import numpy as np
    one = 1.0 + 2.0 ** -11  # a float16 tie (1 + half an ulp)
    vals = torch.tensor([one + 2.0 ** -40, one - 2.0 ** -40, one, -(one + 2.0 ** -40), 3.0 * 2.0 ** -20 + 2.0 ** -50,
                         65519.99, 2.0 ** -30, 0.0], dtype=torch.float64)
    got = ref._round_once(vals, torch.float16)
    assert torch.equal(got.double(), torch.from_numpy(vals.numpy().astype(np.float16).astype(np.float64)))
    assert got[0] == 1.0 + 2.0 ** -10 and got[1] == 1.0 and got[2] == 1.0  # past / before / on the tie
    b = ref._round_once(torch.tensor([1.0 + 2.0 ** -8 + 2.0 ** -40, 1.0 + 2.0 ** -8], dtype=torch.float64),
                        torch.bfloat16)
    assert b[0] == 1.0 + 2.0 ** -7 and b[1] == 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_int4_marlin_dequantize_bad_input(device, gen):
    w = random_int4_weight(200, 192, 64, device, gen)
    packed = ops.int4_marlin_pack(w, torch.bfloat16)
    d = torch.ops.decodekit.int4_marlin_dequantize
    out = torch.empty(100, 192, dtype=torch.bfloat16, device=device)
    opcheck(d, (out, packed, 200, 192, 64, 50))
    with pytest.raises(RuntimeError, match="'row0' must be in \\[0, 100\\], got 101"):
        d(out, packed, 200, 192, 64, 101)
    with pytest.raises(RuntimeError, match="'out.size\\(0\\) \\(rows\\)' must be in \\[0, 200\\]"):
        d(torch.empty(201, 192, dtype=torch.bfloat16, device=device), packed, 200, 192, 64, 0)
    with pytest.raises(RuntimeError, match="'out'"):  # another dtype than the copy's
        d(out.half(), packed, 200, 192, 64, 0)
    with pytest.raises(RuntimeError, match="'out'"):  # not contiguous
        d(torch.empty(192, 100, dtype=torch.bfloat16, device=device).t(), packed, 200, 192, 64, 0)
    with pytest.raises(RuntimeError, match="'packed'"):  # packed for another shape
        d(out, packed[:-8], 200, 192, 64, 0)
    with pytest.raises(RuntimeError, match="'group_size' must be 32, 64 or 128"):
        d(out, packed, 200, 192, 48, 0)
    shifted = torch.empty(packed.numel() + 1, dtype=packed.dtype, device=device)[1:]
    with pytest.raises(RuntimeError, match="'packed' must start 4-byte aligned"):
        d(out, shifted, 200, 192, 64, 0)
    with pytest.raises(RuntimeError, match="k = 160 must be a multiple of group_size = 64"):
        d(out[:, :160], packed, 200, 160, 64, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("M", [1, 3, 17, 64, 65, 200])
def test_int4_gemm_on_marlin_copy_only(M, dtype, device, monkeypatch, gen):
    """int4_gemm / linear on a weight held as its Marlin copy alone: the kernel to 64 rows, decoded chunks (three,
    the last partial) past them; strided and misaligned activations, a column-slice `out`, bias; float32
    activations on the 16-bit copy (decoded, cast)."""
    monkeypatch.setattr(ops, "_dense_chunk_rows", lambda x, K: 128)  # N = 300 -> chunks of 128, 128, 44
    N, K, G = 300, 576, 32
    w, held = _held(N, K, G, dtype, device, gen)
    assert held.copy_only.kind == "marlin" and "qweight" not in held.__dict__ and held.shape == (N, K)
    packed = held.copy_only.copy
    buf = torch.full((M, K + 9), float("nan"), dtype=dtype, device=device)
    a = buf[:, 1:K + 1]  # 2-byte offset rows: not 16-byte aligned (copied for the kernel)
    a.copy_(randn((M, K), dtype, device, gen))
    bias = randn((N,), dtype, device, gen) if M % 2 else None
    wide = torch.full((M, N + 5), float("nan"), dtype=dtype, device=device)
    out = wide[:, 2:N + 2]
    assert ops.int4_gemm(a, held, bias, out=out) is out
    check_marlin_gemm(out, a, packed, N, K, G, bias, dtype)
    assert wide[:, :2].isnan().all() and wide[:, N + 2:].isnan().all()  # nothing written outside out
    check_marlin_gemm(ops.linear(a, held, bias), a, packed, N, K, G, bias, dtype)
    got32 = ops.int4_gemm(a.float(), held, None if bias is None else bias.float())
    assert got32.dtype == torch.float32
    check_marlin_gemm(got32, a.float(), packed, N, K, G, bias, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_marlin_copy_sliced_rows(device, monkeypatch, gen):
    """DECODEKIT_INT4_MARLIN_SLICED_MAX_M: up to that many rows run the Marlin kernel over 64-row slices (the
    last partial) instead of the decoded chunks; a bad value is a clear error."""
    N, K, G = 200, 384, 128
    w, held = _held(N, K, G, torch.bfloat16, device, gen)
    a = randn((150, K), torch.bfloat16, device, gen)
    bias = randn((N,), torch.bfloat16, device, gen)
    monkeypatch.setenv("DECODEKIT_INT4_MARLIN_SLICED_MAX_M", "150")
    got = torch.full((150, N), float("nan"), dtype=torch.bfloat16, device=device)
    ops.int4_gemm(a, held, bias, out=got)
    check_marlin_gemm(got, a, held.copy_only.copy, N, K, G, bias, torch.bfloat16)
    for m0 in (0, 64, 128):  # each slice: bitwise the kernel on those rows alone
        assert torch.equal(got[m0:m0 + 64], ops.int4_gemm(a[m0:m0 + 64], held, bias))
    if device == "cuda":
        names = cuda_kernel_names(lambda: ops.int4_gemm(a, held, bias))
        assert not any("int4_marlin_dequantize" in n for n in names), names
    for bad in ("32", "lots"):
        monkeypatch.setenv("DECODEKIT_INT4_MARLIN_SLICED_MAX_M", bad)
        with pytest.raises(ValueError, match="DECODEKIT_INT4_MARLIN_SLICED_MAX_M = .* must be an integer >= 64"):
            ops.int4_gemm(a, held, bias)


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_marlin_copy_only_fields_rebuilt(dtype, gen):
    """The dropped fields come back exactly (codes from the copy; scales / mins from it for a float16 copy, from
    host memory for a bfloat16 one, whose pairs are rounded); int4_dequantize gives the copy's weights (what the
    kernels compute); rows / pickle keep working; nbytes is the copy's; decoder_layer does not take it
    (projection_operands None); act-order weights are held as the copy of their stored column order."""
    N, K, G = 130, 256, 64
    w, held = _held(N, K, G, dtype, "cpu", gen)
    packed = held.copy_only.copy
    assert held.nbytes == packed.numel() * 2
    assert torch.equal(held.qweight, w.qweight)
    assert torch.equal(held.scales, w.scales) and torch.equal(held.mins, w.mins)
    if dtype == torch.bfloat16:
        assert not torch.equal(w.scales.to(dtype).half(), w.scales)  # the copy's pairs alone would not do
    want = ref.int4_marlin_dequantize(packed, N, K, G).float()
    assert torch.equal(ops.int4_dequantize(held, torch.float32), want)
    assert torch.equal(held.rows(3, 9).qweight, w.qweight[3:9])
    back = pickle.loads(pickle.dumps(held))
    assert torch.equal(ops.int4_dequantize(back, torch.float32), want)
    assert ops.projection_operands(held) is None

    # act-order: the weight and its stored-order object (sharing the tensors) both held as the copy
    perm = torch.randperm(K, generator=gen)
    wa = Int4Weight(w.qweight.clone(), w.scales.clone(), w.mins.clone(), G, perm)
    plain = Int4Weight(w.qweight.clone(), w.scales.clone(), w.mins.clone(), G, perm)
    ops.prepare_marlin(wa, dtype, drop_stored=True)
    assert ops.marlin_copy_only(wa) is not None and ops.marlin_copy_only(wa.stored()) is not None
    assert "qweight" not in wa.__dict__ and "qweight" not in wa.stored().__dict__ and wa.shape == (N, K)
    assert torch.equal(wa.qweight, w.qweight) and torch.equal(wa.scales, w.scales) and torch.equal(wa.perm, perm)
    copy_w = ref.int4_marlin_dequantize(wa.stored().copy_only.copy, N, K, G).float()  # stored column order
    unperm = torch.empty_like(copy_w)
    unperm[:, perm] = copy_w
    assert torch.equal(ops.int4_dequantize(wa, torch.float32), unperm)
    for M in (5, 70):
        x = randn((M, K), dtype, "cpu", gen)
        got = ops.linear(x, wa)
        check_marlin_gemm(got, x.index_select(1, perm), wa.stored().copy_only.copy, N, K, G, None, dtype)
        want_plain = ops.linear(x, plain)  # int4.h's route: the same weights up to the copy's rounding to dtype
        assert (got.float() - want_plain.float()).abs().max() <= 0.05 * want_plain.float().abs().max() + 0.05
    assert ops.projection_operands(wa) is None


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_marlin_copy_only_routes_on_cuda(device, monkeypatch, gen):
    """On CUDA: 1..64 rows run the packed Marlin kernel on the copy (bitwise int4_gemm's with both layouts when
    that takes the same kernel), 65+ decode the copy (int4_marlin_dequantize) for cuBLAS; inside a CUDA graph too."""
    monkeypatch.setenv("DECODEKIT_SM90_GEMM", "never")
    N, K, G = 4096, 4096, 128
    w, held = _held(N, K, G, torch.bfloat16, device, gen)
    for M in (1, 17, 64):
        a = randn((M, K), torch.bfloat16, device, gen)
        names = cuda_kernel_names(lambda: ops.linear(a, held))
        assert any("int4_gemm_marlin_kernel" in n and ", true," in n for n in names), names
        assert torch.equal(ops.linear(a, held), ops.linear(a, w))  # w: the packed copy + int4.h's tensors
    a = randn((300, K), torch.bfloat16, device, gen)
    names = cuda_kernel_names(lambda: ops.linear(a, held))
    assert any("int4_marlin_dequantize" in n for n in names) and not any("int4_gemm" in n for n in names), names
    check_marlin_gemm(ops.linear(a, held), a, held.copy_only.copy, N, K, G, None, torch.bfloat16)
    a5, out = randn((5, K), torch.bfloat16, device, gen), torch.empty(5, N, dtype=torch.bfloat16, device=device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.int4_gemm(a5, held, None, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ops.int4_gemm(a5, held, None))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_cuda_model_holds_int4_as_marlin_copy(device, monkeypatch):
    """A bf16 CUDA model with packed INT4 weights holds each projection as its Marlin copy alone (about half the
    INT4 bytes of both layouts); DECODEKIT_INT4_MARLIN=both keeps both; the greedy tokens agree."""
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    g = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(100, 49152, (n,), generator=g).tolist()} for n in (4, 19, 90)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs, held = {}, {}
    for mode in ("auto", "both"):
        monkeypatch.setenv("DECODEKIT_INT4_MARLIN", mode)
        llm = LLM("random:smollm2-135m", device=device, dtype="bfloat16", gpu_memory_utilization=0.3,
                  quantization="int4-rtn", max_num_seqs=8)
        ws = [w for L in llm.engine.model.layers for w in (L.qkv, L.o, L.gate_up, L.down)]
        assert all(isinstance(w, Int4Weight) for w in ws)
        assert all((w.copy_only is not None) == (mode == "auto") for w in ws)
        held[mode] = sum(w.nbytes + sum(p.numel() * 2 for p in w.__dict__.get("_marlin", {}).values()
                                        if w.copy_only is None) for w in ws)
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
        torch.cuda.empty_cache()
    assert held["auto"] < 0.6 * held["both"], held
    assert [o[:1] for o in outs["auto"]] == [o[:1] for o in outs["both"]], outs  # (random weights: near-ties)
    assert sum(a == b for a, b in zip(outs["auto"], outs["both"])) >= len(prompts) - 1, outs


PROMPTS = ["The capital of France is Paris, and the capital of Italy is Rome. " * 3,
           "Write a haiku about the sea. Waves fold into foam, the gulls cry over the harbour, " * 2,
           "List three prime numbers greater than 50 and explain briefly why each is prime, one per line: " * 2]


def _prompt_logprobs(llm):
    from decodekit.sampling import SamplingParams
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1))
    return [[e[t].logprob for e, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])] for o in outs]


@pytest.fixture(scope="module")
def fp32_logprobs():
    from dk_testing import embedded_llm
    return _prompt_logprobs(embedded_llm(kv_cache_memory="64MiB"))


@pytest.mark.parametrize("dtype, columns_only", [("bfloat16", False), ("float16", False), ("bfloat16", True)])
def test_engine_on_marlin_copies_cpu(dtype, columns_only, fp32_logprobs, monkeypatch):
    """The model-level route of a CUDA model, run on the CPU: the embedded model (Q4_1 projections kept packed)
    in a 16-bit dtype, then its projections held as their Marlin copies alone (LlamaModel.hold_marlin_copies,
    what prepare_packed_gemms does on CUDA; under TP qkv / gate_up alone): decode steps through int4_gemm_marlin, the prompts (41-48 tokens,
    several in one step) through decoded chunks; the fused CPU layer steps aside. The prompt tokens' logprobs stay
    as close to the float32 model's as the 16-bit model's own (measured: bfloat16 mean |diff| 0.029 before,
    0.032 on the copies; float16 0.0030 / 0.0037: the copy's weights are rounded to the 16-bit type, as the
    kernel computes them); decoding runs on (greedy continuations may part at near-ties: 16-bit arithmetic)."""
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    monkeypatch.setenv("DECODEKIT_CPU_AMX_ROWS", "0")  # float16 would hold the CPU's AMX copies alone
    llm = LLM(None, dtype=dtype, device="cpu", kv_cache_memory="64MiB")
    model = llm.engine.model
    params = SamplingParams(temperature=0, max_tokens=8)

    def err():
        d = [abs(a - b) for xs, rs in zip(_prompt_logprobs(llm), fp32_logprobs) for a, b in zip(xs, rs)]
        return sum(d) / len(d)
    err_before = err()
    model.hold_marlin_copies(True, columns_only=columns_only)  # columns_only: what a TP rank holds
    model.refresh_fused_layers()
    for L in model.layers:
        for w, row_parallel in ((L.qkv, False), (L.o, True), (L.gate_up, False), (L.down, True)):
            assert (ops.marlin_copy_only(w) is None) == (columns_only and row_parallel)
    assert not model.fused_layers
    err_after = err()
    assert err_after <= 1.5 * err_before + 0.002, (err_before, err_after)
    assert all(len(o.outputs[0].token_ids) == 8 for o in llm.generate(PROMPTS, params))
