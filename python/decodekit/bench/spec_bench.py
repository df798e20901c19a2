"""`decodekit bench latency --spec METHOD`: speculative against plain decoding, in the same engine
(same weights; the plain runs simply switch the engine's SpecDecoder off), one request at a time.

Per prompt of each class (bench.spec_prompts: grounded and open; chat template applied when the
model has one): greedy decoding of up to --output-len tokens (EOS ends a request, the same way in
both runs) timed after the first token; the speculative run must emit the identical tokens.
--temperature T > 0: seeded sampling instead (the outputs follow the same distribution, not the
same tokens: "identical" is None); a model drafter then also runs with argmax drafts (its
DraftSampling off: one-hot drafts) and each prompt reports both ("argmax_drafts").
Each prompt runs --iters times, plain and speculative alternately; the fastest run of each is timed
(interference from other work on the machine only ever slows a run down).
Reported per class: median decode speed-up, acceptance rate and mean accepted length (tokens
emitted per verification step); and the verification op's own time on the step's shapes
(rejection_sample over [1, k+1, V]) as a fraction of one plain decode step.
"""
from __future__ import annotations

import statistics
import time

import torch

from .engine_bench import timed_request
from .spec_prompts import PROMPT_CLASSES


def _prompt_ids(eng, text: str) -> list[int]:
    tok = eng.tokenizer
    if getattr(tok, "chat_template", None):
        try:
            return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True),
                              add_special_tokens=False)
        except Exception:  # noqa: BLE001 -- a template that cannot render a plain user turn
            pass
    return tok.encode(text)


def _run_one(eng, ids: list[int], out_len: int, temperature: float = 0.0,
             seed: int = 0) -> tuple[list[int], float, int, dict]:
    """(tokens, seconds after the first token, tokens after the first, metrics) for one request
    (greedy, or seeded sampling at `temperature`)."""
    from decodekit.sampling import SamplingParams
    sp = SamplingParams(temperature=temperature, max_tokens=out_len, seed=seed if temperature > 0 else None)
    final, _, after, n_after = timed_request(eng, ids, sp)
    return final.outputs[0].token_ids, after, n_after, final.metrics


def _verify_op_seconds(eng, k: int, reps: int = 50, sharpness: float = 1.0) -> tuple[float, float | None]:
    """(median wall time of one rejection_sample call, its device time per call or None on CPU) on a decode
    step's shapes ([1, k+1, V], sampled, one-hot drafts), target softmax(sharpness * randn): 1 = nearly flat
    (the worst case: every token drawn), 8 = a confident prediction (~1% of the tokens drawn: the kernel
    skips those that cannot win; SmolLM2's own next-token distributions at temperature 0.8 leave 1-33% of
    its 49152 tokens to draw, by context). The wall time includes the op's Python and launch overhead and
    a synchronisation; the device time is CUDA events around `reps` back-to-back calls, divided by reps."""
    from decodekit import ops
    V, dev = eng.model_config.vocab_size, eng.device
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, k + 1, V, generator=g) * sharpness, -1).to(dev)
    d = torch.randint(0, V, (1, k), generator=g).to(dev)
    nd = torch.full((1,), k, dtype=torch.int32, device=dev)
    seeds = torch.zeros(1, dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ts = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        ops.rejection_sample(d, nd, None, p, seeds, pos, greedy=False)
        sync()
        ts.append(time.perf_counter() - t)
    device_s = None
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            ops.rejection_sample(d, nd, None, p, seeds, pos, greedy=False)
        end.record()
        end.synchronize()
        device_s = start.elapsed_time(end) / 1e3 / reps
    return statistics.median(ts), device_s


def _spec_run(eng, spec, ids, out_len, temperature, seed) -> tuple[list[int], float, int, int, int, int]:
    """(tokens, seconds, tokens after the first, drafts, accepted, verify steps) of one speculative run."""
    eng.spec = spec
    keys = ("spec_draft_tokens", "spec_accepted_tokens", "spec_verify_steps")
    before = [spec.stats[k] for k in keys]
    toks, s, n, _ = _run_one(eng, ids, out_len, temperature, seed)
    d, a, v = (spec.stats[k] - x for k, x in zip(keys, before))
    return toks, s, n, d, a, v


def _speedup(base_s, base_n, s, n):
    return (base_s / base_n) / (s / n) if base_n and n and s > 0 and base_s > 0 else None


def spec_latency(eng, args) -> dict:
    spec = eng.spec
    temp = float(getattr(args, "temperature", 0.0) or 0.0)
    both = temp > 0 and getattr(spec, "sampling", None) is not None   # model drafter: sampled vs argmax drafts
    classes = {}
    _run_one(eng, eng.tokenizer.encode("Hello")[:8] or [1], 4)   # warm-up, both paths
    eng.spec = None
    _run_one(eng, eng.tokenizer.encode("Hello")[:8] or [1], 4)
    plain_step = []
    reps = max(1, int(getattr(args, "iters", 1) or 1))
    for cls, make in PROMPT_CLASSES.items():
        rows = []
        for i, text in enumerate(make()):
            ids = _prompt_ids(eng, text)[-(eng.max_model_len - args.output_len - 1):]
            base_s = s = float("inf")
            for _ in range(reps):   # alternating, fastest of each: a busy machine slows runs, never speeds them
                eng.spec = None
                base_toks, bs, base_n = _run_one(eng, ids, args.output_len, temp, 1 + i)[:3]
                toks, ss, n, d, a, v = _spec_run(eng, spec, ids, args.output_len, temp, 1 + i)
                base_s, s = min(base_s, bs), min(s, ss)
            if base_n > 0:
                plain_step.append(base_s / base_n)
            row = {"prompt_tokens": len(ids), "output_tokens": len(toks),
                   "identical": toks == base_toks if temp == 0 else None,
                   "plain_tok_s": base_n / base_s if base_s > 0 else None,
                   "spec_tok_s": n / s if s > 0 else None,
                   "speedup": _speedup(base_s, base_n, s, n),
                   "draft_tokens": d, "accepted_tokens": a, "verify_steps": v,
                   "acceptance_rate": a / d if d else 0.0,
                   "mean_accepted_length": (a + v) / v if v else 0.0}
            if both:
                sampling, spec.sampling = spec.sampling, None
                try:
                    _, s2, n2, d2, a2, v2 = _spec_run(eng, spec, ids, args.output_len, temp, 1 + i)
                finally:
                    spec.sampling = sampling
                row["argmax_drafts"] = {"speedup": _speedup(base_s, base_n, s2, n2),
                                        "acceptance_rate": a2 / d2 if d2 else 0.0,
                                        "mean_accepted_length": (a2 + v2) / v2 if v2 else 0.0}
            rows.append(row)
        sp = [r["speedup"] for r in rows if r["speedup"]]
        D, A, Vs = (sum(r[k] for r in rows) for k in ("draft_tokens", "accepted_tokens", "verify_steps"))
        if both:
            am = [r["argmax_drafts"] for r in rows]
            sp2 = [x["speedup"] for x in am if x["speedup"]]
            extra = {"argmax_drafts_median_speedup": statistics.median(sp2) if sp2 else None,
                     "argmax_drafts_acceptance_rate": statistics.mean(x["acceptance_rate"] for x in am)}
        else:
            extra = {}
        classes[cls] = {**extra, "median_speedup": statistics.median(sp) if sp else None,
                        "min_speedup": min(sp) if sp else None,
                        "all_identical": all(r["identical"] for r in rows) if temp == 0 else None,
                        "acceptance_rate": A / D if D else 0.0,
                        "mean_accepted_length": (A + Vs) / Vs if Vs else 0.0,
                        "prompts": rows}
    eng.spec = spec
    op_s, op_dev_s = _verify_op_seconds(eng, spec.k)
    op_peaked_s, op_peaked_dev_s = _verify_op_seconds(eng, spec.k, sharpness=8.0)
    step = statistics.median(plain_step) if plain_step else None
    return {"method": spec.method, "k_max": spec.k, "adaptive": spec.adaptive, "temperature": temp,
            "classes": classes, "verify_op_s": op_s, "verify_op_peaked_s": op_peaked_s,
            "verify_op_device_s": op_dev_s, "verify_op_peaked_device_s": op_peaked_dev_s,
            "plain_decode_step_s": step,
            "verify_op_frac_of_decode_step": op_s / step if step else None,
            "verify_op_device_frac_of_decode_step": op_dev_s / step if step and op_dev_s is not None else None}
