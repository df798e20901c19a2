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

Tensor parallelism: the driver's model is a TPDriverModel. Each bucket is then built on every rank
(the driver sends ("bucket", ...) first, so all ranks warm up and capture in lockstep: the
collectives inside the captured forward pass meet), and a bucketed step sends ("bucket_run", ...)
with the step's host inputs before replaying the driver's own graph over its local shard.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
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


@dataclass
class BucketHost:
    """What decode buckets run on: one rank's model (the local shard under tensor parallelism), its KV
    caches, their device, the block-table width, and the CUDA graph memory pool its buckets share."""
    model: object
    kv_caches: list
    device: torch.device
    max_blocks_per_seq: int
    graph_pool: object = None


class DecodeBucket:
    """Static inputs (and on CUDA a captured graph) for decode batches of up to `size` rows."""

    def __init__(self, host: BucketHost, size: int, capture: bool, batch_invariant: bool = False):
        dev, mb = host.device, host.max_blocks_per_seq
        self.size = size
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=dev)
        self.md = AttentionMetadata(
            positions=torch.zeros(size, dtype=torch.int64, device=dev),
            slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=dev),
            block_tables=torch.zeros(size, mb, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(size, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
            logits_indices=torch.arange(size, dtype=torch.int64, device=dev),
            decode_rows=size if batch_invariant else -1)   # every row a decode row
        self.graph = None
        self.logits = None
        self.host = host
        if capture:
            self._capture()

    def _forward(self) -> torch.Tensor | None:  # logits [size, vocab] (None on a tensor-parallel worker)
        return self.host.model.forward(self.input_ids, self.md, self.host.kv_caches)

    def _capture(self) -> None:
        s = torch.cuda.Stream(self.input_ids.device)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up outside the graph (allocations, lazy init)
                self._forward()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.host.graph_pool):
            self.logits = self._forward()
        self.host.graph_pool = self.graph.pool()

    def run(self, ids: torch.Tensor,        # [B] int64, B <= size
            positions: torch.Tensor,        # [B] int64
            slots: torch.Tensor,            # [B] int64
            tables: torch.Tensor,           # [B, nb] int32, nb <= max_blocks_per_seq
            seq_lens: torch.Tensor          # [B] int32
            ) -> torch.Tensor | None:       # logits [B, vocab] fp32 (None on a tensor-parallel worker)
        B = ids.shape[0]
        nb = tables.shape[1]
        md = self.md
        self.input_ids[:B].copy_(ids, non_blocking=True)
        md.positions[:B].copy_(positions, non_blocking=True)
        md.slot_mapping[:B].copy_(slots, non_blocking=True)
        md.slot_mapping[B:].fill_(-1)
        md.block_tables[:B, :nb].copy_(tables, non_blocking=True)
        # padding rows read one key of block 0: a row a larger batch used keeps that sequence's table, whose
        # leading entries may be RELEASED (-1, a sliding window's), outside the cache
        md.block_tables[B:, 0].fill_(0)
        md.seq_lens[:B].copy_(seq_lens, non_blocking=True)
        md.seq_lens[B:].fill_(1)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._forward()
        return None if logits is None else logits[:B]


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, max_model_len: int | None = None,
                 decode_graphs: str = "off", max_batch: int = 256, batch_invariant: bool = False):
        """decode_graphs: "off" (always eager, variable shapes), "static" (padded static
        buffers, eager), "cuda" (padded static buffers captured in CUDA graphs). batch_invariant (CPU): each
        step marks its decode-phase rows (AttentionMetadata.decode_rows), so every row's bits are those it
        gets in any batch."""
        self.model = model
        self.batch_invariant = batch_invariant
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)
        self.max_blocks_per_seq = -(-(max_model_len or model.config.context_limit) // block_size)
        self.tp_driver = getattr(self.kv_caches, "tp_driver", None)  # TPDriverModel under tensor parallelism
        self.buckets: list[DecodeBucket] = []
        if decode_graphs not in ("off", "static", "cuda"):
            raise ValueError(f"decode_graphs must be off, static or cuda; got {decode_graphs!r}")
        if decode_graphs != "off":
            local = self.tp_driver.local_model if self.tp_driver is not None else model
            host = BucketHost(local, self.kv_caches, self.device, self.max_blocks_per_seq)
            sizes = [b for b in GRAPH_BATCH_SIZES if b <= max_batch]
            if not sizes or sizes[-1] < max_batch:
                sizes.append(max_batch)
            # largest first, so the smaller graphs reuse the largest one's memory pool
            for b in sorted(sizes, reverse=True):
                capture = decode_graphs == "cuda"
                if self.tp_driver is not None:  # every worker builds (and captures) the same bucket with it
                    self.buckets.append(self.tp_driver.build_decode_bucket(self.kv_caches, host, b, capture))
                else:
                    self.buckets.append(DecodeBucket(host, b, capture, batch_invariant))
            self.buckets.sort(key=lambda b: b.size)

    def _to_dev(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def prepare(self, so: SchedulerOutput) -> tuple[torch.Tensor, AttentionMetadata]:
        """input_ids [T] and the step's metadata from the scheduled requests."""
        toks, starts, tables, logits, rope_long = self._seqs_of(so)
        ids, md = self.prepare_seqs(toks, starts, tables, logits, [sr.num_prompt_logits for sr in so.scheduled],
                                    rope_long)
        if self.batch_invariant:  # the leading decode-phase requests' tokens (the scheduler puts them first)
            md.decode_rows = sum(sr.num_new_tokens for sr in itertools.takewhile(lambda sr: sr.is_decode,
                                                                                  so.scheduled))
        return ids, md

    def prepare_seqs(self, token_lists: list[list[int]], starts: list[int], tables: list[list[int]],
                     num_logits: list[int], num_first: list[int] | None = None, rope_long: list[bool] | None = None,
                     model=None) -> tuple[torch.Tensor, AttentionMetadata]:
        """input_ids [T] and metadata for sequences given directly (drafters use this): sequence i
        computes token_lists[i] at positions starts[i].. with block table tables[i] and needs the
        logits of its first num_first[i] tokens (prompt logprobs) and of its last num_logits[i];
        rope_long[i]: its Request.rope_long (LongRoPE rows of `model`, default the runner's)."""
        ids, positions, slots, bt, seq_lens, qsl, sample_rows = self._host_inputs(
            token_lists, starts, tables, num_logits, num_first, rope_long, model)
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
        """(token lists, start positions, block tables, logits rows per sequence, rope_long flags) of a step: a
        sampling request needs its last token's logits, a verifying one also each draft's."""
        sc = so.scheduled
        return ([sr.token_ids for sr in sc], [sr.start_pos for sr in sc], [sr.block_ids for sr in sc],
                [1 + sr.num_spec if sr.will_sample else 0 for sr in sc], [sr.request.rope_long for sr in sc])

    def _host_inputs(self, token_lists, starts, tables, num_logits, num_first=None, rope_long=None, model=None):
        """Host tensors: ids [T], positions [T] (rope rows: + the model's rope_row_offset for the sequences
        with rope_long), slots [T], block tables [S, maxb] int32,
        seq_lens [S] int32, query_start_loc [S + 1] int64, rows whose logits are needed (per sequence
        its first num_first, then its last num_logits tokens; the two never overlap). Built with numpy
        (a few array operations whatever S: at 256 sequences a torch op per row cost ~5 ms a step)."""
        bs = self.block_size
        counts = np.fromiter((len(toks) for toks in token_lists), dtype=np.int64, count=len(token_lists))
        S = len(counts)
        ids = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(counts.sum()))
        nbs = np.fromiter((len(t) for t in tables), dtype=np.int64, count=S)
        maxb = int(nbs.max())
        bt = np.zeros((S, maxb), dtype=np.int32)
        flat = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=int(nbs.sum()))
        bt[np.repeat(np.arange(S), nbs), np.arange(flat.size) - np.repeat(np.cumsum(nbs) - nbs, nbs)] = flat
        starts_a = np.asarray(starts, dtype=np.int64).reshape(S)
        qsl = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(counts, out=qsl[1:])
        T = int(qsl[-1])
        seq_of_tok = np.repeat(np.arange(S), counts)                                # [T]
        positions = starts_a[seq_of_tok] + (np.arange(T, dtype=np.int64) - qsl[:-1][seq_of_tok])
        slots = bt[seq_of_tok, positions // bs].astype(np.int64) * bs + positions % bs
        sample_rows, end = [], 0
        for i, (c, n) in enumerate(zip(counts.tolist(), num_logits)):   # the first m and last n tokens of each
            m = num_first[i] if num_first else 0
            if m + n > c:
                raise ValueError(f"sequence {i}: {m} first and {n} last logits rows overlap in {c} tokens")
            sample_rows.extend(range(end, end + m))
            end += c
            sample_rows.extend(range(end - n, end))
        seq_lens = (starts_a + counts).astype(np.int32)
        if rope_long is not None and any(rope_long):
            offset = getattr(model if model is not None else self.model, "rope_row_offset", 0)
            positions = positions + offset * np.asarray(rope_long, dtype=np.int64)[seq_of_tok]
        return (torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(slots), torch.from_numpy(bt),
                torch.from_numpy(seq_lens), torch.from_numpy(qsl), sample_rows)

    def _bucket_for(self, so: SchedulerOutput) -> DecodeBucket | None:
        if not self.buckets or not all(sr.num_new_tokens == 1 and sr.will_sample and not sr.num_prompt_logits
                                       and (sr.is_decode or not self.batch_invariant) for sr in so.scheduled):
            return None     # (batch invariance: a one-token prompt's row is a prompt row, not a bucket's decode row)
        B = len(so.scheduled)
        return next((b for b in self.buckets if b.size >= B), None)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        copy_kv_blocks(self.kv_caches, pairs)

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> torch.Tensor:
        """Logits [rows, vocab] float32, in scheduling order: per request its num_prompt_logits prompt rows,
        then one row if it samples, 1 + num_spec rows (last token, then each draft) if it verifies."""
        self.copy_blocks(so.blocks_to_copy)
        bucket = self._bucket_for(so)
        if bucket is not None:
            toks, starts, tables, logits, rope_long = self._seqs_of(so)
            inputs = self._host_inputs(toks, starts, tables, logits, rope_long=rope_long)[:5]  # ids .. seq_lens
            if self.tp_driver is not None:
                return self.tp_driver.run_decode_bucket(self.kv_caches, bucket, inputs, self._to_dev)
            return bucket.run(*(self._to_dev(t) for t in inputs))
        input_ids, md = self.prepare(so)
        return self.model.forward(input_ids, md, self.kv_caches)
