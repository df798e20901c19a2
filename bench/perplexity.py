"""Perplexity of weight quantizers on held-out text (teacher forcing through the engine's model).

The float baseline is a model's weights decoded to fp32 (default: the embedded SmolLM2-135M-Instruct,
whose file is Q4_1: the baseline is its exact dequantization). Each quantizer then re-quantizes
the same float projections at the same group size, so the perplexity increase over the baseline
is the quantizer's own damage:
  rtn   round to nearest (quant.quantize_rtn), asymmetric, fp16 scale + min
  gptq  GPTQ with act-order (quant.gptq_quantizer), calibrated on the start of the pydoc text
  fp8   W8A8 e4m3 (quant.fp8): per-channel weight scales, per-token activation scales
Evaluation text: the end of the pydoc topic texts (disjoint from the calibration part), in
--seqs windows of --seq-len tokens.

  PYTHONPATH=python python bench/perplexity.py [--model M] [--group 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time

import torch

from decodekit import LLM
from decodekit.quant import quantize_rtn
from decodekit.quant.fp8 import quantize_fp8_weight
from decodekit.quant.gptq_quantizer import calibration_forward, calibration_text, gptq_quantize_model


def perplexity(model, windows: list[list[int]]) -> float:
    nll, n = 0.0, 0
    for w in windows:
        logits = calibration_forward(model, [w]).double()
        lp = torch.log_softmax(logits[:-1], dim=-1)
        tgt = torch.tensor(w[1:])
        nll -= lp[torch.arange(len(w) - 1), tgt].sum().item()
        n += len(w) - 1
    return math.exp(nll / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--calib-seqs", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    llm = LLM(a.model, dtype="float32", device="cpu", weight_format="dequantized", kv_cache_memory="64MiB")
    base = llm.engine.model
    tok = llm.engine.tokenizer
    text = calibration_text()
    vocab = base.config.vocab_size
    calib_ids = [t for t in tok.encode(text[: 8 * a.calib_seqs * a.seq_len]) if t < vocab]
    calib = [calib_ids[i * a.seq_len:(i + 1) * a.seq_len] for i in range(a.calib_seqs)]
    eval_ids = [t for t in tok.encode(text[-12 * a.seqs * a.seq_len:]) if t < vocab]
    windows = [eval_ids[i * a.seq_len:(i + 1) * a.seq_len] for i in range(a.seqs)]
    assert all(len(w) == a.seq_len for w in windows + calib), "not enough text"
    res = {"model": llm.engine.model_source, "group_size": a.group, "eval_tokens": a.seqs * a.seq_len,
           "calib_tokens": a.calib_seqs * a.seq_len, "date": time.strftime("%Y-%m-%d %H:%M")}
    t = time.perf_counter()
    res["float"] = perplexity(base, windows)
    print(f"float (dequantized file): ppl {res['float']:.4f} ({time.perf_counter() - t:.0f} s)")
    for name in ("rtn", "gptq", "fp8"):
        m = copy.copy(base)
        m.layers = [copy.copy(L) for L in base.layers]
        t = time.perf_counter()
        if name in ("rtn", "fp8"):
            for L in m.layers:
                for n in ("qkv", "o", "gate_up", "down"):
                    w = getattr(L, n)
                    setattr(L, n, quantize_rtn(w, a.group) if name == "rtn" else quantize_fp8_weight(w))
        else:
            gptq_quantize_model(m, lambda: calibration_forward(m, calib), group_size=a.group, act_order=True)
        tq = time.perf_counter() - t
        p = perplexity(m, windows)
        res[name] = p
        res[name + "_quantize_s"] = tq
        print(f"{name}{'' if name == 'fp8' else f' g{a.group}'}: ppl {p:.4f} (+{100 * (p / res['float'] - 1):.2f}% over float; quantized in {tq:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
