"""bad_words are encoded off the engine's step loop: the server's worker thread (async_engine.prepare_request, also
engine_proc._PrepareWorker) encodes them and leaves the encoding on the params (SamplingParams.encode_bad_words),
where the engine's add_request finds it. Was: 1024 words of 1024 characters took ~0.5 s of tokenizer calls on
the step loop, every other stream waiting."""
from __future__ import annotations

import copy
import pickle
import threading

import pytest

from decodekit.sampling.params import SamplingParams, SamplingParamsError


class _CountingTok:
    """A toy tokenizer (one token per character, a space its own token) that counts its encode calls."""

    def __init__(self):
        self.calls = 0

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        text.encode("utf-8")        # (a lone surrogate raises, as the real tokenizer)
        return [ord(c) % 50 for c in text]


def test_set_bad_words_reuses_the_prepared_encoding():
    tok = _CountingTok()
    p = SamplingParams(bad_words=["ab", "cde"], max_tokens=3)
    seqs = p.encode_bad_words(tok)
    assert tok.calls == 4                           # each word as written and after a space
    q = copy.deepcopy(p)                            # (add_request's own copy)
    q.set_bad_words_token_ids(tok, 50)
    assert tok.calls == 4, "add_request encoded the words again"
    assert q.bad_words_token_ids == seqs
    fresh = SamplingParams(bad_words=["ab", "cde"], max_tokens=3)
    fresh.set_bad_words_token_ids(_CountingTok(), 50)
    assert fresh.bad_words_token_ids == seqs         # the same sequences as without the preparation


@pytest.mark.parametrize("change", ["other tokenizer", "words changed", "pickled"])
def test_the_prepared_encoding_is_not_reused_when_it_does_not_apply(change):
    tok = _CountingTok()
    p = SamplingParams(bad_words=["ab"], max_tokens=3)
    p.encode_bad_words(tok)
    if change == "other tokenizer":
        tok = _CountingTok()
    elif change == "words changed":
        p.bad_words = ["xyz"]
    else:
        p = pickle.loads(pickle.dumps(p))          # (a tokenizer of another process: the memo arrives empty)
    before = tok.calls
    p.set_bad_words_token_ids(tok, 50)
    assert tok.calls == before + 2
    assert p.bad_words_token_ids[0] == [ord(c) % 50 for c in p.bad_words[0]]


def test_vocabulary_and_allowed_checks_still_run_on_a_prepared_encoding():
    tok = _CountingTok()
    p = SamplingParams(bad_words=["a"], allowed_token_ids=[ord("a") % 50], max_tokens=3)
    p.encode_bad_words(tok)
    with pytest.raises(SamplingParamsError, match="allowed_token_ids"):
        copy.deepcopy(p).set_bad_words_token_ids(tok, 50)
    with pytest.raises(SamplingParamsError, match=r"vocabulary \[0, 10\)"):
        copy.deepcopy(p).set_bad_words_token_ids(tok, 10)


def test_in_thread_server_encodes_bad_words_off_the_loop_threads(thread_aeng, monkeypatch):
    """--engine-in-thread: AsyncEngine.add has the words encoded in a worker thread; the engine's loop thread only
    looks them up (checked by the threads that call the tokenizer with the words), and the request's output
    avoids the word."""
    import asyncio
    tok = thread_aeng.engine.tokenizer
    words = ["tomorrow", "dragon"]
    callers = []
    real = type(tok).encode

    def recording(self, text, add_special_tokens=True):
        if text.strip() in words:
            callers.append(threading.current_thread().name)
        return real(self, text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(type(tok), "encode", recording)

    async def run():
        params = SamplingParams(bad_words=words, max_tokens=8, temperature=0)
        stream = await thread_aeng.add("bad-words-prepared", "Once upon a time", params)
        return await stream.final()

    out = asyncio.run(run())
    assert out.finished
    assert len(callers) == 2 * len(words), callers      # encoded once: as written and after a space
    assert "decodekit-engine" not in callers, callers
    assert threading.main_thread().name not in callers, callers
    assert not any(w in out.outputs[0].text for w in words)


def test_engine_process_refuses_a_bad_word_from_its_worker(server):
    """The production path (engine child, _PrepareWorker): a word that is not valid Unicode is refused by name,
    and a good request right after it is served with its words encoded there."""
    httpx = pytest.importorskip("httpx")
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2, "bad_words": ["a\\ud800"]}',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "bad_words" in r.text, r.text
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "bad_words": ["time"]},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert "time" not in r.json()["choices"][0]["text"].split()
