"""Runs one scheduled step on the model: builds the AttentionMetadata, runs the forward
pass over the paged KV cache and returns the logits of the rows that sample.

Device-agnostic: on CPU the CPU ops run, on CUDA the CUDA ops (same code). Per-step state
lives in the metadata object built here; the runner keeps only the KV cache and, for
decode steps, static buffers per batch-size bucket:

Decode graphs: a step whose requests all decode one token, with batch B <= the largest
bucket, is padded to the smallest bucket >= B (padding rows write no KV: slot -1, and
attend to one cached token of block 0, their logits are dropped) and run on the bucket's
static input buffers. On CUDA that forward pass is captured once per bucket in a CUDA graph
and each step only copies its inputs in and replays it; elsewhere (mode "static") the same
padded path runs eagerly, so the padding logic is tested without a GPU.
"""
from __future__ import annotations

import torch

from decodekit import ops
from decodekit.models import AttentionMetadata, LlamaModel

from .scheduler import SchedulerOutput

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def copy_kv_blocks(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int]]) -> None:
    """Copy-on-write of forked blocks: (src, dst) pairs, every layer's K and V of one pool, one op call."""
    if not pairs:
        return
    driver = getattr(kv_caches, "tp_driver", None)  # tensor parallel: the workers copy theirs too
    if driver is not None:
        driver.copy_kv_blocks(kv_caches, pairs)
    mapping = torch.tensor(pairs, dtype=torch.int64).to(kv_caches[0][0].device, non_blocking=True)
    ops.copy_blocks([k for k, _ in kv_caches], [v for _, v in kv_caches], mapping)


class _DecodeBucket:
    """Static inputs (and on CUDA a captured graph) for decode batches of up to `size` rows."""

    def __init__(self, runner: "ModelRunner", size: int, capture: bool):
        dev, mb = runner.device, runner.max_blocks_per_seq
        self.size = size
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=dev)
        self.md = AttentionMetadata(
            positions=torch.zeros(size, dtype=torch.int64, device=dev),
            slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=dev),
            block_tables=torch.zeros(size, mb, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(size, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
            logits_indices=torch.arange(size, dtype=torch.int64, device=dev))
        self.graph = None
        self.logits = None
        self.runner = runner
        if capture:
            self._capture()

    def _forward(self) -> torch.Tensor:
        return self.runner.model.forward(self.input_ids, self.md, self.runner.kv_caches)

    def _capture(self) -> None:
        s = torch.cuda.Stream(self.input_ids.device)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up outside the graph (allocations, lazy init)
                self._forward()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.runner.graph_pool):
            self.logits = self._forward()
        self.runner.graph_pool = self.graph.pool()

    def run(self, ids, positions, slots, tables, seq_lens) -> torch.Tensor:
        B = ids.shape[0]
        nb = tables.shape[1]
        md = self.md
        self.input_ids[:B].copy_(ids, non_blocking=True)
        md.positions[:B].copy_(positions, non_blocking=True)
        md.slot_mapping[:B].copy_(slots, non_blocking=True)
        md.slot_mapping[B:].fill_(-1)
        md.block_tables[:B, :nb].copy_(tables, non_blocking=True)
        md.seq_lens[:B].copy_(seq_lens, non_blocking=True)
        md.seq_lens[B:].fill_(1)
        if self.graph is not None:
            self.graph.replay()
            return self.logits[:B]
        return self._forward()[:B]


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, max_model_len: int | None = None,
                 decode_graphs: str = "off", max_batch: int = 256):
        """decode_graphs: "off" (always eager, variable shapes), "static" (padded static
        buffers, eager), "cuda" (padded static buffers captured in CUDA graphs)."""
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)
        self.max_blocks_per_seq = -(-(max_model_len or model.config.max_position_embeddings) // block_size)
        self.graph_pool = None
        self.buckets: list[_DecodeBucket] = []
        if decode_graphs not in ("off", "static", "cuda"):
            raise ValueError(f"decode_graphs must be off, static or cuda; got {decode_graphs!r}")
        if decode_graphs != "off":
            sizes = [b for b in GRAPH_BATCH_SIZES if b <= max_batch]
            if not sizes or sizes[-1] < max_batch:
                sizes.append(max_batch)
            # largest first, so the smaller graphs reuse the largest one's memory pool
            for b in sorted(sizes, reverse=True):
                self.buckets.append(_DecodeBucket(self, b, capture=decode_graphs == "cuda"))
            self.buckets.sort(key=lambda b: b.size)

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def prepare(self, so: SchedulerOutput) -> tuple[torch.Tensor, AttentionMetadata]:
        """input_ids [T] and the step's metadata from the scheduled requests."""
        return self.prepare_seqs(*self._seqs_of(so))

    def prepare_seqs(self, token_lists: list[list[int]], starts: list[int], tables: list[list[int]],
                     num_logits: list[int]) -> tuple[torch.Tensor, AttentionMetadata]:
        """input_ids [T] and metadata for sequences given directly (drafters use this): sequence i
        computes token_lists[i] at positions starts[i].. with block table tables[i] and needs the
        logits of its last num_logits[i] tokens."""
        ids, positions, slots, bt, seq_lens, qsl, sample_rows = self._host_inputs(token_lists, starts, tables,
                                                                                  num_logits)
        host = AttentionMetadata(positions=positions, slot_mapping=slots, block_tables=bt, seq_lens=seq_lens,
                                 query_start_loc=qsl.to(torch.int32),
                                 logits_indices=torch.tensor(sample_rows, dtype=torch.int64))
        if self.device.type != "cuda":
            return ids, host
        dev_ids = self._to_dev(ids)
        md = AttentionMetadata(
            positions=self._to_dev(positions), slot_mapping=self._to_dev(slots), block_tables=self._to_dev(bt),
            seq_lens=self._to_dev(seq_lens), query_start_loc=self._to_dev(host.query_start_loc),
            logits_indices=self._to_dev(host.logits_indices), host=(dev_ids, ids, host))
        return dev_ids, md

    @staticmethod
    def _seqs_of(so: SchedulerOutput):
        """(token lists, start positions, block tables, logits rows per sequence) of a step: a
        sampling request needs its last token's logits, a verifying one also each draft's."""
        sc = so.scheduled
        return ([sr.token_ids for sr in sc], [sr.start_pos for sr in sc], [sr.block_ids for sr in sc],
                [1 + sr.num_spec if sr.will_sample else 0 for sr in sc])

    def _host_inputs(self, token_lists, starts, tables, num_logits):
        """Host tensors: ids [T], positions [T], slots [T], block tables [S, maxb] int32,
        seq_lens [S] int32, query_start_loc [S + 1] int64, rows whose logits are needed."""
        bs = self.block_size
        ids: list[int] = [t for toks in token_lists for t in toks]
        counts = [len(toks) for toks in token_lists]
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
        slots = bt[seq_of_tok, positions // bs].long() * bs + positions % bs
        sample_rows, end = [], 0
        for c, n in zip(counts, num_logits):   # the last n tokens of each sequence
            end += c
            sample_rows.extend(range(end - n, end))
        seq_lens = (starts_t + counts_t).to(torch.int32)
        return torch.tensor(ids, dtype=torch.int64), positions, slots, bt, seq_lens, qsl, sample_rows

    def _bucket_for(self, so: SchedulerOutput) -> _DecodeBucket | None:
        if not self.buckets or not all(sr.num_new_tokens == 1 and sr.will_sample for sr in so.scheduled):
            return None
        B = len(so.scheduled)
        return next((b for b in self.buckets if b.size >= B), None)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        copy_kv_blocks(self.kv_caches, pairs)

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> torch.Tensor:
        """Logits [num sampling rows, vocab] float32, in scheduling order: one row per sampling
        request, 1 + num_spec rows (last token, then each draft) for a verifying one."""
        self.copy_blocks(so.blocks_to_copy)
        bucket = self._bucket_for(so)
        if bucket is not None:
            ids, positions, slots, bt, seq_lens, _, _ = self._host_inputs(*self._seqs_of(so))
            return bucket.run(*(self._to_dev(t) for t in (ids, positions, slots, bt, seq_lens)))
        input_ids, md = self.prepare(so)
        return self.model.forward(input_ids, md, self.kv_caches)
