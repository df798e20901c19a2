"""End to end on the embedded SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32):
greedy decodekit vs HF transformers loading the same GGUF."""
import os

import pytest
import torch

from decodekit.loader import embedded_model_path
from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

RAW = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village",
    "1, 2, 3, 4, 5,",
]
CHAT = [
    "What is the boiling point of water?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in one sentence.",
    "Translate 'good morning' into Spanish.",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def llm():
    from decodekit import LLM
    return LLM(None, dtype="float32", device="cpu", kv_cache_memory="512MiB", seed=0)


@pytest.fixture(scope="module")
def hf_model():
    path = embedded_model_path()
    m = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                          dtype=torch.float32)
    return m.eval()


def _prompts(llm):
    out = [llm.tokenizer.encode(p) for p in RAW]
    out += [llm.apply_chat_template([{"role": "user", "content": c}]) for c in CHAT]
    return out


@torch.no_grad()
def _hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Plain greedy loop with HF's KV cache (no EOS stop, like ignore_eos)."""
    ids, past, toks, scores = torch.tensor([prompt]), None, [], []
    for _ in range(n):
        r = model(input_ids=ids, past_key_values=past, use_cache=True)
        past, logits = r.past_key_values, r.logits[0, -1].float()
        tok = int(logits.argmax())
        toks.append(tok)
        scores.append(logits)
        ids = torch.tensor([[tok]])
    return toks, scores


def test_greedy_matches_hf(llm, hf_model):
    prompts = _prompts(llm)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    ours = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    mismatches = []
    for p, o in zip(prompts, ours):
        theirs, scores = _hf_greedy(hf_model, p, MAX_TOKENS)
        mine = o.outputs[0].token_ids
        assert len(mine) == MAX_TOKENS
        if mine != theirs:
            i = next(k for k in range(MAX_TOKENS) if mine[k] != theirs[k])
            their_top5 = torch.topk(scores[i], 5).indices.tolist()
            my_top5 = list(o.outputs[0].logprobs[i].keys())
            assert mine[i] in their_top5 and theirs[i] in my_top5, (
                f"prompt {p[:8]}...: first difference at {i}: ours {mine[i]} (HF top5 {their_top5}), "
                f"HF {theirs[i]} (our top5 {my_top5})")
            mismatches.append(i)
    assert len(mismatches) <= 1, f"{len(mismatches)} prompts differ from HF (first-difference positions {mismatches})"


def test_logprobs_match_hf(llm, hf_model):
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy")
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, -1].double(), -1)
    lp = out.outputs[0].logprobs[0]
    for tok, v in lp.items():
        assert abs(v.logprob - ref[tok].item()) < 1e-3, (tok, v.logprob, ref[tok].item())
    assert list(lp)[0] == int(ref.argmax())


def _teacher_forced_hits(other, llm, hf_model, n: int = 12) -> tuple[float, float]:
    """At every position of HF's own greedy continuation (n tokens) of each prompt, whether `other`
    predicts HF's next token as its argmax (top-1) and within its top 5: the two hit rates."""
    forced, want = [], []
    for p in _prompts(llm):
        theirs, _ = _hf_greedy(hf_model, p, n)
        for k in range(n):
            forced.append({"prompt_token_ids": p + theirs[:k]})
            want.append(theirs[k])
    outs = other.generate(forced, SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    top1 = sum(o.outputs[0].token_ids[0] == w for o, w in zip(outs, want)) / len(want)
    top5 = sum(w in o.outputs[0].logprobs[0] for o, w in zip(outs, want)) / len(want)
    return top1, top5


def test_fp8_kv_cache_stays_close_to_hf(llm, hf_model):
    """An fp8 (e4m3) KV cache, with per-head scales calibrated at start-up, rounds K and V to 3
    mantissa bits (first-token logprobs move by up to ~0.7 nats on this 135M model), so free
    greedy runs drift apart after a near-tie and compound. Measured teacher-forced instead: at
    every position of HF's own greedy continuation, decodekit-with-fp8-KV predicts HF's next
    token as its argmax nearly always, and always has it in its top 5."""
    from decodekit import LLM
    llm8 = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", kv_cache_dtype="fp8", seed=0)
    assert llm8.engine.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    ks, vs = llm8.engine.model.kv_scales[0]
    assert ks.shape == (llm8.engine.model_config.num_kv_heads,) and bool((ks > 0).all() and (vs > 0).all())
    top1, top5 = _teacher_forced_hits(llm8, llm, hf_model)
    assert top1 >= 0.85 and top5 == 1.0, f"fp8 KV, teacher-forced on HF's greedy tokens: top-1 {top1:.3f}, top-5 {top5:.3f}"


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_16bit_kv_cache_for_fp32_model_stays_close_to_hf(llm, hf_model, kv):
    """kv_cache_dtype bfloat16 / float16 under the float32 model (CPU): half the cache's bytes, so twice the
    blocks in the same memory; K and V rounded once when written (8 / 11 significant bits), so the
    teacher-forced next-token argmax on HF's greedy continuations stays HF's nearly always, and the first
    generated token's logprobs stay within a few hundredths of a nat of HF's (fp8 above: ~0.7)."""
    from decodekit import LLM
    llm16 = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", kv_cache_dtype=kv, seed=0)
    llm32 = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", seed=0)
    assert llm16.engine.runner.kv_caches[0][0].dtype == getattr(torch, kv)
    assert llm16.engine.kv_manager.num_blocks == 2 * llm32.engine.kv_manager.num_blocks
    top1, top5 = _teacher_forced_hits(llm16, llm, hf_model)
    assert top1 >= 0.97 and top5 == 1.0, f"{kv} KV, teacher-forced on HF's greedy tokens: top-1 {top1:.3f}, top-5 {top5:.3f}"
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy")
    lp = llm16.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, -1].double(), -1)
    worst = max(abs(v.logprob - ref[tok].item()) for tok, v in lp.outputs[0].logprobs[0].items())
    assert worst < 0.05, f"{kv} KV: first-token logprobs {worst:.4f} nats from HF's"


def test_prompt_logprobs_match_hf(llm, hf_model):
    """prompt_logprobs: per prompt position after the first, the token's logprob, rank and the top-3 from
    transformers' full forward (float64 log-softmax; the same 1e-3 as the generated tokens' logprobs); a
    prompt longer than PROMPT_LOGPROBS_CHUNK, chunked, and a second request over the same prompt, which
    must not take a prefix-cache hit for them."""
    from decodekit.engine.scheduler import PROMPT_LOGPROBS_CHUNK
    text = "The history of the Roman Empire spans many centuries. " * 60
    ids = llm.tokenizer.encode(text)[:PROMPT_LOGPROBS_CHUNK + 77]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), -1)
    llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1))  # cached: the next ones must recompute
    outs = llm.generate([{"prompt_token_ids": ids}] * 2, SamplingParams(temperature=0, max_tokens=2, n=2,
                                                                         prompt_logprobs=3))
    for out in outs:
        pl = out.prompt_logprobs
        assert pl is not None and len(pl) == len(ids) and pl[0] is None
        worst = 0.0
        for pos in range(1, len(ids)):
            entry, r = pl[pos], ref[pos - 1]
            tok = ids[pos]
            assert tok in entry and len(entry) in (3, 4), (pos, entry)
            worst = max(worst, abs(entry[tok].logprob - r[tok].item()))
            want_rank = int((r > r[tok]).sum()) + 1
            assert abs(entry[tok].rank - want_rank) <= max(2, want_rank // 1000), (pos, entry[tok].rank, want_rank)
            mine = sorted((v.logprob for v in entry.values() if v.rank <= 3), reverse=True)
            assert len(mine) == 3 and max(abs(a - b) for a, b in zip(mine, torch.topk(r, 3).values.tolist())) < 1e-3
            assert entry[tok].decoded_token == llm.tokenizer.decode([tok], skip_special_tokens=False)
        assert worst < 1e-3, worst
    assert outs[0].prompt_logprobs == outs[1].prompt_logprobs
    assert_no_leaks(llm)
