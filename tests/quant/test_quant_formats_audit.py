"""Black-box / differential audit of quantized checkpoints: small Llama / Qwen2 / Qwen3 / Phi-3 directories written
here in the GPTQ (auto-gptq v1, gptqmodel v2), AWQ (AutoAWQ GEMM) and decodekit-int4 formats, loaded through
decodekit.loader, and compared with a float64 dequantization written here from the formats' definitions (its own
numpy packer: nothing of decodekit.quant is the oracle). Also: the quantizers (RTN against an independent
nearest-code search, GPTQ against RTN) and the refusals of formats decodekit does not read.

Tolerance of a dequantized weight against the oracle (float64 scale * (code - zero), scale the fp16 stored one):
Int4Weight stores min = -scale * zero rounded once to fp16 (<= 2^-11 |scale * zero|) and decodes scale * q + min in
fp32 (one rounding, <= 2^-24 |w| each), so |got - want| <= 2^-11 |s z| + 2^-23 (|s q| + |s z|)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from decodekit import ops
from decodekit.loader import ModelLoadError, load_model
from decodekit.models import LlamaModel
from decodekit.quant import Int4Weight, from_awq, from_gptq, quantize_rtn, to_awq, to_gptq
from decodekit.quant.export import save_quantized
from decodekit.quant.gptq_quantizer import calibration_forward, gptq_quantize

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # AutoAWQ: nibble j of a word holds column 8i + AWQ_ORDER[j]


# ---------------------------------------------------------------- the oracle: packing and dequantization

def _words(nib: np.ndarray) -> torch.Tensor:
    """[..., 8] codes 0..15 -> int32 words, element j in bits 4j..4j+3 (uint64 arithmetic, then reinterpreted)."""
    nib = np.asarray(nib, dtype=np.uint64)
    w = np.zeros(nib.shape[:-1], dtype=np.uint64)
    for j in range(8):
        w += nib[..., j] << np.uint64(4 * j)
    return torch.from_numpy(w.astype(np.uint32).view(np.int32).copy())


def gptq_tensors(codes, zeros, scales, g_idx, v2=False) -> dict:
    """codes [N, K], real zero points [Gn, N], scales [Gn, N], g_idx [K] -> auto-gptq's tensors: qweight [K/8, N]
    packed along K, qzeros [Gn, N/8] packed along N holding zero - 1 (v1; gptq_v2: the zero itself)."""
    N, K = codes.shape
    z = (np.asarray(zeros) - (0 if v2 else 1)) & 15
    return {"qweight": _words(codes.T.reshape(K // 8, 8, N).transpose(0, 2, 1)),
            "qzeros": _words(z.reshape(z.shape[0], N // 8, 8)),
            "scales": torch.from_numpy(scales.astype(np.float16)),
            "g_idx": torch.from_numpy(np.asarray(g_idx, dtype=np.int32))}


def awq_tensors(codes, zeros, scales) -> dict:
    """AutoAWQ GEMM: qweight [K, N/8], qzeros [Gn, N/8], both with the interleaved column order; scales [Gn, N]."""
    N, K = codes.shape

    def pack(x):
        return _words(np.asarray(x).reshape(x.shape[0], N // 8, 8)[:, :, AWQ_ORDER])
    return {"qweight": pack(codes.T), "qzeros": pack(zeros), "scales": torch.from_numpy(scales.astype(np.float16))}


def dequant(codes, zeros, scales, g_idx) -> torch.Tensor:
    """float64 W[n, k] = scales[g, n] * (codes[n, k] - zeros[g, n]), g = g_idx[k]."""
    g = np.asarray(g_idx, dtype=np.int64)
    s = scales.astype(np.float16).astype(np.float64)
    return torch.from_numpy(s[g].T * (codes.astype(np.float64) - np.asarray(zeros, dtype=np.float64)[g].T))


def bound(codes, zeros, scales, g_idx) -> torch.Tensor:
    g = np.asarray(g_idx, dtype=np.int64)
    s = scales.astype(np.float16).astype(np.float64)[g].T
    sz, sq = np.abs(s * np.asarray(zeros, dtype=np.float64)[g].T), np.abs(s * codes)
    return torch.from_numpy(sz * 2.0 ** -11 + (sq + sz) * 2.0 ** -23 + 1e-12)


def rand_layer(N, K, group, rng, act=False, sym=False, zeros=(0, 15)):
    """Random codes / zeros / fp16 scales of a layer; act: a shuffled g_idx (desc_act), sym: zero 8 (auto-gptq)."""
    grp = K if group == -1 else group
    Gn = K // grp
    codes = rng.integers(0, 16, (N, K))
    z = np.full((Gn, N), 8) if sym else rng.integers(zeros[0], zeros[1] + 1, (Gn, N))
    scales = (rng.random((Gn, N)) * 0.02 + 1e-3).astype(np.float16)
    g_idx = np.arange(K) // grp
    if act:
        g_idx = g_idx[rng.permutation(K)]
    return codes, z, scales, g_idx


def check_weight(got: torch.Tensor, layer, what: str = "") -> None:
    want, tol = dequant(*layer), bound(*layer)
    err = (got.double() - want).abs()
    assert (err <= tol).all(), f"{what}: max error {err.max().item():.3g} (x{(err / tol).max().item():.2f} the bound)"


# ---------------------------------------------------------------- checkpoint directories

def write_dir(d, config: dict, tensors: dict, shards: int = 1, extra_files: dict | None = None) -> str:
    from decodekit.tokenizer.builders import synthetic_backend
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write(synthetic_backend(config["vocab_size"]).to_str())
    for fn, obj in (extra_files or {}).items():
        with open(os.path.join(d, fn), "w") as f:
            json.dump(obj, f)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, os.path.join(d, "model.safetensors"))
        return str(d)
    names, weight_map = sorted(tensors), {}
    for s in range(shards):   # every s-th name: a layer's qweight / qzeros / scales / g_idx land in different shards
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[s::shards]}
        save_file(part, os.path.join(d, fn))
        weight_map.update(dict.fromkeys(part, fn))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return str(d)


def llama_cfg(arch="LlamaForCausalLM", tie=False, **kw) -> dict:
    c = dict(architectures=[arch], vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=256, tie_word_embeddings=tie)
    c.update(kw)
    return c


_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")


def quantized_model(cfg: dict, method: str, group: int, rng, act=False, v2=False, sym=False, skip=(),
                    quant_head=False, fused=False, bias=None):
    """(tensors, layers, floats): a checkpoint whose projections are `method`-packed random codes; layers: {HF weight
    name: (codes, zeros, scales, g_idx) of its rows} for the oracle; floats: {name: tensor} of the float ones.
    skip: (layer, proj) kept float (AWQ's modules_to_not_convert); fused: Phi-3's qkv_proj / gate_up_proj packed
    whole (one act-order g_idx each); bias: std of Qwen2's q/k/v biases (None: GPTQ's all-zero biases)."""
    h, inter, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    T, layers, floats = {}, {}, {}

    def quant(name, N, K):
        z = (1, 16) if method == "gptq" and not v2 else (0, 15)   # v1 stores zero - 1 in 4 bits
        layer = rand_layer(N, K, group, rng, act, sym, z)
        t = gptq_tensors(*layer, v2=v2) if method == "gptq" else awq_tensors(*layer[:3])
        if method == "gptq" and not act and len(T) % 2:
            del t["g_idx"]            # optional when trivial
        T.update({f"{name}.{k}": v for k, v in t.items()})
        return layer

    def rows(layer, a, b):
        c, z, s, g = layer
        return c[a:b], z[:, a:b], s[:, a:b], g

    def put_float(name, t):
        T[name] = floats[name] = t

    put_float("model.embed_tokens.weight", torch.randn(V, h) * 0.1)
    put_float("model.norm.weight", 1 + 0.1 * torch.randn(h))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put_float(p + "input_layernorm.weight", 1 + 0.1 * torch.randn(h))
        put_float(p + "post_attention_layernorm.weight", 1 + 0.1 * torch.randn(h))
        shapes = dict(zip(_PROJ, [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]))
        if fused:
            for whole, parts in (("self_attn.qkv_proj", _PROJ[:3]), ("mlp.gate_up_proj", _PROJ[4:6])):
                layer = quant(p + whole, sum(shapes[n][0] for n in parts), h)
                a = 0
                for n in parts:
                    b = a + shapes.pop(n)[0]
                    layers[p + n + ".weight"] = rows(layer, a, b)
                    a = b
        for n, (N, K) in shapes.items():
            if (i, n) in skip:
                put_float(p + n + ".weight", torch.randn(N, K) * 0.05)
            else:
                layers[p + n + ".weight"] = quant(p + n, N, K)
            if bias is not None and n in _PROJ[:3]:
                put_float(p + n + ".bias", torch.randn(N) * bias)
            elif method == "gptq" and bias is None and (i, n) not in skip:
                T[p + n + ".bias"] = torch.zeros(N, dtype=torch.float16)   # auto-gptq writes zero biases
    if not cfg["tie_word_embeddings"]:
        if quant_head:
            layers["lm_head.weight"] = quant("lm_head", V, h)
        else:
            put_float("lm_head.weight", torch.randn(V, h) * 0.1)
    return T, layers, floats


def qconfig(method, group, act=False, v2=False, **kw) -> dict:
    if method == "gptq":   # as auto-gptq / gptqmodel write it (true_sequential, damp_percent ...: ignored)
        d = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act, "sym": False,
             "true_sequential": True, "damp_percent": 0.01, "static_groups": False, "lm_head": False,
             "checkpoint_format": "gptq_v2" if v2 else "gptq", "meta": {"quantizer": ["audit"]}}
    else:
        d = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    d.update(kw)
    return d


def _logits(weights: dict, cfg) -> torch.Tensor:
    return calibration_forward(LlamaModel(cfg, dict(weights)), [list(range(3, 40)), list(range(100, 117))])


# ---------------------------------------------------------------- loader: GPTQ / AWQ against the oracle

CASES = {   # name: (config overrides, quantized_model arguments, quantization_config overrides, shards)
    "gptq_g32": ({}, dict(method="gptq", group=32), {}, 1),
    "gptq_act_sharded": ({}, dict(method="gptq", group=32, act=True), {}, 3),
    "gptq_v2_act": ({}, dict(method="gptq", group=32, act=True, v2=True), {}, 1),
    "gptq_sym": ({}, dict(method="gptq", group=32, sym=True), {"sym": True}, 1),
    "gptq_per_channel_act": ({}, dict(method="gptq", group=-1, act=True), {}, 1),
    "gptq_tied": (dict(tie=True), dict(method="gptq", group=32), {}, 1),
    "gptq_quantized_head": ({}, dict(method="gptq", group=32, quant_head=True), {"lm_head": True}, 1),
    "awq_g32": ({}, dict(method="awq", group=32), {}, 1),
    "awq_not_converted": ({}, dict(method="awq", group=32, skip={(0, "mlp.down_proj"), (1, "self_attn.k_proj")}),
                          {"modules_to_not_convert": ["down_proj"]}, 2),
    "qwen2_gptq_bias_act": (dict(arch="Qwen2ForCausalLM"), dict(method="gptq", group=32, act=True, bias=0.1), {}, 1),
    "phi3_gptq_fused_act": (dict(arch="Phi3ForCausalLM"), dict(method="gptq", group=32, act=True, fused=True), {}, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_checkpoint_matches_oracle(tmp_path, case):
    cfg_kw, model_kw, qc_kw, shards = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    torch.manual_seed(len(case))
    cfg = llama_cfg(**cfg_kw)
    T, layers, floats = quantized_model(cfg, rng=rng, **model_kw)
    cfg["quantization_config"] = qconfig(model_kw["method"], model_kw["group"], model_kw.get("act", False),
                                         model_kw.get("v2", False), **qc_kw)
    d = write_dir(tmp_path / case, cfg, T, shards)
    m = load_model(d, progress=False)
    assert set(m.weights) == set(layers) | set(floats)
    for name, layer in layers.items():
        check_weight(m.weights[name], layer, name)
    for name, t in floats.items():
        assert torch.equal(m.weights[name], t.float()), name
    packed = load_model(d, progress=False, keep_quantized=True)
    for name in layers:
        w = packed.weights[name]
        assert isinstance(w, Int4Weight), name
        assert (w.perm is not None) == (model_kw.get("act", False) and model_kw["group"] != -1), name
    # the packed model through the INT4 kernels == the dequantized one (fp32 accumulation order apart) ...
    got = _logits(packed.weights, packed.config)
    torch.testing.assert_close(got, _logits(m.weights, m.config), atol=2e-5, rtol=2e-5)
    # ... and near the oracle's dense model: each weight is off by <= 2^-11 |scale * zero| (the fp16 min), which
    # through two layers of these random weights measures ~2^-10 of the logits' norm (sym: 0, its min is exact); a
    # wrong nibble order, zero offset or g_idx gives O(1)
    dense = {**{k: v.float() for k, v in floats.items()}, **{k: dequant(*v).float() for k, v in layers.items()}}
    want = _logits(dense, m.config)
    assert ((got - want).norm() / want.norm()).item() < 4e-3


def test_quantize_config_json_and_autoawq_quant_config_json(tmp_path):
    """auto-gptq's quantize_config.json (no quant_method: GPTQ) and AutoAWQ's older quant_config.json ({w_bit,
    q_group_size, zero_point, version}: AWQ, as vLLM reads it) announce the format when config.json does not (the
    latter was an 'unexpected tensor ...qweight' error)."""
    rng = np.random.default_rng(0)
    for method, fn, qc in [("gptq", "quantize_config.json",
                            {"bits": 4, "group_size": 32, "desc_act": False, "sym": False, "damp_percent": 0.01,
                             "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model"}),
                           ("awq", "quant_config.json", {"zero_point": True, "q_group_size": 32, "w_bit": 4,
                                                         "version": "GEMM"})]:
        cfg = llama_cfg()
        T, layers, _ = quantized_model(cfg, method, 32, rng)
        m = load_model(write_dir(tmp_path / method, cfg, T, extra_files={fn: qc}), progress=False)
        for name, layer in layers.items():
            check_weight(m.weights[name], layer, f"{method} {name}")


def test_refused_formats_name_the_field(tmp_path):
    """Formats decodekit does not read are refused up front, naming what is unsupported (never loaded as garbage)."""
    rng = np.random.default_rng(1)
    cfg = llama_cfg()
    T, _, _ = quantized_model(cfg, "gptq", 32, rng)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}
    cases = [
        (dict(quantization_config=qconfig("gptq", 32, bits=8)), None, "bits = 8"),
        (dict(quantization_config=qconfig("gptq", 32, checkpoint_format="marlin")), None, "checkpoint_format"),
        (dict(quantization_config=qconfig("awq", 32, version="gemv")), None, "AWQ version 'gemv'"),
        (dict(quantization_config=qconfig("awq", 32, zero_point=False)), None, "zero_point"),
        (dict(quantization_config=fp8), None, "quant_method 'fp8'"),
        (dict(quantization_config=ct), None, "quant_method 'compressed-tensors'"),
        # was: read as GPTQ with the default group 128 ('GPTQ group_size 128 does not divide in_features 160')
        (dict(quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}), None, "bitsandbytes"),
        # was: loaded as if in the GPTQ layout (auto-gptq's Marlin checkpoints hold repacked tensors)
        ({}, {"quantize_config.json": {"bits": 4, "group_size": 32, "sym": True, "is_marlin_format": True}},
         "is_marlin_format"),
    ]
    for i, (patch, files, msg) in enumerate(cases):
        d = write_dir(tmp_path / f"c{i}", dict(cfg, **patch), T, extra_files=files)
        with pytest.raises(ModelLoadError, match=msg):
            load_model(d, progress=False)


def test_layer_both_quantized_and_float_is_refused(tmp_path):
    """A projection both packed (qweight ...) and as a float .weight: transformers' quantized module has no float
    weight (it would drop it); decodekit silently took the float one. Now refused, naming the layer."""
    rng = np.random.default_rng(2)
    cfg = dict(llama_cfg(), quantization_config=qconfig("gptq", 32))
    T, _, _ = quantized_model(cfg, "gptq", 32, rng)
    T["model.layers.1.mlp.up_proj.weight"] = torch.randn(160, 96)
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.1\.mlp\.up_proj' is in the checkpoint both quantized"):
        load_model(write_dir(tmp_path / "both", cfg, T), progress=False)


def test_tied_config_with_own_head_quantized_checkpoint(tmp_path):
    """tie_word_embeddings true but an lm_head.weight that differs from the embedding: transformers 5 (and decodekit
    for float checkpoints) use the checkpoint's head; a quantized checkpoint used the embedding instead."""
    rng = np.random.default_rng(3)
    cfg = llama_cfg(tie=True)
    T, layers, floats = quantized_model(cfg, "gptq", 32, rng)
    T["lm_head.weight"] = head = torch.randn(320, 96) * 0.1
    cfg["quantization_config"] = qconfig("gptq", 32)
    m = load_model(write_dir(tmp_path / "tied", cfg, T), progress=False)
    assert not m.config.tie_word_embeddings
    assert torch.equal(m.weights["lm_head.weight"], head)
    for name, layer in layers.items():
        check_weight(m.weights[name], layer, name)


# ---------------------------------------------------------------- `decodekit quantize`'s format: exact reload

def _float_dir(tmp_path, preset: str, arch: str, tie: bool, own_head: bool = False):
    """A float HF directory with a random:PRESET model's weights (own_head: tied config, distinct lm_head.weight)."""
    m = load_model(f"random:{preset}", progress=False)
    c = m.config
    cfg = dict(architectures=[arch], vocab_size=c.vocab_size, hidden_size=c.hidden_size,
               intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
               rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, max_position_embeddings=512,
               tie_word_embeddings=tie)
    w = dict(m.weights)
    if own_head:
        w["lm_head.weight"] = torch.randn(c.vocab_size, c.hidden_size) * 0.05
    return write_dir(tmp_path / f"{preset}-float", cfg, w)


@pytest.mark.parametrize("preset,arch,tie,own_head", [
    ("tiny-qwen3", "Qwen3ForCausalLM", True, False),    # was: q_norm / k_norm not written -> reload refused
    ("tiny", "LlamaForCausalLM", True, True),           # was: reloaded with the embedding as the head
    ("tiny-qwen2", "Qwen2ForCausalLM", True, False),      # q/k/v biases
])
def test_exported_int4_reloads_with_identical_logits(tmp_path, preset, arch, tie, own_head):
    """save_quantized (what `decodekit quantize` writes) reloads to the same model: identical logits."""
    src = _float_dir(tmp_path, preset, arch, tie, own_head)
    loaded = load_model(src, progress=False)
    gen = torch.Generator().manual_seed(0)
    w = dict(loaded.weights)
    calib = torch.randn(256, loaded.config.hidden_size, generator=gen, dtype=torch.float64)
    for k, v in list(w.items()):
        if k.endswith("_proj.weight"):   # GPTQ (act-order) where K = hidden, RTN for the others
            w[k] = gptq_quantize(v, calib.t() @ calib, 32, True) if v.shape[1] == calib.shape[1] else \
                quantize_rtn(v, 32)
    model = LlamaModel(loaded.config, dict(w))
    out = str(tmp_path / "int4")
    save_quantized(model, src, out)
    back = load_model(out, progress=False, keep_quantized=True)
    ids = [list(range(5, 40)), list(range(200, 230))]
    assert torch.equal(calibration_forward(model, ids), calibration_forward(LlamaModel(back.config, back.weights), ids))


# ---------------------------------------------------------------- converters and quantizers

@pytest.mark.parametrize("N,K,group", [(40, 96, 32), (24, 320, 64), (56, 384, 128), (8, 768, 256), (40, 160, -1),
                                       (24, 1152, 384)])
def test_converters_awkward_shapes_exact_round_trip(N, K, group):
    """K an odd multiple of the group, groups larger than 128 (split, sharing scale and min), per-channel; GPTQ
    v1 / v2, sym / asym, act-order; AWQ. Dequantized against the oracle; back to the format bit for bit."""
    rng = np.random.default_rng(N * K + group)
    grp = K if group == -1 else group
    for act in (False, True):
        for v2 in (False, True):
            for sym in (False, True):
                layer = rand_layer(N, K, group, rng, act, sym, (0, 15) if v2 else (1, 16))
                t = gptq_tensors(*layer, v2=v2)
                w = from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], group, "gptq_v2" if v2 else "gptq")
                check_weight(ops.int4_dequantize(w, torch.float32), layer, f"gptq act={act} v2={v2} sym={sym}")
                if not v2:
                    back = to_gptq(w, grp)
                    assert all(torch.equal(back[k], t[k]) for k in t)
    layer = rand_layer(N, K, group, rng)
    t = awq_tensors(*layer[:3])
    w = from_awq(t["qweight"], t["qzeros"], t["scales"], group)
    check_weight(ops.int4_dequantize(w, torch.float32), layer, "awq")
    back = to_awq(w, grp)
    assert all(torch.equal(back[k], t[k]) for k in t)


def test_rtn_codes_are_the_nearest():
    """quantize_rtn against an independent search: scale = fp16((max - min) / 15), min = fp16(min), and each code
    the one of 16 whose decoded value (fp32 scale * q + min) is nearest the weight."""
    rng = np.random.default_rng(4)
    for N, K, G in [(5, 96, 32), (3, 320, 64), (7, 384, 128)]:
        w = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)) * 0.1
        w[1, G:2 * G] *= 1000
        r = quantize_rtn(w, G)
        wf = w.double().numpy().reshape(N, K // G, G)
        assert np.array_equal(r.mins.numpy(), wf.min(-1).astype(np.float16))
        assert np.array_equal(r.scales.numpy(), ((wf.max(-1) - wf.min(-1)) / 15).astype(np.float16))
        s = np.repeat(r.scales.numpy().astype(np.float32), G, 1)[..., None]
        m = np.repeat(r.mins.numpy().astype(np.float32), G, 1)[..., None]
        dist = np.abs((s * np.arange(16, dtype=np.float32) + m).astype(np.float64) - w.double().numpy()[..., None])
        mine = np.take_along_axis(dist, r.codes().long().numpy()[..., None], -1)[..., 0]
        assert (mine <= dist.min(-1)).all()


@pytest.mark.parametrize("N,K,G", [(24, 160, 32), (40, 192, 64), (8, 384, 128)])
def test_gptq_beats_rtn_on_odd_shapes(N, K, G):
    """K an odd multiple of the group (and of no 128-column block): GPTQ's output error on its calibration inputs
    below round-to-nearest's, with and without act-order."""
    gen = torch.Generator().manual_seed(K + G)
    for act in (False, True):
        w = torch.randn(N, K, generator=gen) * 0.05
        x = torch.randn(4 * K, K, generator=gen, dtype=torch.float64) @ (torch.randn(K, K, generator=gen,
                                                                                      dtype=torch.float64) / K ** 0.5)
        q = gptq_quantize(w, x.t() @ x, G, act)
        ref = x @ w.double().t()
        err_g = (x @ ops.int4_dequantize(q).double().t() - ref).norm()
        err_r = (x @ ops.int4_dequantize(quantize_rtn(w, G)).double().t() - ref).norm()
        assert err_g < 0.8 * err_r, (err_g.item(), err_r.item())


def test_gptq_all_zero_group_stays_finite():
    """A group whose weights are all zero (an all-zero row, dead inputs): the scale floor 1e-8 rounded to 0 in fp16,
    zero = 0 / 0 = NaN, the min NaN, and the error feedback spread NaN along the whole row."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, 128, generator=gen) * 0.05
    w[3] = 0
    w[:, 32:64] = 0
    x = torch.randn(512, 128, generator=gen, dtype=torch.float64)
    for act in (False, True):
        q = gptq_quantize(w, x.t() @ x, 32, act)
        d = ops.int4_dequantize(q)
        assert torch.isfinite(q.mins).all() and torch.isfinite(d).all()
        assert (q.scales > 0).all()
        assert torch.equal(d[3], torch.zeros(128))   # an all-zero row decodes to zeros exactly
