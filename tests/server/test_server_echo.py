"""/v1/completions echo (with max_tokens=0 too: lm-eval's loglikelihood requests), legacy logprobs over the
prompt, and vLLM's prompt_logprobs on completions and chat."""
from __future__ import annotations

import json
import math

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")
PROMPT = "The capital of France is Paris, and the capital of Italy is"


def _post(server, path, body):
    return httpx.post(server.url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=120)


def _ok(server, body, path="/v1/completions"):
    r = _post(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_only_scores_the_prompt(server, hf_tok):
    """echo + max_tokens=0 + logprobs: the prompt's text, None for its first token, then each token's logprob
    (the same numbers prompt_logprobs gives), no completion tokens."""
    out = _ok(server, {"prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1})
    c = out["choices"][0]
    ids = hf_tok.encode(PROMPT)
    lps = c["logprobs"]
    assert c["text"] == PROMPT and c["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert lps["tokens"] == [hf_tok.decode([t]) for t in ids] and lps["token_logprobs"][0] is None
    assert lps["top_logprobs"][0] is None and lps["text_offset"][0] == 0
    assert all(isinstance(v, float) and v <= 0 for v in lps["token_logprobs"][1:])
    assert lps["text_offset"] == [sum(len(t) for t in lps["tokens"][:i]) for i in range(len(ids))]
    for tops, tokstr, v in zip(lps["top_logprobs"][1:], lps["tokens"][1:], lps["token_logprobs"][1:]):
        assert tokstr in tops and tops[tokstr] == v and 1 <= len(tops) <= 2
    plp = _ok(server, {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0})["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for i in range(1, len(ids)):
        e = plp[i][str(ids[i])]
        assert math.isclose(e["logprob"], lps["token_logprobs"][i], abs_tol=1e-5) and e["rank"] >= 1
        assert e["decoded_token"] == hf_tok.decode([ids[i]])
    # " Rome" is what the model expects: a high logprob for the continuation, a low one for nonsense
    good = _ok(server, {"prompt": PROMPT + " Rome", "echo": True, "max_tokens": 0, "logprobs": 0})
    bad = _ok(server, {"prompt": PROMPT + " banana", "echo": True, "max_tokens": 0, "logprobs": 0})
    assert good["choices"][0]["logprobs"]["token_logprobs"][-1] > bad["choices"][0]["logprobs"]["token_logprobs"][-1] + 3
    assert wait_idle(server.aeng)


def test_echo_with_generation_stream_and_ids(server, hf_tok):
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 4, "logprobs": 2, "temperature": 0, "ignore_eos": True}
    full = _ok(server, body)["choices"][0]
    plain = _ok(server, {**body, "echo": False})["choices"][0]
    assert full["text"] == PROMPT + plain["text"]
    n_prompt = len(hf_tok.encode(PROMPT))
    lps = full["logprobs"]
    assert lps["tokens"][n_prompt:] == plain["logprobs"]["tokens"]
    assert lps["token_logprobs"][n_prompt:] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-4)
    assert lps["text_offset"][n_prompt:] == [o + len(PROMPT) for o in plain["logprobs"]["text_offset"]]
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=120)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == full["text"]
    toks = [t for ch in chunks for t in ch["choices"][0]["logprobs"]["tokens"]]
    assert toks == lps["tokens"]
    ids = hf_tok.encode(PROMPT)
    by_ids = _ok(server, {**body, "prompt": ids})["choices"][0]
    assert by_ids["text"] == hf_tok.decode(ids) + plain["text"]
    two = _ok(server, {**body, "n": 2, "temperature": 0.8, "seed": 1})["choices"]
    assert len(two) == 2 and all(c["text"].startswith(PROMPT) for c in two)
    only = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "echo": True, "max_tokens": 0,
                                                           "stream": True}, timeout=120)
    chunks = [json.loads(line[6:]) for line in only.text.splitlines() if line.startswith("data: {")]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == PROMPT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_prompt_logprobs(server):
    out = _ok(server, {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 2, "prompt_logprobs": 1},
              "/v1/chat/completions")
    plp = out["prompt_logprobs"]
    assert len(plp) == out["usage"]["prompt_tokens"] and plp[0] is None
    assert all(1 <= len(e) <= 2 for e in plp[1:])


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 99},
     "prompt_logprobs"),
])
def test_bad_values(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_lm_eval_loglikelihood_payload(server, hf_tok):
    """lm-eval's local-completions loglikelihood request: a batch of token-id prompts (context +
    continuation), echo, max_tokens=1, logprobs=1, temperature 0; it reads token_logprobs[ctxlen:-1] and
    checks greediness against top_logprobs. The continuation's summed logprob must equal the prompt
    logprobs the engine reports for it, choices indexed per prompt."""
    pairs = [("The capital of France is", " Paris"), ("2 + 2 =", " 4"), ("The sky is", " green and purple")]
    prompts, ctxlens = [], []
    for ctx, cont in pairs:
        c = hf_tok.encode(ctx)
        prompts.append(c + hf_tok.encode(cont, add_special_tokens=False))
        ctxlens.append(len(c))
    out = _ok(server, {"prompt": prompts, "echo": True, "max_tokens": 1, "logprobs": 1, "temperature": 0,
                       "seed": 1234})
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    for ids, ctxlen, ch in zip(prompts, ctxlens, choices):
        lps = ch["logprobs"]
        assert len(lps["token_logprobs"]) == len(ids) + 1          # the prompt, then the generated token
        cont = lps["token_logprobs"][ctxlen:-1]
        ref = _ok(server, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0})["choices"][0]["prompt_logprobs"]
        want = [ref[i][str(ids[i])]["logprob"] for i in range(ctxlen, len(ids))]
        assert cont == pytest.approx(want, abs=1e-4)
        for tok, top in zip(lps["tokens"][ctxlen:-1], lps["top_logprobs"][ctxlen:-1]):
            assert tok in top and max(top.values()) >= top[tok]
    paris, green = sum(choices[0]["logprobs"]["token_logprobs"][ctxlens[0]:-1]), \
        sum(choices[2]["logprobs"]["token_logprobs"][ctxlens[2]:-1])
    assert paris > green


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Once upon a time"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to five."}]}),
])
def test_continuous_usage_stats(server, path, body):
    """vLLM's stream_options.continuous_usage_stats: every content chunk carries the usage so far, the last
    chunk the total; without include_usage it is ignored."""
    req = {**body, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": True,
           "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    r = httpx.post(server.url + path, json=req, timeout=120)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    counted = [ch["usage"]["completion_tokens"] for ch in chunks if ch["choices"] and "usage" in ch]
    assert counted == sorted(counted) and counted[-1] == 5 and len(counted) >= 5, chunks
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    req["stream_options"] = {"continuous_usage_stats": True}
    r = httpx.post(server.url + path, json=req, timeout=120)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert not any("usage" in ch for ch in chunks)


def test_streamed_echo_with_n_over_a_long_prompt(server, hf_tok):
    """Only the first of n samples computes a prompt's logprobs (in 512-token chunks); the others may stream
    tokens before they exist: each choice must still start with the prompt and match the non-streamed one.
    echo-only with n > 1: one sequence computes them, every choice gets the prompt and then 'length'."""
    ids = (hf_tok.encode("The history of the Roman Empire spans many centuries. ") * 80)[:1000]
    body = {"prompt": ids, "max_tokens": 3, "n": 2, "echo": True, "logprobs": 1, "temperature": 0, "ignore_eos": True}
    whole = {c["index"]: c for c in _ok(server, body)["choices"]}
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=300)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    for idx in (0, 1):
        mine = [ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["index"] == idx]
        assert "".join(m["text"] for m in mine) == whole[idx]["text"]
        assert [t for m in mine for t in m["logprobs"]["tokens"]] == whole[idx]["logprobs"]["tokens"]
        assert [o for m in mine for o in m["logprobs"]["text_offset"]] == whole[idx]["logprobs"]["text_offset"]
        assert mine[-1]["finish_reason"] == "length" and all(m["finish_reason"] is None for m in mine[:-1])
    only = {**body, "max_tokens": 0, "n": 3, "stream": True}
    r = httpx.post(server.url + "/v1/completions", json=only, timeout=300)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    for idx in range(3):
        mine = [ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["index"] == idx]
        assert [m["finish_reason"] for m in mine] == [None, "length"]
        assert mine[0]["text"] == hf_tok.decode(ids) and mine[0]["logprobs"]["token_logprobs"][0] is None
    r = _post(server, "/v1/completions", {"prompt": "hi", "echo": True, "max_tokens": 0, "min_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
