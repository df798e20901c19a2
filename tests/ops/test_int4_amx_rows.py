"""The CPU's repacked INT4 / INT8 copies and int4_gemm's 1..12-row / int8_gemm's 1..8-row AMX kernels
(include/decodekit/gemm/quant_amx_rows.h).

With the copy (int4_amx_rows_pack, passed as int4_gemm's `packed`), float32 / float16 activations of 1..12 rows
run on the AMX int8 unit with quant_amx_exact.h's semantics -- the ones 9+ rows get anyway -- so a row's bits do
not depend on how many rows come with it: checked bit for bit against the float64 emulation of those semantics
(test_quant_amx_exact._emulate) and against the same rows inside batches of every size. The layout itself is
checked against the pure-torch reference (ops.reference.int4_amx_rows_pack) on any CPU.
"""
import pytest
import torch

from dk_testing import cpu_amx_exact_expected, random_int4_weight, random_int8_weight, randn, strided_rows
from decodekit import ops
from decodekit.ops import reference as ref
from test_quant_amx_exact import _agreement, _emulate

needs_amx = pytest.mark.skipif(not (cpu_amx_exact_expected() and ops.int4_amx_rows_available()),
                               reason="no AMX int8 on this CPU (or DECODEKIT_CPU_AMX=0 / a non-native build)")


def _packed(w):
    out = torch.full((ref.amx_rows_packed_bytes(*w.shape, w.group_size),), 0xEE, dtype=torch.uint8)
    torch.ops.decodekit.int4_amx_rows_pack(out, w.qweight, w.scales, w.mins, w.group_size)
    return out


def _gemm(a, w, packed, bias=None):
    out = torch.full((a.shape[0], w.shape[0]), float("nan"), dtype=a.dtype)
    torch.ops.decodekit.int4_gemm(out, a, w.qweight, w.scales, w.mins, w.group_size, bias, packed)
    return out


@pytest.mark.parametrize("N,K,G", [(1, 32, 32), (15, 64, 64), (17, 128, 128), (33, 96, 32), (130, 576, 32),
                                   (200, 384, 128), (576, 1536, 64)])
def test_pack_matches_reference(N, K, G, gen):
    w = random_int4_weight(N, K, G, "cpu", gen)
    got = _packed(w)
    want = ref.int4_amx_rows_pack(w.qweight, w.scales, w.mins, G)
    assert got.shape == want.shape == (ref.amx_rows_packed_bytes(N, K, G),)
    assert torch.equal(got, want)


@pytest.mark.parametrize("N,K,G", [(1, 32, 32), (15, 64, 64), (45, 384, 128), (130, 576, 32)])
def test_copies_round_trip(N, K, G, gen):
    """The converters both ways: unpack(pack(w)) == w exactly, INT4 and INT8."""
    w = random_int4_weight(N, K, G, "cpu", gen)
    q, s, m = ref.int4_amx_rows_unpack(_packed(w), N, K, G)
    assert torch.equal(q, w.qweight) and torch.equal(s, w.scales) and torch.equal(m, w.mins)
    w8 = random_int8_weight(N, K, G, "cpu", gen)
    q8, s8 = ref.int8_amx_rows_unpack(ref.int8_amx_rows_pack(w8.qweight, w8.scales, G), N, K, G)
    assert torch.equal(q8, w8.qweight) and torch.equal(s8, w8.scales)


def test_pack_reference_places_every_code(gen):
    """The reference against the layout's definition (amx_rows_layout.h), code by code."""
    N, K, G = 21, 64, 32
    w = random_int4_weight(N, K, G, "cpu", gen)
    q = ref._int4_codes(w.qweight, G).reshape(N, K)
    packed = ref.int4_amx_rows_pack(w.qweight, w.scales, w.mins, G)
    S, nb = ref.amx_rows_strips(N), K // 32
    for s in range(S):
        for b in range(nb):
            for t in range(512):
                byte = int(packed[(s * nb + b) * 256 + t % 256])
                code = byte & 15 if t < 256 else byte >> 4
                n, k = 16 * s + t % 64 // 4, 32 * b + 4 * (t // 64) + t % 4
                assert code == (int(q[n, k]) if n < N else 0), (s, b, t)
    scales = packed[S * nb * 256:].view(torch.float16)[:S * (K // G) * 16].view(S, K // G, 16)
    assert torch.equal(scales.permute(0, 2, 1).reshape(S * 16, K // G)[:N], w.scales)


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M", list(range(1, 17)))
def test_rows_match_the_exact_semantics(M, dtype, gen):
    N, K, G = 77 + M, 32 * (3 + M % 4), 32 if M % 3 else 64  # odd N, K an odd or even number of blocks
    K = (K + G - 1) // G * G
    w = random_int4_weight(N, K, G, "cpu", gen)
    a, _ = strided_rows(M, K, dtype, "cpu", gen)
    if M > 1:
        a[1] *= 1e-3 if dtype == torch.float16 else 1e-20  # a row of its own exponent
    a[0, :32] = 0.0                                          # an all-zero block
    bias = randn((N,), dtype, "cpu", gen) if M % 2 else None
    out = _gemm(a, w, _packed(w), bias)
    assert not out.isnan().any(), "unwritten (NaN-poisoned) outputs"
    frac, ulps = _agreement(out, _emulate(a, w, bias, dtype))
    assert frac >= 0.999 and ulps <= 1.0, f"{frac:.5f} of the outputs bitwise, {ulps:.2f} ulps"


@needs_amx
def test_rows_do_not_depend_on_the_row_count(gen):
    """Every row count 1..40 (the AMX rows kernel to 16, quant_amx_exact.h beyond) gives a row the same bits;
    without the copy, 1..8 rows keep the GEMV arithmetic and differ."""
    N, K, G = 130, 576, 32
    w = random_int4_weight(N, K, G, "cpu", gen)
    packed = _packed(w)
    a = randn((40, K), torch.float32, "cpu", gen)
    full = _gemm(a, w, packed)
    for m in range(1, 40):
        for r0 in {0, 40 - m, (40 - m) // 2}:
            assert torch.equal(_gemm(a[r0:r0 + m].contiguous(), w, packed), full[r0:r0 + m]), (m, r0)
    assert not torch.equal(_gemm(a[:1].contiguous(), w, None), full[:1])


@needs_amx
def test_non_finite_rows(gen):
    N, K, G = 45, 192, 32
    w = random_int4_weight(N, K, G, "cpu", gen)
    packed = _packed(w)
    a = randn((5, K), torch.float32, "cpu", gen)
    clean = _gemm(a, w, packed)
    a[1, 100], a[3, 0] = float("inf"), float("nan")
    out = _gemm(a, w, packed)
    assert out[1].isnan().all() and out[3].isnan().all()
    assert torch.equal(out[[0, 2, 4]], clean[[0, 2, 4]])


def test_wrong_copy_is_refused(gen):
    w = random_int4_weight(40, 64, 32, "cpu", gen)
    a = randn((2, 64), torch.float32, "cpu", gen)
    bad = torch.zeros(ref.amx_rows_packed_bytes(40, 64, 32) - 1, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="packed.*amx_rows_packed_bytes"):
        _gemm(a, w, bad)
    with pytest.raises(RuntimeError, match="out.*amx_rows_packed_bytes"):
        torch.ops.decodekit.int4_amx_rows_pack(bad, w.qweight, w.scales, w.mins, 32)


def test_opcheck(gen):
    w = random_int4_weight(33, 64, 32, "cpu", gen)
    out = torch.empty(ref.amx_rows_packed_bytes(33, 64, 32), dtype=torch.uint8)
    torch.library.opcheck(torch.ops.decodekit.int4_amx_rows_pack.default, (out, w.qweight, w.scales, w.mins, 32))
    a = randn((3, 64), torch.float32, "cpu", gen)
    torch.library.opcheck(torch.ops.decodekit.int4_gemm.default,
                          (torch.empty(3, 33), a, w.qweight, w.scales, w.mins, 32, None, _packed(w)))


@needs_amx
def test_model_uses_the_copy(gguf_path, monkeypatch):
    """LlamaModel.prepare_packed_gemms gives every INT4 projection of a float32 CPU model its copy (the fused
    decoder_layer gets it as the 4th operand); DECODEKIT_CPU_AMX_ROWS=0 makes none."""
    from decodekit.loader import load_model
    from decodekit.models import LlamaModel
    lm = load_model(gguf_path, progress=False, keep_quantized=True)
    model = LlamaModel(lm.config, dict(lm.weights))
    ws = [w for L in model.layers for w in (L.qkv, L.o, L.gate_up, L.down)]
    assert ws and all("_amx_rows" in w.__dict__ and w.copy_only is not None for w in ws)
    assert all(len(w) == 4 for op in model.layer_operands for w in op[:4])
    assert "_amx_rows" in model.lm_head.__dict__  # the Q8_0 LM head's INT8 copy
    monkeypatch.setenv("DECODEKIT_CPU_AMX_ROWS", "0")
    model = LlamaModel(lm.config, dict(lm.weights))
    assert not any("_amx_rows" in w.__dict__ for L in model.layers for w in (L.qkv, L.o, L.gate_up, L.down))


# ---- INT8 (the LM head's Q8_0)

def _packed8(w):
    out = torch.full((ref.amx_rows_int8_packed_bytes(*w.shape, w.group_size),), 0xEE, dtype=torch.uint8)
    torch.ops.decodekit.int8_amx_rows_pack(out, w.qweight, w.scales, w.group_size)
    return out


def _gemm8(a, w, packed, bias=None):
    out = torch.full((a.shape[0], w.shape[0]), float("nan"), dtype=a.dtype)
    torch.ops.decodekit.int8_gemm(out, a, w.qweight, w.scales, w.group_size, bias, packed)
    return out


@pytest.mark.parametrize("N,K,G", [(1, 32, 32), (17, 64, 64), (33, 384, 128), (130, 576, 32)])
def test_int8_pack_matches_reference(N, K, G, gen):
    w = random_int8_weight(N, K, G, "cpu", gen)
    assert torch.equal(_packed8(w), ref.int8_amx_rows_pack(w.qweight, w.scales, G))


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M", list(range(1, 12)))
def test_int8_rows_match_the_exact_semantics(M, dtype, gen):
    N, K, G = 90 + M, 32 * (5 + M % 3), 32 << (M % 3)
    K = (K + G - 1) // G * G
    w = random_int8_weight(N, K, G, "cpu", gen)
    a, _ = strided_rows(M, K, dtype, "cpu", gen)
    a[0, :32] = 0.0
    bias = randn((N,), dtype, "cpu", gen) if M % 2 else None
    out = _gemm8(a, w, _packed8(w), bias)
    assert not out.isnan().any()
    frac, ulps = _agreement(out, _emulate(a, w, bias, dtype))
    assert frac >= 0.999 and ulps <= 1.0, f"{frac:.5f} of the outputs bitwise, {ulps:.2f} ulps"


@needs_amx
def test_int8_rows_do_not_depend_on_the_row_count(gen):
    w = random_int8_weight(200, 576, 32, "cpu", gen)
    packed = _packed8(w)
    a = randn((20, 576), torch.float32, "cpu", gen)
    full = _gemm8(a, w, packed)
    for m in range(1, 20):
        assert torch.equal(_gemm8(a[20 - m:].contiguous(), w, packed), full[20 - m:]), m


def test_int8_wrong_copy_is_refused(gen):
    w = random_int8_weight(40, 64, 32, "cpu", gen)
    a = randn((2, 64), torch.float32, "cpu", gen)
    with pytest.raises(RuntimeError, match="packed.*amx_rows_int8_packed_bytes"):
        _gemm8(a, w, torch.zeros(ref.amx_rows_int8_packed_bytes(40, 64, 32) + 64, dtype=torch.uint8))
    torch.library.opcheck(torch.ops.decodekit.int8_amx_rows_pack.default,
                          (torch.empty(ref.amx_rows_int8_packed_bytes(40, 64, 32), dtype=torch.uint8),
                           w.qweight, w.scales, 32))
