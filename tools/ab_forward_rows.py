"""In-process A/B of one forward step of the embedded default model (SmolLM2-135M Q4_1, float32, CPU) with and
without the AMX copies of its quantized weights (DECODEKIT_CPU_AMX_ROWS, read when a LlamaModel is made): one
sequence with a 200-token context and T new tokens (T = 1: a decoding step; T = k + 1: a speculative
verification), both models called alternately so a shared machine's drift hits both alike.

Usage: python tools/ab_forward_rows.py [T ...]   (default 1 2 4 7 8)
"""
import os
import sys
import time

import torch

from decodekit.loader import load_model
from decodekit.models import AttentionMetadata, LlamaModel


def main() -> None:
    torch.set_grad_enabled(False)
    Ts = [int(x) for x in sys.argv[1:]] or [1, 2, 4, 7, 8]
    lm = load_model(None, progress=False, keep_quantized=True)
    models = {}
    for v in ("1", "0"):
        os.environ["DECODEKIT_CPU_AMX_ROWS"] = v
        models[v] = LlamaModel(lm.config, {k: w.clone() for k, w in lm.weights.items()})
    copies = {k: sum("_amx_rows" in w.__dict__ for L in m.layers for w in (L.qkv, L.o, L.gate_up, L.down))
              for k, m in models.items()}
    print(f"INT4 projections with the AMX copy: {copies}")
    bs, C = 16, 200
    nblk = C // bs + 3
    caches = {k: m.allocate_kv_cache(nblk, bs) for k, m in models.items()}

    def md(T):
        pos = torch.arange(C - T, C)
        return AttentionMetadata(positions=pos, slot_mapping=pos.clone(),
                                 block_tables=torch.arange(nblk, dtype=torch.int32)[None],
                                 seq_lens=torch.tensor([C], dtype=torch.int32),
                                 query_start_loc=torch.tensor([0, T], dtype=torch.int32), logits_indices=torch.arange(T))

    times = {(k, T): [] for k in models for T in Ts}
    for r in range(25):
        for T in Ts:
            for k, m in models.items():
                ids = torch.randint(0, lm.config.vocab_size, (T,))
                t0 = time.perf_counter()
                m.forward(ids, md(T), caches[k])
                if r >= 3:
                    times[(k, T)].append(time.perf_counter() - t0)
    for T in Ts:
        med = {k: sorted(times[(k, T)])[len(times[(k, T)]) // 2] * 1e3 for k in models}
        best = {k: min(times[(k, T)]) * 1e3 for k in models}
        print(f"T={T}: with copies median {med['1']:.2f} ms (best {best['1']:.2f}) | without {med['0']:.2f} ms "
              f"(best {best['0']:.2f}) | speed-up {med['0'] / med['1']:.2f}x")


if __name__ == "__main__":
    main()
