"""Batch invariance end to end on the embedded model (CPU; EngineArgs.batch_invariant): a request's tokens and
logprobs are bit for bit the same alone and in a batch (mixed steps of chunked prefills and decodes, short prompts,
seeded sampling), and greedy speculative decoding gives plain decoding's tokens for a whole batch of prompts
(verification passes of 9+ rows), in float32 and bfloat16."""
import pytest
import torch

from decodekit import LLM
from decodekit.bench.spec_prompts import grounded_prompts, open_prompts
from decodekit.engine.args import EngineArgs
from decodekit.sampling import SamplingParams
from dk_testing import assert_no_leaks, embedded_model_or_skip


def _llm(**kw):
    embedded_model_or_skip()
    kw.setdefault("dtype", "float32")
    return LLM(None, device="cpu", kv_cache_memory="256MiB", **kw)


def _prompts(llm, n_chat: int):
    chat = [llm.apply_chat_template([{"role": "user", "content": p}])
            for p in (grounded_prompts()[:3] + open_prompts())[:n_chat]]
    raw = [llm.engine.tokenizer.encode(t) for t in ("Hi", "The capital of France is", "1, 2, 3,")]
    return chat + raw   # raw prompts of 1 .. 8 tokens: prefills shorter than a many-row kernel's rows


def _result(out):
    o = out.outputs[0]
    lps = [sorted((t, lp.logprob) for t, lp in d.items()) for d in (o.logprobs or [])]
    return o.token_ids, lps


@pytest.mark.parametrize("dtype,graphs", [("float32", "off"), ("bfloat16", "off"), ("float32", "static")])
def test_a_request_gets_the_same_bits_alone_and_in_a_batch(dtype, graphs):
    """graphs "static": decode steps on padded static buffers (ModelRunner's DecodeBucket)."""
    llm = _llm(dtype=dtype, batch_invariant=True, max_num_batched_tokens=80,   # prefill chunks share steps
               decode_graphs=graphs)
    assert llm.engine.runner.batch_invariant
    ids = _prompts(llm, 9)
    for params in (SamplingParams(temperature=0, max_tokens=10, logprobs=3),
                   SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=10, logprobs=1)):
        batch = llm.generate([{"prompt_token_ids": i} for i in ids], params)
        for n, (i, b) in enumerate(zip(ids, batch)):
            alone = llm.generate({"prompt_token_ids": i}, params)[0]
            assert _result(b) == _result(alone), f"prompt {n}: batched output differs from the request alone"
    assert_no_leaks(llm)


@pytest.mark.parametrize("dtype,method", [("float32", "ngram"), ("bfloat16", "ngram"), ("float32", "layerskip")])
def test_greedy_speculative_batch_equals_plain_batch(dtype, method):
    """Ten prompts in one batch: verification passes of up to 10 x (k + 1) rows against plain decode steps of
    10 rows; batch invariance (auto with speculative decoding; asked for on the plain engine in bfloat16) makes
    every request's tokens and logprobs identical."""
    spec = _llm(dtype=dtype, speculative=method, spec_layers=20 if method == "layerskip" else None)
    plain = _llm(dtype=dtype, batch_invariant=True if dtype == "bfloat16" else None)
    assert spec.engine.runner.batch_invariant and plain.engine.runner.batch_invariant
    ids = _prompts(spec, 7)
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=2)
    a = plain.generate([{"prompt_token_ids": i} for i in ids], params)
    b = spec.generate([{"prompt_token_ids": i} for i in ids], params)
    assert [_result(x) for x in a] == [_result(y) for y in b]   # the tokens, and the logprobs bit for bit
    s = spec.engine.spec.summary()
    assert s["spec_verify_steps"] > 0 and s["spec_draft_tokens"] > 0
    assert_no_leaks(spec)


def test_batch_invariant_resolution_and_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # (EngineArgs checks that device="cuda" exists)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cpu = dict(device="cpu")
    assert EngineArgs(**cpu).resolved_batch_invariant()                      # float32: auto on
    assert EngineArgs(dtype="float16", **cpu).resolved_batch_invariant()
    assert not EngineArgs(dtype="bfloat16", **cpu).resolved_batch_invariant()
    assert EngineArgs(dtype="bfloat16", speculative="ngram", **cpu).resolved_batch_invariant()
    assert EngineArgs(dtype="bfloat16", batch_invariant=True, **cpu).resolved_batch_invariant()
    assert not EngineArgs(batch_invariant=False, **cpu).resolved_batch_invariant()
    assert not EngineArgs(device="cuda", dtype="float32").resolved_batch_invariant()   # auto: off on CUDA
    with pytest.raises(ValueError, match="batch_invariant=True is available on the CPU only"):
        EngineArgs(device="cuda", batch_invariant=True).resolved_batch_invariant()
    with pytest.raises(ValueError, match="batch_invariant must be a bool or None"):
        EngineArgs(batch_invariant="yes", **cpu)
    with pytest.raises(ValueError, match="batch_invariant=True needs tensor_parallel_size 1"):
        EngineArgs(batch_invariant=True, tensor_parallel_size=2, **cpu)


@pytest.mark.parametrize("seed", [3, 8])
def test_randomized_batches_equal_requests_alone(seed):
    """Random engine settings (budget, max_num_seqs, prefix caching, dtype) and requests (chat or raw prompt cuts,
    greedy or seeded sampling, max_tokens): each request of the batch equals the request alone, logprobs included."""
    import random
    rng = random.Random(seed)
    llm = _llm(dtype=rng.choice(["float32", "bfloat16"]), batch_invariant=True,
               max_num_batched_tokens=rng.choice([48, 64, 100, 256]), max_num_seqs=rng.choice([3, 5, 16]),
               enable_prefix_caching=rng.choice([True, False]))
    texts = grounded_prompts() + open_prompts()
    ids = [llm.apply_chat_template([{"role": "user", "content": t}]) if rng.random() < 0.6
           else llm.engine.tokenizer.encode(t[:rng.randint(3, 60)])
           for t in (rng.choice(texts) for _ in range(rng.randint(6, 14)))]
    params = [SamplingParams(temperature=rng.choice([0, 0.8]), seed=rng.randint(0, 99), max_tokens=rng.randint(3, 20),
                             logprobs=2) for _ in ids]
    batch = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    for n, (i, p, b) in enumerate(zip(ids, params, batch)):
        assert _result(b) == _result(llm.generate({"prompt_token_ids": i}, p)[0]), f"request {n} differs"
    assert_no_leaks(llm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dense_weights_same_bits_alone_and_in_a_batch(dtype):
    """A float checkpoint (dense projections, unlike the embedded model's packed ones): a prompt alone runs its
    rows as one padded block, in a batch among 33+ prompt rows -- both on one route (was: float32 17..32 rows on
    dense_gemm, 33+ on torch's GEMM: logprobs 2e-7..7e-7 apart)."""
    import random
    llm = LLM("random:tiny-gqa4", device="cpu", dtype=dtype, kv_cache_memory="32MiB", batch_invariant=True,
              max_num_batched_tokens=96)
    rng = random.Random(4)
    ids = [[rng.randrange(3, 1000) for _ in range(n)] for n in (1, 5, 13, 20, 31, 40, 57)]
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True)
    batch = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    for n, (i, b) in enumerate(zip(ids, batch)):
        assert _result(b) == _result(llm.generate({"prompt_token_ids": i}, params)[0]), f"prompt {n} differs"
    assert_no_leaks(llm)
