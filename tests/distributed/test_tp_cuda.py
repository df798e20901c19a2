"""Tensor parallelism on one H200 (run by tools/gpu_check.sh; skipped without a GPU). Two ranks share
the GPU: NCCL refuses that, so the model's collectives run over gloo and decodekit's AllReduce (CUDA IPC
between the two processes), which is what CUDA graphs capture. Greedy tokens equal TP=1's: the shards'
float32 GEMMs sum in another order than the whole one's, so a near-tie may flip a later token of one
sequence; the first tokens of all must agree."""
import pytest
import torch

from dk_testing import cuda_only
from decodekit.sampling import SamplingParams

pytestmark = cuda_only


def _generate(dtype="float32", **kw):
    from decodekit import LLM
    g = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(5, 1001, (n,), generator=g).tolist()} for n in (3, 17, 40, 9, 65)]
    llm = LLM("random:tiny-gqa4-d64", device="cuda", dtype=dtype, gpu_memory_utilization=0.1, max_num_seqs=4,
              max_model_len=256, **kw)
    try:
        buckets = [(b.size, b.graph is not None) for b in llm.engine.runner.buckets]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        return [o.outputs[0].token_ids for o in outs], buckets
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("fused", [False, True])
def test_cuda_tp2_graphs_custom_allreduce_match_tp1(fused):
    """TP 2 with decode steps captured in CUDA graphs on both ranks (the custom AllReduce, the fused
    gemm_allreduce when asked, and the logits gather through the AllReduce buffers inside the graph)."""
    ref, _ = _generate(decode_graphs="off")
    got, buckets = _generate(decode_graphs="cuda", tensor_parallel_size=2, tp_allreduce="custom",
                             tp_fused_allreduce=fused)
    assert buckets and all(captured for _, captured in buckets), buckets
    _same(got, ref)


@pytest.mark.parametrize("fused", [False, True])
def test_cuda_tp2_int4_bf16_runs(fused):
    """bf16 INT4 (int4-rtn, groups of 32) at TP 2: each rank holds qkv / gate_up as the Marlin copy alone and o /
    down with int4.h's layout too (gemm_allreduce_int4 when fused); decode steps in CUDA graphs. bf16 shards sum
    in another order than TP 1: most sequences' first tokens agree, every sequence runs to its length."""
    ref, _ = _generate("bfloat16", quantization="int4-rtn", decode_graphs="off")
    got, _ = _generate("bfloat16", quantization="int4-rtn", decode_graphs="cuda", tensor_parallel_size=2,
                       tp_allreduce="custom", tp_fused_allreduce=fused)
    assert all(len(o) == 10 for o in got), got
    assert sum(a[:1] == b[:1] for a, b in zip(got, ref)) >= len(ref) - 1, (got, ref)


def _same(got, ref):
    assert [o[:2] for o in got] == [o[:2] for o in ref], (got, ref)
    assert sum(a == b for a, b in zip(got, ref)) >= len(ref) - 1, (got, ref)


def test_cuda_tp2_eager_allreduce_matches_tp1():
    ref, _ = _generate(decode_graphs="off")
    got, buckets = _generate(decode_graphs="off", tensor_parallel_size=2, tp_allreduce="custom")
    assert not buckets
    _same(got, ref)
