"""Tensor parallelism end to end on CPU (gloo, worker processes on this machine): greedy outputs equal
TP=1's token for token, fused and unfused AllReduce paths give identical results, sizes that do not
split fail before any process starts, a killed worker fails the driver with a clear error instead of a
hang, and torchrun-launched ranks work."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from decodekit import LLM
from decodekit.sampling import SamplingParams

PROMPTS = ["The capital of France is", "def fib(n):", "1, 2, 3, 4,", "Once upon a time"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)


def _run(model, prompts=PROMPTS, params=GREEDY, **kw):
    llm = LLM(model=model, max_model_len=256, kv_cache_memory="64MiB", **kw)
    try:
        outs = llm.generate(prompts, params)
        return ([o.outputs[0].token_ids for o in outs],
                [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs or [], o.outputs[0].token_ids)] for o in outs])
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def tiny_ref():
    return _run("random:tiny-gqa4")


@pytest.mark.parametrize("tp, allreduce, fused", [(2, "torch", False), (2, "torch", True), (4, "torch", True),
                                                   (2, "custom", False), (2, "custom", True), (4, "custom", True)])
def test_tp_greedy_matches_tp1(tiny_ref, tp, allreduce, fused):
    """8 query / 2 KV heads: TP 2 splits the KV heads, TP 4 replicates them; an odd vocabulary (1001)
    gives uneven vocabulary slices; separate LM head. AllReduce through gloo or decodekit's own
    (shared-memory buffers; fused: gemm_allreduce with the add + RMSNorm epilogue)."""
    toks, lps = _run("random:tiny-gqa4", tensor_parallel_size=tp, tp_allreduce=allreduce, tp_fused_allreduce=fused)
    assert toks == tiny_ref[0]
    for a, b in zip(lps, tiny_ref[1]):
        assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize("tp, allreduce, fused", [(2, "custom", True), (4, "torch", False)])
def test_tp_decode_buckets_match_tp1(tiny_ref, tp, allreduce, fused, monkeypatch):
    """decode_graphs="static" under TP: every rank builds the same padded decode buckets (on CUDA the
    graphs are captured in lockstep) and decode steps go through ("bucket_run", ...) -- the protocol the
    CUDA-graph path uses, run eagerly: the same tokens as TP=1."""
    from decodekit.distributed.worker import TPDriverModel
    calls = []
    real = TPDriverModel.run_decode_bucket
    monkeypatch.setattr(TPDriverModel, "run_decode_bucket",
                        lambda self, pool, bucket, *a: calls.append(bucket.size) or real(self, pool, bucket, *a))
    toks, lps = _run("random:tiny-gqa4", tensor_parallel_size=tp, tp_allreduce=allreduce, tp_fused_allreduce=fused,
                     decode_graphs="static", max_num_seqs=3)
    assert toks == tiny_ref[0]
    for a, b in zip(lps, tiny_ref[1]):
        assert a == pytest.approx(b, abs=1e-4)
    # 4 prompts, at most 3 running: decode batches of 3 (bucket 3 = max_num_seqs) then 1 (bucket 1)
    assert calls and set(calls) <= {1, 2, 3} and 3 in calls, calls


@pytest.mark.parametrize("allreduce", ["torch", "custom"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_and_unfused_allreduce_identical(allreduce, dtype):
    """Column-chunked GEMM + overlapped AllReduce (gloo; bf16: dense_gemm chunks) or gemm_allreduce
    (custom) computes every element exactly like GEMM then AllReduce: identical tokens and logprobs."""
    kw = dict(tensor_parallel_size=2, tp_allreduce=allreduce, dtype=dtype)
    a = _run("random:tiny-gqa4", **kw, tp_fused_allreduce=False)
    b = _run("random:tiny-gqa4", **kw, tp_fused_allreduce=True)
    assert a == b


@pytest.mark.parametrize("quantization", ["int4-rtn", "fp8"])
def test_fused_quantized_allreduce_identical(quantization):
    """INT4 / fp8 W8A8 row-parallel shards: gemm_allreduce_int4 / _fp8 (fused) against the quantized GEMM
    then AllReduce: identical tokens and logprobs."""
    kw = dict(tensor_parallel_size=2, tp_allreduce="custom", dtype="bfloat16", quantization=quantization)
    a = _run("random:tiny-gqa4", **kw, tp_fused_allreduce=False)
    b = _run("random:tiny-gqa4", **kw, tp_fused_allreduce=True)
    assert a == b


def test_tp3_embedded_default_matches_tp1():
    """The embedded SmolLM2 (9 query / 3 KV heads, Q4_1 projections, Q8_0 tied embedding) at TP 3."""
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    prompts, params = PROMPTS[:2], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref, _ = _run(None, prompts, params)
    got, _ = _run(None, prompts, params, tensor_parallel_size=3, tp_allreduce="custom", tp_fused_allreduce=True)
    assert got == ref


def test_tp3_embedded_fused_identical():
    """Packed Q4_1 projections: the fused path (gemm_allreduce_int4: int4_gemm tiles pushed to the peers)
    gives exactly the unfused results."""
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    prompts, params = PROMPTS[2:], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    a = _run(None, prompts, params, tensor_parallel_size=3, tp_allreduce="custom")
    b = _run(None, prompts, params, tensor_parallel_size=3, tp_allreduce="custom", tp_fused_allreduce=True)
    assert a == b


def test_tp_with_spec_decode_and_fp8_kv():
    """Verification steps (several rows per request), layer-skip drafting through the driver model and
    fp8 KV calibration per rank: same greedy tokens as TP=1 with the same options."""
    kw = dict(speculative="layerskip", spec_layers=1, kv_cache_dtype="fp8")
    ref, _ = _run("random:tiny-gqa4", **kw)
    got, _ = _run("random:tiny-gqa4", tensor_parallel_size=2, tp_allreduce="torch", **kw)
    assert got == ref


@pytest.mark.parametrize("allreduce", ["torch", "custom"])
def test_killed_worker_fails_clearly(allreduce):
    from decodekit.distributed.parallel_state import TPWorkerError
    llm = LLM(model="random:tiny-gqa4", max_model_len=256, kv_cache_memory="64MiB", tensor_parallel_size=2,
              tp_allreduce=allreduce, tp_timeout=20)
    eng = llm.llm_engine
    try:
        assert llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].token_ids
        eng.tp.procs[0].kill()
        eng.tp.procs[0].wait(timeout=10)
        t0 = time.monotonic()
        with pytest.raises(TPWorkerError, match=r"worker rank 1 \(exit code -9\) died"):
            llm.generate(["hello again"], SamplingParams(temperature=0, max_tokens=3))
        assert time.monotonic() - t0 < 30
    finally:
        eng.shutdown()


@pytest.mark.parametrize("model, tp, msg", [("random:tiny-gqa4", 3, r"tensor_parallel_size 3 .*allowed sizes: \[1, 2, 4, 8\]"),
                                            ("random:tiny-gqa4", 0, r"tensor_parallel_size must be an int in \[1, 64\]")])
def test_bad_sizes_fail_before_spawning(model, tp, msg):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=msg):
        LLM(model=model, tensor_parallel_size=tp)
    assert time.monotonic() - t0 < 10


def test_embedded_tp2_names_allowed_sizes():
    from dk_testing import embedded_model_or_skip
    embedded_model_or_skip()
    with pytest.raises(ValueError, match=r"9\).*allowed sizes: \[1, 3\]"):
        LLM(tensor_parallel_size=2)


def test_torchrun_two_cpu_ranks(tmp_path):
    """`torchrun --nproc-per-node 2 -m decodekit.cli generate --tp 2 ...`: rank 0 prints the answer,
    rank 1 serves as a worker and exits with it; the text equals a single-process run's."""
    args = ["--model", "random:tiny-gqa4", "--max-model-len", "128", "--kv-cache-memory", "32MiB", "--max-tokens",
            "8", "--temperature", "0", "--no-stream", "Hello there"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, "-m", "decodekit.cli", "generate", *args], capture_output=True, text=True,
                         timeout=120, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(_free_port()), "-m", "decodekit.cli", "generate", "--tp", "2", "--tp-allreduce", "torch",
                          *args], capture_output=True, text=True, timeout=180, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    assert one.stdout.strip() and two.stdout.strip() == one.stdout.strip()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp_qwen3_head_norms_match_tp1():
    """Qwen3 (q / k head norms, replicated on every rank; head_dim 32 where hidden / heads is 16): TP 2 gives
    TP 1's tokens and logprobs (the synthetic tokenizer: the prompts are byte tokens)."""
    ref = _run("random:tiny-qwen3")
    toks, lps = _run("random:tiny-qwen3", tensor_parallel_size=2, tp_allreduce="torch")
    assert toks == ref[0]
    for a, b in zip(lps, ref[1]):
        assert a == pytest.approx(b, abs=1e-4)
