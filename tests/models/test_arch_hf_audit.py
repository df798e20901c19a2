"""Audit: every architecture the HF loader supports, differential-tested against transformers 5.

Each case builds a tiny model with transformers from a config (seeded random init, float32, norms and
biases perturbed so they matter), saves it with save_pretrained (safetensors) next to decodekit's synthetic
tokenizer.json, loads the directory with decodekit's loader and compares
  * the logits at every position (paged KV cache, block 8, prefill chunks of 13 / 19 / rest, then five
    one-token decode steps, three sequences batched) with transformers' float64 forward over the same
    (rounded) weights, and
  * greedy tokens through the engine (chunked prefill over a 16-token budget, prompts longer than a block and
    than the sliding window) with transformers' generate, and prompt_logprobs with its log_softmax.

Tolerance (logits): decodekit computes in float32 and the reference in float64 (rope angles in float32 as
transformers computes them), so the difference is float32 rounding (eps 1.2e-7) accumulated over two-three
layers of 64-128-wide dot products, softmax and an LM head, on logits of magnitude ~5-7: measured max
2e-7..3.4e-5 (the largest with the q / k projections scaled 3x for peaked attention). atol 2e-4 leaves ~6x
headroom while a wrong rope table, window, bias or norm moves logits by >= 1e-2 (a wrong YaRN
original_max_position_embeddings: 5.1).
"""
from __future__ import annotations

import copy
import json
import os
import warnings

import pytest
import torch

from decodekit.loader import ModelLoadError, load_model
from decodekit.models import LlamaModel
from dk_testing import run_paged, tiny_hf_model

transformers = pytest.importorskip("transformers")

V = 512
ATOL = 2e-4         # see the module docstring
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def _longrope(rot: int) -> dict:
    g = torch.Generator().manual_seed(0)
    n = rot // 2
    return {"rope_type": "longrope", "short_factor": (1 + torch.rand(n, generator=g)).tolist(),
            "long_factor": (1 + 6 * torch.rand(n, generator=g)).sort().values.tolist()}


def build(tmp_path, kind: str, save_dtype=torch.float32, scale_qk: float = 1.0, edit=None, **kw):
    """(model dir, float64 transformers reference). kind: Llama / Mistral / Qwen2 / Qwen3 / Phi3.
    edit(config_dict): rewrites the saved config.json; the reference is then transformers' own reading of it."""
    from decodekit.tokenizer.builders import synthetic_backend
    base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15, bos_token_id=0,
                eos_token_id=0, pad_token_id=0)
    model = tiny_hf_model(kind, **{**base, **kw})
    with torch.no_grad():
        for n, p in model.named_parameters():
            if scale_qk != 1 and any(s in n for s in ("q_proj", "k_proj", "qkv_proj")):
                p.mul_(scale_qk)    # peaked attention: positions (rope, windows) move the greedy tokens
    ref = copy.deepcopy(model)      # the saved (rounded) weights; the rope buffers as built (float32)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(save_dtype).float())
    d = str(tmp_path / f"{kind}-{len(os.listdir(tmp_path))}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.to(save_dtype).save_pretrained(d)
    synthetic_backend(V).save(os.path.join(d, "tokenizer.json"))
    if edit is not None:
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        edit(c)
        json.dump(c, open(p, "w"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    return d, ref.double().eval()


def logits_diff(d: str, ref, lens=(40, 3, 70), dtype=torch.float32, max_model_len=None) -> tuple[float, object]:
    m = load_model(d, dtype=dtype, progress=False)
    lm = LlamaModel(m.config, dict(m.weights), dtype=dtype, max_model_len=max_model_len)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, V, (n,), generator=g).tolist() for n in lens]
    worst = 0.0
    for s, got in zip(seqs, run_paged(lm, seqs)):
        with torch.no_grad():
            want = ref(torch.tensor([s])).logits[0]
        assert want.abs().max() > 2     # (logits of a useful size: initializer_range 0.15)
        worst = max(worst, (got.double() - want).abs().max().item())
    return worst, m.config


def hf_greedy(ref, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return out[0, len(prompt):].tolist()


# (id, transformers class prefix, config kwargs, what decodekit's config must say)
LOGIT_CASES = [
    ("llama-tied-mqa", "Llama", dict(tie_word_embeddings=True, num_key_value_heads=1), {}),
    ("llama-gqa3-headdim24", "Llama", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=24),
     dict(head_dim=24)),
    ("llama-gqa4-3layers", "Llama", dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                                         num_hidden_layers=3, intermediate_size=160), {}),
    ("llama-odd-sizes", "Llama", dict(hidden_size=60, intermediate_size=97, num_attention_heads=5,
                                      num_key_value_heads=5, rms_norm_eps=1e-2, rope_theta=500.0), {}),
    ("llama-llama3", "Llama", dict(rope_theta=500000.0, rope_scaling=LLAMA3), {}),
    ("llama-linear", "Llama", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), {}),
    ("llama-yarn", "Llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 32}), {}),
    ("qwen2-gqa8-headdim8", "Qwen2", dict(hidden_size=128, num_attention_heads=16, num_key_value_heads=2,
                                          head_dim=8), {}),
    ("qwen2-window-layers1+", "Qwen2", dict(use_sliding_window=True, sliding_window=9, max_window_layers=1),
     dict(sliding_window=9, sliding_window_layers=[1])),
    ("qwen3-headdim32-window", "Qwen3", dict(head_dim=32, use_sliding_window=True, sliding_window=10,
                                             max_window_layers=0), dict(head_dim=32, sliding_window=10)),
    ("qwen3-yarn", "Qwen3", dict(head_dim=32, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32}), {}),
    ("mistral-window-headdim32", "Mistral", dict(head_dim=32, sliding_window=7, scale_qk=3.0),
     dict(sliding_window=7, sliding_window_layers=None)),
    ("phi3-partial", "Phi3", dict(sliding_window=None, partial_rotary_factor=0.5, tie_word_embeddings=True),
     dict(rotary_dim=8)),
    ("phi3-window-mqa", "Phi3", dict(sliding_window=12, num_key_value_heads=1, scale_qk=2.0), dict(sliding_window=12)),
]


@pytest.mark.parametrize("kind,kw,want", [c[1:] for c in LOGIT_CASES], ids=[c[0] for c in LOGIT_CASES])
def test_logits_match_transformers(tmp_path, kind, kw, want):
    d, ref = build(tmp_path, kind, **kw)
    worst, cfg = logits_diff(d, ref)
    for k, v in want.items():
        assert getattr(cfg, k) == v, k
    assert worst < ATOL, worst


def test_longrope_logits_match_transformers(tmp_path):
    """LongRoPE on Llama and on Phi-3 with partial rotary: transformers takes the long factors for a sequence
    past the original context (32) and the short ones up to it, whatever the context length the model allows
    (was: decodekit chose one set by max_model_len, so every short prompt differed at the default 512)."""
    d, ref = build(tmp_path, "Llama", rope_scaling=dict(_longrope(16), original_max_position_embeddings=32))
    assert logits_diff(d, ref, lens=(40, 70, 20))[0] < ATOL
    assert logits_diff(d, ref, lens=(20, 31, 32))[0] < ATOL
    assert logits_diff(d, ref, lens=(20, 31), max_model_len=32)[0] < ATOL
    d, ref = build(tmp_path, "Phi3", sliding_window=None, rope_scaling=_longrope(12), partial_rotary_factor=0.75,
                   original_max_position_embeddings=32)
    assert logits_diff(d, ref, lens=(40, 70, 9))[0] < ATOL
    assert logits_diff(d, ref, lens=(20, 31))[0] < ATOL


@pytest.mark.parametrize("engine_kw", [dict(), dict(speculative="ngram", spec_ngram_min=1, num_speculative_tokens=4),
                                       dict(speculative="layerskip", spec_layers=1, num_speculative_tokens=3)],
                         ids=["plain", "ngram", "layerskip"])
def test_longrope_engine_greedy_matches_transformers_generate(tmp_path, engine_kw):
    """transformers' Phi-3 generate runs a sequence on the short factors up to the original context (32) and,
    at the first step past it, recomputes its cache with the long factors (a longer prompt: long throughout). The engine: prompts of 9 / 20 / 31 (crossing 32 while decoding) and 40 / 45 (long) tokens, a
    short and a long prompt sharing 32 tokens (prefix caching must not mix their blocks), block 8, chunked
    prefill over a 16-token budget, with and without speculative decoding."""
    from decodekit import LLM, SamplingParams
    d, ref = build(tmp_path, "Phi3", sliding_window=None, rope_scaling=_longrope(12), partial_rotary_factor=0.75,
                   original_max_position_embeddings=32, scale_qk=2.0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (9, 20, 31, 40, 45)]
    prompts.append(prompts[3][:30])                                        # shares 3 full blocks with prompt 3
    llm = LLM(model=d, block_size=8, max_num_batched_tokens=16, enable_prefix_caching=True, **engine_kw)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for batch in (prompts, prompts[3:] + prompts[:3]):                     # the second pass hits the cache
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], sp)
        for p, o in zip(batch, outs):
            assert o.outputs[0].token_ids == hf_greedy(ref, p, 24), len(p)


@pytest.mark.parametrize("save_dtype", [torch.bfloat16, torch.float16])
def test_16bit_checkpoint_as_float32(tmp_path, save_dtype):
    """A bf16 / fp16 checkpoint (sharded, tied) loaded with dtype float32: the float32 model of the rounded
    weights (measured 5e-6 .. 7e-6). The 16-bit model of the same file: transformers' own bf16 forward is
    0.16 off its float64 one here, decodekit's bf16 0.16 too (fp16: 0.01), so the bound is loose."""
    d, ref = build(tmp_path, "Qwen2", save_dtype=save_dtype, tie_word_embeddings=True)
    sharded = d + "-sharded"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.AutoModelForCausalLM.from_pretrained(d, dtype=save_dtype).save_pretrained(
            sharded, max_shard_size="40KB")
    os.link(os.path.join(d, "tokenizer.json"), os.path.join(sharded, "tokenizer.json"))
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    worst, cfg = logits_diff(sharded, ref)
    assert cfg.tie_word_embeddings and worst < ATOL, worst
    assert logits_diff(d, ref, dtype=save_dtype)[0] < 0.5


@pytest.mark.parametrize("case", [
    ("Mistral", dict(sliding_window=5, scale_qk=3.0)),                      # window < block < prompt
    ("Qwen2", dict(use_sliding_window=True, sliding_window=12, max_window_layers=1, scale_qk=2.0)),
    ("Phi3", dict(sliding_window=None, partial_rotary_factor=0.5)),
    ("Llama", dict(rope_theta=500000.0, rope_scaling=LLAMA3, tie_word_embeddings=True)),
], ids=["mistral-window5", "qwen2-window-layer1", "phi3-partial", "llama3-tied"])
def test_engine_greedy_and_prompt_logprobs_match_transformers(tmp_path, case):
    """32 greedy tokens token-identical to transformers' generate for prompts of 5 / 21 / 45 tokens (block 8,
    16-token budget: chunked prefill), and prompt_logprobs equal to its log_softmax (ATOL)."""
    from decodekit import LLM, SamplingParams
    kind, kw = case
    d, ref = build(tmp_path, kind, **kw)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (5, 21, 45)]
    llm = LLM(model=d, block_size=8, max_num_batched_tokens=16)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, prompt_logprobs=0))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(ref, p, 32)
        with torch.no_grad():
            lp = torch.log_softmax(ref(torch.tensor([p])).logits[0], -1)
        assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(p)
        for j in range(1, len(p)):
            assert abs(o.prompt_logprobs[j][p[j]].logprob - lp[j - 1, p[j]].item()) < ATOL


def _v4(c: dict) -> None:
    """A transformers 4 style config.json: rope_theta + rope_scaling at the top level."""
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp


@pytest.mark.parametrize("kind,kw,edit,want", [
    # YaRN with 32 in the rope dict and 64 at the top level: transformers 5 reads 64 (v5 and v4 spellings)
    ("Qwen2", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
     lambda c: c.update(original_max_position_embeddings=64), 64),
    ("Qwen2", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
     lambda c: (_v4(c), c.update(original_max_position_embeddings=64)), 64),
    # llama3: the same (128 wins over 32); and the top-level value alone (was: "lacks original_max_position...")
    ("Llama", dict(rope_theta=500000.0, rope_scaling=LLAMA3), lambda c: c.update(original_max_position_embeddings=128),
     128),
    ("Llama", dict(rope_theta=500000.0, rope_scaling=LLAMA3),
     lambda c: (_v4(c), c["rope_scaling"].pop("original_max_position_embeddings"),
                c.update(original_max_position_embeddings=32)), 32),
    # LongRoPE on Llama: the top-level 16 over the dict's 64 (long factors past 16; the factor 512 / 16)
    ("Llama", dict(rope_scaling=dict(_longrope(16), original_max_position_embeddings=64)),
     lambda c: c.update(original_max_position_embeddings=16), 16),
], ids=["yarn-v5", "yarn-v4", "llama3-both", "llama3-top-only", "longrope-llama"])
def test_top_level_original_max_position_embeddings_wins(tmp_path, kind, kw, edit, want):
    """Bug: for a non-Phi-3 config holding original_max_position_embeddings both at the top level and in its
    rope dict (llama3 / yarn / longrope), the loader took the dict's value while transformers 5
    (standardize_rope_params) takes the top-level one: other rope frequencies, logits off by ~5; a llama3 dict
    without one beside a top-level value was refused. Reference: transformers' own reading of the edited file."""
    d, ref = build(tmp_path, kind, edit=edit, **kw)
    assert ref.config.rope_parameters["original_max_position_embeddings"] == want
    worst, cfg = logits_diff(d, ref, lens=(40, 70))
    assert cfg.rope_scaling["original_max_position_embeddings"] == want
    assert worst < ATOL, worst


def test_unsupported_configs_name_the_field(tmp_path):
    """What decodekit cannot run is refused at load naming the key, never run with other semantics."""
    from decodekit import LLM, SamplingParams
    from decodekit.loader.hf import config_from_hf
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 4}
    for extra, match in [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' is not supported"),
        ({"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 1e4}}, "'ntk-by-parts' is not supported"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"architectures": ["Qwen3ForCausalLM"], "attention_bias": True}, "attention_bias=True .* qwen3"),
        ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma"}, "unsupported architecture"),
        ({"architectures": ["MixtralForCausalLM"]}, "unsupported architecture"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported for llama"),
    ]:
        with pytest.raises(ModelLoadError, match=match):
            config_from_hf({**base, **extra})
    # a context shorter than prompt + output: refused per request, naming the lengths; max_model_len past it too
    d, _ = build(tmp_path, "Llama", max_position_embeddings=48)
    with pytest.raises(ValueError, match="exceeds the model's context length: 48"):
        LLM(model=d, max_model_len=64)
    llm = LLM(model=d, block_size=8)
    for n, max_tokens, match in ((40, 32, r"prompt \(40 tokens\) \+ max_tokens \(32\) = 72 exceeds max_model_len"),
                                 (48, 1, r"prompt \(48 tokens\) exceeds max_model_len \(48\) - 1")):
        with pytest.raises(ValueError, match=match):
            llm.generate([{"prompt_token_ids": list(range(3, 3 + n))}],
                         SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    (out,) = llm.generate([{"prompt_token_ids": list(range(3, 50))}], SamplingParams(temperature=0, max_tokens=1))
    assert len(out.outputs[0].token_ids) == 1


def test_yarn_extends_the_context_as_vllm(tmp_path):
    """Qwen2.5 / Qwen3 ship max_position_embeddings = original context and add YaRN to serve factor x that
    (vLLM's derived max_model_len: original_max_position_embeddings x factor). Was: capped at
    max_position_embeddings (max_model_len 128 refused; the rope table ended at position 32)."""
    from decodekit import LLM
    from decodekit.engine.llm_engine import resolve_max_model_len
    d, ref = build(tmp_path, "Qwen2", max_position_embeddings=32,
                   rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    worst, cfg = logits_diff(d, ref, lens=(120, 33, 70))       # positions past 32, up to 4 x 32
    assert worst < ATOL, worst
    assert cfg.context_limit == 128 and resolve_max_model_len(None, cfg) == 128
    with pytest.raises(ValueError, match="max_model_len 129 exceeds the model's context length: 128"):
        resolve_max_model_len(129, cfg)
    llm = LLM(d, dtype="float32", device="cpu", kv_cache_memory="4MiB")
    assert llm.engine.max_model_len == 128
    from decodekit.sampling import SamplingParams
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, V, (100,), generator=g).tolist()
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(ref, prompt, 20)


def test_draft_model_with_a_shorter_context_than_the_target(tmp_path):
    """A draft model whose own context is shorter than the engine's max_model_len: its rope table covers the
    engine's context (was: rotary_embedding refused the first position past the draft's 32)."""
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    d, ref = build(tmp_path, "Qwen2", max_position_embeddings=32,
                   rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    draft, _ = build(tmp_path, "Llama", max_position_embeddings=32)
    llm = LLM(d, dtype="float32", device="cpu", kv_cache_memory="4MiB", speculative="draft",
              spec_draft_model=draft, num_speculative_tokens=3)
    prompt = torch.randint(3, V, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(ref, prompt, 12)
