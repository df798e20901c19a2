"""A packed weight held only as the CPU's AMX copy (decodekit.ops.prepare_amx_rows(w, drop_stored=True),
PackedWeight.copy_only): what LlamaModel does on AMX CPUs, so that one copy of each quantized weight is in memory,
not two.

The ops read the copy for every row count (1..12 rows: quant_amx_rows.h; 13+: quant_amx_exact.h's kernels decoding
their strips from the copy; bf16 / no tile unit: the copy unpacked first) -- bit for bit the same calls with the
weight's own tensors; qweight / scales / mins read from Python are rebuilt from the copy, equal to the originals.
Runs on any CPU (without AMX the ops take the unpacking route).
"""
import pickle

import pytest
import torch

from dk_testing import random_int4_weight, random_int8_weight, randn, strided_rows
from decodekit import ops
from decodekit.quant import Int4Weight, Int8Weight

_ops = torch.ops.decodekit
SHAPES = [(1, 32, 32), (45, 192, 64), (130, 576, 32), (97, 384, 128)]


def _pair(kind, N, K, G, gen):
    """(weight with its copy, the same values held only as the copy): separate objects."""
    w = (random_int4_weight if kind == "int4" else random_int8_weight)(N, K, G, "cpu", gen)
    fields = {"qweight": w.qweight.clone(), "scales": w.scales.clone(), "group_size": G}
    if kind == "int4":
        fields["mins"] = w.mins.clone()
    only = type(w)(**fields)
    ops.prepare_amx_rows(w)
    ops.prepare_amx_rows(only, drop_stored=True)
    return w, only


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("N,K,G", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gemm_bitwise_the_weights_own(kind, N, K, G, dtype, gen):
    w, only = _pair(kind, N, K, G, gen)
    gemm = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    for M in (1, 2, 5, 8, 12, 13, 16, 17, 40, 131):
        a, _ = strided_rows(M, K, dtype, "cpu", gen)
        bias = randn((N,), dtype, "cpu", gen) if M % 2 else None
        want = gemm(a, w, bias, torch.full((M, N), float("nan"), dtype=dtype))
        got = gemm(a, only, bias, torch.full((M, N), float("nan"), dtype=dtype))
        assert not got.isnan().any(), (M, "unwritten (NaN-poisoned) outputs")
        assert torch.equal(got, want), (M, (got.float() - want.float()).abs().max().item())


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("N,K,G", SHAPES)
def test_bf16_rows_on_the_copy(kind, N, K, G, gen):
    """bf16 activations on a weight with its AMX copy (quant_amx_rows_bf16.h): up to the few-row limit (INT4 12, INT8
    8 rows) the float32 rows' exact-integer bits rounded once to bf16 (bf16 -> fp32 is exact), so a row's bits do
    not depend on the row count there; past it quant_amx.h's bf16 products on strips decoded from the copy, bit for
    bit those decoded from the weight's own tensors."""
    if not ops.int4_amx_rows_available():
        pytest.skip("no AMX int8 on this CPU: bf16 takes the copy-unpacking route")
    w, only = _pair(kind, N, K, G, gen)
    plain = type(w)(**{f: getattr(w, f).clone() for f in w._OPERANDS}, group_size=G)  # no copy
    gemm = ops.int4_gemm if kind == "int4" else ops.int8_gemm
    few = 12 if kind == "int4" else 8
    for M in (1, 2, 5, few - 1, few, few + 1, 16, 40, 131):
        a, _ = strided_rows(M, K, torch.bfloat16, "cpu", gen)
        bias = randn((N,), torch.bfloat16, "cpu", gen) if M % 2 else None
        got = gemm(a, only, bias, torch.full((M, N), float("nan"), dtype=torch.bfloat16))
        assert torch.equal(got, gemm(a, w, bias)), M
        if M <= few:
            want = gemm(a.float(), only, None if bias is None else bias.float()).to(torch.bfloat16)
        else:
            want = gemm(a, plain, bias)
        assert torch.equal(got, want), (M, (got.float() - want.float()).abs().max().item())


@pytest.mark.parametrize("N,K,G", SHAPES)
def test_embedding_rows(N, K, G, gen):
    w, only = _pair("int8", N, K, G, gen)
    ids = torch.randint(0, N, (37,), generator=gen)
    ids[0], ids[-1] = 0, N - 1
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(ops.int8_embedding(ids, only, dtype), ops.int8_embedding(ids, w, dtype))
    with pytest.raises(RuntimeError, match="'ids'.*outside"):
        ops.int8_embedding(torch.tensor([N]), only, torch.float32)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_fields_rebuilt_from_the_copy(kind, gen):
    """The dropped tensors are gone from the object; reading them rebuilds them from the copy (equal to the
    originals), so every other reader -- dequantize, rows, to, clone, repr -- still works."""
    w, only = _pair(kind, 77, 256, 64, gen)
    names = ("qweight", "scales", "mins") if kind == "int4" else ("qweight", "scales")
    assert only.copy_only is not None and w.copy_only is None
    assert not any(n in only.__dict__ for n in names)
    for n in names:
        assert torch.equal(getattr(only, n), getattr(w, n)), n
    assert only.shape == w.shape == (77, 256) and only.device == w.device
    assert only.nbytes == only.__dict__["_amx_rows"].numel()  # the copy is all that is held
    assert w.nbytes == sum(getattr(w, n).numel() * getattr(w, n).element_size() for n in names)
    deq = ops.int4_dequantize if kind == "int4" else ops.int8_dequantize
    assert torch.equal(deq(only, torch.float32), deq(w, torch.float32))
    for other in (only.rows(5, 40), only.clone(), only.to("cpu")):
        assert all(torch.equal(getattr(other, n), getattr(w.rows(5, 40) if other.shape[0] == 35 else w, n))
                   for n in names)
    assert "group_size" in repr(only)
    back = pickle.loads(pickle.dumps(only))  # (torch.save / multiprocessing)
    assert back.copy_only is not None and torch.equal(back.qweight, w.qweight)
    with pytest.raises(AttributeError, match="no_such"):
        only.no_such
    ops.prepare_amx_rows(only, drop_stored=True)  # again: a no-op
    assert only.copy_only is not None


def test_act_order_weights_keep_their_tensors(gen):
    """An act-order weight's stored-order object shares its tensors: the copy is made, nothing dropped."""
    w = random_int4_weight(40, 128, 32, "cpu", gen)
    w = Int4Weight(w.qweight, w.scales, w.mins, 32, torch.randperm(128, generator=gen))
    ops.prepare_amx_rows(w, drop_stored=True)
    assert w.copy_only is None and w.stored().copy_only is None and "_amx_rows" in w.stored().__dict__


def test_errors_name_the_field(gen):
    w, only = _pair("int4", 40, 64, 32, gen)
    q, s, m = only.operands()
    copy = only.__dict__["_amx_rows"]
    a = randn((3, 64), torch.float32, "cpu", gen)
    out = torch.empty(3, 40)
    with pytest.raises(RuntimeError, match=r"'qweight' is \[N, 0\].*'packed' must be"):
        _ops.int4_gemm(out, a, q, s, m, 32, None, None)
    with pytest.raises(RuntimeError, match="'scales'.*size"):
        _ops.int4_gemm(out, a, q, w.scales, m, 32, None, copy)
    with pytest.raises(RuntimeError, match="packed.*amx_rows_packed_bytes"):
        _ops.int4_gemm(out, a, q, s, m, 32, None, copy[:-64].clone())
    with pytest.raises(RuntimeError, match="K = 48 must be a multiple"):
        _ops.int4_gemm(torch.empty(3, 40), randn((3, 48), torch.float32, "cpu", gen), q, s, m, 32, None, copy)
    w8, only8 = _pair("int8", 40, 64, 32, gen)
    q8, s8 = only8.operands()
    with pytest.raises(RuntimeError, match=r"'qweight' is \[N, 0\]"):
        _ops.int8_gemm(out, a, q8, s8, 32, None, None)
    with pytest.raises(RuntimeError, match=r"'qweight' is \[N, 0\]"):
        _ops.int8_dequantize_rows(torch.empty(2, 64), q8, s8, 32, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="packed.*amx_rows_int8_packed_bytes"):
        _ops.int8_dequantize_rows(torch.empty(2, 64), q8, s8, 32, torch.tensor([0, 1]), copy)


def test_opcheck(gen):
    _, only = _pair("int4", 33, 64, 32, gen)
    _, only8 = _pair("int8", 33, 64, 32, gen)
    a = randn((3, 64), torch.float32, "cpu", gen)
    torch.library.opcheck(_ops.int4_gemm.default,
                          (torch.empty(3, 33), a, *only.operands(), 32, None, only.__dict__["_amx_rows"]))
    torch.library.opcheck(_ops.int8_gemm.default,
                          (torch.empty(3, 33), a, *only8.operands(), 32, None, only8.__dict__["_amx_rows"]))
    torch.library.opcheck(_ops.int8_dequantize_rows.default,
                          (torch.empty(2, 64), *only8.operands(), 32, torch.tensor([3, 0]),
                           only8.__dict__["_amx_rows"]))


def test_model_holds_one_copy(gguf_path, monkeypatch):
    """LlamaModel (float32, CPU with AMX) holds its INT4 projections and Q8_0 LM head / embedding as the copies
    alone: the bytes held equal those without copies (up to the copy's padding to 32 rows). (Its outputs: the
    HF-oracle, engine and speculative-decoding suites run on such models.)"""
    if not ops.int4_amx_rows_available():
        pytest.skip("no AMX int8 on this CPU: no copies are made")
    from decodekit.loader import load_model
    from decodekit.models import LlamaModel
    lm = load_model(gguf_path, progress=False, keep_quantized=True)

    def held(model):
        ws = [w for L in model.layers for w in (L.qkv, L.o, L.gate_up, L.down)] + [model.lm_head]
        return ws, sum(w.nbytes for w in ws)

    model = LlamaModel(lm.config, dict(lm.weights))
    ws, nbytes = held(model)
    assert all(w.copy_only is not None for w in ws if isinstance(w, (Int4Weight, Int8Weight)))
    monkeypatch.setenv("DECODEKIT_CPU_AMX_ROWS", "0")  # (the weight objects above now hold only copies: reload)
    lm = load_model(gguf_path, progress=False, keep_quantized=True)
    plain = LlamaModel(lm.config, dict(lm.weights))
    assert 1.0 <= nbytes / held(plain)[1] < 1.01


def test_engine_never_rebuilds_the_fields(monkeypatch):
    """Serving from copy-only weights reads the copies only: prefill, decode, a speculative verification and a batch
    run without rebuilding any dropped field (that would cost a whole weight's unpack per call)."""
    if not ops.int4_amx_rows_available():
        pytest.skip("no AMX int8 on this CPU: no copies are made")
    from decodekit import LLM, SamplingParams
    from decodekit.ops import reference

    llm = LLM(speculative="ngram", num_speculative_tokens=4)
    model = llm.engine.model
    assert model.layers[0].qkv.copy_only is not None and model.lm_head.copy_only is not None

    def no_unpack(*args):
        raise AssertionError("a dropped field was rebuilt while serving")
    monkeypatch.setattr(reference, "int4_amx_rows_unpack", no_unpack)  # (what the rebuild calls)
    monkeypatch.setattr(reference, "int8_amx_rows_unpack", no_unpack)
    with pytest.raises(AssertionError, match="rebuilt"):  # the trap works
        model.layers[0].qkv.qweight
    outs = llm.generate(["Repeat: one two three one two three one two three", "Hi"] * 2,
                        SamplingParams(temperature=0, max_tokens=24))
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
