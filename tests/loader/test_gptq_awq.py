"""4-bit GPTQ (incl. act-order) and AWQ checkpoints: the converters against a float64 dequantization
written here from the formats' definitions (independent packing code), exact round trips, and a
GPTQ / AWQ Hugging Face directory loaded end to end and compared with HF transformers running
the dequantized weights."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from dk_testing import save_hf_dir
from decodekit import ops
from decodekit.loader import ModelLoadError, load_model
from decodekit.models import LlamaModel
from decodekit.quant import Int4Weight, from_awq, from_gptq, to_awq, to_gptq
from decodekit.quant.gptq_quantizer import calibration_forward

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., 8] values 0..15 -> int32 words, nibble j at bits 4j (two's complement wrap)."""
    w = torch.zeros(nibbles.shape[:-1], dtype=torch.int64)
    for j in range(8):
        w |= nibbles[..., j].to(torch.int64) << (4 * j)
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


def gptq_pack(codes, zeros, scales, g_idx, v1=True):
    """codes [N, K] (0..15), zeros [Gn, N] (the zero points), scales [Gn, N] -> GPTQ tensors."""
    N, K = codes.shape
    qweight = _words(codes.t().reshape(K // 8, 8, N).permute(0, 2, 1))        # [K/8, N]: inputs 8i..8i+7
    z = zeros - 1 if v1 else zeros
    qzeros = _words(z.reshape(z.shape[0], N // 8, 8))                            # [Gn, N/8]
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.half(), "g_idx": g_idx.to(torch.int32)}


def awq_pack(codes, zeros, scales):
    """codes [N, K], zeros [Gn, N], scales [Gn, N] -> AWQ GEMM tensors (columns interleaved)."""
    N, K = codes.shape
    def pack(x):  # [R, N] -> [R, N/8], nibble j = column 8i + AWQ_ORDER[j]
        return _words(x.reshape(x.shape[0], N // 8, 8)[:, :, AWQ_ORDER])
    return {"qweight": pack(codes.t().contiguous()), "qzeros": pack(zeros), "scales": scales.half()}


def dequant(codes, zeros, scales, g_idx):
    """float64 W[n, k] = scales[g, n] * (code - zero[g, n]), g = g_idx[k]."""
    g = g_idx.long()
    return scales.double()[g].t() * (codes.double() - zeros.double()[g].t())


def _random_layer(N, K, group, gen, act_order, zmax=15, zmin=0):
    Gn = K // group
    codes = torch.randint(0, 16, (N, K), generator=gen)
    zeros = torch.randint(zmin, zmax + 1, (Gn, N), generator=gen)
    scales = (torch.rand(Gn, N, generator=gen) * 0.02 + 1e-3).half()
    g_idx = torch.arange(K) // group
    if act_order:
        g_idx = g_idx[torch.randperm(K, generator=gen)]
    return codes, zeros, scales, g_idx


def _check_weight(w: Int4Weight, ref: torch.Tensor, zeros, scales, g_idx):
    got = ops.int4_dequantize(w, torch.float32).double()
    # the one rounding: min = -(scale * zero) stored in fp16 (half an fp16 ulp of |scale * zero|)
    g = g_idx.long()
    bound = (scales.double() * zeros.double())[g].t().abs() * 2 ** -11 + 1e-7
    assert ((got - ref).abs() <= bound).all(), (got - ref).abs().max()
    x = torch.randn(7, ref.shape[1], dtype=torch.float32)
    y = ops.linear(x, w).double()
    want = x.double() @ ref.t()
    tol = (x.double().abs() @ bound.t()) + 1e-4 * (x.double().abs() @ ref.abs().t())  # + fp32 accumulation
    assert ((y - want).abs() <= tol).all(), (y - want).abs().max()


@pytest.mark.parametrize("group", [32, 64, 128, 256, -1])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_convert(group, act_order, fmt):
    gen = torch.Generator().manual_seed(group * 7 + act_order)
    N, K = 40, 512
    grp = K if group == -1 else group
    v1 = fmt == "gptq"
    codes, zeros, scales, g_idx = _random_layer(N, K, grp, gen, act_order, zmax=16 if v1 else 15, zmin=1 if v1 else 0)
    t = gptq_pack(codes, zeros, scales, g_idx, v1=v1)
    w = from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"] if act_order or group > 0 else None, group, fmt)
    assert w.shape == (N, K) and w.group_size == min(128, grp)
    assert (w.perm is not None) == (act_order and grp < K)  # one group: any order is the same
    _check_weight(w, dequant(codes, zeros, scales, g_idx), zeros, scales, g_idx)
    if v1:  # exact round trip
        back = to_gptq(w, grp)
        for k in ("qweight", "qzeros", "scales", "g_idx"):
            assert torch.equal(back[k], t[k]), k


@pytest.mark.parametrize("group", [32, 128, -1])
def test_awq_convert(group):
    gen = torch.Generator().manual_seed(3 + group)
    N, K = 48, 256
    grp = K if group == -1 else group
    codes, zeros, scales, g_idx = _random_layer(N, K, grp, gen, False)
    t = awq_pack(codes, zeros, scales)
    w = from_awq(t["qweight"], t["qzeros"], t["scales"], group)
    _check_weight(w, dequant(codes, zeros, scales, g_idx), zeros, scales, g_idx)
    back = to_awq(w, grp)
    for k in ("qweight", "qzeros", "scales"):
        assert torch.equal(back[k], t[k]), k


def test_convert_errors():
    gen = torch.Generator().manual_seed(0)
    codes, zeros, scales, g_idx = _random_layer(16, 128, 32, gen, False, zmin=1, zmax=16)
    t = gptq_pack(codes, zeros, scales, g_idx)
    with pytest.raises(ValueError, match="scales: expected shape"):
        from_gptq(t["qweight"], t["qzeros"], t["scales"][:2], None, 32)
    with pytest.raises(ValueError, match="group_size 48 does not divide"):
        from_gptq(t["qweight"], t["qzeros"], t["scales"], None, 48)
    bad = t["g_idx"].clone(); bad[0] = 1  # group 1 gets 33 features, group 0 31
    with pytest.raises(ValueError, match="exactly 32 input features"):
        from_gptq(t["qweight"], t["qzeros"], t["scales"], bad, 32)
    with pytest.raises(ValueError, match="g_idx values must lie in"):
        from_gptq(t["qweight"], t["qzeros"], t["scales"], torch.full((128,), 9, dtype=torch.int32), 32)
    with pytest.raises(ValueError, match="must be int32"):
        from_gptq(t["qweight"].long(), t["qzeros"], t["scales"], None, 32)
    with pytest.raises(ValueError, match="checkpoint_format"):
        from_gptq(t["qweight"], t["qzeros"], t["scales"], None, 32, "marlin")


def test_act_order_fused_rows():
    """Fused q/k/v (same input, same act-order perm) stay packed; different perms cannot be fused."""
    gen = torch.Generator().manual_seed(5)
    codes, zeros, scales, g_idx = _random_layer(16, 64, 32, gen, True, zmin=1, zmax=16)
    t = gptq_pack(codes, zeros, scales, g_idx)
    a = from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 32)
    fused = Int4Weight.cat([a, a])
    assert torch.equal(fused.perm, a.perm)
    ref = dequant(codes, zeros, scales, g_idx)
    x = torch.randn(3, 64)
    torch.testing.assert_close(ops.linear(x, fused).double(), (x.double() @ torch.cat([ref, ref]).t()), atol=2e-3,
                               rtol=0)
    other = from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"].flip(0), 32)
    with pytest.raises(ValueError, match="same input order"):
        Int4Weight.cat([a, other])


# ---------------------------------------------------------------- end to end: HF directories

transformers = pytest.importorskip("transformers")
_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")


def _quantized_dir(tmp_path, hf_tok, method: str, act_order: bool):
    """A tiny Llama whose projections are 4-bit (RTN codes of its random weights) in `method`'s
    checkpoint format; returns (dir, HF model with the dequantized float64->fp32 weights)."""
    from safetensors.torch import save_file
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(11)
    group = 32
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("inv_freq")}
    tensors = {}
    for i in range(cfg.num_hidden_layers):
        perms = {}
        for proj in _PROJ:
            name = f"model.layers.{i}.{proj}"
            w = state.pop(name + ".weight").double()
            N, K = w.shape
            # q/k/v share their input (one act-order perm), gate/up too
            key = "qkv" if proj in _PROJ[:3] else "gu" if proj in _PROJ[4:6] else proj
            g_idx = torch.arange(K) // group
            if act_order:
                perms.setdefault(key, torch.randperm(K, generator=gen))
                g_idx = g_idx[perms[key]]
            Gn = K // group
            wg = torch.stack([w[:, g_idx == g] for g in range(Gn)])           # [Gn, N, group]
            lo, hi = wg.amin(2).clamp(max=0), wg.amax(2).clamp(min=0)
            scales = ((hi - lo) / 15).clamp(min=1e-6).half()                  # [Gn, N]
            zmin = 1 if method == "gptq" else 0
            zeros = torch.round(-lo / scales.double()).clamp(zmin, 15).long()  # [Gn, N]
            codes = torch.empty(N, K, dtype=torch.long)
            for g in range(Gn):
                cols = (g_idx == g).nonzero().flatten()
                codes[:, cols] = torch.round(w[:, cols] / scales[g].double()[:, None] + zeros[g][:, None]).clamp(0, 15).long()
            parts = gptq_pack(codes, zeros, scales, g_idx) if method == "gptq" else awq_pack(codes, zeros, scales)
            if method == "gptq" and not act_order:
                parts.pop("g_idx")  # optional for plain GPTQ
            for k, v in parts.items():
                tensors[f"{name}.{k}"] = v.contiguous()
            with torch.no_grad():
                model.get_submodule(name).weight.copy_(dequant(codes, zeros, scales, g_idx).float())
    tensors.update({k: v.contiguous() for k, v in state.items()})
    d = tmp_path / f"{method}{'-act' if act_order else ''}"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    raw = json.loads(cfg.to_json_string())
    raw["architectures"] = ["LlamaForCausalLM"]
    raw["quantization_config"] = ({"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                                   "sym": False, "checkpoint_format": "gptq"} if method == "gptq" else
                                  {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                   "version": "gemm"})
    (d / "config.json").write_text(json.dumps(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_tok.save_pretrained(d)
    return str(d), model


def _prefill_logits(m, ids):
    return calibration_forward(LlamaModel(m.config, dict(m.weights)), [ids])


@pytest.mark.parametrize("method,act_order", [("gptq", False), ("gptq", True), ("awq", False)])
def test_quantized_hf_dir_matches_hf(tmp_path, hf_tok, method, act_order):
    d, hf = _quantized_dir(tmp_path, hf_tok, method, act_order)
    ids = torch.randint(0, 49152, (23,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float()
    for packed in (True, False):
        m = load_model(d, progress=False, keep_quantized=packed)
        w = m.weights["model.layers.1.self_attn.q_proj.weight"]
        assert isinstance(w, Int4Weight) == packed
        if packed:
            assert (w.perm is not None) == act_order
        got = _prefill_logits(m, ids)
        # the fp16 rounding of min = -scale * zero (<= 2^-11 relative) is the only difference
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_quantized_hf_dir_errors(tmp_path, hf_tok):
    d, _ = _quantized_dir(tmp_path, hf_tok, "gptq", False)
    raw = json.loads(open(os.path.join(d, "config.json")).read())
    for patch, msg in [({"bits": 8}, "only 4-bit GPTQ"), ({"quant_method": "bitsandbytes"}, "quant_method"),
                       ({"group_size": 48}, "group_size = 48"), ({"checkpoint_format": "marlin"}, "checkpoint_format")]:
        bad = dict(raw, quantization_config=dict(raw["quantization_config"], **patch))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(bad, f)
        with pytest.raises(ModelLoadError, match=msg):
            load_model(d, progress=False)


def test_engine_int4_gptq_at_load(tmp_path, hf_tok):
    """--quantization int4-gptq: a float checkpoint's projections GPTQ-quantized at load (act-order,
    calibrated on built-in text), then served by the engine like any packed model."""
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).eval()
    d = save_hf_dir(model, hf_tok, str(tmp_path / "float"))
    llm = LLM(d, dtype="float32", device="cpu", kv_cache_memory="64MiB", quantization="int4-gptq")
    L = llm.engine.model.layers[1]
    assert all(isinstance(getattr(L, n), Int4Weight) for n in ("qkv", "o", "gate_up", "down"))
    assert L.qkv.perm is not None and L.qkv.group_size == 64
    out = llm.generate(["Hello, my name is", "1, 2, 3,"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)


@pytest.mark.parametrize("method", ["gptq", "rtn"])
def test_quantize_cli_saves_and_reloads_exactly(tmp_path, hf_tok, method):
    """`decodekit quantize` writes a decodekit-int4 directory; loading it gives back exactly the
    engine's quantized weights (and the same logits), without quantizing again."""
    from decodekit import LLM
    from decodekit.cli import main
    torch.manual_seed(1)
    cfg = transformers.Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg).eval()  # q/k/v biases: saved as float tensors
    src, out = save_hf_dir(model, hf_tok, str(tmp_path / "float")), str(tmp_path / "int4")
    assert main(["quantize", "--model", src, "--method", method, "--out", out]) == 0
    raw = json.loads(open(os.path.join(out, "config.json")).read())
    assert raw["quantization_config"]["quant_method"] == "decodekit-int4"
    ref = LLM(src, dtype="float32", device="cpu", kv_cache_memory="64MiB", quantize_lm_head=False,
              quantization="int4-gptq" if method == "gptq" else "int4-rtn").engine.model
    m = load_model(out, progress=False, keep_quantized=True)
    got = LlamaModel(m.config, dict(m.weights))
    for La, Lb in zip(ref.layers, got.layers):
        for n in ("qkv", "o", "gate_up", "down"):
            a, b = getattr(La, n), getattr(Lb, n)
            assert isinstance(b, Int4Weight) and torch.equal(a.qweight, b.qweight) and torch.equal(a.scales, b.scales)
            assert torch.equal(a.mins, b.mins) and (a.perm is None) == (b.perm is None)
            if a.perm is not None:
                assert torch.equal(a.perm, b.perm)
        assert torch.equal(La.qkv_bias, Lb.qkv_bias)
    ids = [list(range(100, 140))]
    assert torch.equal(calibration_forward(ref, ids), calibration_forward(got, ids))
    # and through the engine, from the directory
    llm = LLM(out, dtype="float32", device="cpu", kv_cache_memory="64MiB")
    assert isinstance(llm.engine.model.layers[0].down, Int4Weight)
    with pytest.raises(SystemExit):
        main(["quantize", "--model", src])  # --out is required
