"""Head dims the CUDA attention kernels lack (they take 64 / 128 / 256; Phi-3 has 96, the tiny presets
16 and 32) run there through a zero-padded KV cache (models/llama.py cache_head_dim).
DECODEKIT_ATTN_PAD_HEAD_DIM=always takes that path on the CPU too, where it must give what the unpadded
path gives: padded zeros add nothing to q.k and the zero V columns are dropped."""
import pytest
import torch

from decodekit import LLM
from decodekit.models.llama import cache_head_dim
from decodekit.sampling import SamplingParams


def test_cache_head_dim_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("DECODEKIT_ATTN_PAD_HEAD_DIM", raising=False)
    assert [cache_head_dim(d, cuda) for d in (16, 64, 80, 96, 128, 160, 256)] == [64, 64, 128, 128, 128, 256, 256]
    assert [cache_head_dim(d, cpu) for d in (16, 96, 160)] == [16, 96, 160]  # the CPU kernel takes any size
    with pytest.raises(ValueError, match="head_dim 320 is larger"):
        cache_head_dim(320, cuda)
    monkeypatch.setenv("DECODEKIT_ATTN_PAD_HEAD_DIM", "always")
    assert cache_head_dim(96, cpu) == 128 and cache_head_dim(128, cpu) == 128
    monkeypatch.setenv("DECODEKIT_ATTN_PAD_HEAD_DIM", "never")
    assert cache_head_dim(96, cuda) == 96  # the attention op then names the head_dim it cannot take
    monkeypatch.setenv("DECODEKIT_ATTN_PAD_HEAD_DIM", "sometimes")
    with pytest.raises(ValueError, match="DECODEKIT_ATTN_PAD_HEAD_DIM must be auto, always or never"):
        cache_head_dim(96, cpu)


def _run(model, monkeypatch, mode, **kw):
    monkeypatch.setenv("DECODEKIT_ATTN_PAD_HEAD_DIM", mode)
    g = torch.Generator().manual_seed(5)
    prompts = [{"prompt_token_ids": torch.randint(3, 500, (n,), generator=g).tolist()} for n in (5, 37, 70)]
    llm = LLM(model, device="cpu", dtype="float32", kv_cache_memory="64MiB", max_model_len=256, **kw)
    try:
        runner = llm.engine.runner
        width = runner.kv_caches[0][0].shape[-1]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2))
        return width, [(o.outputs[0].token_ids, [max(d.values(), key=lambda x: x.logprob).logprob
                                                 for d in o.outputs[0].logprobs]) for o in outs]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("model, padded", [("random:tiny-phi3", 64),   # head_dim 16, partial rotary, LongRoPE
                                           ("random:tiny-qwen3", 64),  # 32, q / k head norms
                                           ("random:tiny-gqa4", 64)])  # 16, GQA 4
def test_padded_cache_equals_unpadded(model, padded, monkeypatch):
    w0, ref = _run(model, monkeypatch, "never")
    w1, got = _run(model, monkeypatch, "always")
    assert w1 == padded and w0 < padded
    for (t_ref, lp_ref), (t_got, lp_got) in zip(ref, got):
        assert t_got == t_ref
        # float32 sums over 64 instead of 16 / 32 lanes: the same terms plus exact zeros, grouped otherwise
        assert max(abs(a - b) for a, b in zip(lp_ref, lp_got)) < 1e-4


def test_padded_cache_with_fp8_kv_and_chunked_prefill(monkeypatch):
    """fp8 KV (per-head scales; the padded columns quantize to code 0) and a prompt split over steps."""
    kw = dict(kv_cache_dtype="fp8", max_num_batched_tokens=32)
    w0, ref = _run("random:tiny-phi3", monkeypatch, "never", **kw)
    w1, got = _run("random:tiny-phi3", monkeypatch, "always", **kw)
    assert (w0, w1) == (16, 64)
    assert [t for t, _ in got] == [t for t, _ in ref]
