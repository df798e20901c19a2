#!/usr/bin/env python3
"""Cost of guided decoding on the CPU (embedded SmolLM2-135M Q4_1), against the same requests unguided:

1. compile: pattern -> NFA -> lazy DFA (the vocabulary's token-byte matrix is built once per tokenizer,
   timed separately), for a JSON schema, json_object, a regex and llama.cpp's JSON grammar (GBNF);
2. token masks: ms to compute a state's mask the first time (fresh states along a random walk) and
   cached; and per token through a 40-deep JSON object (json_object's pushdown guide: every depth new states);
3. decode: LLM.chat of one prompt, greedy, at most 80 tokens, guided_json / json_object / guided_regex: seconds
   cold (first run: guide compiled, masks computed) and warm (second run), against the same prompt unguided for
   the same number of tokens (ignore_eos); and n=16 sampled rows with a schema against 16 unguided rows of the
   same lengths.

    python bench/bench_guided.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import random
import time

from decodekit import LLM, SamplingParams
from decodekit.bench.timing import emit_json
from decodekit.sampling.guided import Guide, LazyPDA, _guides, compile_guide, guide_pattern, token_vocab
from decodekit.sampling.guided.pda import compile_rules

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    "married": {"type": "boolean"}}, "required": ["name", "age"]}
REGEX = r"[A-Z][a-z]{1,12}(?: [A-Z][a-z]{1,12})?, aged [1-9][0-9]?, lives in [A-Z][a-z]{2,15}\."
MSGS = [[{"role": "user", "content": "Describe a fictional person as JSON with name, age, tags."}]]
# llama.cpp's grammars/json.gbnf (a pushdown guide: no depth bound)
JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llm = LLM(None, dtype="float32", device="cpu", kv_cache_memory="256MiB", seed=0)
    tok, V, eos = llm.engine.tokenizer, llm.engine.model_config.vocab_size, llm.engine.eos_token_ids
    res: dict = {}
    t = time.perf_counter()
    token_vocab(tok)
    res["token_vocab_build_ms"] = (time.perf_counter() - t) * 1e3

    guides = {"json_schema": ("json", PERSON), "json_object": ("json_object", None), "regex": ("regex", REGEX),
              "grammar_json": ("grammar", JSON_GBNF)}
    comp, masks = {}, {}
    for name, (kind, value) in guides.items():
        t = time.perf_counter()
        g = compile_guide(guide_pattern(kind, value), tok, eos)
        comp[name] = (time.perf_counter() - t) * 1e3
        rng, s, first, again = random.Random(0), g.initial, [], []
        for _ in range(30):
            t = time.perf_counter()
            m, _ = g.mask(s, V)
            first.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            g.mask(s, V)
            again.append((time.perf_counter() - t) * 1e3)
            ids = [i for i in m.nonzero().flatten().tolist() if i not in eos]
            if not ids:
                break
            s = g.next_state(s, rng.choice(ids))
        masks[name] = {"first_ms_median": sorted(first)[len(first) // 2], "first_ms_max": max(first),
                       "cached_ms_median": sorted(again)[len(again) // 2], "dfa_states": len(g.dfa.sets)}
    res["compile_ms"], res["mask_ms"] = comp, masks

    # deep nesting (pushdown guide): the tokens of a 40-container-deep JSON object, each state new (per-depth
    # states), mask + step per token, against the same document's 4-deep prefix structure in a fresh guide
    deep = 1
    for i in range(40):
        deep = {f"key{i}": [deep, "text value"], "n": i} if i % 2 else {"a": deep}
    ids = tok.encode(json.dumps({"x": deep}), add_special_tokens=False)
    g = Guide(LazyPDA(compile_rules(guide_pattern("json_object", None))), token_vocab(tok), eos)
    s, per = g.initial, []
    for t_id in ids:
        t = time.perf_counter()
        m, _ = g.mask(s, V)
        s = g.next_state(s, t_id)
        per.append((time.perf_counter() - t) * 1e3)
        assert m[t_id]
    assert g.dfa.is_accepting(s)
    res["deep_json_object_40"] = {"tokens": len(ids), "ms_per_token_median": sorted(per)[len(per) // 2],
                                  "ms_per_token_mean": sum(per) / len(per), "ms_per_token_max": max(per),
                                  "states": len(g.dfa.sets)}

    _guides.clear()                                   # decode from cold guides
    dec = {}

    def timed(sp):
        t = time.perf_counter()
        o = llm.chat(MSGS, sp)[0].outputs[0]
        return time.perf_counter() - t, o

    timed(SamplingParams(temperature=0, max_tokens=8))
    for name, kw in [("json_schema", {"guided_json": PERSON}), ("json_object", {"guided_json_object": True}),
                     ("regex", {"guided_regex": REGEX}), ("grammar_json", {"guided_grammar": JSON_GBNF})]:
        sp = SamplingParams(temperature=0, max_tokens=80, **kw)
        cold, o = timed(sp)
        warm, o = timed(sp)
        n = len(o.token_ids)
        peer, _ = timed(SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))   # same prompt and length
        dec[name] = {"tokens": n, "s_cold": cold, "s_warm": warm, "s_unguided_same_length": peer,
                     "warm_time_vs_unguided": warm / peer, "text": o.text[:120]}
    res["chat_greedy"] = dec

    sp = SamplingParams(temperature=1.0, seed=1, n=16, max_tokens=32, guided_json=PERSON)
    llm.chat(MSGS, sp)
    t = time.perf_counter()
    outs = llm.chat(MSGS, sp)[0].outputs
    guided_s, lens = time.perf_counter() - t, [len(o.token_ids) for o in outs]
    # the peer: 16 unguided rows of the same lengths (one request each, so each stops where its guided row did)
    t = time.perf_counter()
    llm.chat(MSGS * 16, [SamplingParams(temperature=1.0, seed=1 + i, max_tokens=k, ignore_eos=True)
                         for i, k in enumerate(lens)])
    peer_s = time.perf_counter() - t
    res["n16_sampled_json_schema"] = {"tokens": sum(lens), "s_guided": guided_s, "s_unguided_same_lengths": peer_s,
                                      "time_vs_unguided": guided_s / peer_s}
    emit_json(res, args.json)


if __name__ == "__main__":
    main()
