"""The OpenAI API with the official `openai` client (completions and chat, streaming and not, n > 1,
stop, logprobs, seeds), against the engine's own offline outputs; models, health, metrics."""
from __future__ import annotations

import pytest

from server_harness import wait_idle

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_and_stream_agree(client, server):
    r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "length" and "Paris" in r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    assert wait_idle(server.aeng)


def test_token_prompt_batch_n_and_stop(client, server):
    ids = server.aeng.engine.tokenizer.encode(PROMPT)
    r = client.completions.create(model="smollm2", prompt=[ids, "1, 2, 3, 4,"], max_tokens=12, temperature=0.8, n=2,
                                  seed=3, stop=[" 7"])
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    for c in r.choices[2:]:
        assert " 7" not in c.text
    again = client.completions.create(model="smollm2", prompt=[ids, "1, 2, 3, 4,"], max_tokens=12, temperature=0.8,
                                      n=2, seed=3, stop=[" 7"])
    assert [c.text for c in again.choices] == [c.text for c in r.choices]    # seeds reproduce


def test_completion_logprobs(client):
    r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for t, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) >= 3 and max(top.values()) == pytest.approx(l)   # greedy: the top token


def test_chat_stream_and_logprobs(client):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=10, temperature=0, logprobs=True,
                                       top_logprobs=2)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert len(c.logprobs.content) == r.usage.completion_tokens
    assert all(len(x.top_logprobs) == 2 for x in c.logprobs.content)
    s = list(client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=10, temperature=0, stream=True))
    assert s[0].choices[0].delta.role == "assistant"
    assert "".join(x.choices[0].delta.content or "" for x in s if x.choices) == c.message.content
    assert s[-1].choices[0].finish_reason == c.finish_reason


def test_chat_n_and_max_completion_tokens(client):
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], n=3,
                                       max_completion_tokens=5, temperature=1.0, seed=1)
    assert len(r.choices) == 3 and r.usage.completion_tokens <= 15


def test_models_health_metrics(server, client):
    import httpx
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.url + "/metrics").text
    for name in ("decodekit:num_requests_running", "decodekit:num_requests_waiting", "decodekit:kv_cache_usage_perc",
                 "decodekit:prefix_cache_hit_rate", "decodekit:num_preemptions", "decodekit:generation_tokens",
                 "decodekit:engine_steps",
                 "decodekit:time_to_first_token_seconds_bucket", "decodekit:e2e_request_latency_seconds_count",
                 "decodekit:time_per_output_token_seconds", "decodekit:request_queue_time_seconds",
                 "decodekit:inter_token_latency_seconds_count"):
        assert name in text, name


def test_speculative_server_same_greedy_output(server, client):
    """A server started with --spec ngram answers greedy requests exactly as the plain one and
    exports the acceptance metrics."""
    import httpx
    from server_harness import LiveServer
    from decodekit.engine.args import EngineArgs
    from decodekit.server.engine_proc import EngineProcess
    a = EngineProcess(EngineArgs(kv_cache_memory="64MiB", max_model_len=1024, speculative="ngram"))
    a.start()
    s = LiveServer(a)
    try:
        spec = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        text = "Repeat exactly: red green blue red green blue red green blue"
        kw = dict(model="smollm2", messages=[{"role": "user", "content": text}], max_tokens=24, temperature=0)
        assert spec.chat.completions.create(**kw).choices[0].message.content == \
            client.chat.completions.create(**kw).choices[0].message.content
        m = httpx.get(s.url + "/metrics").text
        assert "decodekit:spec_decode_acceptance_rate" in m and "decodekit:spec_decode_num_draft_tokens" in m
    finally:
        s.stop()
        a.shutdown()
