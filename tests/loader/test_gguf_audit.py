"""Audit: GGUF files as llama.cpp users bring them, against independent references.

* Hyperparameters: tiny transformers models (Llama / Qwen2 / Qwen3, seeded random init, norms and biases perturbed)
  written the way llama.cpp's convert_hf_to_gguf.py writes them (q / k rows permuted for "llama" only; key_length /
  value_length when head_dim is explicit; the rope keys it writes, including the 2023 `rope.scale_linear` key and a
  factor without a type, which llama.cpp reads as linear scaling), loaded by decodekit and run through its paged
  forward; logits compared with transformers' float64 forward over the same (float32) weights.
  Tolerance: decodekit computes in float32, so the difference is float32 rounding over two layers of 48-128-wide
  dot products and the LM head on logits of ~5: measured max 1.5e-5. ATOL 2e-4 (as tests/models/
  test_arch_hf_audit.py) while every metadata misreading found here moved logits by > 4.
* Tensor types: every type gguf.quants can dequantize, the decodekit weights against gguf.quants.dequantize of the
  file's bytes read with gguf's own reader and the q / k rows un-permuted by index arithmetic (not the loader's
  reverse_permute); the packed (keep_quantized) Q4_0 / Q4_1 / Q8_0 weights decode to the same values. Types gguf
  cannot quantize get random blocks whose fp16 scale fields are kept finite.
* File forms: big-endian files (made by gguf's own gguf_convert_endian.py) load the same weights as the
  little-endian file; GGUF v2; gguf-split parts; custom alignment; truncated files; unsupported versions / types.
"""
from __future__ import annotations

import argparse
import builtins
import copy
import json
import os
import shutil
import struct
import warnings

import numpy as np
import pytest
import torch

from decodekit.loader import ModelLoadError, load_config, load_model
from decodekit.loader.gguf import permute
from decodekit.models import AttentionMetadata, LlamaModel
from dk_testing import tiny_hf_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

V = 512
ATOL = 2e-4     # see the module docstring
_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
          "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def _gname(hf: str) -> str:
    if hf in _NAMES:
        return _NAMES[hf]
    p = hf.split(".")
    return f"blk.{p[2]}." + _LAYER[".".join(p[3:])]


def _hf_name(gname: str) -> str:
    return {v: k for k, v in _NAMES.items()}.get(gname) or next(
        f"model.layers.{gname.split('.')[1]}.{k}" for k, v in _LAYER.items() if gname.split(".", 2)[2] == v)


def _tokenizer_meta():
    from decodekit.tokenizer.builders import SYNTHETIC_SPECIALS, synthetic_backend
    model = json.loads(synthetic_backend(V).to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges, [3 if t in SYNTHETIC_SPECIALS else 1 for t in tokens]


def build_hf(kind: str, **kw):
    base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    return tiny_hf_model(kind, **{**base, **kw})


def _probe_scale_bytes(q) -> list[int]:
    """Byte offsets in a block of type q that hold the high byte of an fp16 scale: setting its exponent bits makes
    gguf's dequantization blow up. Random blocks get bit 0x40 cleared there (finite scales below ~2)."""
    n_b = gguf.GGML_QUANT_SIZES[q][1]
    rng = np.random.default_rng(0)
    out = []
    for i in range(n_b):
        for _ in range(3):
            blk = rng.integers(0, 256, (1, n_b), dtype=np.uint8) & 0xBF
            hot = blk.copy()
            hot[0, i] |= 0x7C
            with np.errstate(all="ignore"):
                a, b = gguf.quants.dequantize(blk, q), gguf.quants.dequantize(hot, q)
            if not np.isfinite(b).all() or np.abs(b).max() > 1e3 * max(np.abs(a).max(), 1e-3):
                out.append(i)
                break
    return out


def _encode(a: np.ndarray, q, seed: int):
    """(array for GGUFWriter.add_tensor, raw_dtype): gguf's quantizer, or random finite blocks for the types it
    cannot quantize (K-quants, IQ types)."""
    if q in (None, Q.F32):
        return np.ascontiguousarray(a, np.float32), None
    if q == Q.F16:
        return a.astype(np.float16), None
    try:
        return gguf.quants.quantize(a, q), q
    except NotImplementedError:
        n_el, n_b = gguf.GGML_QUANT_SIZES[q]
        raw = np.random.default_rng(seed).integers(0, 256, (a.shape[0], a.shape[1] // n_el, n_b), dtype=np.uint8)
        for i in _probe_scale_bytes(q):
            raw[..., i] &= 0xBF
        return raw.reshape(a.shape[0], -1), q


def write_gguf(model, path: str, arch: str, meta: dict | None = None, qtype=None, tensors: dict | None = None,
               **writer_kw) -> str:
    """model as convert_hf_to_gguf.py writes it. meta: {key: (GGUFWriter add_<type> suffix, value) or None (drop)}
    over the usual keys; qtype: the type of 2-D weights (1-D stay F32); tensors: more F32 tensors by GGUF name;
    writer_kw: GGUFWriter options."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    keys = {"block_count": ("uint32", c.num_hidden_layers), "context_length": ("uint32", c.max_position_embeddings),
            "embedding_length": ("uint32", c.hidden_size), "feed_forward_length": ("uint32", c.intermediate_size),
            "attention.head_count": ("uint32", c.num_attention_heads),
            "attention.head_count_kv": ("uint32", c.num_key_value_heads),
            "rope.freq_base": ("float32", float(c.rope_parameters["rope_theta"])),
            "attention.layer_norm_rms_epsilon": ("float32", float(c.rms_norm_eps)), "vocab_size": ("uint32", V)}
    keys = {f"{arch}.{k}": v for k, v in keys.items()}
    if arch == "llama":     # LlamaModel.set_gguf_parameters: the rotary dimension is the head size
        keys[f"{arch}.rope.dimension_count"] = ("uint32", head_dim)
    if c.to_dict().get("head_dim"):     # TextModel.set_gguf_parameters: whenever the config has one
        keys[f"{arch}.attention.key_length"] = ("uint32", head_dim)
        keys[f"{arch}.attention.value_length"] = ("uint32", head_dim)
    keys.update(meta or {})
    w = gguf.GGUFWriter(path, arch=arch, **writer_kw)
    w.add_name("audit")
    for k, v in keys.items():
        if k == "general.alignment":
            w.add_custom_alignment(v[1])     # (the writer pads the tensors to it too)
        elif v is not None:
            getattr(w, f"add_{v[0]}")(k, v[1])
    tokens, merges, types = _tokenizer_meta()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    sd = model.state_dict()
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight")
    for i, (n, t) in enumerate(sd.items()):
        a = t.detach().float().numpy()
        if arch == "llama" and n.endswith(("q_proj.weight", "q_proj.bias")):     # (LlamaModel.modify_tensors)
            a = permute(a, c.num_attention_heads)
        elif arch == "llama" and n.endswith(("k_proj.weight", "k_proj.bias")):
            a = permute(a, c.num_key_value_heads)
        arr, raw_dtype = _encode(a, qtype if a.ndim == 2 else None, seed=i)
        w.add_tensor(_gname(n), arr, raw_dtype=raw_dtype)
    for n, a in (tensors or {}).items():
        w.add_tensor(n, np.asarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dk_logits(path: str, ids: list[int]):
    """decodekit's logits at every position (one prefill over a paged cache of 8-token blocks), and its config."""
    m = load_model(path, progress=False)
    lm = LlamaModel(m.config, dict(m.weights), dtype=torch.float32)
    n, bs = len(ids), 8
    nb = -(-n // bs)
    kv = lm.allocate_kv_cache(nb + 1, bs)
    perm = torch.randperm(nb + 1, generator=torch.Generator().manual_seed(0))[:nb].to(torch.int32)
    slots = (perm.long()[torch.arange(n) // bs] * bs + torch.arange(n) % bs)
    md = AttentionMetadata(torch.arange(n), slots, perm[None], torch.tensor([n], dtype=torch.int32),
                           torch.tensor([0, n], dtype=torch.int32), torch.arange(n))
    return lm.forward(torch.tensor(ids), md, kv), m.config


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(model).double()(torch.tensor([ids])).logits[0]


_IDS = torch.randint(3, V, (70,), generator=torch.Generator().manual_seed(1)).tolist()
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def _yarn_meta(arch: str, **extra) -> dict:
    m = {f"{arch}.rope.scaling.type": ("string", "yarn"), f"{arch}.rope.scaling.factor": ("float32", 4.0),
         f"{arch}.rope.scaling.original_context_length": ("uint32", 32)}
    return {**m, **{f"{arch}.rope.scaling.{k}": ("float32", v) for k, v in extra.items()}}


# (id, transformers class prefix, GGUF arch, config kwargs, GGUF metadata over the converter's, expected config)
CASES = [
    ("llama-gqa", "Llama", "llama", {}, {}, dict(num_kv_heads=2, head_dim=16, tie_word_embeddings=False)),
    ("llama-mha-5-heads-odd-sizes", "Llama", "llama",
     dict(hidden_size=60, num_attention_heads=5, num_key_value_heads=5, intermediate_size=97),
     {"llama.attention.key_length": None, "llama.attention.value_length": None}, dict(head_dim=12)),   # (older files)
    ("llama-3-heads-mqa", "Llama", "llama", dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1), {},
     dict(num_kv_heads=1)),
    ("llama-head_dim-32-key_length", "Llama", "llama", dict(head_dim=32), {}, dict(head_dim=32)),
    ("llama-tied-no-output-weight", "Llama", "llama", dict(tie_word_embeddings=True), {},
     dict(tie_word_embeddings=True)),
    ("qwen2-bias-tied", "Qwen2", "qwen2", dict(tie_word_embeddings=True), {},
     dict(attention_bias=True, tie_word_embeddings=True)),
    # q / k biases under "llama" (the converter permutes them with the weights): Qwen2's graph
    ("llama-arch-qkv-bias", "Qwen2", "llama", dict(num_key_value_heads=1), {}, dict(attention_bias=True)),
    ("qwen3-head_dim-32", "Qwen3", "qwen3", dict(head_dim=32), {}, dict(head_dim=32, qk_norm=True)),
    ("llama-linear", "Llama", "llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
     {"llama.rope.scaling.type": ("string", "linear"), "llama.rope.scaling.factor": ("float32", 4.0)},
     dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    # bug: llama.cpp's 2023 key (convert.py before the rope.scaling.* keys) was ignored: logits off by 6
    ("llama-scale_linear-2023-key", "Llama", "llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
     {"llama.rope.scale_linear": ("float32", 4.0)}, dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    # bug: a factor without rope.scaling.type (llama.cpp's default type is "linear") was ignored: logits off by 6
    ("llama-factor-without-type", "Llama", "llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
     {"llama.rope.scaling.factor": ("float32", 4.0)}, dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    ("qwen2-yarn", "Qwen2", "qwen2", dict(rope_scaling=_YARN), _yarn_meta("qwen2"), dict(rope_scaling=_YARN)),
    # bug: the YaRN keys convert_hf_to_gguf.py writes from beta_fast / beta_slow / attention_factor were ignored
    # (logits off by 5.5 / 4.7)
    ("qwen2-yarn-betas", "Qwen2", "qwen2", dict(rope_scaling={**_YARN, "beta_fast": 8.0, "beta_slow": 2.0}),
     _yarn_meta("qwen2", yarn_beta_fast=8.0, yarn_beta_slow=2.0),
     dict(rope_scaling={**_YARN, "beta_fast": 8.0, "beta_slow": 2.0})),
    ("qwen3-yarn-attention_factor", "Qwen3", "qwen3", dict(head_dim=32, rope_scaling={**_YARN, "attention_factor": 1.5}),
     _yarn_meta("qwen3", yarn_attn_factor=1.5), dict(rope_scaling={**_YARN, "attention_factor": 1.5})),
    # bug: per-layer arrays (llama.cpp's get_key_or_arr) of equal values: head_count_kv's was a TypeError
    ("llama-per-layer-arrays", "Llama", "llama", {},
     {"llama.attention.head_count": ("array", [4, 4]), "llama.attention.head_count_kv": ("array", [2, 2]),
      "llama.feed_forward_length": ("array", [96, 96])}, dict(num_heads=4, num_kv_heads=2, intermediate_size=96)),
]


@pytest.mark.parametrize("kind,arch,kw,meta,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_converter_layout_logits_match_transformers(tmp_path, kind, arch, kw, meta, want):
    model = build_hf(kind, **copy.deepcopy(kw))     # (transformers adds rope_theta to the dict it is given)
    path = write_gguf(model, str(tmp_path / "m.gguf"), arch, meta)
    got, cfg = dk_logits(path, _IDS)
    for k, v in want.items():
        assert getattr(cfg, k) == v, (k, getattr(cfg, k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_logits = hf_logits(model, _IDS)
    assert want_logits.abs().max() > 2
    assert (got.double() - want_logits).abs().max().item() < ATOL


@pytest.mark.parametrize("factor,head_dim", [(8.0, 64), (32.0, 32)])      # Llama 3.1 / 3.2's scalings
def test_llama3_rope_freqs_from_transformers(tmp_path, factor, head_dim):
    """rope_freqs.weight as the converter computes it (here: transformers' default inverse frequencies over its
    llama3 ones) gives back transformers' llama3 rope parameters, and the same logits (a check that held)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rp = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    model = build_hf("Llama", head_dim=head_dim, rope_theta=500000.0, rope_scaling=dict(rp),
                     max_position_embeddings=131072)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    base = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    path = write_gguf(model, str(tmp_path / "l3.gguf"), "llama", tensors={"rope_freqs.weight": (base / inv).numpy()})
    got, cfg = dk_logits(path, _IDS)
    assert cfg.rope_scaling == rp and cfg.rope_theta == 500000.0 and cfg.head_dim == head_dim
    assert (got.double() - hf_logits(model, _IDS)).abs().max().item() < ATOL


def test_bad_per_layer_and_yarn_metadata_named(tmp_path):
    """What decodekit cannot run is one ModelLoadError naming the file and the key (load_model and load_config)."""
    model = build_hf("Llama")
    for meta, match in [
        ({"llama.attention.head_count_kv": ("string", "two")},      # was a TypeError undoing the k permutation
         r"llama\.attention\.head_count_kv must be an integer >= 1, got 'two'"),
        ({"llama.attention.head_count_kv": ("array", [2, 1])},
         r"llama\.attention\.head_count_kv gives each layer its own value \(\[2, 1\]\); .* not supported"),
        ({"llama.feed_forward_length": ("array", [96, 48])}, r"llama\.feed_forward_length gives each layer"),
        (_yarn_meta("llama", yarn_ext_factor=0.5), r"llama\.rope\.scaling\.yarn_ext_factor 0\.5 is not supported"),
    ]:
        path = write_gguf(model, str(tmp_path / "m.gguf"), "llama", meta)
        with pytest.raises(ModelLoadError, match=match) as e:
            load_model(path, progress=False)
        assert str(e.value).startswith(path)
        with pytest.raises(ModelLoadError, match=match):
            load_config(path)


# ------------------------------------------------------------------------------------------- tensor types

def _unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """HF row j of a head from llama.cpp's interleaved order, by index arithmetic: HF rows j < half sit at 2j,
    rows half + i at 2i + 1."""
    hd = a.shape[0] // n_head
    half = hd // 2
    src = [h * hd + (2 * j if j < half else 2 * (j - half) + 1) for h in range(n_head) for j in range(hd)]
    return a[src]


@pytest.fixture(scope="module")
def wide_llama():
    """K-quant / IQ blocks hold 256 weights: hidden and intermediate sizes of 256."""
    return build_hf("Llama", hidden_size=256, intermediate_size=256, num_hidden_layers=1)


DEQUANTIZABLE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                 "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0",
                 "TQ2_0", "MXFP4", "NVFP4"]
DEQUANTIZABLE = [n for n in DEQUANTIZABLE if n in Q.__members__]     # (NVFP4: gguf >= 0.18)


@pytest.mark.parametrize("qname", DEQUANTIZABLE)
def test_every_tensor_type_equals_gguf_dequantize(tmp_path, wide_llama, qname):
    """Every 2-D weight of type qname (embedding, LM head, projections): exactly gguf's dequantization of the
    file's bytes, q / k rows back in HF order; Q4_0 / Q4_1 / Q8_0 kept packed decode to the same values."""
    from decodekit import ops
    path = write_gguf(wide_llama, str(tmp_path / f"{qname}.gguf"), "llama", qtype=Q[qname])
    got = load_model(path, progress=False).weights
    reader = gguf.GGUFReader(path)
    seen = 0
    for t in reader.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        if t.name.endswith("attn_q.weight"):
            ref = _unpermute_rows(ref, 4)
        elif t.name.endswith("attn_k.weight"):
            ref = _unpermute_rows(ref, 2)
        name = _hf_name(t.name)
        assert np.array_equal(got[name].numpy(), ref.astype(np.float32)), name
        seen += t.tensor_type == Q[qname]
    assert seen == 9        # embedding, LM head, 7 projections
    if qname in ("Q4_0", "Q4_1", "Q8_0"):
        packed = load_model(path, progress=False, keep_quantized=True).weights
        dq = ops.int8_dequantize if qname == "Q8_0" else ops.int4_dequantize
        kept = [n for n, w in packed.items() if not isinstance(w, torch.Tensor)]
        assert len(kept) == (9 if qname == "Q8_0" else 7)
        for n in kept:
            assert torch.equal(dq(packed[n], torch.float32), got[n]), n


def _retype(path: str, tensor: str, type_id: int) -> None:
    """Rewrites one tensor's GGML type id in the file's tensor infos."""
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == tensor)
    pos = t.field.offset + sum(p.nbytes for p in t.field.parts[:-2])
    with open(path, "r+b") as f:
        f.seek(pos)
        assert struct.unpack("<I", f.read(4))[0] == int(t.tensor_type)
        f.seek(pos)
        f.write(struct.pack("<I", type_id))


def test_unreadable_types_refused_before_loading(tmp_path):
    """A weight of a type gguf cannot dequantize (Q8_1, F64, I32): refused naming the file, the tensor and the type
    before any weight is loaded (was: an error without the file, after every tensor before it); an id the gguf
    package does not know (31, llama.cpp's removed Q4_0_4_4) is not called a truncated or corrupt file."""
    model = build_hf("Llama")
    for qt in (Q.Q8_1, Q.F64, Q.I32):     # an F32 file with one tensor's type id rewritten
        path = write_gguf(model, str(tmp_path / f"{qt.name}.gguf"), "llama")
        _retype(path, "blk.1.ffn_down.weight", int(qt))
        with pytest.raises(ModelLoadError) as e:
            load_model(path, progress=False)
        msg = str(e.value)
        assert msg.startswith(path) and "tensor blk.1.ffn_down.weight" in msg and f"type {qt.name}" in msg, msg
    path = write_gguf(model, str(tmp_path / "old.gguf"), "llama")
    _retype(path, "blk.0.ffn_up.weight", 31)
    with pytest.raises(ModelLoadError, match=r"old\.gguf: a tensor has GGML type id 31, .* Q4_0_4_4") as e:
        load_model(path, progress=False)
    assert "truncated" not in str(e.value)


# ------------------------------------------------------------------------------------------- file forms

def _to_big_endian(src: str, dst: str) -> str:
    """dst: src converted by gguf's own gguf_convert_endian.py (the tool llama.cpp documents for s390x)."""
    from gguf.scripts.gguf_convert_endian import convert_byteorder
    shutil.copy(src, dst)
    reader = gguf.GGUFReader(dst, "r+")
    saved, builtins.input = builtins.input, (lambda *a: "YES")
    try:
        convert_byteorder(reader, argparse.Namespace(order="big", dry_run=False))
    finally:
        builtins.input = saved
    reader.data.flush()
    del reader
    return dst


@pytest.mark.parametrize("qname", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_big_endian_file_loads_the_same_weights(tmp_path, wide_llama, qname):
    """Was: F16 / BF16 read in the file's byte order (garbage, NaN at best) and the blocks' fp16 scales too."""
    le = write_gguf(wide_llama, str(tmp_path / "le.gguf"), "llama", qtype=Q[qname])
    be = _to_big_endian(le, str(tmp_path / "be.gguf"))
    with open(be, "rb") as f:
        assert f.read(8)[4:] == struct.pack(">I", 3)
    a, b = load_model(le, progress=False), load_model(be, progress=False)
    assert a.config == b.config
    for n, w in a.weights.items():
        assert torch.equal(w, b.weights[n]), n
    if qname in ("Q8_0", "Q4_0"):     # the packed weights: the file's blocks with their scales in host order
        pa, pb = (load_model(p, progress=False, keep_quantized=True).weights for p in (le, be))
        kept = [n for n, w in pa.items() if not isinstance(w, torch.Tensor)]
        assert kept
        for n in kept:
            assert torch.equal(pa[n].scales, pb[n].scales) and torch.equal(pa[n].qweight, pb[n].qweight), n


def test_big_endian_block_type_without_known_layout_refused(tmp_path):
    """Q4_1 blocks (gguf_convert_endian.py cannot convert them, so their byte order is unknown): refused naming
    the tensor, never read as garbage."""
    path = write_gguf(build_hf("Llama"), str(tmp_path / "be.gguf"), "llama", qtype=Q.Q4_1,
                      endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(ModelLoadError, match=r"be\.gguf: tensor token_embd\.weight: a big-endian GGUF file's Q4_1 "
                                             r"blocks cannot be read .*gguf_convert_endian"):
        load_model(path, progress=False)


def test_gguf_versions(tmp_path):
    model = build_hf("Llama")
    path = write_gguf(model, str(tmp_path / "v3.gguf"), "llama")
    data = bytearray(open(path, "rb").read())
    ref = load_model(path, progress=False).weights
    for version, match in ((2, None), (1, "version 1 files predate"), (4, "a newer format")):
        p = str(tmp_path / f"v{version}.gguf")
        data[4:8] = struct.pack("<I", version)
        open(p, "wb").write(data)
        if match is None:     # v2 differs from v3 only in allowing big-endian files
            got = load_model(p, progress=False).weights
            assert all(torch.equal(got[n], ref[n]) for n in ref)
            continue
        with pytest.raises(ModelLoadError, match=rf"v{version}\.gguf: GGUF version {version} is not supported "
                                                 rf"\(versions 2 and 3 are; {match}"):
            load_model(p, progress=False)


def test_split_model_loads_from_its_first_part(tmp_path):
    """gguf-split parts (PREFIX-0000i-of-0000n.gguf): the first part loads the whole model; was 'missing weights'
    (and a tied LM head, output.weight being in a later part) -- and part 2 'architecture None'."""
    model = build_hf("Llama")
    whole = load_model(write_gguf(model, str(tmp_path / "whole.gguf"), "llama"), progress=False)
    d = tmp_path / "split"
    d.mkdir()
    write_gguf(model, str(d / "m.gguf"), "llama", split_max_tensors=8)
    parts = sorted(os.listdir(d))
    assert parts == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    first = str(d / parts[0])
    got = load_model(first, progress=False)
    assert got.config == whole.config and not got.config.tie_word_embeddings
    assert set(got.weights) == set(whole.weights)
    assert all(torch.equal(got.weights[n], whole.weights[n]) for n in whole.weights)
    assert load_config(first) == load_config(str(tmp_path / "whole.gguf"))
    # the directory of one split model resolves to its first part (was: 'several .gguf files')
    assert load_config(str(d)) == load_config(str(tmp_path / "whole.gguf"))
    with pytest.raises(ModelLoadError, match=r"part 2 of a model split in 3 .* pass the first part, "
                                             r"m-00001-of-00003\.gguf"):
        load_model(str(d / parts[1]), progress=False)
    os.remove(d / parts[2])
    with pytest.raises(ModelLoadError, match=r"part 3 of this split model is missing: .*m-00003-of-00003\.gguf"):
        load_model(first, progress=False)


def test_alignment_and_truncation(tmp_path):
    """Checks that held before this audit: general.alignment 8 / 64 / 256 loads the same weights; a file cut
    anywhere is one ModelLoadError naming it."""
    model = build_hf("Llama")
    ref = load_model(write_gguf(model, str(tmp_path / "ref.gguf"), "llama", qtype=Q.Q8_0), progress=False).weights
    for al in (8, 64, 256):
        path = str(tmp_path / f"al{al}.gguf")
        w_path = write_gguf(model, path, "llama", qtype=Q.Q8_0, meta={"general.alignment": ("uint32", al)})
        assert gguf.GGUFReader(w_path).alignment == al
        got = load_model(w_path, progress=False).weights
        assert all(torch.equal(got[n], ref[n]) for n in ref)
    data = open(str(tmp_path / "ref.gguf"), "rb").read()
    cut = str(tmp_path / "cut.gguf")
    for n in (6, 30, 200, 5000, len(data) // 2, len(data) - 1):
        open(cut, "wb").write(data[:n])
        with pytest.raises(ModelLoadError, match=r"cut\.gguf: truncated or corrupt GGUF file"):
            load_model(cut, progress=False)
