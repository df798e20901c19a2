"""Host-side stalls of the engine / server loops that no kernel benchmark sees (CPU, embedded model):

1. bad_words: engine.add_request's time on the step loop for 1024 words of ~1000 characters, with the words
   encoded there (unprepared) or ahead in a worker (server.async_engine.prepare_request);
2. a large cached guide (a 20000-way guided_regex): objects the garbage collector tracks afterwards and the
   time of a full collection, before and after compiling it;
3. a streamed completion's text_offset over N tokens: one OffsetCursor fed chunk by chunk vs recomputing
   text_offsets over all tokens at every chunk (what the stream did before).

    python tools/bench_host_stalls.py [--out bench/results/DATE_cpu_host_stalls.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import string
import time


def _best(fn, reps: int = 3) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def bad_words(eng) -> list[dict]:
    from decodekit.sampling.params import SamplingParams
    from decodekit.server.async_engine import prepare_request
    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_letters + " ") for _ in range(1000)).strip() + "x" for _ in range(1024)]
    rows = []
    for prepared in (False, True, False, True):
        p = SamplingParams(bad_words=list(words), max_tokens=2)
        t0 = time.perf_counter()
        if prepared:
            prepare_request(eng, "hi", p)
        t1 = time.perf_counter()
        eng.add_request(None, "hi", p)
        t2 = time.perf_counter()
        rows.append({"case": "bad_words 1024 x ~1000 chars", "prepared": prepared, "worker_s": t1 - t0,
                     "step_loop_s": t2 - t1})
        while eng.has_unfinished_requests():
            eng.step()
    return rows


def guide_gc(eng) -> list[dict]:
    from decodekit.sampling.guided import compile_guide
    gc.collect()
    n0, full0 = len(gc.get_objects()), _best(gc.collect)
    rx = "|".join(f"w{i}gc" for i in range(20000))
    t = time.perf_counter()
    g = compile_guide(rx, eng.tokenizer, eng.eos_token_ids)
    compile_s = time.perf_counter() - t
    for _ in range(3):
        gc.collect()
    n1, full1 = len(gc.get_objects()), _best(gc.collect)
    del g
    return [{"case": "20000-way guided_regex", "compile_s": compile_s, "tracked_before": n0, "tracked_after": n1,
             "full_gc_before_s": full0, "full_gc_after_s": full1}]


def offsets(eng) -> list[dict]:
    from decodekit.server import protocol as P
    tok = eng.tokenizer
    tok.token_bytes()
    ids = tok.encode("Some long text with emoji \U0001f389 and \u65e5\u672c\u8a9e " * 400, add_special_tokens=False)
    chunks = list(range(1, len(ids) + 1))

    def cursor():
        c = P.OffsetCursor(tok)
        for k in chunks:
            c.offsets(ids[:k])

    def recompute():        # every 16th chunk, scaled by 16 (the whole run would take minutes)
        for k in chunks[::16]:
            P.text_offsets(tok, ids[:k])
    return [{"case": f"stream text_offset, {len(ids)} tokens one a chunk", "cursor_s": _best(cursor, 1),
             "recompute_s": 16 * _best(recompute, 1)}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    eng = LLMEngine(EngineArgs(kv_cache_memory="64MiB", max_model_len=1024))
    rows = bad_words(eng) + guide_gc(eng) + offsets(eng)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in rows:
        r["date"] = stamp
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
