"""logit_bias (OpenAI's {"token id": bias}), allowed_token_ids and bad_words (vLLM's) through the server:
they change the tokens as asked, and bad values get a 400 naming the field."""
from __future__ import annotations

import json

import pytest

from server_harness import wait_idle

httpx = pytest.importorskip("httpx")


def _post(server, path, body):
    return httpx.post(server.url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=120)


def _ids(server, body):
    r = _post(server, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                                          "ignore_eos": True, "logprobs": 0, **body})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    return c["text"], c["logprobs"]["tokens"]


def test_logit_bias_and_allowed_tokens(server, hf_tok):
    text, toks = _ids(server, {})
    forced = 1000
    text_b, toks_b = _ids(server, {"logit_bias": {str(forced): 100}})
    assert toks_b == [hf_tok.decode([forced])] * 6 and text_b != text
    # -100 on the greedy first token: another one comes first
    first = hf_tok.encode(toks[0], add_special_tokens=False)
    assert len(first) == 1
    _, toks_c = _ids(server, {"logit_bias": {str(first[0]): -100}})
    assert toks_c[0] != toks[0]
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4,
                                               "temperature": 0, "logit_bias": {str(forced): 100}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == hf_tok.decode([forced] * 4), r.text
    allowed = [1000, 1001, 1002]
    _, toks_d = _ids(server, {"temperature": 1.0, "seed": 3, "allowed_token_ids": allowed, "max_tokens": 12})
    assert set(toks_d) <= {hf_tok.decode([t]) for t in allowed} and len(toks_d) == 12
    assert wait_idle(server.aeng)


def test_bad_words_remove_the_greedy_word(server):
    text, _ = _ids(server, {})
    word = text.split()[0] if text.split() else None
    if not word:
        pytest.skip("greedy continuation has no word")
    text_b, _ = _ids(server, {"bad_words": [word]})
    assert word not in text_b.split(), (word, text, text_b)
    assert text_b != text


@pytest.mark.parametrize("body, param", [
    ({"logit_bias": {"3": -100.5}}, "logit_bias"),
    ({"logit_bias": {"3.5": 1}}, "logit_bias"),
    ({"logit_bias": "none"}, "logit_bias"),
    ({"allowed_token_ids": [1, "2"]}, "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"bad_words": ["ok", 5]}, "bad_words"),
    ({"bad_words": ["x" * 2000]}, "bad_words"),
])
def test_bad_values_name_the_field(server, body, param):
    r = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                               **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_bad_word_that_is_not_unicode_is_refused(server):
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2, "bad_words": ["a\\ud800"]}',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words", r.text
    assert wait_idle(server.aeng)


def test_guided_choice_both_spellings(server):
    msgs = [{"role": "user", "content": "Pick a colour."}]
    for extra in ({"guided_choice": ["red", "green", "blue"]}, {"structured_outputs": {"choice": ["red", "green", "blue"]}}):
        r = _post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 1.0, "n": 4,
                                                   "seed": 5, **extra})
        assert r.status_code == 200, r.text
        assert all(c["message"]["content"] in ("red", "green", "blue") and c["finish_reason"] == "stop"
                   for c in r.json()["choices"]), r.text
    for bad, param in (({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs"),
                       ({"structured_outputs": {"choice": None}}, "structured_outputs"),
                       ({"guided_choice": ["a"], "min_tokens": 2}, "guided_choice"),
                       ({"guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}}, "structured_outputs"),
                       ({"guided_choice": "red"}, "guided_choice"), ({"guided_choice": []}, "guided_choice"),
                       ({"guided_choice": ["a"], "ignore_eos": True}, "guided_choice")):
        r = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_truncate_prompt_tokens(server):
    """vLLM's truncate_prompt_tokens on both endpoints: usage counts the kept tokens; bad values are a 400."""
    long = "one two three four five six seven eight nine ten " * 8
    r = _post(server, "/v1/completions", {"prompt": long, "max_tokens": 3, "truncate_prompt_tokens": 7, "echo": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 7, r.text
    echoed = r.json()["choices"][0]["text"]     # the kept prompt (decoded from its 7 tokens), then the completion
    assert len(echoed) < len(long) // 3 and echoed.split()[0] in long.split(), echoed
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 3,
                                               "truncate_prompt_tokens": 12})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 12, r.text
    for bad in (0, -5, 10 ** 6, "x", -1.0, 2.0):
        for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions",
                                                                    {"messages": [{"role": "user", "content": "hi"}]})):
            r = _post(server, path, {**body, "max_tokens": 2, "truncate_prompt_tokens": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", (bad, r.text)
            if bad != 10 ** 6:
                assert "must be -1 or an int >= 1" in r.json()["error"]["message"], r.text
    # with a beam search (vLLM's: the search starts from the kept tokens)
    r = _post(server, "/v1/completions", {"prompt": long, "use_beam_search": True, "n": 2, "max_tokens": 3,
                                          "truncate_prompt_tokens": 7})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 7, r.text
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 3,
                                               "use_beam_search": True, "n": 2, "truncate_prompt_tokens": 12})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 12, r.text
