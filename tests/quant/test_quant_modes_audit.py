"""Audit of the load-time quantization modes (--quantization int4-rtn / int4-gptq / fp8, quantize_lm_head,
`decodekit quantize`) on tiny transformers-built checkpoints with awkward shapes (hidden 96 / 160 / 192, head_dim
24 / 64 / 80, intermediate 97 / 128 / 200, vocabulary 301, tied and untied, Qwen2 biases, Phi-3's fused qkv / gate_up).

The oracle is written here from the documented rules (numpy, float64; nothing of decodekit.quant):
  int4-rtn  per group of 32 along K: min = fp16(lo), scale = fp16(max((hi - lo) / 15, 1e-8)) (range taken in fp32,
            as the weights are), code = nearest of 0..15 to (w - min) / scale, w' = scale * q + min in fp32;
  Q8_0 head d = fp16(amax / 127), q = round(w / d) (int4-rtn on the CPU; the tied embedding with it);
  fp8       per output channel s = amax / 448 (1 for a zero row), code = e4m3(w / s) round to nearest even, saturated
            (own e4m3 table); activations the same per token.
Only exact ties (a value half way between two codes, where the float32 and float64 quotients may fall either side)
may differ from the engine's code.

Tolerances: the engine's logits against a float64 transformers model carrying the oracle's weights (and, for fp8, its
per-token activation rounding): float32 rounding only, as tests/models/test_arch_hf_audit.py (measured 1.7e-6 ..
3.3e-6 for int4-rtn; ATOL 2e-4), while the quantization itself moves the logits by 0.15 .. 0.56 (median over
positions) and a mutated oracle (RTN groups of 64 / per-row for 32, per-tensor fp8 scale) by 0.21 .. 0.87.
fp8 activations: the engine rounds its float32 activations, the oracle its float64 ones; a value within ~1e-6 of the
midpoint of two e4m3 codes can round either way (measured: the nearest at 3e-6 of a step) and one such flip moves
later logits by up to ~0.1, so for fp8 at least 90% of positions must be within ATOL (measured: all but 0 / 1 / 6 of
113, the largest 2.2e-2).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import warnings

import numpy as np
import pytest
import torch

from decodekit import LLM, SamplingParams, ops
from decodekit.models import LlamaModel
from decodekit.quant import Int4Weight, Int8Weight, quantize_rtn
from decodekit.quant.fp8 import Fp8Weight, quantize_fp8_weight
from decodekit.quant.gptq_quantizer import calibration_forward, gptq_quantize
from decodekit.quant.load import quantize_projections
from dk_testing import run_paged, tiny_hf_model

transformers = pytest.importorskip("transformers")

V = 301
ATOL = 2e-4
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")

# (id, transformers class prefix, config): hidden / head_dim / intermediate chosen awkward
MODELS = {
    "llama-tied-hd24-i97": ("Llama", dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                          intermediate_size=97, tie_word_embeddings=True)),
    "qwen2-bias-h160-hd80": ("Qwen2", dict(hidden_size=160, num_attention_heads=2, num_key_value_heads=1,
                                           intermediate_size=200)),
    "qwen3-tied-h192-hd64": ("Qwen3", dict(hidden_size=192, num_attention_heads=3, num_key_value_heads=1, head_dim=64,
                                           intermediate_size=128, tie_word_embeddings=True)),
    "phi3-fused-h96": ("Phi3", dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=4,
                                    intermediate_size=200, sliding_window=None)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """id -> (directory, float64 transformers model), built lazily."""
    from decodekit.tokenizer.builders import synthetic_backend
    cache = {}

    def get(mid: str):
        if mid not in cache:
            kind, kw = MODELS[mid]
            m = tiny_hf_model(kind, vocab_size=V, num_hidden_layers=2, max_position_embeddings=512,
                              initializer_range=0.06, bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
            d = str(tmp_path_factory.mktemp(mid))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.save_pretrained(d)
            synthetic_backend(V).save(os.path.join(d, "tokenizer.json"))
            cache[mid] = (d, m.double())
        return cache[mid]
    return get


# ---------------------------------------------------------------- the oracle

def rtn_oracle(w: torch.Tensor, G: int = 32):
    """(dequantized float64 [N, K], scale [N, K/G], min [N, K/G], (w - min) / scale) of the documented RTN."""
    wf = w.detach().float().numpy()
    N, K = wf.shape
    g = wf.reshape(N, K // G, G)
    lo, hi = g.min(-1), g.max(-1)
    s = np.maximum((hi - lo) / np.float32(15), np.float32(1e-8)).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (g.astype(np.float64) - m[..., None]) / s[..., None]
    q = np.nan_to_num(np.clip(np.rint(x), 0, 15))
    deq = (s[..., None] * q.astype(np.float32) + m[..., None]).astype(np.float64)
    return deq.reshape(N, K), s, m, x.reshape(N, K)


def q8_oracle(w: torch.Tensor, G: int = 32):
    """(dequantized float64 [N, K], w / d) of Q8_0: d = fp16(amax / 127), q = round(w / d)."""
    wf = w.detach().float().numpy().astype(np.float64)
    N, K = wf.shape
    g = wf.reshape(N, K // G, G)
    d = (np.abs(g).max(-1) / 127).astype(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(d[..., None] > 0, g / d[..., None], 0)
    q = np.clip(np.rint(x), -127, 127)
    return (q * d[..., None]).reshape(N, K), x.reshape(N, K)


def _e4m3_values() -> np.ndarray:   # the finite non-negative e4m3fn values, by code 0 .. 126 (127 is NaN)
    return np.array([(c & 7) / 8 * 2.0 ** -6 if c >> 3 == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7)
                     for c in range(127)])


E4M3 = _e4m3_values()


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Round to the nearest e4m3 value (ties to the even code), saturating at 448."""
    a = np.abs(x)
    i = np.clip(np.searchsorted(E4M3, np.minimum(a, 448.0)), 1, 126)
    lo, hi = E4M3[i - 1], E4M3[i]
    up = (a - lo > hi - a) | ((a - lo == hi - a) & ((i - 1) % 2 == 1))
    r = np.where(a >= 448, 448.0, np.where(up, hi, lo))
    return np.copysign(np.where(a == 0, 0.0, r), x)


def fp8_oracle(w: torch.Tensor, per_tensor: bool = False):
    """(codes float64 [N, K], scales float32 [N]) of per-output-channel fp8 (per_tensor: a mutation)."""
    wf = w.detach().float().numpy()
    amax = np.abs(wf).max(1)
    if per_tensor:
        amax = np.full_like(amax, amax.max())
    s = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    return to_e4m3((wf / s[:, None]).astype(np.float64)), s


def fake_fp8_act(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    return (torch.from_numpy(to_e4m3((xf / s).double().numpy())) * s.double()).to(x.dtype)


def oracle_model(ref, mode: str, head_int8: bool = False, rtn_group: int = 32, fp8_per_tensor: bool = False):
    """A copy of the float64 transformers model carrying the oracle's quantization: projections with K % 32 == 0;
    fp8 adds the per-token activation rounding; head_int8: Q8_0 head (and a tied embedding)."""
    r = copy.deepcopy(ref)
    with torch.no_grad():
        for name, mod in r.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in PROJ and mod.in_features % 32 == 0:
                if mode == "int4-rtn":   # (a mutated group that does not divide K: one group per row)
                    G = rtn_group if mod.in_features % rtn_group == 0 else mod.in_features
                    mod.weight.copy_(torch.from_numpy(rtn_oracle(mod.weight, G)[0]))
                else:
                    c, s = fp8_oracle(mod.weight, fp8_per_tensor)
                    mod.weight.copy_(torch.from_numpy(c * s[:, None].astype(np.float64)))
                    mod.register_forward_pre_hook(lambda m, a: (fake_fp8_act(a[0]),))
        if head_int8:
            r.lm_head.weight.copy_(torch.from_numpy(q8_oracle(r.lm_head.weight)[0]))
            r.model.embed_tokens.weight.copy_(r.lm_head.weight) if r.config.tie_word_embeddings else None
    return r


# ---------------------------------------------------------------- helpers

SEQS = [torch.randint(3, V, (n,), generator=torch.Generator().manual_seed(1)).tolist() for n in (40, 3, 70)]


def ref_logits(ref, seqs=SEQS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [ref(torch.tensor([s])).logits[0] for s in seqs]


def position_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(g.double() - w).abs().amax(-1) for g, w in zip(got, want)])


def float_parts(ref, li: int) -> dict[str, torch.Tensor]:
    """The float weights of layer li's fused projections (qkv, o, gate_up, down), rows stacked as LlamaModel does."""
    sd = {k: v.float() for k, v in ref.state_dict().items()}
    p = f"model.layers.{li}."

    def get(*names):
        return torch.cat([sd[p + n + ".weight"] for n in names])
    qkv = get("self_attn.qkv_proj") if p + "self_attn.qkv_proj.weight" in sd else \
        get("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    gate_up = get("mlp.gate_up_proj") if p + "mlp.gate_up_proj.weight" in sd else get("mlp.gate_proj", "mlp.up_proj")
    return {"qkv": qkv, "o": get("self_attn.o_proj"), "gate_up": gate_up, "down": get("mlp.down_proj")}


def llm(d: str, **kw) -> LLM:
    return LLM(d, kv_cache_memory="16MiB", **kw)


# ---------------------------------------------------------------- (a) packed weights == the oracle's

@pytest.mark.parametrize("mid", list(MODELS))
def test_int4_rtn_weights_and_head_equal_oracle(models, mid):
    d, ref = models(mid)
    m = llm(d, quantization="int4-rtn").engine.model
    for li, L in enumerate(m.layers):
        for n, w in float_parts(ref, li).items():
            got = getattr(L, n)
            if w.shape[1] % 32:                       # K = 97 / 200: documented to stay float
                assert isinstance(got, torch.Tensor) and torch.equal(got, w), (li, n)
                continue
            assert isinstance(got, Int4Weight) and got.group_size == 32 and got.perm is None, (li, n)
            want, s, mn, x = rtn_oracle(w)
            assert np.array_equal(got.scales.float().numpy(), s) and np.array_equal(got.mins.float().numpy(), mn)
            diff = ops.int4_dequantize(got).double().numpy() != want
            assert not (diff & (np.abs(np.abs(x - np.floor(x)) - 0.5) > 1e-6)).any(), (li, n, diff.sum())
    # the LM head (tied: the embedding with it) as Q8_0 on the CPU
    head = ref.lm_head.weight.float()
    assert isinstance(m.lm_head, Int8Weight) and m.lm_head.group_size == 32
    assert (m.embed is m.lm_head) == ref.config.tie_word_embeddings
    want, x = q8_oracle(head)
    diff = ops.int8_dequantize(m.lm_head).double().numpy() != want
    assert not (diff & (np.abs(np.abs(x - np.floor(x)) - 0.5) > 1e-6)).any(), diff.sum()
    emb = ops.int8_embedding(torch.arange(V), m.embed, torch.float32) if isinstance(m.embed, Int8Weight) else m.embed
    assert torch.equal(emb, ops.int8_dequantize(m.lm_head) if ref.config.tie_word_embeddings else
                       ref.model.embed_tokens.weight.float())
    plain = llm(d, quantization="int4-rtn", quantize_lm_head=False).engine.model
    assert torch.equal(plain.lm_head, head) and torch.equal(plain.embed, ref.model.embed_tokens.weight.float())


@pytest.mark.parametrize("mid", ["qwen2-bias-h160-hd80", "phi3-fused-h96", "qwen3-tied-h192-hd64"])
def test_fp8_weights_equal_oracle(models, mid):
    d, ref = models(mid)
    m = llm(d, quantization="fp8").engine.model
    assert isinstance(m.lm_head, torch.Tensor)         # fp8: the head stays float
    for li, L in enumerate(m.layers):
        for n, w in float_parts(ref, li).items():
            got = getattr(L, n)
            if w.shape[1] % 32:
                assert isinstance(got, torch.Tensor), (li, n)
                continue
            c, s = fp8_oracle(w)
            assert isinstance(got, Fp8Weight), (li, n)
            assert np.array_equal(got.scales.numpy(), s), (li, n)
            assert np.array_equal(got.qweight.double().numpy(), c), (li, n)


# ---------------------------------------------------------------- (b) logits: the oracle's model, and vs dense

@pytest.mark.parametrize("mode", ["int4-rtn", "fp8"])
@pytest.mark.parametrize("mid", ["llama-tied-hd24-i97", "qwen2-bias-h160-hd80", "phi3-fused-h96"])
def test_logits_equal_oracle_model(models, mid, mode):
    """Chunked prefill and decode steps (1..33-row GEMMs) of the quantized engine model against float64
    transformers carrying the oracle's quantization; a mutated oracle (RTN groups of 64, per-tensor fp8 scale) is
    far outside the tolerance, and the quantization itself moves the logits far more than the tolerance."""
    d, ref = models(mid)
    m = llm(d, quantization=mode).engine.model
    got = run_paged(m, SEQS)
    head = mode == "int4-rtn"
    err = position_errors(got, ref_logits(oracle_model(ref, mode, head_int8=head)))
    if mode == "int4-rtn":
        assert err.max() < ATOL, err.max().item()
    else:
        assert (err < ATOL).float().mean() >= 0.9, (err >= ATOL).sum().item()
        assert err.max() < 0.2, err.max().item()
    mutated = oracle_model(ref, mode, head_int8=head, rtn_group=64, fp8_per_tensor=True)
    assert position_errors(got, ref_logits(mutated)).median() > 50 * ATOL
    assert position_errors(got, ref_logits(ref)).median() > 0.05


# ---------------------------------------------------------------- fp8 edge rows, activations, dtypes

@pytest.mark.parametrize("dtype,rel", [(torch.float32, 1e-5), (torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)])
def test_fp8_linear_edge_rows_and_zero_activations(dtype, rel):
    """Weight rows: all zero (scale 1), one huge outlier (2e3 among 0.05s: the rest round into e4m3's subnormals),
    tiny (scale ~2e-33; fp16 outputs underflow to 0), a 500 spike over 1e-3s; activation rows all zero (scale 1:
    zeros out, no NaN) and ordinary; 1, 5 and 20 rows (the CPU's one-row, few-row and tiled fp8 paths). Against the
    oracle's codes in float64: the error is the accumulation's and the output's rounding (rel x (sum |a_k w_k| + the
    dtype's smallest normal); measured 2.7e-7 / 3.0e-3 / 4.3e-4 of the sum for float32 / bfloat16 / float16)."""
    g = torch.Generator().manual_seed(0)
    N, K = 40, 96
    w = torch.randn(N, K, generator=g) * 0.05
    w[3] = 0
    w[5, 7] = 2e3
    w[6] = 1e-30
    w[7] = 1e-3
    w[7, 0] = 500.0
    fw = quantize_fp8_weight(w)
    c, s = fp8_oracle(w)
    assert np.array_equal(fw.qweight.double().numpy(), c) and np.array_equal(fw.scales.numpy(), s)
    assert fw.scales[3] == 1 and torch.equal(fw.dequantize()[3], torch.zeros(K))
    wq = torch.from_numpy(c * s[:, None].astype(np.float64))
    for M, zero in ((1, True), (1, False), (5, True), (20, True)):
        x = (torch.randn(M, K, generator=g) * 3).to(dtype)
        if zero:
            x[0] = 0
        out = ops.linear(x, fw)
        assert out.dtype == dtype and torch.isfinite(out).all()
        if zero:
            assert torch.equal(out[0], torch.zeros(N, dtype=dtype))
        xq = fake_fp8_act(x.float()).double()
        want = xq @ wq.t()
        bound = rel * (xq.abs() @ wq.abs().t() + torch.finfo(dtype).smallest_normal)
        assert ((out.double() - want).abs() <= bound).all(), ((out.double() - want).abs() / bound).max().item()


def _damaged(tmp_path, src: str, name: str, value: float) -> str:
    from safetensors.torch import load_file, save_file
    d = str(tmp_path / "damaged")
    os.makedirs(d, exist_ok=True)
    for fn in os.listdir(src):
        if fn != "model.safetensors":
            with open(os.path.join(src, fn), "rb") as f, open(os.path.join(d, fn), "wb") as o:
                o.write(f.read())
    t = load_file(os.path.join(src, "model.safetensors"))
    t[name] = t[name].clone()
    t[name][3, 5] = value
    save_file(t, os.path.join(d, "model.safetensors"))
    return d


@pytest.mark.parametrize("mode", ["int4-rtn", "fp8", "int4-gptq"])
def test_non_finite_weight_refused_naming_it(models, tmp_path, mode):
    """A projection weight with an inf / NaN in the checkpoint: the loader refuses it naming the weight, before any
    quantization (documented in loader/_common.py: check_finite)."""
    from decodekit.loader import ModelLoadError
    d, _ = models("qwen2-bias-h160-hd80")
    bad = _damaged(tmp_path, d, "model.layers.0.mlp.up_proj.weight", float("nan") if mode == "fp8" else float("inf"))
    with pytest.raises(ModelLoadError, match=r"weight model\.layers\.0\.mlp\.up_proj\.weight holds 1 NaN / inf"):
        llm(bad, quantization=mode)


def test_gptq_non_finite_inputs_named():
    """GPTQ given non-finite calibration inputs (H) or weights (a model built from a weights dict, past the loader's
    check): was torch's LinAlgError "the input is not positive-definite" from Cholesky - one layer later for an inf
    weight, whose own quantization spread NaN along its rows silently. Now a ValueError naming the layer."""
    from decodekit.config import ModelConfig
    from decodekit.quant.gptq_quantizer import gptq_quantize_model
    H = torch.eye(64, dtype=torch.float64)
    H[2, 2] = float("nan")
    with pytest.raises(ValueError, match=r"gptq_quantize: H holds inf or NaN"):
        gptq_quantize(torch.randn(8, 64), H, 32)
    g = torch.Generator().manual_seed(0)
    h, i = 64, 96
    cfg = ModelConfig(vocab_size=V, hidden_size=h, intermediate_size=i, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256)
    w = {"model.embed_tokens.weight": torch.randn(V, h, generator=g), "model.norm.weight": torch.ones(h),
         "lm_head.weight": torch.randn(V, h, generator=g) * 0.1}
    for li in range(2):
        p = f"model.layers.{li}."
        for n, shape in (("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (32, h)), ("self_attn.v_proj", (32, h)),
                         ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)),
                         ("mlp.down_proj", (h, i))):
            w[p + n + ".weight"] = torch.randn(*shape, generator=g) * 0.1
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
    w["model.layers.0.mlp.up_proj.weight"][3, 5] = float("inf")
    model = LlamaModel(cfg, w)
    with pytest.raises(ValueError, match=r"GPTQ: layer 0 gate/up_proj: gptq_quantize: the weight holds inf or NaN"):
        gptq_quantize_model(model, lambda: calibration_forward(model, [list(range(3, 60))]), group_size=32)


_FLOAT32_REL: dict = {}   # (mode, kv cache dtype) -> the float32 engine's distance (computed once)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_models_match_float32_quantized(models, dtype):
    """bf16 / fp16 CPU engines with each mode (int4-rtn with an fp8 KV cache too; GPTQ in bf16): finite logits whose relative
    distance from the float64 model is the float32 engine's (the quantization's: 0.10 fp8 .. 0.32 GPTQ) within
    twice the dtype's own (the dense bf16 / fp16 engine's: 0.012 / 0.0014) + 0.01 (measured: within 0.0035);
    greedy generation runs."""
    d, ref = models("qwen3-tied-h192-hd64")
    dense = torch.cat(ref_logits(ref))

    def rel(**kw):
        e = llm(d, **kw)
        got = torch.cat(run_paged(e.engine.model, SEQS))
        assert torch.isfinite(got).all(), kw
        return e, ((got.double() - dense).norm() / dense.norm()).item()
    own = rel(dtype=dtype)[1]
    modes = (("int4-rtn", "fp8"), ("fp8", "auto")) + ((("int4-gptq", "auto"),) if dtype == "bfloat16" else ())
    for mode, kv in modes:
        e, r = rel(quantization=mode, dtype=dtype, kv_cache_dtype=kv)
        if (mode, kv) not in _FLOAT32_REL:
            _FLOAT32_REL[mode, kv] = rel(quantization=mode, kv_cache_dtype=kv)[1]
        r32 = _FLOAT32_REL[mode, kv]
        assert abs(r - r32) <= 2 * own + 0.01, (mode, r, r32, own)
        out = e.generate(["hello there"], SamplingParams(max_tokens=6, temperature=0))[0].outputs[0]
        assert len(out.token_ids) == 6


# ---------------------------------------------------------------- (c) `decodekit quantize` then reload

@pytest.mark.parametrize("mid,method", [("qwen2-bias-h160-hd80", "gptq"), ("qwen3-tied-h192-hd64", "gptq"),
                                        ("phi3-fused-h96", "rtn"), ("llama-tied-hd24-i97", "gptq")])
def test_quantize_cli_reload_identical(models, tmp_path, mid, method, capsys):
    """The CLI's directory reloads to the model --quantization builds at load (same logits bit for bit, same greedy
    tokens); GPTQ is deterministic; the group is the largest of 128 / 64 / 32 dividing every K (hidden 192: 64)."""
    from decodekit.cli import main
    d, _ = models(mid)
    out = str(tmp_path / "int4")
    assert main(["quantize", "--model", d, "--out", out, "--method", method]) == 0
    mode = "int4-gptq" if method == "gptq" else "int4-rtn"
    a = llm(d, quantization=mode, quantize_lm_head=False)
    b = llm(out)
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    assert qc["group_size"] == (64 if mid.startswith("qwen3") else 32)
    ma, mb = a.engine.model, b.engine.model
    for La, Lb in zip(ma.layers, mb.layers):
        for n in ("qkv", "o", "gate_up", "down"):
            wa, wb = getattr(La, n), getattr(Lb, n)
            assert type(wa) is type(wb), n
            if isinstance(wa, Int4Weight):
                assert (wa.perm is not None) == (method == "gptq")
                assert torch.equal(ops.int4_dequantize(wa), ops.int4_dequantize(wb)), n
    la = run_paged(ma, SEQS)
    assert all(torch.equal(x, y) for x, y in zip(la, run_paged(mb, SEQS)))
    sp = SamplingParams(max_tokens=8, temperature=0)
    tokens = [x.generate(["hello there"], sp)[0].outputs[0].token_ids for x in (a, b)]
    assert tokens[0] == tokens[1]
    if mid.startswith("qwen2"):   # GPTQ deterministic: a second engine quantizes to the same bytes
        again = llm(d, quantization=mode, quantize_lm_head=False).engine.model
        assert all(torch.equal(x, y) for x, y in zip(la, run_paged(again, SEQS)))


def test_quantize_cli_refuses_source_or_stale_output_dir(models, tmp_path, capsys):
    """`decodekit quantize --out` = --model: was config.json (now with quantization_config) and model.safetensors
    overwritten, then "... are the same file" copying tokenizer.json (exit 2), leaving a half-converted checkpoint.
    An --out holding a model.safetensors.index.json (an older sharded model): the loader read its shards and ignored
    the quantized model.safetensors. Both refused now before anything is written; re-running into an earlier output
    directory is allowed."""
    import hashlib
    import shutil
    from decodekit.cli import main
    d, _ = models("phi3-fused-h96")
    src = str(tmp_path / "src")
    shutil.copytree(d, src)

    def digest(p):
        return {f: hashlib.sha256(open(os.path.join(p, f), "rb").read()).hexdigest() for f in sorted(os.listdir(p))}
    before = digest(src)
    assert main(["quantize", "--model", src, "--out", src, "--method", "rtn"]) == 2
    assert "is the source model directory" in capsys.readouterr().err
    assert digest(src) == before
    out = str(tmp_path / "out")
    os.makedirs(out)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {}}, f)
    assert main(["quantize", "--model", src, "--out", out, "--method", "rtn"]) == 2
    assert "already holds other weight files (model.safetensors.index.json)" in capsys.readouterr().err
    os.remove(os.path.join(out, "model.safetensors.index.json"))
    for _ in range(2):   # a second run overwrites the first one's files
        assert main(["quantize", "--model", src, "--out", out, "--method", "rtn"]) == 0
    assert isinstance(llm(out).engine.model.layers[0].qkv, Int4Weight)


def test_save_quantized_packed_head_named(models, tmp_path):
    """save_quantized of an int4-rtn engine with quantize_lm_head on (the CPU default): was AttributeError
    ('Int8Weight' object has no attribute 'detach') for an untied head; now a ValueError naming quantize_lm_head."""
    from decodekit.quant.export import save_quantized
    for mid, what in (("qwen2-bias-h160-hd80", "LM head"), ("llama-tied-hd24-i97", "embedding")):
        d, _ = models(mid)
        with pytest.raises(ValueError, match=rf"the {what} is a packed Int8Weight.*quantize_lm_head=False"):
            save_quantized(llm(d, quantization="int4-rtn").engine.model, d, str(tmp_path / mid))


# ---------------------------------------------------------------- GPTQ on singular / degenerate Hessians

@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_singular_hessians(act_order):
    """K = 160 (five groups of 32, one 128-column block and a 32-column one); inputs collinear, fewer calibration
    tokens than K (rank 5), none at all (H = 0: every input dead). Finite, deterministic bit for bit, the act-order
    perm the inputs by decreasing H diagonal, and on the calibration inputs never worse than RTN (rank 5: far
    better)."""
    g = torch.Generator().manual_seed(0)
    N, K = 24, 160
    w = torch.randn(N, K, generator=g) * 0.05
    x = torch.randn(400, K, generator=g, dtype=torch.float64)
    col = x.clone()
    col[:, 10] = col[:, 11]
    col[:, 12] = 2 * col[:, 11]
    for name, xs, factor in (("collinear", col, 1.0), ("rank5", x[:5], 0.3), ("zero", torch.zeros(1, K,
                                                                                                  dtype=torch.float64),
                                                                            None)):
        H = xs.t() @ xs
        q = gptq_quantize(w, H, 32, act_order)
        q2 = gptq_quantize(w, H, 32, act_order)
        assert all(torch.equal(getattr(q, f), getattr(q2, f)) for f in ("qweight", "scales", "mins")), name
        d = ops.int4_dequantize(q)
        assert torch.isfinite(d).all(), name
        if act_order:
            assert torch.equal(torch.sort(q.perm).values, torch.arange(K))
            assert (torch.diff(torch.diag(H)[q.perm]) <= 0).all() or name == "zero"
        else:
            assert q.perm is None
        if factor is None:   # no input ever active: the weight is irrelevant, GPTQ zeroes it (as the reference does)
            assert torch.equal(d, torch.zeros(N, K))
            continue
        ref = xs @ w.double().t()
        err_g = (xs @ d.double().t() - ref).norm()
        err_r = (xs @ ops.int4_dequantize(quantize_rtn(w, 32)).double().t() - ref).norm()
        assert err_g <= factor * err_r * 1.001, (name, err_g.item(), err_r.item())


# ---------------------------------------------------------------- packed checkpoints (GGUF) with --quantization

def _write_gguf():
    spec = importlib.util.spec_from_file_location("_loader_conftest", os.path.join(os.path.dirname(__file__), "..",
                                                                                 "loader", "conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_gguf


def test_gguf_packed_projections_ignore_quantization(tmp_path, caplog):
    """GGUF Q4_1 / Q8_0 files (packed on the CPU): --quantization leaves the packed projections as they are (the
    logits of fp8 / int4-gptq are the plain engine's, bit for bit; int4-rtn only packs the float LM head as
    documented), and says so in the log. A file with Q4_0 q / k and an F16 v under fp8: was TypeError ("expected
    Tensor as element 2 ... got Fp8Weight") building the fused qkv; now v stays float and that qkv runs dense
    (the plain engine's logits)."""
    gguf = pytest.importorskip("gguf")
    from decodekit.loader import load_model
    Q = gguf.GGMLQuantizationType
    write_gguf = _write_gguf()
    src = load_model("random:tiny", progress=False)
    ids = [list(range(5, 40)), list(range(100, 130))]
    for name, qtype in (("mixed", lambda n: Q.F16 if "v_proj" in n else Q.Q4_0), ("q4_1", Q.Q4_1), ("q8_0", Q.Q8_0)):
        os.makedirs(tmp_path / name)
        path = write_gguf(str(tmp_path / name / "m.gguf"), src.config, dict(src.weights), qtype=qtype)
        plain = llm(path).engine.model
        want = calibration_forward(plain, ids)
        for mode in ("fp8", "int4-gptq", "int4-rtn"):
            if name == "mixed" and mode != "fp8":
                continue
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="decodekit"):
                m = llm(path, quantization=mode).engine.model
            got = calibration_forward(m, ids)
            if mode == "int4-rtn":   # projections untouched; the LM head (float in the file if Q4_1) packed Q8_0
                assert isinstance(m.lm_head, Int8Weight)
                for La, Lb in zip(m.layers, plain.layers):
                    for n in ("qkv", "o", "gate_up", "down"):
                        assert torch.equal(getattr(La, n).qweight, getattr(Lb, n).qweight), (name, n)
            else:
                assert torch.equal(got, want), (name, mode)
            if name == "mixed":
                assert isinstance(m.layers[0].qkv, torch.Tensor) and isinstance(m.layers[0].o, Int4Weight)
                assert "packed in another format" in caplog.text
            if mode != "int4-gptq":
                assert "already packed by the checkpoint" in caplog.text, (name, mode)


def test_quantize_projections_fused_siblings():
    """The rule of the fix above at the weights-dict level: a float part beside packed parts of another format stays
    float (fp8 beside INT4; int4-rtn beside act-order or 128-group INT4); beside INT4 groups of 32 int4-rtn packs it
    (the fused weight stays packed); an unknown method is refused."""
    g = torch.Generator().manual_seed(0)
    p = "model.layers.0."

    def weights(k):
        return {p + "self_attn.q_proj.weight": quantize_rtn(torch.randn(64, 128, generator=g), k),
                p + "self_attn.k_proj.weight": quantize_rtn(torch.randn(32, 128, generator=g), k),
                p + "self_attn.v_proj.weight": torch.randn(32, 128, generator=g),
                p + "mlp.gate_proj.weight": torch.randn(96, 128, generator=g),
                p + "mlp.up_proj.weight": torch.randn(96, 128, generator=g)}
    w = weights(32)
    quantize_projections(w, "fp8")
    assert isinstance(w[p + "self_attn.v_proj.weight"], torch.Tensor)
    assert isinstance(w[p + "mlp.gate_proj.weight"], Fp8Weight) and isinstance(w[p + "mlp.up_proj.weight"], Fp8Weight)
    w = weights(32)
    quantize_projections(w, "int4-rtn")
    assert isinstance(w[p + "self_attn.v_proj.weight"], Int4Weight)
    w = weights(128)
    quantize_projections(w, "int4-rtn")
    assert isinstance(w[p + "self_attn.v_proj.weight"], torch.Tensor)
    assert isinstance(w[p + "mlp.up_proj.weight"], Int4Weight)
    with pytest.raises(ValueError, match="method must be 'int4-rtn' or 'fp8'"):
        quantize_projections(weights(32), "int4-gptq")


def test_unsupported_options_named(models, capsys):
    d, _ = models("phi3-fused-h96")
    for kw, msg in ((dict(quantization="int4"), r"quantization must be one of None, int4-rtn, int4-gptq, fp8; got "
                                                r"'int4'"),
                    (dict(quantization="FP8"), r"quantization must be one of .*got 'FP8'"),
                    (dict(quantize_lm_head="no"), r"quantize_lm_head must be a bool"),
                    (dict(quantization="int4-gptq", tensor_parallel_size=2),
                     r"'int4-gptq' .* tensor_parallel_size > 1"),
                    (dict(weight_format="int4"), r"weight_format must be one of auto, packed, dequantized")):
        with pytest.raises(ValueError, match=msg):
            llm(d, **kw)
    from decodekit.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--model", d, "--quantization", "int8", "x"])
    import re
    assert re.search(r"--quantization: invalid choice: 'int8' \(choose from '?int4-rtn'?, '?int4-gptq'?, '?fp8'?\)",
                     capsys.readouterr().err)


def test_fused_projection_of_fp8_and_other_parts_runs_dense():
    """LlamaModel's fused q/k/v of an fp8 part beside an INT4 and a float part: one dense weight of the parts'
    decoded values (was: TypeError in torch.cat on the Fp8Weight)."""
    from decodekit.loader.random import random_model
    from decodekit.models import LlamaModel
    from decodekit.quant import quantize_rtn
    from decodekit.quant.fp8 import quantize_fp8_weight
    cfg, weights, _ = random_model("tiny", progress_bar=False)
    p = "model.layers.0.self_attn."
    q, k, v = (weights[p + f"{n}_proj.weight"] for n in "qkv")
    weights[p + "q_proj.weight"], weights[p + "k_proj.weight"] = quantize_fp8_weight(q), quantize_rtn(k, 32)
    m = LlamaModel(cfg, dict(weights))
    want = torch.cat([quantize_fp8_weight(q).dequantize(torch.float32), ops.int4_dequantize(quantize_rtn(k, 32),
                                                                                            torch.float32), v])
    assert isinstance(m.layers[0].qkv, torch.Tensor) and torch.equal(m.layers[0].qkv, want)
