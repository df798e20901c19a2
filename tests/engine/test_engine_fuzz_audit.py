"""Randomised stress of the real LLMEngine (random: presets, CPU, float32): add_request / step / abort
under workloads mixing prefix caching (shared prefixes, repeated prompts, prompts of exactly k block sizes
and one off), a tiny KV cache (preemption by recompute), chunked prefill with small odd budgets,
max_num_seqs limits, n > 1 samples, aborts at random steps (right after add, while preempted), speculative
decoding (n-gram, layer-skip, a draft model) beside undrafted requests, stop strings / stop_token_ids /
max_tokens 1, logprobs / prompt_logprobs, min_tokens, beam searches (forks), final_only requests, a bf16
KV cache, decode buckets (decode_graphs="static": CUDA graphs' padded path, eager), a sliding-window model
(a test-only preset) and requests added between steps.

Fast: pytest -q tests/engine/test_engine_fuzz_audit.py -m "not slow"; the slow variants run ~270 more seeds.

Invariants, every seed (reproducible: the seed picks the whole workload):
  1. every finished request's samples (tokens, text, finish and stop reasons) equal the same request's run
     alone on a fresh engine with a large cache and no speculation (float32 on the CPU is batch-invariant,
     docs/ARCHITECTURE.md "Batch invariance"; greedy speculation gives plain decoding's tokens); an aborted
     request's tokens are a prefix of them;
  2. after each step the scheduler's and the KV pool's invariants hold (refcounts = block-table holders,
     prefix-cache maps consistent); at the end every block is free, no per-request state is left;
  3. every request gets exactly one finished RequestOutput, nothing after it, and each output's tokens
     extend the previous one's (deltas consistent);
  4. no step raises; 5. the run ends within a bounded number of steps.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from decodekit.engine.llm_engine import LLMEngine
from decodekit.engine.request import RequestStatus
from decodekit.loader import random as random_loader
from decodekit.sampling import SamplingParams
from decodekit.sampling.beam_search import BeamSearchParams

SWA_PRESET = "tiny-swa-audit"     # random:tiny with a sliding window on every layer (no such preset ships)


@pytest.fixture(autouse=True)
def _swa_preset(monkeypatch):
    monkeypatch.setitem(random_loader.PRESETS, SWA_PRESET,
                        dict(random_loader.PRESETS["tiny"], sliding_window=20))


@dataclass
class Job:
    rid: str
    prompt: list[int]
    params: dict
    arrival: int                    # step before which it is added
    abort_at: int | None = None     # step before which it is aborted (== arrival: right after the add)
    abort_preempted: bool = False   # aborted as soon as one of its samples is preempted
    beam: bool = False              # params are BeamSearchParams'
    final_only: bool = False        # add_request(final_only=True): one output, when it finishes

    def sampling(self):
        return BeamSearchParams(**self.params) if self.beam else SamplingParams(**self.params)


def _engine(model: str, **kw) -> LLMEngine:
    return LLMEngine(model=f"random:{model}", dtype="float32", device="cpu", **kw)


_REF_CACHE: dict = {}


def reference(model: str, max_model_len: int, job: Job, kv_cache_dtype: str = "auto") -> dict:
    """The job's samples run alone on a fresh engine with a large cache, no speculation."""
    key = (model, max_model_len, kv_cache_dtype, tuple(job.prompt), job.beam,
           tuple(sorted((k, repr(v)) for k, v in job.params.items())))
    if key not in _REF_CACHE:
        eng = _engine(model, max_model_len=max_model_len, kv_cache_memory="8MiB", block_size=16,
                      kv_cache_dtype=kv_cache_dtype)
        eng.add_request("ref", job.prompt, job.sampling())
        final = None
        for _ in range(10_000):
            for o in eng.step():
                if o.finished:
                    final = o
            if not eng.has_unfinished_requests():
                break
        assert final is not None
        _REF_CACHE[key] = _result(final)
    return _REF_CACHE[key]


def _lp(d):
    """A {token: Logprob} entry as {token: (rank, logprob)}."""
    return None if d is None else {t: (l.rank, l.logprob) for t, l in d.items()}


def _result(o) -> dict:
    """What is compared of a finished RequestOutput."""
    return dict(samples=[(tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason) for c in o.outputs],
                logprobs=[None if c.logprobs is None else [_lp(d) for d in c.logprobs] for c in o.outputs],
                prompt_logprobs=None if o.prompt_logprobs is None else [_lp(d) for d in o.prompt_logprobs])


def _same_logprobs(got, want, tol: float = 1e-5) -> bool:
    """Same tokens and ranks, logprob values within tol. Documented as bitwise under batch invariance, except
    dense float weights' prompt rows past dense_route's rows (torch's GEMM: a prompt chunked otherwise gives
    ~1e-7 apart, and a bf16 KV cache that rounds those keys / values amplifies it to ~1e-5) and a request
    preempted by recompute: the random: presets are dense float models."""
    if got is None or want is None:
        return got is want
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if (g is None) != (w is None):
            return False
        if g is None:
            continue
        if g.keys() != w.keys() or any(g[t][0] != w[t][0] or abs(g[t][1] - w[t][1]) > tol for t in g):
            return False
    return True


def _free_run(model: str, max_model_len: int, prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
    """Greedy continuation without stops (to pick stop tokens / strings that do occur)."""
    (toks, text, _, _), = reference(model, max_model_len, Job("free", prompt, dict(
        temperature=0, max_tokens=max_tokens, ignore_eos=True), 0))["samples"]
    return list(toks), text


def make_workload(rng: random.Random, model: str, bs: int, max_model_len: int, n_jobs: int,
                  spread: int, abort_prob: float) -> list[Job]:
    V = 512
    bases = [[rng.randrange(3, V) for _ in range(rng.choice([bs, 2 * bs, 2 * bs + 1, 3 * bs - 1, rng.randint(5, 50)]))]
             for _ in range(3)]
    loop = [rng.randrange(3, V) for _ in range(4)]
    prompts: list[list[int]] = []
    jobs = []
    for i in range(n_jobs):
        kind = rng.random()
        if prompts and kind < 0.15:                 # an exact repeat
            prompt = list(rng.choice(prompts))
        elif kind < 0.55:                           # a shared prefix + a tail, lengths at / around block edges
            base = rng.choice(bases)
            tail_len = rng.choice([0, 1, bs - 1, bs, bs + 1, rng.randint(1, 20)])
            prompt = base + [rng.randrange(3, V) for _ in range(tail_len)]
        elif kind < 0.7:                            # repetitive: n-gram drafts hit
            prompt = (loop * 12)[:rng.randint(6, 40)]
        else:
            prompt = [rng.randrange(3, V) for _ in range(rng.choice([1, bs - 1, bs, bs + 1, rng.randint(2, 60)]))]
        max_tokens = rng.choice([1, 2, 5, rng.randint(3, 24), rng.randint(20, 60)])
        prompt = prompt[:max_model_len - max_tokens] or [5]
        prompts.append(prompt)
        p: dict = dict(temperature=0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.7)
        r = rng.random()
        if r < 0.15:
            p.update(temperature=0.8, seed=rng.randrange(1 << 30), top_k=rng.choice([-1, 20]))
        if rng.random() < 0.2:
            p["n"] = rng.choice([2, 3])
        s = rng.random()
        if s < 0.35 and max_tokens > 2:             # stops that occur in the free run
            toks, text = _free_run(model, max_model_len, prompt, max_tokens)
            if s < 0.2 and text.strip():
                a = rng.randrange(len(text))
                p["stop"] = [text[a:a + rng.randint(1, 3)]]
                p["include_stop_str_in_output"] = rng.random() < 0.3
            else:
                p["stop_token_ids"] = [rng.choice(toks)]
        if rng.random() < 0.12:
            p["logprobs"] = rng.choice([0, 2])
        if rng.random() < 0.08:
            p["prompt_logprobs"] = rng.choice([0, 1])
        if rng.random() < 0.08 and not p.get("stop") and max_tokens > 3:
            p["min_tokens"] = rng.randint(1, max_tokens - 1)
        beam = rng.random() < 0.08
        if beam:
            p = dict(beam_width=rng.choice([2, 3]), max_tokens=min(max_tokens, rng.randint(1, 12)),
                     ignore_eos=rng.random() < 0.5)
        arrival = rng.randint(0, spread)
        abort_at = None
        if rng.random() < abort_prob:
            abort_at = arrival + rng.choice([0, 0, 1, rng.randint(1, 30)])
        jobs.append(Job(f"j{i}", prompt, p, arrival, abort_at, abort_preempted=rng.random() < 0.1, beam=beam))
    return jobs


@dataclass
class RunStats:
    steps: int = 0
    preemptions: int = 0
    spec_drafts: int = 0
    hits: float = 0.0
    max_running: int = 0


def run_engine(model: str, jobs: list[Job], max_steps: int = 5000, **engine_kw) -> tuple[dict, dict, RunStats]:
    """Drives the engine; returns (final samples per job, aborted-before-finish job ids -> their samples, stats)
    after checking invariants 2-5."""
    eng = _engine(model, **engine_kw)
    sched, kv = eng.scheduler, eng.kv_manager
    by_arrival = sorted(jobs, key=lambda j: (j.arrival, j.rid))
    k = step = 0
    last: dict[str, list] = {}              # rid -> last output's token lists
    final: dict[str, list] = {}
    aborted: set[str] = set()
    stats = RunStats()
    pre_watch = {j.rid for j in jobs if j.abort_preempted}
    is_beam = {j.rid: j.beam for j in jobs}
    final_only = {j.rid: j.final_only for j in jobs}

    def abort(rid):
        if rid in final or rid in aborted:
            return
        assert eng.abort_request(rid)
        aborted.add(rid)

    while k < len(by_arrival) or eng.has_unfinished_requests():
        while k < len(by_arrival) and by_arrival[k].arrival <= step:
            j = by_arrival[k]
            k += 1
            eng.add_request(j.rid, j.prompt, j.sampling(), final_only=j.final_only)
            if j.abort_at == step:
                abort(j.rid)
        for j in jobs:
            if j.abort_at == step and j.rid not in final:
                abort(j.rid)
        for rid in list(pre_watch):
            if rid in final or rid in aborted:
                pre_watch.discard(rid)
                continue
            g = eng._groups.get(rid)
            reqs = [s.request for s in g.seqs] if g is not None else [
                r for r in sched.requests.values() if r.request_id.startswith(rid + "#beam")]
            if any(r.status == RequestStatus.PREEMPTED for r in reqs):
                abort(rid)
                pre_watch.discard(rid)
        outs = eng.step()
        seen = set()
        for o in outs:
            rid = o.request_id
            assert rid not in seen, f"step {step}: two outputs for {rid}"
            seen.add(rid)
            assert rid not in final, f"step {step}: output for {rid} after its finished one"
            prev = last.get(rid)
            for i, c in enumerate(o.outputs if not is_beam[rid] else ()):     # (a beam search: one output)
                p = prev[i] if prev else []
                assert list(c.token_ids[:len(p)]) == p, f"{rid}: tokens are not an extension of the last output"
                assert list(c.delta_token_ids) == list(c.token_ids[len(p):]), f"{rid}: bad delta"
                assert len(c.token_ids) <= o_max(jobs, rid)
            last[rid] = [list(c.token_ids) for c in o.outputs]
            assert o.finished or not final_only[rid], f"{rid}: final_only, but an unfinished output"
            if o.finished:
                final[rid] = _result(o)
                if rid in aborted:
                    assert all(c.finish_reason is not None for c in o.outputs)
        for rid in aborted:     # an abort's final output comes with the next step
            assert rid in final, f"step {step}: no final output for aborted {rid}"
        sched.check_invariants()
        stats.max_running = max(stats.max_running, sched.num_running)
        # (beams resumed by their group may outnumber max_num_seqs for a while: documented)
        assert sum(not r.no_spec for r in sched.running) <= engine_kw.get("max_num_seqs", 256)
        step += 1
        assert step < max_steps, f"no progress after {step} steps (livelock?)"
    stats.steps, stats.preemptions = step, sched.num_preemptions
    stats.hits = kv.prefix_cache_hit_rate
    # every job: exactly one finished output
    assert set(final) == {j.rid for j in jobs}, {j.rid for j in jobs} - set(final)
    # nothing held: every block free, the prefix cache's maps consistent, no per-request state left
    assert not sched.has_unfinished_requests() and not sched.requests
    assert kv.num_free_blocks == kv.num_blocks and kv.usage == 0.0
    kv.check_invariants([])
    assert not eng._groups and not eng._seq_of and not eng._holding and not eng._beams and not eng._beam_of
    assert eng.step() == []                         # (delivers the last finished ids to the drafter)
    if eng.spec is not None:
        stats.spec_drafts = eng.spec.stats["spec_draft_tokens"]
        assert not eng.spec._k_of, f"AdaptiveK state kept for {sorted(eng.spec._k_of)}"
        d = eng.spec.drafter
        assert not getattr(d, "_proposers", {}) and not getattr(d, "_computed", {})
    assert not kv._req_serials
    return final, {rid: last.get(rid, []) for rid in aborted}, stats


def o_max(jobs, rid):
    return next(j.params["max_tokens"] for j in jobs if j.rid == rid)


def check_against_references(model: str, max_model_len: int, jobs: list[Job], final: dict, aborted: dict,
                             kv_cache_dtype: str = "auto") -> None:
    for j in jobs:
        want = reference(model, max_model_len, j, kv_cache_dtype)
        got = final[j.rid]
        if j.rid in aborted:
            if not j.beam:
                for (wt, _, _, _), (gt, _, fr, _) in zip(want["samples"], got["samples"]):
                    assert list(gt) == list(wt[:len(gt)]), (j, gt, wt)
                    assert fr in ("abort", "stop", "length"), fr
            continue
        assert got["samples"] == want["samples"], f"{j}\n got  {got['samples']}\n want {want['samples']}"
        tol = 1e-5 if kv_cache_dtype == "auto" else 2e-4
        for g, w in zip(got["logprobs"], want["logprobs"]):
            assert _same_logprobs(g, w, tol), (j, g, w)
        assert _same_logprobs(got["prompt_logprobs"], want["prompt_logprobs"], tol), \
            (j, got["prompt_logprobs"], want["prompt_logprobs"])


# (model, block_size, spec kwargs) per configuration; the seed picks the rest
CONFIGS = [
    ("tiny", 8, {}),
    ("tiny", 16, dict(speculative="ngram", spec_ngram_min=1, num_speculative_tokens=4)),
    ("tiny-qwen3", 8, dict(speculative="layerskip", spec_layers=1, num_speculative_tokens=3)),
    ("tiny", 8, dict(speculative="draft", spec_draft_model="random:tiny-qwen2", num_speculative_tokens=3)),
    ("tiny-phi3", 16, dict(speculative="ngram", spec_ngram_min=1, num_speculative_tokens=5, spec_adaptive=False)),
    (SWA_PRESET, 8, {}),
    (SWA_PRESET, 8, dict(speculative="ngram", spec_ngram_min=1, num_speculative_tokens=3)),
]


def fuzz_once(seed: int, n_jobs: int = 28):
    rng = random.Random(seed)
    model, bs, spec = CONFIGS[seed % len(CONFIGS)]
    max_model_len = rng.choice([96, 128])
    jobs = make_workload(rng, model, bs, max_model_len, n_jobs, spread=rng.choice([0, 5, 20, 60]),
                         abort_prob=0.2)
    need = -(-max_model_len // bs)
    num_blocks = need + rng.choice([0, 1, 2, 3, need // 2, 3 * need])
    per_block = _engine(model, max_model_len=max_model_len, kv_cache_memory="1MiB",
                        block_size=bs).model.kv_cache_block_bytes(bs)
    if spec.get("speculative") == "draft":
        per_block += _engine("tiny-qwen2", kv_cache_memory="1MiB", block_size=bs).model.kv_cache_block_bytes(bs)
    kw = dict(max_model_len=max_model_len, block_size=bs, kv_cache_memory=per_block * num_blocks,
              max_num_batched_tokens=rng.choice([1, 3, 7, 13, 29, 61, 512]), max_num_seqs=rng.choice([1, 2, 3, 5, 64]),
              enable_prefix_caching=rng.random() < 0.8, decode_graphs=rng.choice(["off", "static"]), **spec)
    # each step computes a token at least; preemption recomputes: a generous bound that a livelock still breaks
    total = sum((len(j.prompt) + j.params["max_tokens"]) * j.params.get("n", j.params.get("beam_width", 1))
                for j in jobs)
    final, aborted, stats = run_engine(model, jobs, max_steps=4 * total + 1000, **kw)
    check_against_references(model, max_model_len, jobs, final, aborted)
    return stats


def fuzz_mixed(seed: int, n_jobs: int = 24):
    """Like fuzz_once, the configuration drawn too: any preset with any drafter (k, adaptive or not), a bf16
    KV cache for the float32 model, decode buckets, final_only requests."""
    rng = random.Random(seed)
    model = rng.choice(["tiny", "tiny-qwen3", "tiny-phi3", SWA_PRESET])
    bs = rng.choice([8, 16])
    spec = rng.choice([{}, dict(speculative="ngram", spec_ngram_min=rng.choice([1, 2])),
                       dict(speculative="layerskip", spec_layers=1), dict(speculative="draft",
                                                                          spec_draft_model="random:tiny-qwen2")])
    if spec:
        spec.update(num_speculative_tokens=rng.randint(1, 6), spec_adaptive=rng.random() < 0.5)
    kv_dtype = rng.choice(["auto", "bfloat16"])
    max_model_len = rng.choice([64, 96, 128])
    jobs = make_workload(rng, model, bs, max_model_len, n_jobs, spread=rng.choice([0, 3, 20]), abort_prob=0.25)
    for j in jobs:
        j.final_only = rng.random() < 0.3
    need = -(-max_model_len // bs)
    num_blocks = need + rng.choice([0, 1, 2, need // 3, 2 * need])
    per_block = _engine(model, max_model_len=max_model_len, kv_cache_memory="1MiB", block_size=bs,
                        kv_cache_dtype=kv_dtype).model.kv_cache_block_bytes(bs)
    if spec.get("speculative") == "draft":
        per_block += _engine("tiny-qwen2", kv_cache_memory="1MiB", block_size=bs).model.kv_cache_block_bytes(bs)
    kw = dict(max_model_len=max_model_len, block_size=bs, kv_cache_memory=per_block * num_blocks,
              kv_cache_dtype=kv_dtype, max_num_batched_tokens=rng.choice([2, 5, 11, 17, 33, 4096]),
              max_num_seqs=rng.choice([1, 2, 4, 7, 256]), enable_prefix_caching=rng.random() < 0.75,
              decode_graphs=rng.choice(["off", "static"]), **spec)
    total = sum((len(j.prompt) + j.params["max_tokens"]) * j.params.get("n", j.params.get("beam_width", 1))
                for j in jobs)
    final, aborted, stats = run_engine(model, jobs, max_steps=4 * total + 1000, **kw)
    check_against_references(model, max_model_len, jobs, final, aborted, kv_dtype)
    return stats


@pytest.mark.parametrize("seed", range(6))
def test_engine_fuzz(seed):
    fuzz_once(seed)


@pytest.mark.parametrize("seed", range(4))
def test_engine_fuzz_mixed(seed):
    fuzz_mixed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 140))
def test_engine_fuzz_many(seed):
    fuzz_once(seed, n_jobs=30)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 140))
def test_engine_fuzz_mixed_many(seed):
    fuzz_mixed(seed, n_jobs=30)


def test_decode_bucket_padding_rows_never_read_released_blocks():
    """Decode buckets (decode_graphs static here; CUDA graphs on a GPU) pad a shrinking batch with rows
    that must attend to block 0: their table rows must not keep a finished sequence's RELEASED (-1)
    entries of a sliding-window model (before the fix: paged_attention refused block -1 on the CPU; a CUDA
    graph replay, whose launch checked nothing, read outside the cache)."""
    kw = dict(max_model_len=128, block_size=8, kv_cache_memory="1MiB", max_num_seqs=4)
    jobs = [Job(f"r{i}", list(range(3 + i, 60 + i)), dict(temperature=0, max_tokens=mt, ignore_eos=True), 0)
            for i, mt in enumerate([10, 3, 6, 8])]
    final, _, _ = run_engine(SWA_PRESET, jobs, decode_graphs="static", **kw)
    check_against_references(SWA_PRESET, 128, jobs, final, {})


def test_request_growing_behind_paused_beams_does_not_livelock():
    """Paused beams (waiting for a sibling queued behind `w`) hold blocks; `w` fits when admitted but not when
    it grows. It used to preempt itself, go back to the queue's front, be readmitted and preempt itself
    again forever (the sibling never ran: fuzz seed 74). Now the newest paused beam is preempted instead."""
    from decodekit.engine import KVCacheManager, Request, Scheduler, SchedulerConfig
    kv = KVCacheManager(4, 4, False)
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4, max_model_len=16, block_size=4,
                                  enable_prefix_caching=False), kv)
    beams = [Request(f"b{i}", [1, 2 + i], SamplingParams(max_tokens=5)) for i in range(2)]
    for b in beams:
        s.add_request(b)
    s.update_from_output(s.schedule(), {b.request_id: [7] for b in beams})
    for b in beams:
        b.paused = True
    w = Request("w", list(range(10, 22)), SamplingParams(max_tokens=2))
    sib = Request("sib", [1, 2, 3, 9], SamplingParams(max_tokens=4))
    s.add_request(w)
    s.add_request(sib)
    for _ in range(30):
        out = s.schedule()
        s.check_invariants()
        s.update_from_output(out, {sr.request_id: [5] for sr in out.scheduled if sr.will_sample})
        if sib.num_output_tokens:
            break
    assert sib.num_output_tokens and w.is_finished


def test_beam_searches_behind_a_long_prompt_finish():
    """The engine-level livelock of the test above: beam searches whose new beams queue behind a prompt that
    the blocks their paused beams hold leave too small (fuzz seed 74)."""
    fuzz_once(74)


def test_fork_copies_run_on_a_step_that_schedules_nothing():
    """A fork's copy-on-write pairs leave the scheduler with the step that follows it; when that step schedules
    nothing (every running request paused), the runner still copies them then. Was: only a forward copied them,
    so such a step dropped them (the child's partial block never written; its block could change hands later)."""
    import torch
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    eng = LLMEngine(EngineArgs(model="random:tiny", kv_cache_memory="4MiB", max_model_len=128, seed=0))
    k0, v0 = eng.runner.kv_caches[0]
    k0[1].normal_()
    v0[1].normal_()
    eng.scheduler._copies = [(1, 2)]              # (what add_forked leaves for the next step)
    assert eng.step() == []
    for k, v in eng.runner.kv_caches:
        assert torch.equal(k[2], k[1]) and torch.equal(v[2], v[1])
    assert eng.scheduler._copies == []
