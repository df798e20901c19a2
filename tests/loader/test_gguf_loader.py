"""GGUF loading: the embedded SmolLM2 Q4_1 file against transformers' GGUF loader, and small
GGUF files written here (every tensor type, untied head, Qwen2 biases, rope_freqs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from decodekit.loader import ModelLoadError, load_model, read_gguf_tensors
from decodekit.loader.gguf import permute, reverse_permute
from decodekit.loader.random import random_model


def _hf_gguf_model(path: str):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    return {k: v.detach() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def hf_smollm_weights(gguf_path):
    return _hf_gguf_model(gguf_path)


def test_embedded_config(smollm, gguf_path):
    c = smollm.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (49152, 576, 1536, 30)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0 and c.rope_scaling is None
    assert c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and not c.attention_bias
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert c.bos_token_id == 1 and c.eos_token_ids[0] == 2
    assert smollm.source == gguf_path
    assert smollm.tokenizer.vocab_size == 49152
    assert "lm_head.weight" not in smollm.weights
    assert len(smollm.weights) == 2 + 9 * 30 and smollm.num_params() == 134515008
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in smollm.weights.values())


def test_embedded_default_is_loaded_for_none(smollm, gguf_path):
    from decodekit.loader import resolve_model
    assert resolve_model(None) == ("gguf", gguf_path)


def test_embedded_weights_equal_transformers(smollm, hf_smollm_weights):
    ref = hf_smollm_weights
    assert set(ref) == set(smollm.weights) | {"lm_head.weight"}
    assert torch.equal(ref["lm_head.weight"], ref["model.embed_tokens.weight"])  # tied
    for name, t in smollm.weights.items():
        assert t.shape == ref[name].shape, name
        assert torch.equal(t, ref[name]), f"{name} differs from transformers' GGUF load"


def test_raw_tensors_keep_quantized_bytes(gguf_path, smollm):
    import gguf
    infos = {i.name: i for i in read_gguf_tensors(gguf_path)}
    assert len(infos) == 272
    types = {i.type_name for i in infos.values()}
    assert types == {"Q4_1", "Q8_0", "F32"}
    q = infos["blk.3.attn_q.weight"]
    assert q.hf_name == "model.layers.3.self_attn.q_proj.weight"
    assert q.shape == (576, 576) and q.unpermute_heads == 9 and q.block_size == (32, 20)
    raw = q.raw_bytes()  # packed Q4_1 rows in HF order
    assert raw.dtype == np.uint8 and raw.shape == (576, 576 // 32 * 20)
    deq = torch.from_numpy(gguf.quants.dequantize(raw, q.quant_type))
    assert torch.equal(deq, smollm.weights[q.hf_name])
    k = infos["blk.3.attn_k.weight"]
    assert k.unpermute_heads == 3 and infos["blk.3.attn_v.weight"].unpermute_heads is None


def test_permute_roundtrip():
    w = torch.randn(3 * 16, 8)
    assert torch.equal(reverse_permute(permute(w, 3), 3), w)
    assert not torch.equal(permute(w, 3), w)
    # rotate-half: row j pairs with row j + dim/2 inside a head; llama.cpp interleaves them
    head = torch.arange(16.0).reshape(16, 1)
    assert permute(head, 1).flatten().tolist() == [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]


@pytest.fixture(scope="module")
def tiny():
    cfg, weights, _ = random_model("tiny", progress_bar=False)
    return cfg, weights


QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
# worst-case error of each type for weights ~N(0, 0.02^2) (max |w| ~ 0.1)
QTOL = {"F32": 0, "F16": 1e-4, "BF16": 5e-4, "Q8_0": 2e-3, "Q4_0": 2e-2, "Q4_1": 1e-2}


@pytest.mark.parametrize("qname", QTYPES)
def test_tensor_types_match_transformers(make_gguf, tiny, qname):
    import gguf
    cfg, weights = tiny
    path = make_gguf(f"tiny-{qname}.gguf", cfg=cfg, weights=weights, qtype=gguf.GGMLQuantizationType[qname])
    m = load_model(path, progress=False)
    assert m.config.num_heads == 4 and m.config.num_kv_heads == 2 and m.config.head_dim == 16
    assert not m.config.tie_word_embeddings and "lm_head.weight" in m.weights
    assert {i.type_name for i in read_gguf_tensors(path) if len(i.shape) == 2} == {qname}
    ref = _hf_gguf_model(path)
    for name, t in m.weights.items():
        assert torch.equal(t, ref[name]), f"{qname} {name} differs from transformers"
        err = (t - weights[name]).abs().max().item()
        assert err <= QTOL[qname], f"{qname} {name}: error {err} vs the original weights"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qname", ["F16", "BF16", "Q4_1"])
def test_dtype_conversion(make_gguf, tiny, dtype, qname):
    import gguf
    cfg, weights = tiny
    path = make_gguf(f"tiny-{qname}.gguf", cfg=cfg, weights=weights, qtype=gguf.GGMLQuantizationType[qname])
    f32 = load_model(path, progress=False).weights
    low = load_model(path, dtype=dtype, progress=False).weights
    for name in f32:
        assert low[name].dtype == dtype
        assert torch.equal(low[name], f32[name].to(dtype)), name


def test_qwen2_bias_no_permutation(make_gguf):
    cfg, weights, _ = random_model("tiny-qwen2", progress_bar=False)
    path = make_gguf("qwen.gguf", cfg=cfg, weights=weights, arch="qwen2")
    m = load_model(path, progress=False)
    assert m.config.architecture == "qwen2" and m.config.attention_bias and m.config.tie_word_embeddings
    assert set(m.weights) == set(weights)
    for name, t in m.weights.items():
        assert torch.equal(t, weights[name]), name
    ref = _hf_gguf_model(path)
    for name, t in m.weights.items():
        assert torch.equal(t, ref[name]), name


def test_rope_freqs_become_llama3_scaling(make_gguf, tiny):
    from decodekit.loader.gguf import _llama3_factors
    cfg, weights = tiny
    freqs = _llama3_factors(cfg.rope_theta, cfg.head_dim, 8.0, 1.0, 4.0, 8192)
    path = make_gguf("l3.gguf", cfg=cfg, weights=weights, rope_freqs=freqs)
    m = load_model(path, progress=False)
    assert m.config.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert "rope_freqs.weight" not in str(list(m.weights))
    bad = make_gguf("bad.gguf", cfg=cfg, weights=weights, rope_freqs=np.linspace(1, 3, cfg.head_dim // 2))
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        load_model(bad, progress=False)


def test_linear_rope_scaling_metadata(make_gguf, tiny):
    cfg, weights = tiny
    path = make_gguf("lin.gguf", cfg=cfg, weights=weights,
                     extra={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    assert load_model(path, progress=False).config.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_gguf_tokenizer_of_small_file(make_gguf, tiny):
    cfg, weights = tiny
    path = make_gguf("tok.gguf", cfg=cfg, weights=weights)
    tok = load_model(path, progress=False).tokenizer
    from decodekit.tokenizer import Tokenizer
    syn = Tokenizer.synthetic(512)
    for text in ["Hello world, 123!", "  spaces\n\nand\ttabs", "Café 🙂 <|im_end|>"]:
        assert tok.encode(text) == syn.encode(text)
        assert tok.decode(tok.encode(text)) == text.replace("<|im_end|>", "")
    assert tok.eos_token_ids[:1] == [2] and tok.bos_token_id == 1


def test_unsupported_architecture_and_tensor(make_gguf, tiny, tmp_path):
    cfg, weights = tiny
    path = make_gguf("gemma.gguf", cfg=cfg, weights=weights, arch="gemma")
    with pytest.raises(ModelLoadError, match="architecture 'gemma'"):
        load_model(path, progress=False)
    w = dict(weights)
    del w["model.layers.1.mlp.up_proj.weight"]
    path = make_gguf("missing.gguf", cfg=cfg, weights=w)
    with pytest.raises(ModelLoadError, match="missing weights"):
        load_model(path, progress=False)


def test_progress_bar_only_when_asked(make_gguf, tiny, capfd):
    cfg, weights = tiny
    path = make_gguf("p.gguf", cfg=cfg, weights=weights)
    load_model(path, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    load_model(path, progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "p.gguf" in err


_MEM_SCRIPT = r"""
import json, sys
import torch, decodekit
def status(key):  # VmHWM, not ru_maxrss: that one carries the parent's peak over fork + exec
    return int(open('/proc/self/status').read().split(key + ':')[1].split()[0]) * 1024
base = status('VmRSS')
from decodekit.loader import load_model
m = load_model(sys.argv[1], progress=False)
peak = status('VmHWM')
size = sum(t.numel() * t.element_size() for t in m.weights.values())
print(json.dumps({"base": base, "peak": peak, "weights": size}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_peak_memory_bounded(gguf_path):
    """Peak RSS added by loading stays under 2x the final weights (tensor-by-tensor dequantization)."""
    out = subprocess.run([sys.executable, "-c", _MEM_SCRIPT, gguf_path], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(__file__))
    r = json.loads(out.stdout.strip().splitlines()[-1])
    added = r["peak"] - r["base"]
    assert added < 2 * r["weights"], f"loading added {added / 2**20:.0f} MiB for {r['weights'] / 2**20:.0f} MiB of weights"


def test_qwen3_head_norms(make_gguf):
    """A qwen3 GGUF (attn_q_norm / attn_k_norm, no q / k permutation, head_dim 32 from rope.dimension_count where
    hidden / heads is 16): the same weights back, and the model runs them (transformers too, where it reads
    qwen3 GGUFs)."""
    cfg, weights, _ = random_model("tiny-qwen3", progress_bar=False)
    path = make_gguf("qwen3.gguf", cfg=cfg, weights=weights, arch="qwen3")
    m = load_model(path, progress=False)
    c = m.config
    assert c.architecture == "qwen3" and c.qk_norm and c.head_dim == 32 and not c.attention_bias
    assert set(m.weights) == set(weights)
    for name, t in m.weights.items():
        assert torch.equal(t, weights[name]), name
    from decodekit import LLM, SamplingParams
    a = LLM(model=path).generate({"prompt_token_ids": [3, 9, 27]}, SamplingParams(temperature=0, max_tokens=6))
    b = LLM(model="random:tiny-qwen3").generate({"prompt_token_ids": [3, 9, 27]},
                                                 SamplingParams(temperature=0, max_tokens=6))
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids
    try:
        ref = _hf_gguf_model(path)
    except Exception:       # noqa: BLE001 -- this transformers cannot read qwen3 GGUFs: our own check above stands
        return
    for name, t in m.weights.items():
        assert torch.equal(t, ref[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q8_0_projections_stay_packed(make_gguf, tiny, dtype):
    """A Q8_0 file's projections stay packed INT8 (int8_gemm, byte for byte the file's blocks) like its embedding /
    LM head; the engine on them (packed by default on the CPU; fp32 on AMX CPUs: held only as the AMX copies)
    decodes the tokens of the same file dequantized."""
    import gguf

    from decodekit import LLM, SamplingParams, ops
    from decodekit.quant import Int8Weight
    cfg, weights = tiny
    path = make_gguf("tiny-q8-proj.gguf", cfg=cfg, weights=weights, qtype=gguf.GGMLQuantizationType.Q8_0)
    packed = load_model(path, progress=False, keep_quantized=True, dtype=dtype).weights
    plain = load_model(path, progress=False, dtype=dtype).weights
    projections = [n for n in packed if n.endswith("_proj.weight")]
    assert projections and all(isinstance(packed[n], Int8Weight) for n in projections)
    for n in projections:
        assert torch.equal(ops.int8_dequantize(packed[n], dtype), plain[n]), n
    p = SamplingParams(temperature=0, max_tokens=12)
    prompt = {"prompt_token_ids": [3, 9, 27, 81, 5]}
    outs = {}
    for fmt in ("packed", "dequantized"):
        llm = LLM(model=path, weight_format=fmt, dtype="float32" if dtype == torch.float32 else "bfloat16")
        outs[fmt] = llm.generate(prompt, p)[0].outputs[0].token_ids
        if fmt == "packed":
            qkv = llm.engine.model.layers[0].qkv
            assert isinstance(qkv, Int8Weight)  # q / k / v fused, still packed
            if dtype == torch.float32 and ops.int4_amx_rows_available():
                assert qkv.copy_only is not None and llm.engine.model.fused_layers
    assert outs["packed"] == outs["dequantized"]
    if dtype == torch.float32:  # tensor parallel: the packed Q8_0 shards (rows / K blocks of the file) decode alike
        llm = LLM(model=path, weight_format="packed", tensor_parallel_size=2)
        try:
            assert llm.generate(prompt, p)[0].outputs[0].token_ids == outs["packed"]
        finally:
            llm.shutdown()
