"""Audit: long contexts (1k .. 8k tokens) on the CPU, differential-tested against transformers.

Tiny random models (fast, the bulk): transformers builds a 2-layer Llama / Mistral (every layer windowed) /
Qwen2 (window on layer 1 only) with head_dim 64 (the vector attention kernel's width), saved and loaded
through decodekit's HF loader, and the engine runs 1.5k .. 4k-token random prompts
  * with many prefill chunks (max_num_batched_tokens 128 / 300), block sizes 16 and 64,
  * with a long shared prefix (2000 tokens, a 150-token tail) hitting the prefix cache on a second pass,
  * with a KV cache too small for the batch (preemption and recompute; for the windowed model 17 blocks of 16
    tokens, so a 3000-token prompt only runs because its out-of-window blocks are released),
  * on a KV pool filled with NaN first (a read of an unwritten / released slot poisons the result),
comparing prompt_logprobs at EVERY position with transformers' float64 log_softmax and 16 greedy tokens with
transformers' greedy loop. Then decoding up to max_model_len exactly (with and without n-gram speculation),
the fp8 / 16-bit caches' attention op at 8192 keys, fp8's error against the float32 cache over 8000 positions, and
how much prefill work preemption throws away (was 4.7-22x the tokens needed; now at most 2x).

The reference's rope angles: transformers computes position x inv_freq in float32 (angle error ~ position x
6e-8 rad: 2e-4 rad at 3000), decodekit in float64 then rounds cos / sin once (ops.reference.rope_cos_sin_cache).
At long positions the float32 angles are the larger error: on the embedded model at 3000 tokens HF float32 is
1.3e-4 from float64-with-float64-angles, decodekit 1.7e-5. So the tiny models' float64 reference takes float64
angles (_f64_rope; the frequencies computed independently of decodekit's table), and a decodekit table built
from float32 angles must fail the tolerance (test_float32_rope_angles_are_caught).

Tolerance (ATOL on logprobs, tiny models): decodekit in float32 against float64 over two layers of 128-wide
projections, 64-wide heads and a 512-token LM head, q / k scaled 2x (peaked attention, so the window and positions
matter): measured worst per prompt 5e-5 .. 1.4e-4 over all positions and configurations (transformers' own float32
forward, q / k scaled 3x: 2.8e-4 .. 2.4e-3 off). ATOL = 6e-4; the mutations it must catch (measured): a rope table
from float32 angles 4.4e-3 at 4000 tokens, a window one key too wide 4.3, no window 10.8.

The embedded SmolLM2-135M (slow: transformers' 8180-token forward takes ~1 min on 2 cores) against transformers'
float32 forward of the same dequantized GGUF weights, with float64 rope angles too: see test_embedded_long_prompts.
"""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, tiny_hf_model

transformers = pytest.importorskip("transformers")

V = 512
ATOL = 6e-4           # prompt logprobs vs float64 (module docstring)
N_GREEDY = 16


# ---- tiny models ----------------------------------------------------------------------------------------------

def _f64_rope(model, theta: float, head_dim: int) -> None:
    """transformers' rotary embedding with float64 angles (cos / sin then rounded to the model's dtype)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))

    def forward(x, position_ids):
        ang = position_ids[..., None].double() * inv
        emb = torch.cat([ang, ang], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    model.model.rotary_emb.forward = forward


def _build(d: str, kind: str, scale_qk: float = 2.0, **kw):
    """A tiny transformers model saved at d with decodekit's synthetic tokenizer: (d, float64 reference with
    float64 rope angles)."""
    from decodekit.tokenizer.builders import synthetic_backend
    cfg = dict(vocab_size=V, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=64, max_position_embeddings=8192, initializer_range=0.15,
               bos_token_id=0, eos_token_id=0, pad_token_id=0, rope_theta=10000.0)
    cfg.update(kw)
    model = tiny_hf_model(kind, **cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if any(s in n for s in ("q_proj", "k_proj")):
                p.mul_(scale_qk)    # peaked attention: positions and the window move the logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
    synthetic_backend(V).save(os.path.join(d, "tokenizer.json"))
    ref = copy.deepcopy(model).double().eval()
    _f64_rope(ref, cfg["rope_theta"], cfg["head_dim"])
    return d, ref


@torch.no_grad()
def _hf_reference(ref, prompt: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """transformers' float64 log_softmax at every prompt position [len, V] and its n greedy tokens (its own KV
    cache, no EOS stop)."""
    r = ref(torch.tensor([prompt]), use_cache=True)
    lp = torch.log_softmax(r.logits[0], -1)
    toks = [int(r.logits[0, -1].argmax())]
    for _ in range(n - 1):
        r = ref(torch.tensor([[toks[-1]]]), past_key_values=r.past_key_values, use_cache=True)
        toks.append(int(r.logits[0, -1].argmax()))
    return lp, toks


def _worst_prompt_logprob_error(out, prompt: list[int], ref_lp: torch.Tensor) -> float:
    pl = out.prompt_logprobs
    assert pl is not None and len(pl) == len(prompt) and pl[0] is None
    got = torch.tensor([pl[j][prompt[j]].logprob for j in range(1, len(prompt))], dtype=torch.float64)
    want = ref_lp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    assert not got.isnan().any(), "NaN prompt logprobs (a read of a poisoned KV slot?)"
    return (got - want).abs().max().item()


def _poison_kv(llm) -> None:
    """Every KV slot NaN until written: reading an unwritten or released slot shows up as NaN."""
    for k, v in llm.engine.runner.kv_caches:
        k.fill_(float("nan"))
        v.fill_(float("nan"))


def _prompts(seed: int, n: int) -> list[list[int]]:
    """A long random prompt, a half-length one, and one sharing the long one's first 2000 tokens."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(3, V, (n,), generator=g).tolist()
    b = torch.randint(3, V, (n // 2 + 7,), generator=g).tolist()
    c = a[:2000] + torch.randint(3, V, (150,), generator=g).tolist()
    return [a, b, c]


_BLOCK_BYTES = 2 * 2 * 1 * 64 * 4     # 2 layers x (K, V) x 1 KV head x head_dim 64 x fp32, per token

# (id, class, config kwargs, long prompt length, KV blocks of 16 for the preemption run)
MODELS = [
    ("llama", "Llama", dict(), 4000, 300),
    ("mistral-window100", "Mistral", dict(sliding_window=100), 3000, 17),         # every layer: blocks released
    ("qwen2-window100-layer1", "Qwen2", dict(use_sliding_window=True, sliding_window=100, max_window_layers=1),
     3000, 200),                                                                 # layer 0 full: nothing released
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Built once: {id: (dir, reference, prompts, reference prompt logprobs, reference greedy tokens, cfg)}."""
    out = {}
    for name, kind, kw, n, blocks in MODELS:
        d, ref = _build(str(tmp_path_factory.mktemp(name)), kind, **kw)
        prompts = _prompts(len(out) + 3, n)
        refs = [_hf_reference(ref, p, N_GREEDY) for p in prompts]
        out[name] = (d, ref, prompts, [r[0] for r in refs], [r[1] for r in refs], (n, blocks))
    return out


def _engine_kw(which: str, n: int, blocks: int) -> dict:
    if which == "chunks128-block16":
        return dict(block_size=16, max_num_batched_tokens=128)
    if which == "chunks300-block64":
        return dict(block_size=64, max_num_batched_tokens=300)
    # a KV cache smaller than the batch: preemption (recompute), and for an all-windowed model block release
    return dict(block_size=16, max_num_batched_tokens=128, kv_cache_memory=blocks * 16 * _BLOCK_BYTES,
                max_model_len=n + 64)


@pytest.mark.parametrize("which", ["chunks128-block16", "chunks300-block64", "small-cache"])
@pytest.mark.parametrize("model", [m[0] for m in MODELS])
def test_long_prompts_match_transformers(tiny_models, model, which):
    """prompt_logprobs at every position of 1.5k .. 4k-token prompts within ATOL of transformers' float64 forward,
    16 greedy tokens equal to its greedy loop; a second pass (reversed order, no prompt_logprobs) hits the
    prefix cache on the shared 2000-token prefix and gives the same tokens; a NaN-poisoned pool; no leaks."""
    from decodekit import LLM
    d, ref, prompts, ref_lps, want, (n, blocks) = tiny_models[model]
    kw = _engine_kw(which, n, blocks)
    llm = LLM(model=d, dtype="float32", device="cpu", **kw)
    _poison_kv(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=N_GREEDY, ignore_eos=True, prompt_logprobs=0))
    for p, o, lp, w in zip(prompts, outs, ref_lps, want):
        worst = _worst_prompt_logprob_error(o, p, lp)
        assert worst < ATOL, f"{len(p)}-token prompt: prompt logprobs {worst:.2e} from transformers'"
        assert o.outputs[0].token_ids == w, f"{len(p)}-token prompt: greedy tokens differ from transformers'"
    hits = llm.engine.kv_manager.prefix_cache_hits
    again = llm.generate([{"prompt_token_ids": p} for p in prompts[::-1]],
                         SamplingParams(temperature=0, max_tokens=N_GREEDY, ignore_eos=True))[::-1]
    assert [o.outputs[0].token_ids for o in again] == want
    if which == "small-cache":
        assert llm.engine.scheduler.num_preemptions > 0, "the small cache was meant to preempt"
        assert llm.engine.kv_manager.num_blocks == blocks
    else:   # (the small cache evicts what it cached)
        assert llm.engine.kv_manager.prefix_cache_hits >= hits + 2000 - 16
    assert_no_leaks(llm)


def test_float32_rope_angles_are_caught(tiny_models):
    """Mutation check of ATOL: decodekit's rope table rebuilt from float32 angles (as transformers computes them)
    puts the 4000-token prompt's logprobs outside ATOL of the float64-angle reference (measured 4.4e-3), while the
    first 200 positions (angles < 200 rad, float32 error ~1e-5 rad) stay within it (measured 8e-5)."""
    from decodekit import LLM
    d, ref, prompts, ref_lps, _, _ = tiny_models["llama"]
    llm = LLM(model=d, dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=1024)
    m = llm.engine.model
    D = m.config.head_dim
    inv32 = (1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))).float()
    ang = torch.arange(m.cos_sin_cache.shape[0], dtype=torch.float32)[:, None] * inv32   # float32 products
    m.cos_sin_cache.copy_(torch.cat([ang.double().cos(), ang.double().sin()], -1).float())
    p = prompts[0]
    out = llm.generate({"prompt_token_ids": p}, SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert _worst_prompt_logprob_error(out, p, ref_lps[0]) > ATOL
    out = llm.generate({"prompt_token_ids": p[:200]}, SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert _worst_prompt_logprob_error(out, p[:200], ref_lps[0][:200]) < ATOL


@pytest.mark.parametrize("window", [101, 0])
def test_window_mutations_are_caught(tiny_models, window):
    """Mutation check: the Mistral engine run with a window one key wider (101) or none at all is outside ATOL of
    the window-100 reference at the 3000-token prompt (so test_long_prompts_match_transformers sees the window)."""
    from decodekit import LLM
    d, ref, prompts, ref_lps, _, _ = tiny_models["mistral-window100"]
    llm = LLM(model=d, dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=1024)
    llm.engine.model.layer_windows = [window] * len(llm.engine.model.layer_windows)
    llm.engine.scheduler.config.sliding_window = None    # (nothing released: the wider window's keys stay)
    p = prompts[0]
    out = llm.generate({"prompt_token_ids": p}, SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert _worst_prompt_logprob_error(out, p, ref_lps[0]) > 5 * ATOL


# ---- up to max_model_len ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [None, "ngram"])
def test_decode_up_to_max_model_len(tmp_path, spec):
    """A 2040-token prompt (a repeated 37-token pattern: n-gram drafts galore) of a model whose context is 2048:
    max_tokens 8 reaches the last position, token-identical to transformers (drafts past the end are dropped);
    max_tokens 9, or a 2048-token prompt, are refused naming max_model_len (the documented behaviour:
    scheduler.add_request); a 2047-token prompt gets its one token."""
    from decodekit import LLM
    d, ref = _build(str(tmp_path), "Llama", max_position_embeddings=2048)
    g = torch.Generator().manual_seed(11)
    pat = torch.randint(3, V, (37,), generator=g).tolist()
    prompt = (pat * 56)[:2040]
    kw = dict(speculative="ngram", num_speculative_tokens=8, spec_ngram_min=2) if spec else {}
    llm = LLM(model=d, dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=256, **kw)
    assert llm.engine.max_model_len == 2048
    want = _hf_reference(ref, prompt, 8)[1]
    (out,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out.outputs[0].token_ids == want and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match=r"= 2049 exceeds max_model_len \(2048\)"):
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=9))
    with pytest.raises(ValueError, match=r"exceeds max_model_len \(2048\) - 1"):
        llm.generate([{"prompt_token_ids": prompt + want}], SamplingParams(temperature=0, max_tokens=1))
    (out,) = llm.generate([{"prompt_token_ids": prompt + want[:7]}], SamplingParams(temperature=0, max_tokens=1))
    assert out.outputs[0].token_ids == want[7:]
    assert_no_leaks(llm)


# ---- fp8 / 16-bit KV caches at long context --------------------------------------------------------------------

def _paged(ctx: list[int], new: list[int], hq: int, hk: int, d: int, bs: int, kv_dtype, gen):
    """Random K / V written by ops.reshape_and_cache into a scattered paged pool whose other blocks hold NaN
    (fp8: its NaN code); returns what paged_attention takes and the float32 pool of the same K / V."""
    from decodekit import ops
    need = [-(-c // bs) for c in ctx]
    nb = sum(need) + 5
    perm = torch.randperm(nb, generator=gen).tolist()
    tables, i = [], 0
    for k in need:
        tables.append(perm[i:i + k])
        i += k
    bt = torch.tensor([t + [perm[-1]] * (max(need) - len(t)) for t in tables], dtype=torch.int32)
    T = sum(ctx)
    k = torch.randn(T, hk, d, generator=gen)
    k[:, :, 3] += 4.0                       # an outlier channel (as real K has): sets the fp8 scale
    v = torch.randn(T, hk, d, generator=gen)
    slots = torch.tensor([tables[s][j // bs] * bs + j % bs for s, c in enumerate(ctx) for j in range(c)])
    pools = {}
    for dt in {kv_dtype, torch.float32}:
        kc = torch.full((nb, hk, bs, d), float("nan")).to(dt)
        vc = kc.clone()
        ks = vs = None
        if dt == torch.float8_e4m3fn:        # calibrated as the engine does: 2 x amax / 448
            ks, vs = k.abs().amax((0, 2)) * 2 / 448, v.abs().amax((0, 2)) * 2 / 448
        ops.reshape_and_cache(k, v, kc, vc, slots, ks, vs)
        pools[dt] = (kc, vc, ks, vs)
    q = torch.randn(sum(new), hq, d, generator=gen)
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    return q, bt, torch.tensor(ctx, dtype=torch.int32), qsl, pools


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float16])
def test_quantized_cache_attention_at_8k_keys(kv_dtype, gen):
    """paged_attention over an fp8 / bf16 / fp16 cache (float32 queries) at 1000 .. 8192 keys and a 300-token chunk
    after 8192 - 300 cached ones beside a decode at 3000, unused blocks NaN: equal to the float64 reference on the SAME
    cache contents (no scale or accumulation error: measured <= 4e-7, TOL float32 2e-5), and its error against the
    unquantized cache does not grow with the context (rms measured, 1000 / 8192 keys: fp8 2.1e-3 / 8.0e-4, bf16
    1.2e-4 / 5.0e-5, fp16 1.9e-5 / 6.3e-6: averaging over more keys)."""
    from decodekit import ops
    from decodekit.ops import reference as ref
    rms = {}
    for ctx, new in (([1000], [1]), ([8192], [1]), ([8192, 3000], [300, 1])):
        q, bt, lens, qsl, pools = _paged(ctx, new, 9, 3, 64, 16, kv_dtype, gen)
        kc, vc, ks, vs = pools[kv_dtype]
        out = ops.paged_attention(q, kc, vc, bt, lens, qsl, 0.125, k_scale=ks, v_scale=vs)
        assert not out.isnan().any(), f"{ctx}: NaN (a read outside the sequence's blocks)"
        want, _ = ref.paged_attention(q.double(), kc, vc, bt, lens, qsl, 0.125, ks, vs)
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
        k32, v32, _, _ = pools[torch.float32]
        exact, _ = ref.paged_attention(q.double(), k32.double(), v32.double(), bt, lens, qsl, 0.125)
        rms[len(ctx), ctx[0]] = ((out.double() - exact) ** 2).mean().sqrt().item()
    assert max(rms[1, 8192], rms[2, 8192]) <= 1.5 * rms[1, 1000], rms


def _next_token_logprobs(model, prompt: list[int], chunk: int = 1024, bs: int = 16) -> torch.Tensor:
    """log p(prompt[j + 1] | prompt[:j + 1]) for every j from LlamaModel.forward over its own KV cache (one sequence,
    prefill chunks of `chunk` tokens)."""
    from decodekit.models import AttentionMetadata
    T = len(prompt)
    nb = -(-T // bs)
    kv = model.allocate_kv_cache(nb, bs)
    table = torch.arange(nb, dtype=torch.int32)[None]
    rows = []
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        md = AttentionMetadata(torch.arange(s, e), torch.arange(s, e), table, torch.tensor([e], dtype=torch.int32),
                               torch.tensor([0, e - s], dtype=torch.int32), torch.arange(e - s))
        rows.append(torch.log_softmax(model.forward(torch.tensor(prompt[s:e]), md, kv).double(), -1))
    return torch.cat(rows)[torch.arange(T - 1), torch.tensor(prompt[1:])]


def test_fp8_kv_error_does_not_grow_with_length(tmp_path):
    """An 8000-token prompt through the tiny Llama with the engine's fp8 KV cache (its start-up calibrated scales)
    and with a float32 one: the mean |next-token logprob difference| over positions 6000-8000 stays within 1.5x of
    that over 100-1000 (measured 0.168 / 0.168 nats; bf16: 0.0107 / 0.0109): an error accumulating with the key
    count, or a scale going wrong far into the sequence, would grow (the op: test_quantized_cache_attention_at_8k_keys).
    """
    from decodekit import LLM
    d, _ = _build(str(tmp_path), "Llama", scale_qk=1.0)
    p = torch.randint(3, V, (8000,), generator=torch.Generator().manual_seed(4)).tolist()
    lp = {kv: _next_token_logprobs(LLM(model=d, dtype="float32", device="cpu", kv_cache_dtype=kv).engine.model, p)
          for kv in ("auto", "fp8")}
    e = (lp["fp8"] - lp["auto"]).abs()
    early, late = e[100:1000].mean().item(), e[6000:].mean().item()
    assert 0.01 < early and late <= 1.5 * early and late < 0.35, (early, late)


# ---- preemption at long context --------------------------------------------------------------------------------

def test_preemption_does_not_thrash(tiny_models):
    """Three long requests that cannot take prefix-cache hits (here: prefix caching off; the same with
    prompt_logprobs, which never take hits, under the default) in a cache of 1600 tokens: the engine must not
    compute many times the tokens it needs. Measured: 15028 tokens computed for 3217 needed (4.7x, 39 preemptions);
    with prompts of 2000 / 2500 / 1700 tokens, prompt_logprobs and max_tokens 300 in 3200 tokens, 157700 for 7097
    (22x, 335 preemptions). While the oldest request decodes, the preempted one is readmitted every other step with
    a chunk that just fits in the free blocks (Scheduler.schedule's waiting loop admits by the chunk), then preempts
    itself on its next chunk (the running loop: the newest request that cannot grow goes), discarding it. On the
    embedded model (README prompts of 2000 / 2500 / 1700 tokens, prompt_logprobs, 60 output tokens, 200 blocks of
    16, max_model_len 3000): 72.7 s and 54505 tokens computed; 15.7 s and 10473 now that a preempted request is
    readmitted only once all its tokens fit in the free blocks (here: 3966 tokens, 1.2x)."""
    from decodekit import LLM
    d, *_ = tiny_models["llama"]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (1000, 1250, 850)]
    llm = LLM(model=d, dtype="float32", device="cpu", max_num_batched_tokens=300, enable_prefix_caching=False,
              kv_cache_memory=100 * 16 * _BLOCK_BYTES, max_model_len=1500)
    sched = llm.engine.scheduler
    computed = [0]
    schedule = sched.schedule

    def counting():
        so = schedule()
        computed[0] += so.num_scheduled_tokens
        return so

    sched.schedule = counting
    mt = 40
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=mt, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == mt for o in outs)
    assert_no_leaks(llm)
    needed = sum(map(len, prompts)) + len(prompts) * (mt - 1)
    assert computed[0] <= 2 * needed, f"{computed[0]} computed for {needed} ({sched.num_preemptions} preemptions)"


# ---- the embedded model ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_embedded(gguf_path):
    """transformers' float32 SmolLM2 from the same GGUF (dequantized), with float64 rope angles."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path),
                                                              gguf_file=os.path.basename(gguf_path),
                                                              dtype=torch.float32).eval()
    rp = getattr(m.config, "rope_parameters", None) or {"rope_theta": m.config.rope_theta}
    _f64_rope(m, float(rp["rope_theta"]), m.config.hidden_size // m.config.num_attention_heads)
    return m


def _readme_ids(tok, n: int) -> list[int]:
    here = os.path.dirname(os.path.abspath(__file__))
    ids = tok.encode(open(os.path.join(here, "..", "..", "README.md"), encoding="utf-8").read())
    return (ids * (n // len(ids) + 1))[:n]


@torch.no_grad()
def _hf_continuation(m, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and each step's float64 log_softmax (only the last position's logits)."""
    r = m(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
    toks, lps = [], []
    for i in range(n):
        lp = torch.log_softmax(r.logits[0, -1].double(), -1)
        toks.append(int(lp.argmax()))
        lps.append(lp)
        if i + 1 < n:
            r = m(torch.tensor([[toks[-1]]]), past_key_values=r.past_key_values, use_cache=True)
    return toks, lps


@pytest.mark.slow
def test_embedded_long_prompts(hf_embedded):
    """SmolLM2-135M (context 8192) on README text of 1000 tokens, 3000 random token ids, and 8180 README tokens
    decoded to the last position (max_tokens 12 = 8192 - 8180): greedy tokens equal transformers' and every
    returned top-20 logprob within 3e-4 of its float32 forward with float64 rope angles (measured worst 3.3e-5 at
    1000, 3.2e-5 at 3000 (3.8e-5 chunked), 7.8e-5 at 8180; against transformers' own float32 angles 5e-5 / 2.4e-4 /
    3.9e-4, growing with the position; decodekit against float64 transformers with float64 angles: 2.3e-5 at 1000,
    1.7e-5 at 3000). The 3000-token prompt again with block 64 and 300-token chunks."""
    from decodekit import LLM
    llm = LLM(None, dtype="float32", device="cpu", kv_cache_memory="512MiB", seed=0)
    assert llm.engine.max_model_len == 8192
    g = torch.Generator().manual_seed(0)
    cases = [(_readme_ids(llm.tokenizer, 1000), 8), (torch.randint(100, 49000, (3000,), generator=g).tolist(), 8),
             (_readme_ids(llm.tokenizer, 8180), 12)]
    sp = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=20)   # noqa: E731
    chunked = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", block_size=64,
                  max_num_batched_tokens=300)
    for prompt, n in cases:
        want, lps = _hf_continuation(hf_embedded, prompt, n)
        runs = [llm] + ([chunked] if len(prompt) == 3000 else [])
        for engine in runs:
            out = engine.generate({"prompt_token_ids": prompt}, sp(n))[0].outputs[0]
            assert out.token_ids == want, f"{len(prompt)}-token prompt"
            worst = max(abs(v.logprob - lps[i][t].item()) for i, step in enumerate(out.logprobs)
                        for t, v in step.items())
            assert worst < 3e-4, f"{len(prompt)}-token prompt: logprobs {worst:.2e} from transformers'"
            assert out.finish_reason == "length"
    assert_no_leaks(llm)
