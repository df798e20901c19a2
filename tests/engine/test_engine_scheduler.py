"""Unit tests of the scheduler (decodekit.engine.scheduler) on hand-built scenarios."""
from __future__ import annotations

import pytest

from decodekit.engine import (KVCacheManager, Request, RequestStatus, Scheduler, SchedulerConfig,
                              split_n)

from engine_harness import FakeModel, Params, Spec, check_against_reference, reference_output, run


def make(num_blocks=64, block_size=4, max_model_len=64, budget=64, max_seqs=8, prefix=True, chunked=True):
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                          block_size=block_size, enable_prefix_caching=prefix, chunked_prefill=chunked)
    kv = KVCacheManager(num_blocks, block_size, prefix)
    return Scheduler(cfg, kv), kv, FakeModel(kv)


def req(rid, n_prompt, max_tokens, start=0):
    return Request(rid, [(start + i) % 50 for i in range(n_prompt)], Params(max_tokens), arrival_time=0.0)


def step(s: Scheduler, model: FakeModel):
    out = s.schedule()
    s.check_invariants()
    finished = s.update_from_output(out, model.execute(out))
    s.check_invariants()
    return out, finished


# ------------------------------------------------------------------------- config
@pytest.mark.parametrize("field,value", [
    ("max_num_seqs", 0), ("max_num_seqs", 1.0), ("max_num_batched_tokens", 0), ("max_model_len", 1),
    ("max_model_len", True), ("block_size", 0), ("block_size", 4096), ("enable_prefix_caching", 1),
    ("chunked_prefill", "yes")])
def test_config_validation_names_the_field(field, value):
    kwargs = dict(max_model_len=128)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)


def test_config_without_chunked_prefill_needs_budget_for_max_model_len():
    with pytest.raises(ValueError, match="max_num_batched_tokens.*max_model_len"):
        SchedulerConfig(max_model_len=4096, max_num_batched_tokens=2048, chunked_prefill=False)
    SchedulerConfig(max_model_len=2048, max_num_batched_tokens=2048, chunked_prefill=False)
    with pytest.raises(TypeError):
        SchedulerConfig()                       # max_model_len is required


def test_scheduler_and_manager_must_agree():
    cfg = SchedulerConfig(max_model_len=64, block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        Scheduler(cfg, KVCacheManager(8, 8))
    with pytest.raises(ValueError, match="prefix_caching"):
        Scheduler(cfg, KVCacheManager(8, 16, enable_prefix_caching=False))


# ------------------------------------------------------------------------- admission
def test_add_request_rejections_leave_the_scheduler_unchanged():
    s, kv, _ = make(num_blocks=8, block_size=4, max_model_len=40)    # cache: 32 tokens
    s.add_request(req("ok", 5, 5))
    with pytest.raises(ValueError, match=r"prompt \(30 tokens\) \+ max_tokens \(20\) = 50 exceeds max_model_len \(40\)"):
        s.add_request(req("long", 30, 20))
    with pytest.raises(ValueError, match="empty"):
        s.add_request(Request("empty", [], Params(3)))
    with pytest.raises(ValueError, match=r"prompt \(35 tokens\) can never fit in the KV cache"):
        s.add_request(req("big", 35, 1))
    with pytest.raises(ValueError, match="already"):
        s.add_request(req("ok", 5, 5))
    with pytest.raises(ValueError, match="split_n"):
        s.add_request(Request("n2", [1, 2], Params(3, n=2)))
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_request(Request("mt0", [1, 2], Params(0)))
    assert s.num_waiting == 1 and s.get_request("ok") is not None and s.get_request("long") is None
    s.check_invariants()


def test_oversize_requests_rejected_alone_while_others_proceed():
    specs = [Spec(f"r{i}", i, [i % 50] * (10 + 7 * i), 6) for i in range(6)]
    specs += [Spec("too_long", 1, [3] * 60, 10), Spec("too_big", 2, [4] * 70, 1), Spec("empty", 0, [], 3)]
    res = run(specs, num_blocks=17, block_size=4, max_model_len=69, budget=16)
    assert set(res.rejected) == {"too_long", "too_big", "empty"}
    check_against_reference(specs, res)


def test_max_tokens_none_means_up_to_max_model_len():
    s, kv, model = make(max_model_len=20)
    r = Request("r", [1, 2, 3], Params(None))
    s.add_request(r)
    while s.has_unfinished_requests():
        step(s, model)
    assert r.num_tokens == 20 and r.status == RequestStatus.FINISHED_LENGTH
    assert r.output_token_ids == reference_output([1, 2, 3], 17)
    with pytest.raises(ValueError, match=r"prompt \(20 tokens\) leaves no room"):
        s.add_request(Request("full", [1] * 20, Params(None)))


# ------------------------------------------------------------------------- stepping
def test_prefill_then_decode_with_optimistic_num_computed():
    s, kv, model = make()
    r = req("r", 10, 3)
    s.add_request(r)
    out = s.schedule()
    (sr,) = out.scheduled
    assert (sr.num_new_tokens, sr.start_pos, sr.will_sample, sr.is_new) == (10, 0, True, True)
    assert r.num_computed_tokens == 10 and r.status == RequestStatus.RUNNING   # optimistic
    assert sr.token_ids == r.prompt_token_ids and out.num_scheduled_tokens == 10
    assert s.update_from_output(out, model.execute(out)) == []
    assert r.num_tokens == 11 and r.num_output_tokens == 1
    out = s.schedule()
    (sr,) = out.scheduled
    assert (sr.num_new_tokens, sr.start_pos, sr.will_sample, sr.is_new) == (1, 10, True, False)
    assert s.schedule().scheduled == []          # no update yet: nothing to compute
    s.update_from_output(out, model.execute(out))
    out, finished = step(s, model)
    assert finished == [r] and r.status == RequestStatus.FINISHED_LENGTH and r.stop_reason == "length"
    assert r.output_token_ids == reference_output(r.prompt_token_ids, 3)
    assert not s.has_unfinished_requests() and kv.num_free_blocks == kv.num_blocks
    assert s.schedule().finished_req_ids == ["r"]


def test_chunked_prefill_samples_only_on_the_last_chunk():
    s, kv, model = make(budget=4)
    r = req("r", 10, 2)
    s.add_request(r)
    chunks = []
    for _ in range(3):
        out = s.schedule()
        (sr,) = out.scheduled
        chunks.append((sr.start_pos, sr.num_new_tokens, sr.will_sample))
        if not sr.will_sample:
            with pytest.raises(ValueError, match="partial prefill"):
                s.update_from_output(out, {"r": [1]})
        s.update_from_output(out, model.execute(out))
    assert chunks == [(0, 4, False), (4, 4, False), (8, 2, True)]
    out = s.schedule()
    with pytest.raises(ValueError, match="no sampled token"):
        s.update_from_output(out, {})


def test_running_first_then_waiting_share_one_budget():
    s, kv, model = make(budget=8)
    a, b = req("a", 6, 5), req("b", 20, 5, start=7)
    s.add_request(a)
    step(s, model)                               # a: 6 prompt tokens
    s.add_request(b)
    out, _ = step(s, model)
    assert [(x.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 7)]
    out, _ = step(s, model)
    assert [(x.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 7)]


def test_decode_phase_requests_lead_the_step(monkeypatch):
    """A running request still in its prefill (here capped per step: prompt logprobs pending) is scheduled after
    the decoding ones admitted after it, so a step's decode rows lead its batch (ModelRunner marks them for batch
    invariance); order kept within each kind."""
    import decodekit.engine.scheduler as sched
    monkeypatch.setattr(sched, "PROMPT_LOGPROBS_CHUNK", 4)
    s, kv, model = make(budget=32)
    a, b, c = req("a", 20, 5), req("b", 3, 5, start=5), req("c", 2, 5, start=9)
    a.prompt_logprobs_pending = True
    for r in (a, b, c):
        s.add_request(r)
    out, _ = step(s, model)      # a: 4 of its 20 prompt tokens; b, c: whole prompts
    assert [(x.request_id, x.is_decode) for x in out.scheduled] == [("a", False), ("b", False), ("c", False)]
    out, _ = step(s, model)      # b, c decode ahead of a's next prompt chunk
    assert [(x.request_id, x.is_decode) for x in out.scheduled] == [("b", True), ("c", True), ("a", False)]
    s.add_request(req("d", 4, 5, start=13))
    out, _ = step(s, model)
    assert [(x.request_id, x.is_decode, x.num_new_tokens) for x in out.scheduled] == [
        ("b", True, 1), ("c", True, 1), ("a", False, 4), ("d", False, 4)]


def test_max_num_seqs():
    s, kv, model = make(max_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", 3, 4, start=i))
    out, _ = step(s, model)
    assert [x.request_id for x in out.scheduled] == ["r0", "r1"] and s.num_waiting == 2


def test_no_chunking_waits_for_a_whole_fit():
    s, kv, model = make(budget=64, max_model_len=64, chunked=False)
    s.add_request(req("a", 40, 3))
    s.add_request(req("b", 30, 3, start=5))
    out, _ = step(s, model)
    assert [x.request_id for x in out.scheduled] == ["a"]       # b (30) does not fit in 24
    out, _ = step(s, model)
    assert [(x.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 30)]


def test_preemption_is_recompute_style_newest_first():
    # budget 9: after the preemption, b's first 8-token chunk would fit in the 2 free blocks,
    # but nothing is admitted in a step that preempted.
    s, kv, model = make(num_blocks=6, block_size=4, max_model_len=24, budget=9, prefix=False)
    a, b = req("a", 8, 12), req("b", 8, 12, start=20)
    s.add_request(a)
    s.add_request(b)
    step(s, model)
    step(s, model)                              # 2 + 2 blocks
    for _ in range(10):     # positions 8..11 use the 3rd block of each; position 12 needs a 7th
        out, _ = step(s, model)
        if out.preempted_req_ids:
            break
    assert out.preempted_req_ids == ["b"] and b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.block_ids == [] and b.num_preemptions == 1
    assert s.waiting[0] is b and b.num_output_tokens > 0 and s.num_preemptions == 1
    assert [x.request_id for x in out.scheduled] == ["a"]      # no admission in this step
    while s.has_unfinished_requests():
        step(s, model)
    for r in (a, b):
        assert r.output_token_ids == reference_output(r.prompt_token_ids, 12)
    assert kv.num_free_blocks == 6


def test_request_larger_than_the_cache_is_cut_by_capacity():
    s, kv, model = make(num_blocks=4, block_size=4, max_model_len=64)    # 16 tokens of cache
    r = req("r", 10, 20)
    s.add_request(r)
    finished = []
    while s.has_unfinished_requests():
        finished += step(s, model)[1]
    assert finished == [r] and r.status == RequestStatus.FINISHED_LENGTH and s.num_preemptions == 0
    assert r.stop_reason == "kv_cache_capacity" and r.num_tokens == 17    # 16 computed + 1 sampled
    assert r.output_token_ids == reference_output(r.prompt_token_ids, 20)[:7]
    assert kv.num_free_blocks == 4


# ------------------------------------------------------------------------- abort / finish
def test_abort_in_every_state_is_idempotent_and_frees_blocks():
    s, kv, model = make(budget=4, max_seqs=1)
    a, b, c = req("a", 10, 5), req("b", 3, 5), req("c", 3, 5)
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()                          # a: first prompt chunk
    sampled = model.execute(out)
    assert s.abort_request("a")                 # between the step and its update: output dropped
    assert s.update_from_output(out, sampled) == []
    assert a.status == RequestStatus.FINISHED_ABORTED and a.block_ids == [] and a.output_token_ids == []
    assert s.abort_request("c")                 # waiting
    assert not s.abort_request("c") and not s.abort_request("a") and not s.abort_request("nope")
    out, _ = step(s, model)
    assert set(out.finished_req_ids) == {"a", "c"}
    assert b.status == RequestStatus.RUNNING
    assert s.finish_request("b", RequestStatus.FINISHED_STOPPED, 7)
    assert b.status == RequestStatus.FINISHED_STOPPED and b.stop_reason == 7
    with pytest.raises(ValueError, match="not a finished status"):
        s.finish_request("b", RequestStatus.RUNNING)
    out = s.schedule()
    assert out.finished_req_ids == ["b"] and not s.has_unfinished_requests()
    assert kv.num_free_blocks == kv.num_blocks
    s.check_invariants()


# ------------------------------------------------------------------------- prefix cache / n > 1
def test_prefix_hit_skips_computed_tokens():
    s, kv, model = make(block_size=4)
    a = req("a", 13, 2)
    s.add_request(a)
    while s.has_unfinished_requests():
        step(s, model)
    b = req("b", 13, 2)                          # same prompt
    s.add_request(b)
    out, _ = step(s, model)
    (sr,) = out.scheduled
    assert b.num_cached_tokens == 12 and (sr.start_pos, sr.num_new_tokens) == (12, 1)
    while s.has_unfinished_requests():
        step(s, model)
    assert b.output_token_ids == a.output_token_ids == reference_output(a.prompt_token_ids, 2)
    assert kv.prefix_cache_hit_rate == pytest.approx(12 / 26)


def test_split_n_children_share_prompt_blocks():
    parent = Request("p", list(range(18)), Params(4, n=3), arrival_time=0.0)
    kids = split_n(parent)
    assert [k.request_id for k in kids] == ["p/0", "p/1", "p/2"]
    assert [k.child_index for k in kids] == [0, 1, 2] and all(k.parent_id == "p" for k in kids)
    single = req("x", 3, 1)
    assert split_n(single) == [single]
    s, kv, model = make(block_size=4)
    s.add_request(kids[0])
    step(s, model)                              # the first child computes the prompt
    s.add_request(kids[1])
    s.add_request(kids[2])
    out, _ = step(s, model)
    assert [x.num_new_tokens for x in out.scheduled] == [1, 2, 2]   # 16 of 18 prompt tokens hit
    assert kids[1].block_ids[:4] == kids[2].block_ids[:4] == kids[0].block_ids[:4]
    while s.has_unfinished_requests():
        step(s, model)
    assert kids[0].output_token_ids == kids[1].output_token_ids == kids[2].output_token_ids
