"""Runs one scheduled step on the model: builds the AttentionMetadata, runs the forward
pass over the paged KV cache and returns the logits of the rows that sample.

Device-agnostic: on CPU the CPU ops run, on CUDA the CUDA ops (same code). Per-step state
lives in the metadata object built here; the runner keeps only the KV cache.
"""
from __future__ import annotations

import torch

from decodekit.models import AttentionMetadata, LlamaModel

from .scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int):
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)

    def prepare(self, so: SchedulerOutput) -> tuple[torch.Tensor, AttentionMetadata]:
        """input_ids [T] and the step's metadata from the scheduled requests."""
        bs = self.block_size
        ids: list[int] = []
        starts, counts, tables, sample_rows = [], [], [], []
        for sr in so.scheduled:
            n = sr.num_new_tokens
            ids += sr.token_ids
            starts.append(sr.start_pos)
            counts.append(n)
            tables.append(sr.block_ids)
        S = len(counts)
        maxb = max(len(t) for t in tables)
        bt = torch.zeros(S, maxb, dtype=torch.int32)
        for i, t in enumerate(tables):
            bt[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
        counts_t = torch.tensor(counts, dtype=torch.int64)
        starts_t = torch.tensor(starts, dtype=torch.int64)
        qsl = torch.zeros(S + 1, dtype=torch.int64)
        qsl[1:] = counts_t.cumsum(0)
        T = int(qsl[-1])
        seq_of_tok = torch.repeat_interleave(torch.arange(S), counts_t)           # [T]
        positions = starts_t[seq_of_tok] + (torch.arange(T) - qsl[:-1][seq_of_tok])
        block_of_tok = bt[seq_of_tok, positions // bs].long()
        slots = block_of_tok * bs + positions % bs
        for i, sr in enumerate(so.scheduled):
            if sr.will_sample:
                sample_rows.append(int(qsl[i + 1]) - 1)
        dev = self.device
        md = AttentionMetadata(
            positions=positions.to(dev), slot_mapping=slots.to(dev), block_tables=bt.to(dev),
            seq_lens=(starts_t + counts_t).to(torch.int32).to(dev), query_start_loc=qsl.to(torch.int32).to(dev),
            logits_indices=torch.tensor(sample_rows, dtype=torch.int64).to(dev))
        return torch.tensor(ids, dtype=torch.int64).to(dev), md

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> torch.Tensor:
        """Logits [num sampling requests, vocab] float32, in scheduling order."""
        self.copy_blocks(so.blocks_to_copy)
        input_ids, md = self.prepare(so)
        return self.model.forward(input_ids, md, self.kv_caches)
