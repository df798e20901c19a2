"""How a Llama-family model is split over tensor-parallel ranks (Megatron-style).

    q_proj / k_proj / v_proj (+ bias)  column-parallel: output rows split by attention head
    o_proj                             row-parallel: input columns split by query head
    gate_proj / up_proj                column-parallel: rows split by intermediate feature
    down_proj                          row-parallel: columns split by intermediate feature
    embed_tokens / lm_head             vocabulary-parallel: rows split in ceil(V / N) slices
    norms                              replicated

KV heads: with N <= num_kv_heads each rank holds num_kv_heads / N of them; with N > num_kv_heads
(N a multiple of it) each rank holds one, shared by N / num_kv_heads ranks (replicated: the KV cache
then stores every head N / num_kv_heads times across the ranks -- the capacity loss is reported).

A `ShardPlan` answers, per HF weight name, which slice of which dimension this rank keeps; the
loaders use it to read only that slice (GGUF through the memory map, safetensors through
get_slice), and `shard_weight` cuts an already-loaded tensor or packed weight (INT4 / INT8 / fp8).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from decodekit.config import ModelConfig


class TPConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ShardPlan:
    config: ModelConfig          # the full model's
    rank: int
    world_size: int

    def __post_init__(self):
        c, n = self.config, self.world_size
        if not isinstance(n, int) or n < 1:
            raise TPConfigError(f"tensor_parallel_size must be a positive int, got {n!r}")
        if not 0 <= self.rank < n:
            raise TPConfigError(f"tensor-parallel rank must be in [0, {n - 1}], got {self.rank}")
        if c.num_heads % n:
            raise TPConfigError(f"tensor_parallel_size {n} must divide the number of attention heads "
                                f"({c.num_heads}); allowed sizes: {_allowed_sizes(c)}")
        if n <= c.num_kv_heads:
            if c.num_kv_heads % n:
                raise TPConfigError(f"tensor_parallel_size {n} must divide the number of KV heads "
                                    f"({c.num_kv_heads}) or be a multiple of it; allowed sizes: "
                                    f"{_allowed_sizes(c)}")
        elif n % c.num_kv_heads:
            raise TPConfigError(f"tensor_parallel_size {n} exceeds the number of KV heads ({c.num_kv_heads}) "
                                f"and is not a multiple of it; allowed sizes: {_allowed_sizes(c)}")
        if c.intermediate_size % n:
            raise TPConfigError(f"tensor_parallel_size {n} must divide intermediate_size ({c.intermediate_size}); "
                                f"allowed sizes: {_allowed_sizes(c)}")

    # ---------------------------------------------------------------- local shapes
    @property
    def kv_replication(self) -> int:
        """How many ranks hold each KV head (1: no replication)."""
        return max(1, self.world_size // self.config.num_kv_heads)

    @property
    def local_config(self) -> ModelConfig:
        c, n = self.config, self.world_size
        return dataclasses.replace(c, num_heads=c.num_heads // n, num_kv_heads=max(1, c.num_kv_heads // n),
                                   intermediate_size=c.intermediate_size // n, eos_token_ids=list(c.eos_token_ids))

    @property
    def vocab_shard(self) -> int:
        return -(-self.config.vocab_size // self.world_size)

    @property
    def vocab_range(self) -> tuple[int, int]:
        v = self.vocab_shard
        return min(self.rank * v, self.config.vocab_size), min((self.rank + 1) * v, self.config.vocab_size)

    def _q_heads(self) -> tuple[int, int]:
        h = self.config.num_heads // self.world_size
        return self.rank * h, (self.rank + 1) * h

    def _kv_heads(self) -> tuple[int, int]:
        c, n = self.config, self.world_size
        if n <= c.num_kv_heads:
            h = c.num_kv_heads // n
            return self.rank * h, (self.rank + 1) * h
        k = self.rank // (n // c.num_kv_heads)
        return k, k + 1

    def selection(self, name: str) -> tuple[int, int, int] | None:
        """(dim, start, end) of `name` that this rank keeps, or None (replicated / not a split weight).
        dim 0: output rows ([out, in] layout, and 1-d biases), dim 1: input columns."""
        if self.world_size == 1:
            return None
        c, D = self.config, self.config.head_dim
        I = c.intermediate_size // self.world_size
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return (0, *self.vocab_range)
        if ".self_attn.q_proj." in name:
            a, b = self._q_heads()
            return 0, a * D, b * D
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            a, b = self._kv_heads()
            return 0, a * D, b * D
        if name.endswith(".self_attn.o_proj.weight"):
            a, b = self._q_heads()
            return 1, a * D, b * D
        if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            return 0, self.rank * I, (self.rank + 1) * I
        if name.endswith(".mlp.down_proj.weight"):
            return 1, self.rank * I, (self.rank + 1) * I
        return None

    @functools.cached_property
    def _full_shapes(self) -> dict[str, tuple[int, ...]]:
        from decodekit.loader import expected_weight_shapes
        return expected_weight_shapes(self.config)

    def full_dim(self, name: str, dim: int) -> int:
        """The whole model's size of `name` along `dim` (a bias: its weight's rows)."""
        shapes = self._full_shapes
        return (shapes[name] if name in shapes else shapes[name.rsplit(".", 1)[0] + ".weight"])[dim]

    def local_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        sel = self.selection(name)
        if sel is None:
            return tuple(shape)
        dim, a, b = sel
        s = list(shape)
        s[dim] = b - a
        return tuple(s)

    def capacity_note(self) -> str | None:
        r = self.kv_replication
        if r == 1:
            return None
        return (f"tensor_parallel_size {self.world_size} > {self.config.num_kv_heads} KV heads: each KV head is "
                f"replicated on {r} ranks, so the cluster's KV cache holds {r}x fewer tokens than "
                f"{self.world_size} unreplicated shards would")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allowed_sizes(c: ModelConfig) -> list[int]:
    return [n for n in _divisors(c.num_heads)
            if ((n <= c.num_kv_heads and c.num_kv_heads % n == 0) or (n > c.num_kv_heads and n % c.num_kv_heads == 0))
            and c.intermediate_size % n == 0]


def shard_weight(name: str, w, plan: ShardPlan):
    """The rank's slice of an already-loaded weight (a torch tensor or a packed INT4 / INT8 / fp8
    weight), as an owning copy (the full tensor can be freed). Already-local shapes pass through."""
    sel = plan.selection(name)
    if sel is None:
        return w
    dim, a, b = sel
    if w.shape[dim] == b - a and w.shape[dim] != plan.full_dim(name, dim):
        return w  # the loader already cut it
    if isinstance(w, torch.Tensor):
        return (w[a:b] if dim == 0 else w[:, a:b]).clone()
    if dim == 0:
        return w.rows(a, b).clone()
    return _packed_cols(name, w, a, b)


def _packed_cols(name: str, w, k0: int, k1: int):
    from decodekit.quant import Int4Weight, Int8Weight
    from decodekit.quant.fp8 import Fp8Weight
    if isinstance(w, Fp8Weight):  # per-output-channel scales: a column slice keeps them
        return Fp8Weight(w.qweight[:, k0:k1].contiguous(), w.scales.clone())
    G = w.group_size
    if k0 % G or k1 % G:
        raise TPConfigError(f"{name}: a tensor-parallel shard of columns [{k0}, {k1}) does not fall on the "
                            f"quantization groups of {G}; use a tensor_parallel_size whose shards are "
                            f"multiples of {G} columns, or a float checkpoint")
    if isinstance(w, Int8Weight):
        return Int8Weight(w.qweight[:, k0:k1].contiguous(), w.scales[:, k0 // G:k1 // G].contiguous(), G)
    if isinstance(w, Int4Weight):
        if w.perm is not None:
            raise TPConfigError(f"{name}: act-order (desc_act) INT4 weights cannot be split by input column; "
                                "use a checkpoint without act-order or tensor_parallel_size 1")
        return Int4Weight(w.qweight[:, k0 // 2:k1 // 2].contiguous(), w.scales[:, k0 // G:k1 // G].contiguous(),
                          w.mins[:, k0 // G:k1 // G].contiguous(), G)
    raise TypeError(f"{name}: cannot shard a {type(w).__name__}")


def shard_weights(weights: dict, plan: ShardPlan) -> None:
    """In place: every weight of the dict replaced by this rank's slice."""
    if plan.world_size == 1:
        return
    for name in list(weights):
        weights[name] = shard_weight(name, weights[name], plan)
