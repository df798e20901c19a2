"""The engine's per-step host work: ModelRunner._host_inputs (numpy) against a plain-Python oracle on
random ragged batches, and final_only requests (step() returns their output once, when they finish,
equal to the last cumulative output of the same request without it)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from decodekit.engine.llm_engine import LLMEngine
from decodekit.engine.args import EngineArgs
from decodekit.engine.model_runner import ModelRunner
from decodekit.sampling import SamplingParams


def _oracle(bs, token_lists, starts, tables, num_logits, num_first):
    ids, pos, slots, sample_rows, end = [], [], [], [], 0
    for i, toks in enumerate(token_lists):
        for j, t in enumerate(toks):
            p = starts[i] + j
            ids.append(t)
            pos.append(p)
            slots.append(tables[i][p // bs] * bs + p % bs)
        m = num_first[i] if num_first else 0
        sample_rows += list(range(end, end + m))
        end += len(toks)
        sample_rows += list(range(end - num_logits[i], end))
    maxb = max(len(t) for t in tables)
    bt = [t + [0] * (maxb - len(t)) for t in tables]
    qsl = [0]
    for toks in token_lists:
        qsl.append(qsl[-1] + len(toks))
    seq_lens = [s + len(t) for s, t in zip(starts, token_lists)]
    return ids, pos, slots, bt, seq_lens, qsl, sample_rows


@pytest.mark.parametrize("seed", range(12))
def test_host_inputs_match_oracle(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 5, 16, 32])
    S = rng.choice([1, 2, 3, 17, 64])
    token_lists, starts, tables, num_logits, num_first = [], [], [], [], []
    for _ in range(S):
        n = rng.choice([1, 1, 1, 2, 7, 40])            # decodes, verifications, prefill chunks
        start = rng.randrange(0, 300)
        nblocks = -(-(start + n) // bs) + rng.randrange(0, 3)   # tables may run past the tokens
        token_lists.append([rng.randrange(0, 50000) for _ in range(n)])
        starts.append(start)
        tables.append(rng.sample(range(10000), nblocks))
        last = rng.randrange(0, n + 1)
        num_logits.append(last)
        num_first.append(rng.randrange(0, n - last + 1))
    runner = SimpleNamespace(block_size=bs)
    got = ModelRunner._host_inputs(runner, token_lists, starts, tables, num_logits, num_first)
    want = _oracle(bs, token_lists, starts, tables, num_logits, num_first)
    dtypes = [torch.int64, torch.int64, torch.int64, torch.int32, torch.int32, torch.int64]
    for g, w, dt, name in zip(got[:6], want[:6], dtypes, ["ids", "positions", "slots", "tables", "seq_lens", "qsl"]):
        assert g.dtype == dt, name
        assert g.tolist() == w, name
    assert got[6] == want[6]


def test_host_inputs_reject_overlapping_logits_rows():
    with pytest.raises(ValueError, match="overlap"):
        ModelRunner._host_inputs(SimpleNamespace(block_size=16), [[1, 2, 3]], [0], [[4]], [2], [2])


def test_final_only_output_once_and_equal():
    eng = LLMEngine(EngineArgs(model="random:tiny-gqa4-d64", kv_cache_memory="16MiB", seed=0))
    sp = SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True, logprobs=2)
    a = eng.add_request("a", "hello world", sp, final_only=True)
    b = eng.add_request("b", "hello world", sp)
    seen = {a: [], b: []}
    while eng.has_unfinished_requests():
        for out in eng.step():
            seen[out.request_id].append(out)
    assert len(seen[a]) == 1 and seen[a][0].finished
    assert len(seen[b]) > 1 and seen[b][-1].finished
    fa, fb = seen[a][0].outputs[0], seen[b][-1].outputs[0]
    assert len(fa.token_ids) == 12
    assert (fa.token_ids, fa.text, fa.finish_reason) == (fb.token_ids, fb.text, fb.finish_reason)
    assert [sorted(e) for e in fa.logprobs] == [sorted(e) for e in fb.logprobs]
    # the one output's delta is everything (nothing was handed out before it)
    assert fa.delta_text == fa.text and list(fa.delta_token_ids) == list(fa.token_ids)
