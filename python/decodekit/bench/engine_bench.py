"""`decodekit bench latency` and `decodekit bench throughput`: offline engine benchmarks.

latency:    (with --spec: bench/spec_bench.py, speculative vs plain decoding per prompt class)
            one request at a time: prefill tokens/s (time to first token) and decode
            tokens/s (steps after the first), as the median over --iters runs; the decode
            figure is also given as weight bytes read per second over the measured copy
            bandwidth (the memory-bound limit of a decode step).
throughput: --num-prompts requests submitted at once (continuous batching): output
            tokens/s and total tokens/s over the whole run, and the steady-state decode rate
            (decode_phase_tok_s: tokens generated in steps that schedule no prompt tokens,
            over those steps' time), and that rate over the batch-1 decode rate measured in the
            same process just before and after (decode_phase_vs_batch1; --rounds N repeats it
            with fresh prompts and reports the median: a ratio that holds on a drifting machine).

Peers in the same run (--peer hf, default): HF transformers on the same weights (a manual
greedy loop with its KV cache for latency, batched generate() for throughput), and
llama.cpp through llama-cpp-python on the GGUF when that package is installed.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from decodekit.bench.datasets import dataset_pairs, random_token_prompts
from decodekit.bench.output import check_output_file, dumps
from decodekit.bench.timing import measure_copy_bandwidth, device_name


def _prompts(args, tokenizer, vocab: int, n: int) -> list[list[int]]:
    if args.dataset:
        texts = [q for q, _ in dataset_pairs(args.dataset)]
        return [tokenizer.encode(texts[i % len(texts)])[: args.input_len] for i in range(n)]
    return random_token_prompts(random.Random(args.seed), n, args.input_len, vocab)


def _engine(args):
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    return LLMEngine(EngineArgs.from_cli(args))


def _weight_bytes(engine) -> int:
    m = engine.model
    seen, total = set(), 0
    tensors = [m.embed, m.norm, m.lm_head] + [t for L in m.layers for t in vars(L).values() if t is not None]
    for t in tensors:
        if not isinstance(t, torch.Tensor):  # packed INT4 / INT8 (decodekit.quant)
            if id(t) not in seen:
                seen.add(id(t))
                total += t.nbytes
        elif t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    # a decode step reads every weight once, except the embedding table (one row)
    if m.lm_head is not m.embed:
        total -= m.embed.nbytes if not isinstance(m.embed, torch.Tensor) else m.embed.numel() * m.embed.element_size()
    return total


def timed_request(engine, prompt: list[int], params):
    """Runs one request alone: (final RequestOutput, seconds to its first token, seconds after that,
    tokens after the first delivery)."""
    rid = engine.add_request(None, list(prompt), params)
    t0 = time.perf_counter()
    first, first_n, final = None, 0, None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id != rid:
                continue
            if first is None and o.outputs[0].token_ids:
                first, first_n = time.perf_counter(), len(o.outputs[0].token_ids)
            if o.finished:
                final = o
    end = time.perf_counter()
    return final, first - t0, end - first, len(final.outputs[0].token_ids) - first_n


def _one_request(engine, prompt: list[int], out_len: int) -> tuple[float, float]:
    """(seconds to first token, seconds per later step) for one request alone."""
    from decodekit.sampling import SamplingParams
    _, ttft, after, _ = timed_request(engine, prompt, SamplingParams(temperature=0, max_tokens=out_len,
                                                                     ignore_eos=True))
    return ttft, after / max(out_len - 1, 1)


def hf_from_loaded(loaded, device="cpu"):
    """HF transformers' LlamaForCausalLM / Qwen2ForCausalLM holding a LoadedModel's weights."""
    import transformers
    c = loaded.config
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
              rope_scaling=c.rope_scaling, max_position_embeddings=c.max_position_embeddings,
              tie_word_embeddings=c.tie_word_embeddings)
    if c.attention_bias:
        cls, cfg = transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**kw)
    else:
        cls, cfg = transformers.LlamaForCausalLM, transformers.LlamaConfig(**kw)
    dtype = next(iter(loaded.weights.values())).dtype
    with torch.device(device):  # random init on the target device is fast; the weights overwrite it
        m = cls(cfg).to(dtype)
    m.load_state_dict(loaded.weights, strict=False)
    if c.tie_word_embeddings:
        m.tie_weights()
    return m.eval()


def _hf_model(engine):
    import transformers
    src = engine.model_source
    if src.startswith("random:"):
        from decodekit.loader import load_model
        return hf_from_loaded(load_model(src, dtype=engine.dtype, device=engine.device, progress=False),
                              engine.device)
    if src.endswith(".gguf"):
        return transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(src), gguf_file=os.path.basename(src), dtype=engine.dtype).eval()
    if os.path.isdir(src):
        return transformers.AutoModelForCausalLM.from_pretrained(src, dtype=engine.dtype).eval()
    return None


@torch.no_grad()
def _hf_one(model, prompt, out_len) -> tuple[float, float]:
    dev = model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ids, past = torch.tensor([prompt], device=dev), None
    sync()
    t0 = time.perf_counter()
    first = None
    for _ in range(out_len):
        r = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = r.past_key_values
        ids = r.logits[:, -1:].argmax(-1)
        if first is None:
            sync()
            first = time.perf_counter()
    sync()
    end = time.perf_counter()
    return first - t0, (end - first) / max(out_len - 1, 1)


def _llama_cpp(engine, prompt, out_len, threads):
    try:
        import llama_cpp
    except ImportError:
        return None
    if not engine.model_source.endswith(".gguf"):
        return None
    llm = llama_cpp.Llama(engine.model_source, n_ctx=len(prompt) + out_len + 8, n_threads=threads, verbose=False)
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(out_len - 1):
        tok = llm.sample(temp=0)
        llm.eval([tok])
    t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / max(out_len - 1, 1)


def latency(args) -> dict:
    if args.output_len < 2:  # also reached from `plan --measure`, which skips run()'s checks
        raise ValueError(f"argument --output-len: bench latency times decode over the tokens after the first, so "
                         f"it needs >= 2 output tokens (got {args.output_len})")
    eng = _engine(args)
    if eng.spec is not None:  # speculative vs plain decoding on built-in prompt classes
        from decodekit.bench.spec_bench import spec_latency
        return {"bench": "latency_spec", "model": eng.model_source, "device": device_name(eng.device),
                "dtype": str(eng.dtype).replace("torch.", ""), "output_len": args.output_len,
                "threads": torch.get_num_threads(), **spec_latency(eng, args)}
    vocab = eng.model_config.vocab_size
    prompts = _prompts(args, eng.tokenizer, vocab, args.iters + 1)
    _one_request(eng, prompts[0][:8], 4)  # warm-up
    runs = [_one_request(eng, p, args.output_len) for p in prompts[1:]]
    ttft = statistics.median(r[0] for r in runs)
    tpot = statistics.median(r[1] for r in runs)
    # the prompts' own length (a --dataset prompt may be shorter than --input-len)
    n_in = statistics.fmean(len(p) for p in prompts[1:])
    wbytes = _weight_bytes(eng)
    copy = float(measure_copy_bandwidth(eng.device))  # GB/s, read + write counted
    res = {"bench": "latency", "model": eng.model_source, "device": device_name(eng.device),
           "dtype": str(eng.dtype).replace("torch.", ""), "input_len": args.input_len, "output_len": args.output_len,
           "prompt_tokens_mean": n_in, "threads": torch.get_num_threads(),
           "decodekit": {"ttft_s": ttft, "prefill_tok_s": n_in / ttft, "tpot_s": tpot,
                         "decode_tok_s": 1 / tpot, "weight_gb_s": wbytes / tpot / 1e9},
           "weight_bytes": wbytes, "copy_bandwidth_gb_s": copy,
           # a copy moves 2 bytes per byte copied; a decode step only reads: its limit is ~copy GB/s
           "decode_frac_of_copy_bw": wbytes / tpot / 1e9 / copy}
    if args.peer in ("hf", "all"):
        hf = _hf_model(eng)
        if hf is not None:
            _hf_one(hf, prompts[0][:8], 4)
            hr = [_hf_one(hf, p, args.output_len) for p in prompts[1:]]
            h_ttft, h_tpot = statistics.median(r[0] for r in hr), statistics.median(r[1] for r in hr)
            res["hf_transformers"] = {"ttft_s": h_ttft, "prefill_tok_s": n_in / h_ttft, "tpot_s": h_tpot,
                                      "decode_tok_s": 1 / h_tpot}
            res["speedup_vs_hf"] = {"prefill": h_ttft / ttft, "decode": h_tpot / tpot}
        lc = _llama_cpp(eng, prompts[1], args.output_len, torch.get_num_threads())
        res["llama_cpp"] = ({"ttft_s": lc[0], "prefill_tok_s": len(prompts[1]) / lc[0], "decode_tok_s": 1 / lc[1]}
                            if lc else "llama-cpp-python not installed")
    return res


def _concurrent(eng, prompts: list[list[int]], params) -> dict:
    """Submits every prompt at once and steps until all finish: elapsed time, steps, and the steady
    state (steps that schedule no prompt tokens: pure decode batches) time and tokens."""
    t0 = time.perf_counter()
    for pr in prompts:
        eng.add_request(None, pr, params)
    steps = 0
    dec_t, dec_tok = 0.0, 0
    while eng.has_unfinished_requests():
        g0, ts = eng.stats["generation_tokens"], time.perf_counter()
        eng.step()
        steps += 1
        made = eng.stats["generation_tokens"] - g0
        if made > 0 and eng.stats["last_step_tokens"] == made:  # one token per sequence: no prompt tokens
            dec_t += time.perf_counter() - ts
            dec_tok += made
    return {"elapsed_s": time.perf_counter() - t0, "steps": steps, "dec_t": dec_t, "dec_tok": dec_tok}


def throughput(args) -> dict:
    from decodekit.sampling import SamplingParams
    eng = _engine(args)
    n = args.num_prompts
    # fresh prompts per round (no prefix-cache hits across rounds), one more per round for the batch-1 runs
    prompts = _prompts(args, eng.tokenizer, eng.model_config.vocab_size, (n + 2) * args.rounds)
    _one_request(eng, prompts[0][:8], 4)
    p = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    rounds = []
    for r in range(args.rounds):
        base = r * (n + 2)
        # batch-1 decode just before and just after the concurrent run: the ratio holds when the machine drifts
        b1 = [_one_request(eng, prompts[base + n], args.output_len)[1]]
        c = _concurrent(eng, prompts[base:base + n], p)
        b1.append(_one_request(eng, prompts[base + n + 1], args.output_len)[1])
        dec = c["dec_tok"] / c["dec_t"] if c["dec_t"] > 0 else None
        # tokens/s of the mean time per token; none with one output token (no decode step to time)
        one = 2 / sum(b1) if args.output_len > 1 else None
        rounds.append({**c, "decode_phase_tok_s": dec, "batch1_decode_tok_s": one,
                       "decode_phase_vs_batch1": dec / one if dec and one else None})
    first = rounds[0]
    n_out = n * args.output_len
    dt = first["elapsed_s"]
    ratios = [x["decode_phase_vs_batch1"] for x in rounds if x["decode_phase_vs_batch1"]]
    n_in = sum(len(x) for x in prompts[:n])  # the first round's prompts (a --dataset prompt may be shorter)
    res = {"bench": "throughput", "model": eng.model_source, "device": device_name(eng.device),
           "dtype": str(eng.dtype).replace("torch.", ""), "num_prompts": n,
           "input_len": args.input_len, "output_len": args.output_len, "prompt_tokens": n_in,
           "threads": torch.get_num_threads(),
           "decodekit": {"elapsed_s": dt, "output_tok_s": n_out / dt,
                         "total_tok_s": (n_out + n_in) / dt, "steps": first["steps"],
                         "decode_phase_tok_s": first["decode_phase_tok_s"],
                         "decode_phase_steps_s": first["dec_t"],
                         "batch1_decode_tok_s": first["batch1_decode_tok_s"],
                         "decode_phase_vs_batch1": first["decode_phase_vs_batch1"],
                         "decode_phase_vs_batch1_median": statistics.median(ratios) if ratios else None,
                         "rounds": [{k: x[k] for k in ("decode_phase_tok_s", "batch1_decode_tok_s",
                                                       "decode_phase_vs_batch1", "elapsed_s")} for x in rounds],
                         "prefix_cache_hit_rate": eng.kv_manager.prefix_cache_hit_rate,
                         "preemptions": eng.scheduler.num_preemptions,
                         "kv_cache_blocks": eng.kv_manager.num_blocks}}
    prompts = prompts[:n]
    if args.peer in ("hf", "all"):
        hf = _hf_model(eng)
        if hf is not None:
            # left-padded to the longest (random prompts: all --input-len long, no padding)
            width = max(len(x) for x in prompts)
            ids = torch.tensor([[0] * (width - len(x)) + x for x in prompts], device=hf.device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=hf.device)
            sync = torch.cuda.synchronize if hf.device.type == "cuda" else (lambda: None)
            with torch.no_grad():
                sync()
                t0 = time.perf_counter()
                hf.generate(ids, attention_mask=mask, max_new_tokens=args.output_len,
                            min_new_tokens=args.output_len, do_sample=False, pad_token_id=0)
                sync()
                hdt = time.perf_counter() - t0
            res["hf_transformers"] = {"elapsed_s": hdt, "output_tok_s": n_out / hdt}
            res["speedup_vs_hf"] = hdt / dt
    return res


def add_args(p: argparse.ArgumentParser) -> None:
    from decodekit.engine.args import EngineArgs
    EngineArgs.add_cli_args(p)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (default 128)")
    p.add_argument("--output-len", type=int, default=64, help="generated tokens per request (default 64)")
    p.add_argument("--num-prompts", type=int, default=32, help="requests for throughput (default 32)")
    p.add_argument("--rounds", type=int, default=1,
                   help="throughput: repeat (batch-1 request, the concurrent run, batch-1 request) this many times with "
                        "fresh prompts; reports each round's steady-state decode rate over its batch-1 rate and the "
                        "median (default 1)")
    p.add_argument("--iters", type=int, default=3, help="latency runs, median reported (default 3); with --spec: runs per prompt and "
                        "mode, fastest reported")
    p.add_argument("--dataset", default=None, help="ShareGPT-format JSON or a JSON list of strings (default: random)")
    p.add_argument("--peer", default="hf", choices=["none", "hf", "all"], help="peers to run in the same process")
    p.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads (default: all cores)")
    p.add_argument("--output-json", default=None, help="write the result here")
    p.add_argument("--bench-seed", dest="seed", type=int, default=0, help="seed for random prompts")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="latency --spec: sample at this temperature (seeded per prompt) instead of greedy; "
                        "model drafters are then also run with argmax drafts for comparison (default 0)")


def run(kind: str, args) -> int:
    if args.threads is not None:
        most = 4 * (os.cpu_count() or 1)
        if not 1 <= args.threads <= most:
            raise ValueError(f"--threads must be in [1, {most}] (4 x this machine's {os.cpu_count()} CPUs), "
                             f"got {args.threads}")
        torch.set_num_threads(args.threads)
    for name in ("input_len", "output_len", "num_prompts", "iters", "rounds"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0.0 <= args.temperature <= 100.0:
        raise ValueError(f"--temperature must be in [0, 100], got {args.temperature}")
    check_output_file(args.output_json)  # before the run, not after it
    res = latency(args) if kind == "latency" else throughput(args)
    res["date"] = time.strftime("%Y-%m-%d %H:%M")
    res["torch"] = torch.__version__
    text = dumps(res)
    print(text)
    if args.output_json:
        with open(args.output_json, "w") as f:
            f.write(text + "\n")
    return 0
