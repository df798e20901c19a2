"""vLLM's /tokenize, /detokenize and /version: ids as transformers' tokenizer gives them, chat prompts
as /v1/chat/completions counts them, round trips, and errors naming the field."""
from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")


def _post(server, path, body=None, raw=None):
    return httpx.post(server.url + path, content=raw if raw is not None else json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize("text", ["Hello world", "  Café 🙂 <|im_start|>user\nhi", "def f():\n\treturn 1", ""])
def test_tokenize_matches_transformers_and_round_trips(server, hf_tok, text):
    r = _post(server, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens"] == hf_tok.encode(text) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 1024 and out["token_strs"] == hf_tok.convert_ids_to_tokens(out["tokens"])
    plain = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == hf_tok.encode(text, add_special_tokens=False) and "token_strs" not in plain
    back = _post(server, "/detokenize", {"tokens": out["tokens"]})
    assert back.status_code == 200 and back.json()["prompt"] == hf_tok.decode(out["tokens"]), back.text


def test_tokenize_chat_counts_what_chat_completions_prefills(server, hf_tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    r = _post(server, "/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    c = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert c.status_code == 200 and c.json()["usage"]["prompt_tokens"] == len(ids), c.text
    no_gen = _post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()["tokens"]
    assert len(no_gen) < len(ids) and ids[:len(no_gen)] == no_gen


def test_version(server):
    import decodekit
    r = httpx.get(server.url + "/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": decodekit.__version__}


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
    ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "continue_final_message": True,
                   "add_generation_prompt": True}, "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "tools": [{"type": "function"}]}, "tools"),
    ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "chat_template": "{{ 1 }}"}, "chat_template"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens"),
    ("/detokenize", {"tokens": [49152]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, "tokens"),
])
def test_bad_requests(server, path, body, param):
    r = _post(server, path, body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_lone_surrogate_is_a_400(server):
    r = _post(server, "/tokenize", raw=b'{"prompt": "a\\ud800b"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert r.json()["error"]["message"].count("prompt") == 1, r.text


def test_long_prompt_does_not_hold_the_event_loop(server):
    """A 4 MB prompt with token strings: encoding and the JSON run in a worker thread, so /health answers
    meanwhile (it took up to 1.3 s when they ran on the event loop)."""
    import threading
    import time
    res = {}

    def big():
        res["r"] = _post(server, "/tokenize", {"prompt": "hello world " * 330000, "return_token_strs": True})
    t = threading.Thread(target=big)
    t.start()
    worst = 0.0
    while t.is_alive():
        t0 = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.02)
    t.join()
    assert res["r"].status_code == 200 and res["r"].json()["count"] > 600000
    assert worst < 0.5, worst


def test_continue_final_message(server, hf_tok):
    """vLLM's continue_final_message: the prompt ends with the last message's content (no end of turn), as
    transformers renders it; the chat reply goes on from there."""
    messages = [{"role": "user", "content": "Give me a JSON object with a name."},
                {"role": "assistant", "content": '{"name": "'}]
    r = _post(server, "/tokenize", {"messages": messages, "continue_final_message": True,
                                    "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    want = hf_tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert r.json()["tokens"] == hf_tok.encode(want, add_special_tokens=False)
    c = _post(server, "/v1/chat/completions", {"messages": messages, "continue_final_message": True,
                                               "add_generation_prompt": False, "max_tokens": 6, "temperature": 0})
    assert c.status_code == 200 and c.json()["usage"]["prompt_tokens"] == r.json()["count"], c.text
    plain = _post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()["tokens"]
    assert len(plain) > r.json()["count"]          # the end-of-turn is gone
