"""Phi-3 (Phi3ForCausalLM, GGUF phi3): fused qkv_proj / gate_up_proj split at load, LongRoPE (short / long
factor sets, attention factor), partial rotary (Phi-4-mini's 0.75), sliding window -- against transformers."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from decodekit.config import ModelConfig
from decodekit.loader import ModelLoadError, load_model
from decodekit.loader.random import random_model

transformers = pytest.importorskip("transformers")

ORIG = 32   # the tiny models' original (pretraining) context: LongRoPE's short set up to here


def _longrope(rot_dim: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = rot_dim // 2
    return {"rope_type": "longrope", "short_factor": (1 + torch.rand(n, generator=g)).tolist(),
            "long_factor": (1 + 6 * torch.rand(n, generator=g)).sort().values.tolist()}


def _tiny_phi3(partial: float = 0.75, window: int | None = None, **kw):
    """head_dim 16, 4 query / 2 KV heads (hidden 64), 512 positions over an original 32."""
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(
        vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=ORIG,
        rope_scaling=_longrope(int(16 * partial)), partial_rotary_factor=partial, sliding_window=window,
        tie_word_embeddings=False, attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2, **kw)
    model = transformers.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "qkv_proj" in n:     # peaked attention: positions (the rope tables) move the greedy tokens
                p[:128].mul_(12.0)
    return model


def _save(tmp_path, name, model, hf_tok):
    d = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
        hf_tok.save_pretrained(d)
    return str(d)


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("long", [False, True])
def test_longrope_tables_match_transformers(partial, long):
    """rope_inv_freq / rope_attention_factor for LongRoPE equal transformers' (short set at a context up to
    the original, long past it; attention factor sqrt(1 + ln(factor) / ln(original)) from the context ratio,
    or the config's own)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from decodekit.ops.reference import rope_attention_factor, rope_inv_freq
    model = _tiny_phi3(partial)
    hf_cfg = model.config
    ours = load_config_of(hf_cfg)
    rot = ours.rotary_dim
    assert rot == int(16 * partial) and ours.rope_scaling["factor"] == 512 / ORIG
    ctx = 512 if long else ORIG
    inv, af = ROPE_INIT_FUNCTIONS["longrope"](hf_cfg, "cpu", seq_len=ctx if long else None)
    torch.testing.assert_close(rope_inv_freq(rot, ours.rope_theta, ours.rope_scaling, ctx).float(), inv,
                               rtol=1e-6, atol=0)
    assert rope_attention_factor(ours.rope_scaling) == pytest.approx(af, rel=1e-12) and af > 1
    # an explicit attention_factor wins
    s = dict(ours.rope_scaling, attention_factor=0.9)
    assert rope_attention_factor(s) == 0.9


def load_config_of(hf_cfg) -> ModelConfig:
    from decodekit.loader.hf import config_from_hf
    return config_from_hf(json.loads(hf_cfg.to_json_string()))


@pytest.mark.parametrize("partial,window", [(0.75, None), (1.0, 20)], ids=["partial-rotary", "window"])
def test_phi3_dir_matches_transformers(tmp_path, hf_tok, partial, window):
    """A saved Phi3ForCausalLM: fused weights come back split, and greedy tokens equal transformers' -- short
    factors while the whole sequence stays within the original context (32), long factors for a prompt past
    it (transformers switches to the long set for the whole sequence then) and, from the step past it, for
    a short prompt's generation (Phi-3's generate recomputes its cache then; the engine too) -- through
    chunked prefill, a prefix-cache hit and n-gram speculation, at max_model_len 32 and the default 512."""
    from decodekit import LLM, SamplingParams
    model = _tiny_phi3(partial, window)
    d = _save(tmp_path, "phi3", model, hf_tok)
    m = load_model(d, progress=False)
    c = m.config
    assert c.architecture == "phi3" and c.partial_rotary_factor == partial and c.sliding_window == window
    assert c.rope_scaling["rope_type"] == "longrope" and c.rope_scaling["original_max_position_embeddings"] == ORIG
    sd = model.state_dict()
    for i in range(2):
        p = f"model.layers.{i}."
        qkv, gu = sd[p + "self_attn.qkv_proj.weight"], sd[p + "mlp.gate_up_proj.weight"]
        want = {"self_attn.q_proj": qkv[:64], "self_attn.k_proj": qkv[64:96], "self_attn.v_proj": qkv[96:],
                "mlp.gate_proj": gu[:96], "mlp.up_proj": gu[96:]}
        for n, w in want.items():
            assert torch.equal(m.weights[p + n + ".weight"], w), n
    assert not any("qkv_proj" in n or "gate_up" in n for n in m.weights)

    g = torch.Generator().manual_seed(1)
    short_prompt = torch.randint(3, 49152, (20,), generator=g).tolist()
    long_prompt = torch.randint(3, 49152, (40,), generator=g).tolist()
    ref_short = _hf_greedy(model, short_prompt, ORIG - 20)      # positions < 32: transformers' short set
    ref_long = _hf_greedy(model, long_prompt, 16)               # prompt past 32: the long set throughout
    params = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)  # noqa: E731
    llm = LLM(model=d, max_model_len=ORIG, max_num_batched_tokens=8)
    outs = llm.generate([{"prompt_token_ids": short_prompt}] * 2, params(ORIG - 20))
    assert [o.outputs[0].token_ids for o in outs] == [ref_short] * 2
    del llm
    for kw in (dict(max_num_batched_tokens=16), dict(speculative="ngram", num_speculative_tokens=3)):
        llm = LLM(model=d, **kw)
        outs = llm.generate([{"prompt_token_ids": long_prompt}] * 2, params(16))
        assert [o.outputs[0].token_ids for o in outs] == [ref_long] * 2, kw
        del llm
    # the default context (512) keeps a short prompt on the short set (was: the long set for every sequence,
    # logprobs off by > 1e-4 from the first token), and its generation crosses 32 as transformers' does
    llm = LLM(model=d)
    (lp,) = llm.generate([{"prompt_token_ids": short_prompt}], SamplingParams(temperature=0, max_tokens=24,
                                                                                logprobs=5, ignore_eos=True))
    with torch.no_grad():
        hf_lp = torch.log_softmax(model(torch.tensor([short_prompt])).logits[0, -1].double(), -1)
    top = lp.outputs[0].logprobs[0]
    assert max(abs(v.logprob - hf_lp[t].item()) for t, v in top.items()) < 1e-4
    assert lp.outputs[0].token_ids == _hf_greedy(model, short_prompt, 24)


def test_phi3_int4_rtn_and_config_errors(tmp_path, hf_tok):
    """--quantization int4-rtn runs the split projections; Phi3Config's spellings ("su" / "yarn" rope types mean
    LongRoPE, the top-level original_max_position_embeddings wins); bad LongRoPE fields are named."""
    from decodekit import LLM, SamplingParams
    from decodekit.loader.hf import config_from_hf
    model = _tiny_phi3()
    d = _save(tmp_path, "phi3", model, hf_tok)
    out = LLM(model=d, quantization="int4-rtn").generate([{"prompt_token_ids": [5, 6, 7]}],
                                                         SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    raw = json.load(open(os.path.join(d, "config.json")))
    scaling = raw.get("rope_scaling") or {k: v for k, v in raw["rope_parameters"].items()
                                          if k not in ("rope_theta", "partial_rotary_factor")}
    base = {k: v for k, v in raw.items() if k not in ("rope_scaling", "rope_parameters")}
    base.update(rope_theta=10000.0, partial_rotary_factor=0.75)
    for kind in ("su", "yarn", "longrope"):
        c = config_from_hf({**base, "rope_scaling": {**scaling, "type": kind, "original_max_position_embeddings": 7},
                            "original_max_position_embeddings": ORIG})
        assert c.rope_scaling["rope_type"] == "longrope" and c.rope_scaling["original_max_position_embeddings"] == ORIG
    bad = {**scaling, "short_factor": scaling["short_factor"][:-1]}
    with pytest.raises(ModelLoadError, match="short_factor has 5 entries.*6 frequencies"):
        config_from_hf({**base, "rope_scaling": bad})
    with pytest.raises(ModelLoadError, match="long_factor must be a non-empty list of numbers > 0"):
        config_from_hf({**base, "rope_scaling": {**scaling, "long_factor": [1, 2, "x", 4, 5, 6]}})
    with pytest.raises(ModelLoadError, match="partial_rotary_factor"):
        config_from_hf({**base, "partial_rotary_factor": 0.1})       # 16 * 0.1 = 1 feature: not a pair
    llama = {**base, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_scaling": None}
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 0.75 is not supported for llama"):
        config_from_hf(llama)
    # a fused weight of the wrong size is named
    from decodekit.loader._common import split_fused
    with pytest.raises(ModelLoadError, match=r"qkv_proj.weight has shape \(100, 64\)"):
        split_fused(config_from_hf(base), "model.layers.0.self_attn.qkv_proj.weight", torch.zeros(100, 64), "x")


@pytest.mark.parametrize("qname", ["F32", "Q8_0", "Q4_1"])
def test_phi3_gguf(make_gguf, qname):
    """A phi3 GGUF as llama.cpp's converter writes it (attn_qkv, ffn_up = gate | up rows, rope_factors_short /
    _long tensors, rope.scaling.attn_factor, rope.dimension_count 12 of head 16): the config and weights come
    back (the packed Q4_1 rows of each part are the fused tensor's rows), and the engine's tokens equal the
    random preset's (F32)."""
    import gguf

    from decodekit import LLM, SamplingParams
    from decodekit.quant import Int4Weight
    cfg, weights, _ = random_model("tiny-phi3", progress_bar=False)
    qt = getattr(gguf.GGMLQuantizationType, qname)
    path = make_gguf("phi3.gguf", cfg=cfg, weights=weights, arch="phi3",
                     qtype=lambda n: qt if n.endswith("_proj.weight") else gguf.GGMLQuantizationType.F32)
    m = load_model(path, progress=False)
    c = m.config
    assert c.architecture == "phi3" and c.head_dim == 16 and c.rotary_dim == 12 and c.sliding_window is None
    s = c.rope_scaling
    assert s["rope_type"] == "longrope" and s["original_max_position_embeddings"] == 256 and s["factor"] == 8.0
    torch.testing.assert_close(torch.tensor(s["long_factor"]), torch.tensor(cfg.rope_scaling["long_factor"]))
    assert set(m.weights) == set(weights)
    for name, t in m.weights.items():
        if qname == "F32" or not name.endswith("_proj.weight"):
            assert torch.equal(t, weights[name]), name
        else:   # the file's quantization error, no more
            assert (t - weights[name]).abs().max() < (0.01 if qname == "Q8_0" else 0.05), name
    packed = load_model(path, progress=False, keep_quantized=True).weights
    if qname == "Q4_1":
        assert isinstance(packed["model.layers.1.mlp.up_proj.weight"], Int4Weight)
        from decodekit import ops
        assert torch.equal(ops.int4_dequantize(packed["model.layers.1.mlp.up_proj.weight"], torch.float32),
                           m.weights["model.layers.1.mlp.up_proj.weight"])
    if qname == "F32":
        p = SamplingParams(temperature=0, max_tokens=8)
        a = LLM(model=path).generate({"prompt_token_ids": [3, 9, 27, 81]}, p)
        b = LLM(model="random:tiny-phi3").generate({"prompt_token_ids": [3, 9, 27, 81]}, p)
        assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids
    # half of a LongRoPE pair, or a fused tensor of the wrong size, is named
    one = make_gguf("phi3_bad.gguf", cfg=cfg, weights={**weights}, arch="phi3")
    from decodekit.loader.gguf import config_from_gguf, read_gguf_metadata, read_gguf_tensors
    meta = read_gguf_metadata(one)
    infos = [i for i in read_gguf_tensors(one, meta) if i.name != "rope_factors_long.weight"]
    with pytest.raises(ModelLoadError, match="rope_factors_short.weight / rope_factors_long.weight"):
        config_from_gguf(meta, infos)


def test_phi3_rope_table_holds_both_sets():
    """Whatever the engine's context: rows below the original context (256) hold the short factors, the rest of
    the first half and all of the second half (rope_row_offset on) the long ones -- each equal to a table
    built with that set alone."""
    from decodekit import LLM
    from decodekit.ops.reference import rope_cos_sin_cache
    for ctx in (256, 257, None):
        llm = LLM(model="random:tiny-phi3", max_model_len=ctx)
        cfg, m = llm.llm_engine.model_config, llm.llm_engine.model
        n, orig = cfg.max_position_embeddings, 256
        assert m.rope_row_offset == n and m.cos_sin_cache.shape == (2 * n, 12)
        only = {}
        for kind in ("short", "long"):
            s = dict(cfg.rope_scaling)
            s["long_factor" if kind == "short" else "short_factor"] = s[f"{kind}_factor"]   # only `kind` left
            only[kind] = rope_cos_sin_cache(n, 12, cfg.rope_theta, s)[:n]
        t = m.cos_sin_cache
        assert torch.equal(t[:orig], only["short"][:orig]) and torch.equal(t[orig:n], only["long"][orig:])
        assert torch.equal(t[n:], only["long"]), ctx
        assert not m.rope_long_for(orig) and m.rope_long_for(orig + 1)
        del llm


def test_phi3_tensor_parallel_matches_tp1(tmp_path, hf_tok, make_gguf):
    """TP 2 (gloo workers): the fused weights split, then sliced per rank (HF safetensors, and a Q4_1 GGUF whose
    parts are row views of the fused blocks), the workers' rope tables as the driver's, a sequence crossing the
    original context (32: the LongRoPE switch recomputes it on every rank): greedy tokens equal TP 1's."""
    import gguf

    from decodekit import LLM, SamplingParams
    d = _save(tmp_path, "phi3", _tiny_phi3(), hf_tok)
    cfg, weights, _ = random_model("tiny-phi3", progress_bar=False)
    q = make_gguf("phi3.gguf", cfg=cfg, weights=weights, arch="phi3",
                  qtype=lambda n: gguf.GGMLQuantizationType.Q4_1 if n.endswith("_proj.weight") else None)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(5, 25))}, {"prompt_token_ids": [7, 8, 9]}]
    for model, ctx in ((d, None), (q, 128)):
        got = []
        for tp in (1, 2):
            llm = LLM(model=model, max_model_len=ctx, kv_cache_memory="16MiB", tensor_parallel_size=tp)
            try:
                got.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
            finally:
                llm.shutdown()
        assert got[0] == got[1], model


@pytest.mark.parametrize("act_order", [False, True])
def test_phi3_gptq_fused_rows(tmp_path, hf_tok, act_order):
    """A GPTQ Phi-3 checkpoint quantizes the fused qkv_proj / gate_up_proj: each part is the converted fused
    weight's rows (act-order permutation kept per part), packed or dequantized."""
    from safetensors.torch import load_file, save_file

    from decodekit import ops
    from decodekit.quant import Int4Weight, from_gptq, to_gptq
    d = _save(tmp_path, "phi3", _tiny_phi3(), hf_tok)
    raw = json.load(open(os.path.join(d, "config.json")))
    tensors = load_file(os.path.join(d, "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    fused = {}
    for i in range(2):
        for proj in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            name = f"model.layers.{i}.{proj}"
            N, K = tensors.pop(name + ".weight").shape
            codes = torch.randint(0, 16, (N, K // 32, 32), generator=gen, dtype=torch.uint8)
            scales = (torch.rand(N, K // 32, generator=gen) * 0.01 + 1e-3).half()
            zeros = torch.randint(1, 16, (N, K // 32), generator=gen)
            perm = torch.randperm(K, generator=gen) if act_order else None
            w = Int4Weight((codes[..., :16] | (codes[..., 16:] << 4)).reshape(N, K // 2), scales,
                           (-scales.float() * zeros).half(), 32, perm)
            parts = to_gptq(w)
            tensors.update({f"{name}.{k}": v for k, v in parts.items()})
            fused[name] = from_gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 32)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(d, "model.safetensors"))
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": act_order,
                                  "sym": False, "checkpoint_format": "gptq"}
    json.dump(raw, open(os.path.join(d, "config.json"), "w"))
    packed = load_model(d, progress=False, keep_quantized=True).weights
    dense = load_model(d, progress=False).weights
    for name, w in fused.items():
        full = ops.int4_dequantize(w, torch.float32)
        rows = {"q_proj": (0, 64), "k_proj": (64, 96), "v_proj": (96, 128)} if "qkv" in name else \
            {"gate_proj": (0, 96), "up_proj": (96, 192)}
        for part, (a, b) in rows.items():
            n = name.rsplit(".", 1)[0] + "." + part + ".weight"
            assert isinstance(packed[n], Int4Weight) and (packed[n].perm is not None) == act_order
            assert torch.equal(ops.int4_dequantize(packed[n], torch.float32), full[a:b]), n
            assert torch.equal(dense[n], full[a:b]), n
    from decodekit import LLM, SamplingParams
    out = LLM(model=d).generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3


def test_phi3_checkpoint_mistakes_named(tmp_path, hf_tok):
    """A weight both fused and on its own (whichever comes first in the file), a null / fractional top-level
    original_max_position_embeddings, a fused tensor missing or of the wrong rank: errors naming them; a null
    top-level partial_rotary_factor leaves rope_parameters' own (as transformers reads it)."""
    from safetensors.torch import load_file, save_file

    from decodekit.loader.hf import config_from_hf
    d = _save(tmp_path, "phi3", _tiny_phi3(), hf_tok)
    st = os.path.join(d, "model.safetensors")
    tensors = load_file(st)
    for stray, src in (("mlp.up_proj", "mlp.gate_up_proj"), ("self_attn.q_proj", "self_attn.qkv_proj")):
        save_file({**tensors, f"model.layers.0.{stray}.weight": torch.zeros(64 if "q_" in stray else 96, 64)}, st)
        with pytest.raises(ModelLoadError, match=rf"'model.layers.0.{stray}.weight' is in the checkpoint both on "
                                                 rf"its own and inside 'model.layers.0.{src}.weight'"):
            load_model(d, progress=False)
    bad = dict(tensors)
    del bad["model.layers.1.self_attn.qkv_proj.weight"]
    save_file(bad, st)
    with pytest.raises(ModelLoadError, match=r"missing weights \['model.layers.1.self_attn.qkv_proj.weight'\]"):
        load_model(d, progress=False)
    save_file({**tensors, "model.layers.0.self_attn.qkv_proj.weight": torch.zeros(128, 64, 1)}, st)
    with pytest.raises(ModelLoadError, match=r"qkv_proj.weight has shape \(128, 64, 1\)"):
        load_model(d, progress=False)
    raw = json.load(open(os.path.join(d, "config.json")))
    for v in (None, 32.5, 10 ** 30):
        with pytest.raises(ModelLoadError, match="original_max_position_embeddings must be an integer"):
            config_from_hf({**raw, "original_max_position_embeddings": v})
    inner = raw.get("rope_parameters") or {**raw["rope_scaling"], "partial_rotary_factor": 0.75}
    c = config_from_hf({**{k: v for k, v in raw.items() if k != "rope_scaling"}, "rope_parameters": inner,
                        "partial_rotary_factor": None})
    assert c.partial_rotary_factor == 0.75 and c.rotary_dim == 12
