"""On an H200 (run by tools/gpu_check.sh; skipped without a GPU): the engine on CUDA with a
random:smollm2-135m model matches HF transformers' LlamaForCausalLM with the same weights,
and its greedy tokens equal the CPU engine's."""
import pytest
import torch

from dk_testing import cuda_only, save_hf_dir
from decodekit.bench.engine_bench import hf_from_loaded
from decodekit.sampling import SamplingParams

pytestmark = cuda_only
transformers = pytest.importorskip("transformers")


def test_cuda_engine_matches_hf_and_cpu():
    from decodekit import LLM
    from decodekit.loader import load_model
    loaded = load_model("random:smollm2-135m", dtype=torch.float32)
    hf = hf_from_loaded(loaded, "cuda")
    gpu = LLM("random:smollm2-135m", device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 49152, (n,), generator=g).tolist() for n in (5, 33, 130)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=5)
    outs = gpu.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, o in zip(prompts, outs):
        seq = p + o.outputs[0].token_ids
        with torch.no_grad():
            logits = hf(torch.tensor([seq], device="cuda")).logits[0].float()
        # every generated token is HF's argmax (or within 1e-3 of it: a near-tie) given the same prefix
        for i, tok in enumerate(o.outputs[0].token_ids):
            row = logits[len(p) - 1 + i]
            assert row[tok] >= row.max() - 1e-3, f"token {i}: ours {tok}, HF argmax {int(row.argmax())}"
    cpu = LLM("random:smollm2-135m", device="cpu", dtype="float32", kv_cache_memory="256MiB")
    cpu_outs = cpu.generate([{"prompt_token_ids": p} for p in prompts], params)
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outs, cpu_outs))
    assert same >= len(prompts) - 1


def test_cuda_graph_replay_equals_eager():
    """Graph replay computes exactly what the same padded decode batch computes eagerly
    ("static": same shapes, same kernels); against unpadded eager steps ("off") the GEMM shapes
    differ (cuBLAS may pick other kernels), so bf16 rounding may flip a near-tie later on: the
    first tokens must agree and most sequences must agree in full."""
    from decodekit import LLM
    g = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(100, 49152, (n,), generator=g).tolist()} for n in (3, 17, 40, 9, 65)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for mode in ("off", "static", "cuda"):
        llm = LLM("random:smollm2-135m", device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
                  decode_graphs=mode, max_num_seqs=8)
        if mode == "cuda":
            assert llm.engine.runner.buckets, "no decode buckets"
            missing = [b.size for b in llm.engine.runner.buckets if b.graph is None]
            assert not missing, f"graphs were not captured for buckets {missing}"
        outs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
        torch.cuda.empty_cache()
    assert outs["cuda"] == outs["static"], f"graph replay != eager on the same buffers:\n{outs}"
    assert [o[:2] for o in outs["cuda"]] == [o[:2] for o in outs["off"]], outs
    same = sum(a == b for a, b in zip(outs["cuda"], outs["off"]))
    assert same >= len(prompts) - 2, f"only {same} of {len(prompts)} sequences equal unpadded eager:\n{outs}"


def test_cuda_int4_rtn_engine_matches_cpu():
    """--quantization int4-rtn on CUDA: decode steps through the CUDA INT4 GEMV kernel (M <= 8),
    prefill through int4_dequantize + cuBLAS; greedy tokens equal the CPU engine's (same RTN codes)."""
    from decodekit import LLM
    from decodekit.quant import Int4Weight
    g = torch.Generator().manual_seed(2)
    prompts = [{"prompt_token_ids": torch.randint(100, 49152, (n,), generator=g).tolist()} for n in (4, 19, 70)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    gpu = LLM("random:smollm2-135m", device="cuda", dtype="float32", gpu_memory_utilization=0.3,
              quantization="int4-rtn", max_num_seqs=8)
    assert isinstance(gpu.engine.model.layers[0].qkv, Int4Weight)
    outs = [o.outputs[0].token_ids for o in gpu.generate(prompts, params)]
    cpu = LLM("random:smollm2-135m", device="cpu", dtype="float32", kv_cache_memory="256MiB", quantization="int4-rtn")
    ref = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    assert sum(a == b for a, b in zip(outs, ref)) >= len(prompts) - 1, (outs, ref)


def test_cuda_beam_search_scores_match_hf():
    """Beam search on CUDA (beams continue or fork their parent's KV: CUDA copy_blocks, decode graphs): every
    hypothesis' cum_logprob is HF's log-probability of its tokens (float32), and an engine without forks'
    shared blocks (no prefix caching, eager) finds the same hypotheses for all prompts but at most one."""
    from decodekit import LLM, BeamSearchParams
    from decodekit.loader import load_model
    hf = hf_from_loaded(load_model("random:smollm2-135m", dtype=torch.float32), "cuda")
    g = torch.Generator().manual_seed(2)
    prompts = [{"prompt_token_ids": torch.randint(100, 49152, (n,), generator=g).tolist()} for n in (7, 16, 31)]
    params = BeamSearchParams(beam_width=4, max_tokens=10, ignore_eos=True)
    gpu = LLM("random:smollm2-135m", device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    outs = gpu.beam_search(prompts, params)
    for o in outs:
        assert len(o.sequences) == 4
        for s in o.sequences:
            with torch.no_grad():
                lp = torch.log_softmax(hf(torch.tensor([s.tokens], device="cuda")).logits[0].double(), -1)
            ref = sum(float(lp[s.prompt_len - 1 + i, t]) for i, t in enumerate(s.generated_token_ids))
            assert abs(ref - s.cum_logprob) < 2e-3, (ref, s.cum_logprob)
    del gpu
    torch.cuda.empty_cache()
    eager = LLM("random:smollm2-135m", device="cuda", dtype="float32", gpu_memory_utilization=0.3,
                decode_graphs="off", enable_prefix_caching=False)
    other = eager.beam_search(prompts, params)
    same = sum([s.tokens for s in a.sequences] == [s.tokens for s in b.sequences] for a, b in zip(outs, other))
    assert same >= len(prompts) - 1


def test_cuda_sliding_window_matches_hf(tmp_path, hf_tok):
    """A Mistral-style model (every layer windowed, head_dim 64) far past its window on CUDA: float32 greedy
    tokens are HF's argmax given the same prefix (decode kernel, split-KV plan capped by the window, released
    blocks); bf16 (tensor-core prefill with the window, decode graphs) agrees with the CPU engine."""
    from decodekit import LLM
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=49152, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                     sliding_window=48, tie_word_embeddings=False, attn_implementation="eager")
    model = transformers.MistralForCausalLM(cfg).eval()
    d = save_hf_dir(model, hf_tok, str(tmp_path / "mistral"))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 49152, (n,), generator=g).tolist() for n in (5, 100, 230)]
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    gpu = LLM(model=d, device="cuda", dtype="float32", gpu_memory_utilization=0.3, max_num_batched_tokens=64)
    outs = gpu.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, o in zip(prompts, outs):
        seq = p + o.outputs[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0].float()
        for i, tok in enumerate(o.outputs[0].token_ids):
            row = logits[len(p) - 1 + i]
            assert row[tok] >= row.max() - 1e-3, f"token {i}: ours {tok}, HF argmax {int(row.argmax())}"
    del gpu
    torch.cuda.empty_cache()
    bf = LLM(model=d, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3, max_num_batched_tokens=64)
    cpu = LLM(model=d, device="cpu", dtype="bfloat16", kv_cache_memory="64MiB", max_num_batched_tokens=64)
    a = [o.outputs[0].token_ids for o in bf.generate([{"prompt_token_ids": p} for p in prompts], params)]
    b = [o.outputs[0].token_ids for o in cpu.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert sum(x[:8] == y[:8] for x, y in zip(a, b)) >= len(prompts) - 1, (a, b)


@pytest.mark.parametrize("model", ["random:tiny-phi3", "random:tiny-qwen3"])
def test_cuda_padded_head_dim_matches_cpu(model):
    """head_dim 16 / 32 (Phi-3: 96), which the CUDA attention kernels lack: a zero-padded KV cache of 64
    (models/llama.py cache_head_dim), decode in CUDA graphs; greedy tokens equal the CPU engine's
    (unpadded) on all but at most one prompt (a near-tie may flip: other kernels, other sums)."""
    from decodekit import LLM
    g = torch.Generator().manual_seed(4)
    prompts = [{"prompt_token_ids": torch.randint(3, 500, (n,), generator=g).tolist()} for n in (3, 21, 66, 130)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    gpu = LLM(model, device="cuda", dtype="float32", gpu_memory_utilization=0.1, max_num_seqs=4, max_model_len=512)
    try:
        assert gpu.engine.runner.kv_caches[0][0].shape[-1] == 64
        outs = [o.outputs[0].token_ids for o in gpu.generate(prompts, params)]
    finally:
        gpu.shutdown()
    cpu = LLM(model, device="cpu", dtype="float32", kv_cache_memory="64MiB", max_model_len=512)
    ref = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    cpu.shutdown()
    assert sum(a == b for a, b in zip(outs, ref)) >= len(prompts) - 1, (outs, ref)
