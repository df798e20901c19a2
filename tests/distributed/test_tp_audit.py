"""Tensor-parallel audit (CPU, gloo, worker processes): what a vLLM user does with TP=N gives TP=1's results --
sampling features (seeded sampling, n > 1, beam search, logprobs / prompt_logprobs, penalties, logit_bias,
guided decoding, stop strings), engine behaviour (preemption, prefix caching, chunked prefill, aborts,
speculative decoding with sampling, sliding windows, the server), quantized weights -- and the group's
lifetime: Ctrl-C and driver failures mid-step, an LLM built in a thread, a second engine in one process,
no orphan workers or leftover files.

What TP=N promises: the same computation with each row-parallel layer's sums split over the ranks, so float32
logits equal TP=1's within rounding (the AllReduce adds partial sums in another order). Tokens (greedy, and
seeded sampling: the same per-request generator draws the same uniforms) are then identical unless two
candidates tie within ~1e-6 -- not the case for these fixed prompts and seeds -- and logprobs agree within 1e-4
(observed at TP 2: <= 1e-6). Not promised: bfloat16 (each rank's partial sum is rounded to bf16 before the AllReduce)
and fp8 W8A8 (per-token activation scales, and scales quantized at load, are per shard of a row-parallel
layer's input), whose tokens may differ at near-ties."""
from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from decodekit import LLM
from decodekit.distributed.parallel_state import TPWorkerError
from decodekit.engine.args import EngineArgs
from decodekit.engine.llm_engine import LLMEngine
from decodekit.sampling import SamplingParams
from decodekit.sampling.beam_search import BeamSearchParams

MODEL = "random:tiny-gqa4"  # 8 query / 2 KV heads, vocabulary 1001 (uneven slices), separate LM head
KW = dict(max_model_len=256, kv_cache_memory="64MiB")
PROMPTS = ["The capital of France is", "def fib(n):", "1, 2, 3, 4,", "Once upon a time there was a"]
LP_TOL = 1e-4

CASES = {
    "seeded": SamplingParams(temperature=1.0, seed=7, max_tokens=10, ignore_eos=True, logprobs=3),
    "top_p_top_k": SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=3, max_tokens=10, ignore_eos=True,
                                  logprobs=2),
    "min_p": SamplingParams(temperature=1.3, min_p=0.05, seed=11, max_tokens=10, ignore_eos=True),
    "n3": SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True, logprobs=1),
    "penalties": SamplingParams(temperature=0, presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.3,
                                max_tokens=10, ignore_eos=True),
    "logit_bias": SamplingParams(temperature=0, logit_bias={5: 5.0, 1000: 3.0}, max_tokens=8, ignore_eos=True),
    "prompt_logprobs": SamplingParams(temperature=0, prompt_logprobs=3, logprobs=5, max_tokens=4, ignore_eos=True),
    "min_tokens_allowed": SamplingParams(temperature=0.5, seed=2, min_tokens=3, max_tokens=6,
                                         allowed_token_ids=[0, 100, 200, 300, 1000]),
    "stop": SamplingParams(temperature=0, max_tokens=20, stop=["e", " the"], include_stop_str_in_output=True),
    "bad_words": SamplingParams(temperature=0, max_tokens=10, bad_words=["the", " Paris"]),
    "regex": SamplingParams(temperature=0.8, seed=1, max_tokens=20, guided_regex=r"[a-z]{3,8}@[a-z]{2,5}\.com"),
    "json": SamplingParams(temperature=0, max_tokens=30, guided_json={
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    "choice": SamplingParams(temperature=0, max_tokens=10, guided_choice=["yes", "no", "maybe"]),
    "context_limit": SamplingParams(temperature=0.9, seed=8, max_tokens=250, ignore_eos=True),
}


def _lps(table):
    return None if table is None else {t: lp.logprob for t, lp in table.items()}


TP4_CASES = ("seeded", "n3", "penalties", "prompt_logprobs", "json")  # (4 processes on a small machine: fewer)


def _results(llm, cases=tuple(CASES)) -> dict:
    """Per case, per output: (tokens, text, finish_reason, logprob tables, prompt logprob tables)."""
    res = {}
    for name in cases:
        p = CASES[name]
        prompts = PROMPTS if name != "context_limit" else [{"prompt_token_ids": [7] * 6}]
        res[name] = [(c.token_ids, c.text, c.finish_reason, [_lps(d) for d in c.logprobs or []],
                      [_lps(d) for d in o.prompt_logprobs or []])
                     for o in llm.generate(prompts, p) for c in o.outputs]
    beams = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    res["beam"] = [[(s.tokens, s.cum_logprob) for s in o.sequences] for o in beams]
    return res


def _assert_tables_close(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None:
            assert x is None and y is None, (what, i)
            continue
        assert set(x) == set(y), (what, i, x, y)  # the same top-k sets
        assert max(abs(x[t] - y[t]) for t in x) <= LP_TOL, (what, i, x, y)


def _assert_same(ref: dict, got: dict) -> None:
    for name in got:
        if name == "beam":
            for r, g in zip(ref[name], got[name]):
                assert [s[0] for s in r] == [s[0] for s in g], name
                assert [s[1] for s in r] == pytest.approx([s[1] for s in g], abs=LP_TOL), name
            continue
        assert len(ref[name]) == len(got[name]), name
        for i, (r, g) in enumerate(zip(ref[name], got[name])):
            assert r[:3] == g[:3], (name, i)  # tokens, text, finish reason
            _assert_tables_close(r[3], g[3], (name, i, "logprobs"))
            _assert_tables_close(r[4], g[4], (name, i, "prompt_logprobs"))


@pytest.fixture(scope="module")
def ref_results():
    llm = LLM(model=MODEL, seed=0, **KW)
    ref = _results(llm)
    assert ref["context_limit"][0][2] == "length" and len(ref["context_limit"][0][0]) == 250
    return ref


@pytest.mark.parametrize("tp, kw", [(2, {}), (4, dict(tp_allreduce="torch", tp_fused_allreduce=True))],
                         ids=["tp2-auto", "tp4-torch-fused"])
def test_sampling_features_match_tp1(ref_results, tp, kw):
    llm = LLM(model=MODEL, seed=0, tensor_parallel_size=tp, **kw, **KW)
    try:
        got = _results(llm, tuple(CASES) if tp == 2 else TP4_CASES)
    finally:
        llm.shutdown()
    assert len(got) == (len(CASES) + 1 if tp == 2 else len(TP4_CASES) + 1)
    _assert_same(ref_results, got)


# ---------------------------------------------------------------------------------------------- engine
def _workload(seed: int = 0, **engine_kw):
    """A scripted mix of requests (shared prefixes, greedy / seeded / n=2 / prompt_logprobs / up to the context
    limit) added over 40 steps, some aborted, stepped to the end: every output by request id."""
    eng = LLMEngine(EngineArgs(model=MODEL, max_model_len=192, seed=0, **engine_kw))
    rng = random.Random(seed)
    shared = [rng.randrange(3, 1001) for _ in range(40)]
    outs, live = {}, []

    def take(step_outs):
        for o in step_outs:
            outs[o.request_id] = ([(c.token_ids, c.finish_reason, [d[t].logprob for d, t in zip(c.logprobs or [],
                                                                                             c.token_ids)])
                                   for c in o.outputs],
                                  [None if d is None else max(v.logprob for v in d.values())
                                   for d in o.prompt_logprobs or []])
            if o.finished and o.request_id in live:
                live.remove(o.request_id)
    try:
        for step in range(60):
            if step < 40 and rng.random() < 0.5:
                for j in range(rng.randrange(1, 4)):
                    ids = (shared[:rng.randrange(0, 40)] if rng.random() < 0.5 else []) + \
                          [rng.randrange(3, 1001) for _ in range(rng.randrange(1, 100))]
                    kind, mt = rng.randrange(5), rng.randrange(1, 30)
                    p = [dict(temperature=0, logprobs=2), dict(temperature=1.0, seed=rng.randrange(1000), top_p=0.9),
                         dict(n=2, temperature=0.8, seed=rng.randrange(1000), logprobs=1),
                         dict(temperature=0, prompt_logprobs=1, repetition_penalty=1.2),
                         dict(temperature=0.7, min_p=0.1, seed=rng.randrange(1000))][kind]
                    p.setdefault("max_tokens", mt if kind != 4 else 192 - len(ids))
                    rid = f"r{step}_{j}"
                    eng.add_request(rid, ids, SamplingParams(ignore_eos=True, **p))
                    live.append(rid)
            if live and rng.random() < 0.1:
                rid = rng.choice(live)
                eng.abort_request(rid)
                live.remove(rid)
            if eng.has_unfinished_requests():
                take(eng.step())
        while eng.has_unfinished_requests():
            take(eng.step())
        return outs, eng.scheduler.num_preemptions
    finally:
        eng.shutdown()


def _assert_workloads_equal(ref, got):
    assert ref.keys() == got.keys()
    for rid in ref:
        (rs, rp), (gs, gp) = ref[rid], got[rid]
        assert [s[:2] for s in rs] == [s[:2] for s in gs], rid
        for a, b in zip(rs, gs):
            assert a[2] == pytest.approx(b[2], abs=LP_TOL), rid
        assert rp == pytest.approx(gp, abs=LP_TOL), rid


def test_workload_with_preemption_prefix_caching_chunks_and_aborts_matches_tp1():
    """Tight KV (the TP=2 budget halved: each rank holds half the KV heads), prefix caching, 64-token chunks:
    both runs preempt, and every request's tokens, finish reasons and logprobs are TP=1's."""
    common = dict(enable_prefix_caching=True, max_num_batched_tokens=64, max_num_seqs=6)
    ref, pre1 = _workload(kv_cache_memory="400KiB", **common)
    got, pre2 = _workload(kv_cache_memory="200KiB", tensor_parallel_size=2, **common)
    assert pre1 > 0 and pre2 > 0
    _assert_workloads_equal(ref, got)


@pytest.mark.parametrize("spec", [dict(speculative="draft", spec_draft_model=MODEL, num_speculative_tokens=3),
                                  dict(speculative="ngram", num_speculative_tokens=3)], ids=["draft", "ngram"])
def test_spec_decode_with_sampling_matches_tp1(spec):
    """Drafts (a draft model on the driver alone, or n-grams) verified by the sharded target, seeded sampling and
    n > 1 included: TP=1's tokens."""
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0.8, seed=3, top_p=0.9, max_tokens=16, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=9, max_tokens=12, ignore_eos=True)]
    prompts = ["1 2 3 1 2 3 1 2 3", "abc abc abc abc", "hello"]
    res = []
    for tp in (1, 2):
        llm = LLM(model=MODEL, tensor_parallel_size=tp, **spec, **KW)
        try:
            res.append([(c.token_ids, [d[t].logprob for d, t in zip(c.logprobs or [], c.token_ids)])
                        for p in params for o in llm.generate(prompts, p) for c in o.outputs])
        finally:
            llm.shutdown()
    assert [r[0] for r in res[0]] == [r[0] for r in res[1]]
    for a, b in zip(res[0], res[1]):
        assert a[1] == pytest.approx(b[1], abs=LP_TOL)


def test_sliding_window_checkpoint_matches_tp1(tmp_path):
    """A Mistral checkpoint (sliding window 7 on every layer: blocks before the window released) at TP 2, prompts
    and generations longer than the window: TP=1's tokens."""
    transformers = pytest.importorskip("transformers")
    import warnings

    import torch

    from decodekit.tokenizer.builders import synthetic_backend
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                     initializer_range=0.15, sliding_window=7, bos_token_id=0, eos_token_id=0)
    d = str(tmp_path / "mistral")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.MistralForCausalLM(cfg).save_pretrained(d)
    synthetic_backend(512).save(os.path.join(d, "tokenizer.json"))
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (3, 20, 45)]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=1, seed=1, max_tokens=30, ignore_eos=True)]
    res = []
    for tp in (1, 2):
        llm = LLM(model=d, max_model_len=256, kv_cache_memory="1MiB", block_size=8, enable_prefix_caching=True,
                  tensor_parallel_size=tp)
        try:
            res.append([o.outputs[0].token_ids for p in params for o in llm.generate(prompts, p)])
        finally:
            llm.shutdown()
    assert res[0] == res[1]


def test_int4_rtn_lm_head_as_tp1():
    """--quantization int4-rtn on the CPU also quantizes the LM head to INT8 (quantize_lm_head, on by default);
    the shards did not, so TP=2 ran another model than TP=1 (logprobs ~4e-3 apart). Now each rank holds its
    vocabulary slice as INT8, and tokens and logprobs are TP=1's."""
    from decodekit.quant import Int8Weight
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
    res = []
    for tp in (1, 2):
        llm = LLM(model=MODEL, quantization="int4-rtn", tensor_parallel_size=tp, **KW)
        try:
            local = llm.engine.model.local_model if tp > 1 else llm.engine.model
            assert isinstance(local.lm_head, Int8Weight)
            res.append([(c.token_ids, [_lps(d) for d in c.logprobs]) for o in llm.generate(PROMPTS, params)
                        for c in o.outputs])
        finally:
            llm.shutdown()
    for a, b in zip(*res):
        assert a[0] == b[0]
        _assert_tables_close(a[1], b[1], "int4 logprobs")


def test_dropped_pools_are_freed_on_the_workers(monkeypatch):
    """A KV pool the driver drops (the fp8 KV calibration's probe; on CUDA also the memory profile's, of
    max_num_batched_tokens tokens) is freed on the workers with the next step. Its finalizer appended to the list
    object of its allocation, which the next send replaced: no ("free", id) ever went out and every worker kept
    the pool (on CUDA: memory the driver's budget counted as free)."""
    from decodekit.distributed.parallel_state import TPGroup
    sent = []
    real = TPGroup.send
    monkeypatch.setattr(TPGroup, "send", lambda self, cmds: sent.extend(cmds) or real(self, cmds))
    llm = LLM(model=MODEL, tensor_parallel_size=2, kv_cache_dtype="fp8", **KW)
    try:
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
        main = llm.engine.runner.kv_caches.tp_pool_id
        allocated = {c[1] for c in sent if c[0] == "alloc"}
        freed = {c[1] for c in sent if c[0] == "free"}
        assert allocated - {main} and freed == allocated - {main}
    finally:
        llm.shutdown()


# -------------------------------------------------------------------------------------------- lifetime
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def greedy_ref():
    llm = LLM(model=MODEL, **KW)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], GREEDY)]


def _tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], GREEDY)]


def _on_call(monkeypatch, obj, name, calls: set, action):
    """obj.name runs action() first on the calls numbered in `calls` (1-based)."""
    real, n = getattr(obj, name), [0]

    def wrapper(*a, **k):
        n[0] += 1
        if n[0] in calls:
            action()
        return real(*a, **k)
    monkeypatch.setattr(obj, name, wrapper)


def _sigint():
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("allreduce", ["torch", "custom"])
def test_ctrl_c_mid_step_keeps_engine_usable(greedy_ref, allreduce, monkeypatch):
    """Ctrl-C while the driver is inside a step's collectives: the driver used to leave the step there while the
    workers waited in it, so the next generate() hung for tp_timeout and then blamed a worker. Now the step
    finishes on every rank, generate() raises KeyboardInterrupt, and the engine goes on as with one rank."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT has a custom handler here")
    llm = LLM(model=MODEL, tensor_parallel_size=2, tp_allreduce=allreduce, tp_timeout=20, **KW)
    try:
        tp = llm.engine.model.tp
        _on_call(monkeypatch, tp, "linear_all_reduce", {7}, _sigint)  # mid-forward, in a later step
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, GREEDY)
        monkeypatch.undo()
        t0 = time.monotonic()
        assert _tokens(llm) == greedy_ref
        assert time.monotonic() - t0 < 10
    finally:
        llm.shutdown()


@pytest.mark.parametrize("action", ["double_ctrl_c", "error"])
def test_driver_leaving_a_step_fails_fast_and_frees_the_group(greedy_ref, action, monkeypatch):
    """A second Ctrl-C, or an exception in the driver's own part of a step (after the workers got it): the
    workers are out of step for good. The next call fails at once with TPWorkerError saying why (it waited
    tp_timeout, then said 'a worker stopped answering'), the workers are gone, and a new tensor-parallel engine
    starts in this process without shutdown() of the broken one."""
    if action == "double_ctrl_c" and signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT has a custom handler here")
    llm = LLM(model=MODEL, tensor_parallel_size=2, tp_allreduce="custom", tp_timeout=20, **KW)
    procs = list(llm.engine.tp.procs)
    try:
        if action == "double_ctrl_c":
            _on_call(monkeypatch, llm.engine.model.tp, "linear_all_reduce", {7, 8}, _sigint)
            expected = KeyboardInterrupt
        else:
            def fail():
                raise MemoryError("driver out of memory")
            _on_call(monkeypatch, llm.engine.model.local_model, "forward", {3}, fail)
            expected = MemoryError
        with pytest.raises(expected):
            llm.generate(PROMPTS, GREEDY)
        monkeypatch.undo()
        t0 = time.monotonic()
        with pytest.raises(TPWorkerError, match=rf"driver left a step part-way \({expected.__name__}.*restart"):
            llm.generate(PROMPTS, GREEDY)
        assert time.monotonic() - t0 < 5
        assert all(p.poll() is not None for p in procs)
        again = LLM(model=MODEL, tensor_parallel_size=2, **KW)  # (the broken engine not shut down)
        try:
            assert _tokens(again) == greedy_ref
        finally:
            again.shutdown()
    finally:
        llm.shutdown()


def test_llm_built_in_a_thread_keeps_its_workers(greedy_ref):
    """The workers' parent-death signal fires when the *thread* that spawned them ends: an LLM built in a
    short-lived thread (a thread pool, a startup hook) lost its workers (TPWorkerError, exit code -9) as soon as
    that thread returned. They now follow the driver process (a pipe it holds)."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("llm", LLM(model=MODEL, tensor_parallel_size=2, **KW)))
    t.start()
    t.join()
    llm = box["llm"]
    try:
        time.sleep(0.5)
        assert [p.poll() for p in llm.engine.tp.procs] == [None]
        assert _tokens(llm) == greedy_ref
    finally:
        llm.shutdown()


_DRIVER = textwrap.dedent("""
    import os, sys, threading
    from decodekit import LLM
    from decodekit.sampling import SamplingParams
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("llm", LLM(model="random:tiny-gqa4", max_model_len=128,
                         kv_cache_memory="16MiB", tensor_parallel_size=2)))
    t.start(); t.join()
    llm = box["llm"]
    print(llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].token_ids, flush=True)
    print(" ".join(str(p.pid) for p in llm.engine.tp.procs), flush=True)
    sys.stdin.read()
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_exit_when_the_driver_process_is_killed():
    """SIGKILL of a driver whose LLM was built in a thread (no parent-death signal): its workers exit too."""
    drv = subprocess.Popen([sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert drv.stdout.readline().startswith("["), "the driver's generate failed"
        pids = [int(x) for x in drv.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        drv.kill()
        drv.wait()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _tp_files() -> set[str]:
    import tempfile
    tmp = tempfile.gettempdir()
    return ({os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("decodekit-tp-")} |
            {f for f in os.listdir("/dev/shm") if f.startswith("decodekit_ar_")})


def test_second_engine_in_process_is_refused_clearly_and_nothing_leaks(greedy_ref, monkeypatch):
    """A second tensor-parallel LLM while one runs: a ValueError that says to shut the first down (it was torch's
    'trying to initialize the default process group twice!'), raised before any process starts (a worker was
    spawned, killed, and its pickled arguments left in /tmp); the first keeps working. After shutdown: no worker
    process, no /tmp or /dev/shm file of ours."""
    before = _tp_files()
    llm = LLM(model=MODEL, tensor_parallel_size=2, **KW)
    procs = list(llm.engine.tp.procs)
    try:
        from decodekit.distributed import parallel_state
        spawned = []
        real = parallel_state._spawn_worker
        monkeypatch.setattr(parallel_state, "_spawn_worker", lambda *a: spawned.append(real(*a)) or spawned[-1])
        with pytest.raises(ValueError, match=r"shutdown\(\) first"):
            LLM(model=MODEL, tensor_parallel_size=2, **KW)
        assert not spawned
        assert _tokens(llm) == greedy_ref
    finally:
        llm.shutdown()
    assert all(p.poll() is not None for p in procs)
    assert _tp_files() <= before


@pytest.mark.slow
def test_server_tp2_concurrent_requests_match_tp1():
    """`decodekit serve --tensor-parallel-size 2` (the engine in its own process, spawning the workers): 14
    concurrent completions (greedy / seeded, logprobs, n=3, streamed) answer as with one rank."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
    httpx = pytest.importorskip("httpx")
    from server_harness import LiveServer

    from decodekit.server.engine_proc import EngineProcess
    bodies = [dict(model="smollm2", prompt=f"Hello number {i} " * (i % 5 + 1), max_tokens=8 + i % 5,
                   temperature=0 if i % 2 else 0.9, seed=i, logprobs=2) for i in range(12)]
    bodies += [dict(model="smollm2", prompt="x", max_tokens=5, stream=True, temperature=0),
               dict(model="smollm2", prompt="x", n=3, max_tokens=5, temperature=1, seed=3)]

    def one(url, b):
        r = httpx.post(url + "/v1/completions", json=b, timeout=120)
        assert r.status_code == 200, r.text
        if b.get("stream"):
            return r.text.count("data:")
        return [(c["text"], c["logprobs"]["tokens"] if c.get("logprobs") else None) for c in r.json()["choices"]]
    res = []
    for tp in (1, 2):
        a = EngineProcess(EngineArgs(model=MODEL, kv_cache_memory="32MiB", max_model_len=256, seed=0,
                                     tensor_parallel_size=tp))
        a.start()
        srv = LiveServer(a)
        try:
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                res.append(list(ex.map(lambda b: one(srv.url, b), bodies)))
        finally:
            srv.stop()
            a.shutdown()
    assert res[0] == res[1]


def test_worker_failing_inside_the_custom_allreduce_fails_the_driver_at_once():
    """A worker that fails mid-step (here a KeyError from a bad pool id before its first collective; equally a
    SIGKILL) while the driver waits in decodekit's shared-memory AllReduce: the driver notices the peer's
    process exited (its pid in the signal block) instead of spinning for tp_timeout. Was: the full 60 s."""
    llm = LLM(model="random:tiny-gqa4", max_model_len=256, kv_cache_memory="64MiB", tensor_parallel_size=2,
              tp_allreduce="custom", tp_timeout=60)
    try:
        p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        assert llm.generate(["x"], p)[0].outputs[0].token_ids
        llm.engine.runner.kv_caches.tp_pool_id = 999   # the worker's forward raises before the collective
        t0 = time.monotonic()
        with pytest.raises(TPWorkerError, match=r"worker rank 1 \(exit code 1\) died.*process exited"):
            llm.generate(["hello"], p)
        assert time.monotonic() - t0 < 15
    finally:
        llm.shutdown()
