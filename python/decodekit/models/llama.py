"""Llama-family decoder (Llama 2/3, Mistral, Qwen2 with QKV bias, Qwen3 with q / k head norms, Phi-3 with
LongRoPE / partial rotary, SmolLM2) over a paged KV cache.

The forward pass is written against decodekit.ops only (norms, rope, silu_and_mul,
reshape_and_cache, paged_attention) plus torch linear layers, so the same code runs on
CPU and CUDA and does not care which kernel is behind each op. Per-step state arrives
in one AttentionMetadata object; nothing is kept in globals.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from decodekit import ops
from decodekit.config import CUDA_ATTENTION_HEAD_DIMS, ModelConfig, cuda_cache_head_dim
from decodekit.ops import reference
from decodekit.quant import Int4Weight, Int8Weight
from decodekit.quant.fp8 import Fp8Weight


def cache_head_dim(head_dim: int, device: torch.device) -> int:
    """The KV cache's row width for a model of head_dim on device: head_dim itself where the
    attention kernel takes it (every size on the CPU), else the next CUDA size (cuda_cache_head_dim): K, V
    and q are zero-padded to it (a zero adds nothing to q.k, a zero V column gives a zero output column
    that is dropped), e.g. Phi-3's 96 -> 128, at 4/3 the cache bytes. DECODEKIT_ATTN_PAD_HEAD_DIM=always
    pads on the CPU too (tests), =never refuses instead."""
    mode = os.environ.get("DECODEKIT_ATTN_PAD_HEAD_DIM", "auto")
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"DECODEKIT_ATTN_PAD_HEAD_DIM must be auto, always or never, got {mode!r}")
    if mode == "never" or (device.type != "cuda" and mode == "auto"):
        return head_dim
    padded = cuda_cache_head_dim(head_dim)
    if padded is None:
        raise ValueError(f"head_dim {head_dim} is larger than the CUDA attention kernels take "
                         f"(at most {CUDA_ATTENTION_HEAD_DIMS[-1]})")
    return padded


@dataclass
class AttentionMetadata:
    """Everything one forward step needs to address the paged KV cache."""
    positions: torch.Tensor        # [T] int64, rope table row of each new token: its position (LongRoPE: + the
                                   # model's rope_row_offset for a sequence on the long factors; ModelRunner)
    slot_mapping: torch.Tensor     # [T] int64, cache slot of each new token (< 0: padding)
    block_tables: torch.Tensor     # [S, max_blocks] int32, per-sequence block ids
    seq_lens: torch.Tensor         # [S] int32, context length incl. this step's tokens
    query_start_loc: torch.Tensor  # [S + 1] int32, cumulative new-token counts
    logits_indices: torch.Tensor   # [N] int64, rows of the T tokens whose logits are needed
    # Batch invariance (CPU; EngineArgs.batch_invariant): the first decode_rows of the T tokens are decode-phase rows
    # (every projection gives them their one-row bits, the others run in one block of >= 17 rows: ops.linear), and the
    # LM head runs its N rows as decode rows; -1: off (each projection's rows by their count).
    decode_rows: int = -1
    # CUDA (ModelRunner.prepare_seqs): (input_ids on the device, input_ids [T] on the host, this metadata's host
    # tensors) -- what it was copied from, so tensor parallelism broadcasts them without a copy back; else None.
    host: tuple | None = field(default=None, repr=False, compare=False)


@dataclass
class LayerWeights:
    qkv: torch.Tensor                # [q_size + 2 * kv_size, hidden]
    qkv_bias: torch.Tensor | None    # [q_size + 2 * kv_size]
    o: torch.Tensor                  # [hidden, q_size]
    gate_up: torch.Tensor            # [2 * intermediate, hidden]
    down: torch.Tensor               # [hidden, intermediate]
    input_norm: torch.Tensor         # [hidden]
    post_norm: torch.Tensor          # [hidden]
    q_norm: torch.Tensor | None = None   # [head_dim] Qwen3: RMSNorm weight of every query head (before RoPE)
    k_norm: torch.Tensor | None = None   # [head_dim] and of every key head


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", tp=None, plan=None,
                 max_model_len: int | None = None):
        """tp, plan: tensor parallelism (decodekit.distributed): this rank's TPGroup and ShardPlan;
        `weights` then holds this rank's slices (or whole tensors, cut here) and the model runs this
        rank's heads / features / vocabulary slice, meeting the other ranks in AllReduces.
        max_model_len: the engine's context length (default: the model's context_limit): the rope table's
        rows. LongRoPE (Phi-3): see rope_long_for."""
        self.full_config = config
        self.tp, self.plan = (tp, plan) if tp is not None and tp.world_size > 1 else (None, None)
        if self.plan is not None:
            from decodekit.distributed.sharding import shard_weights
            shard_weights(weights, self.plan)
            config = self.plan.local_config
        self.config = c = config   # this rank's heads, KV heads and MLP features
        self.dtype, self.device = dtype, torch.device(device)

        def take(name: str):
            if name not in weights:
                raise KeyError(f"checkpoint is missing tensor {name!r}")
            w = weights.pop(name)
            if isinstance(w, (Int4Weight, Int8Weight, Fp8Weight)):  # packed stays packed (ops decode it)
                return w.to(self.device)
            return w.to(device=self.device, dtype=dtype).contiguous()

        def cat_rows(parts):  # fused projections: rows stacked, packed if every part is
            if all(isinstance(p, Fp8Weight) for p in parts):
                return Fp8Weight.cat(parts)
            if (all(isinstance(p, Int4Weight) for p in parts) and len({p.group_size for p in parts}) == 1
                    and Int4Weight.same_perm(parts)):
                return Int4Weight.cat(parts)
            if all(isinstance(p, Int8Weight) for p in parts) and len({p.group_size for p in parts}) == 1:
                return Int8Weight.cat(parts)  # GGUF Q8_0 projections
            return torch.cat([ops.int4_dequantize(p, dtype) if isinstance(p, Int4Weight) else
                              ops.int8_dequantize(p, dtype) if isinstance(p, Int8Weight) else
                              p.dequantize(dtype) if isinstance(p, Fp8Weight) else p for p in parts], 0)

        self.embed = take("model.embed_tokens.weight")  # [vocab, hidden]
        self.layers: list[LayerWeights] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            qkv = cat_rows([take(p + "self_attn.q_proj.weight"), take(p + "self_attn.k_proj.weight"),
                            take(p + "self_attn.v_proj.weight")])
            bias = None
            if c.attention_bias:
                bias = torch.cat([take(p + "self_attn.q_proj.bias"), take(p + "self_attn.k_proj.bias"),
                                  take(p + "self_attn.v_proj.bias")], 0)
            self.layers.append(LayerWeights(
                qkv=qkv, qkv_bias=bias, o=take(p + "self_attn.o_proj.weight"),
                gate_up=cat_rows([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
                down=take(p + "mlp.down_proj.weight"),
                input_norm=take(p + "input_layernorm.weight"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                q_norm=take(p + "self_attn.q_norm.weight") if c.qk_norm else None,
                k_norm=take(p + "self_attn.k_norm.weight") if c.qk_norm else None))
        self.norm = take("model.norm.weight")
        if "lm_head.weight" in weights and not c.tie_word_embeddings:
            self.lm_head = take("lm_head.weight")
        else:
            weights.pop("lm_head.weight", None)
            self.lm_head = self.embed
        # decoder_layers (one op call for all the layers, each a decoder_layer) where every projection is packed
        # INT4 / INT8 or dense, on the CPU: ~10 op calls per layer from Python cost more than a 135M model's kernels
        # take to read the layer there (and one decoder_layer call per layer ~6 us of argument conversion each).
        # fp8 and act-order INT4 projections keep the op-by-op path, and so does CUDA (its decode steps replay CUDA
        # graphs).
        # DECODEKIT_FUSED_LAYERS=0 turns it off (A/B measurements).
        self.op_by_op = False  # True: forward issues every op from Python (callers that hook ops.linear)
        self.cache_head_dim = cache_head_dim(c.head_dim, self.device)  # > head_dim: padded (see there)
        self.refresh_fused_layers()
        rows = max(c.max_position_embeddings, max_model_len or c.context_limit)
        self.cos_sin_cache = reference.rope_cos_sin_cache(      # [rows (x 2: LongRoPE), rotary_dim]
            rows, c.rotary_dim, c.rope_theta, c.rope_scaling).to(self.device)
        # LongRoPE: a sequence longer than the original context reads its rope rows rope_row_offset further
        # (the long factors at every position: see rope_cos_sin_cache, rope_long_for); 0: one set of rows
        self.rope_row_offset = rows if reference.is_longrope(c.rope_scaling) else 0
        self.rope_original = int(c.rope_scaling["original_max_position_embeddings"]) if self.rope_row_offset else 0
        self.scale = c.head_dim ** -0.5
        self.layer_windows = [c.layer_window(i) for i in range(c.num_layers)]  # paged_attention's sliding_window
        self.kv_observer = None  # calibrate_kv_scales: called with (layer, k, v) before the cache write
        self.set_kv_cache_dtype(dtype)

    def refresh_fused_layers(self) -> None:
        """(Re)reads decoder_layer's operands from self.layers: after construction and whenever a
        caller replaces a layer's weights (the GPTQ quantizer)."""
        self.prepare_packed_gemms()  # first: the fused layers' operands include the CPU's copies
        self.layer_operands = [self._layer_operands(L) for L in self.layers]
        self.fused_layers = (self.device.type == "cpu" and os.environ.get("DECODEKIT_FUSED_LAYERS", "1") != "0"
                             and self.cache_head_dim == self.config.head_dim  # decoder_layer: unpadded rows
                             and all(o is not None for o in self.layer_operands))
        self._stack_args = {}  # decoder_layers' per-layer lists by layer count (_layer_stack)

    def prepare_packed_gemms(self) -> None:
        """Each packed INT4 projection's second copy for the kernel that reads it, made now, before the engine
        profiles memory and captures CUDA graphs, rather than on a first decode step: on CUDA with fp16 / bf16
        activations the Marlin-style kernel's (decodekit.ops.prepare_marlin: then all that is held of the weight,
        DECODEKIT_INT4_MARLIN=auto; under TP of the column-parallel ones); on a CPU with AMX-INT8 the few-row
        AMX kernels' (any float dtype; decodekit.ops.prepare_amx_rows, for the INT4 / INT8
        projections and an INT8 LM head: every row count then computes a row with the same bits; the copy is then
        all that is held of the weight, PackedWeight.copy_only: one copy in memory, not two)."""
        if (self.device.type == "cpu" and self.dtype in (torch.float32, torch.float16, torch.bfloat16)
                and self.tp is None and ops.int4_amx_rows_available()):
            for L in self.layers:
                for w in (L.qkv, L.o, L.gate_up, L.down):
                    if isinstance(w, (Int4Weight, Int8Weight)):
                        ops.prepare_amx_rows(w, drop_stored=True)
            if isinstance(self.lm_head, Int8Weight):
                ops.prepare_amx_rows(self.lm_head, drop_stored=True)
            ops.release_freed_host_memory()
            return
        mode = ops._marlin_mode()
        if (self.device.type != "cuda" or self.dtype not in (torch.float16, torch.bfloat16)
                or mode not in ("auto", "both")):
            return
        # "auto": the copy alone (under TP the column-parallel qkv / gate_up only: the row-parallel o / down go
        # through gemm_allreduce or column chunks, which read int4.h's layout)
        drop = mode == "auto"
        self.hold_marlin_copies(drop, columns_only=self.tp is not None)
        if drop:
            torch.cuda.empty_cache()  # the freed int4.h tensors: the engine's memory profile sees them free

    def hold_marlin_copies(self, drop_stored: bool, columns_only: bool = False) -> None:
        """Each packed INT4 projection's copy for the CUDA Marlin-style kernel in the model's dtype (fp16 / bf16;
        decodekit.ops.prepare_marlin), with drop_stored all that is held of it (columns_only: of qkv / gate_up
        alone); then call refresh_fused_layers."""
        for L in self.layers:
            for w, row_parallel in ((L.qkv, False), (L.o, True), (L.gate_up, False), (L.down, True)):
                if isinstance(w, Int4Weight):
                    drop = drop_stored and w.shape[0] <= ops.MARLIN_MAX_N and not (columns_only and row_parallel)
                    ops.prepare_marlin(w, self.dtype, drop_stored=drop)

    @staticmethod
    def _layer_operands(L: LayerWeights):
        """decoder_layer's operands for a layer: (qkv, o, gate_up, down, group sizes), None unless
        all four projections are packed INT4 (not act-order), INT8 or dense."""
        parts = [ops.projection_operands(w) for w in (L.qkv, L.o, L.gate_up, L.down)]
        if any(p is None for p in parts):
            return None
        return (*[p[0] for p in parts], [p[1] for p in parts])

    # KV cache: per layer a (key, value) pair of [num_blocks, num_kv_heads, block_size, head_dim].
    def set_kv_cache_dtype(self, kv_dtype: torch.dtype,
                           kv_scales: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """The KV cache's element type: the model's dtype, or float8_e4m3fn, which stores x / scale
        with per-layer, per-KV-head scales (k_scale, v_scale: [num_kv_heads] float32 each; from
        calibrate_kv_scales, or 1 when not given), or for a float32 model on the CPU bfloat16 / float16
        (the attention kernels read the 16-bit cache under fp32 queries)."""
        if not ops.kv_cache_dtype_ok(self.dtype, kv_dtype, self.device):
            raise ValueError(f"kv cache dtype must be the model's {self.dtype} or float8_e4m3fn (or, for a float32 "
                             f"model on the CPU, bfloat16 / float16), got {kv_dtype}")
        self.kv_dtype = kv_dtype
        if kv_dtype != torch.float8_e4m3fn:
            self.kv_scales = [(None, None)] * self.config.num_layers
            return
        if kv_scales is None:
            one = torch.ones(1, device=self.device)
            kv_scales = [(one, one)] * self.config.num_layers
        if len(kv_scales) != self.config.num_layers:
            raise ValueError(f"kv_scales: need one (k_scale, v_scale) pair per layer ({self.config.num_layers})")
        self.kv_scales = [(k.float().to(self.device).contiguous(), v.float().to(self.device).contiguous())
                          for k, v in kv_scales]

    @torch.inference_mode()
    def calibrate_kv_scales(self, run_forward, margin: float = 2.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer, per-KV-head fp8 scales from one forward pass: run_forward() runs the model
        (with a full-precision KV cache) on calibration tokens while this records the largest
        |K| (after RoPE, as cached) and |V| of every head; scale = margin * amax / 448, so
        values up to `margin` times the calibration maximum stay unsaturated and the normal
        fp8 range reaches down to ~amax * 7e-5."""
        self.begin_kv_calibration()
        try:
            run_forward()
        finally:
            scales = self.end_kv_calibration(margin)
        return scales

    def begin_kv_calibration(self) -> None:
        """calibrate_kv_scales in two halves (tensor-parallel workers run the forward in between)."""
        amax: list[list[torch.Tensor]] = [[] for _ in range(self.config.num_layers)]

        def observe(i: int, k: torch.Tensor, v: torch.Tensor) -> None:  # k, v: [T, Hk, D]
            amax[i] = [k.detach().abs().amax(dim=(0, 2)).float(), v.detach().abs().amax(dim=(0, 2)).float()]

        self._kv_amax = amax
        self.kv_observer = observe

    def end_kv_calibration(self, margin: float = 2.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        amax, self._kv_amax, self.kv_observer = self._kv_amax, None, None
        tiny = torch.finfo(torch.float32).tiny * 448
        return [tuple((a.clamp_min(tiny) * margin / 448.0) for a in pair) for pair in amax]

    def kv_cache_block_bytes(self, block_size: int, kv_dtype: torch.dtype | None = None) -> int:
        c = self.config
        elt = torch.empty((), dtype=kv_dtype or self.kv_dtype).element_size()
        return 2 * c.num_layers * c.num_kv_heads * block_size * self.cache_head_dim * elt

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        shape = (num_blocks, c.num_kv_heads, block_size, self.cache_head_dim)
        return [(torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                 torch.zeros(shape, dtype=self.kv_dtype, device=self.device)) for _ in range(c.num_layers)]

    def _fused_forward(self, h: torch.Tensor,           # [T, hidden]: the first layer's normed input
                       residual: torch.Tensor,              # [T, hidden], updated in place
                       md: AttentionMetadata, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                       layers: list[LayerWeights]) -> torch.Tensor:  # the last layer's MLP output [T, hidden]
        """The layers through decoder_layers (each a decoder_layer): the same op sequence as forward's loop, one call
        for them all."""
        c = self.config
        T, n = h.shape[0], len(layers)
        if n == 0:  # (forward(num_layers=0): the norm and LM head alone)
            return h
        intermediate = self.layer_operands[0][2][0].shape[0] // 2
        ws = torch.empty(ops.decoder_layer_workspace_numel(T, c.q_size, c.kv_size, intermediate),
                         dtype=h.dtype, device=h.device)
        out = torch.empty_like(h)
        weights, counts, group_sizes = self._layer_stack(n)  # (norms, biases: read per call, as the op-by-op loop)
        ops.decoder_layers(out, h, residual, ws, [kv[0] for kv in kv_caches[:n]], [kv[1] for kv in kv_caches[:n]],
                           weights, counts, [L.qkv_bias for L in layers], group_sizes, [L.input_norm for L in layers],
                           [L.post_norm for L in layers], False, c.rms_norm_eps, md.positions, self.cos_sin_cache,
                           True, md.slot_mapping, md.block_tables, md.seq_lens, md.query_start_loc, c.num_heads,
                           c.num_kv_heads, c.head_dim, self.scale, [s[0] for s in self.kv_scales[:n]],
                           [s[1] for s in self.kv_scales[:n]], self.layer_windows[:n], [L.q_norm for L in layers],
                           [L.k_norm for L in layers], md.decode_rows)
        return out

    def _layer_stack(self, n: int) -> tuple[list[torch.Tensor], list[int], list[int]]:
        """decoder_layers' weight lists for the first n layers from layer_operands (built once per count;
        refresh_fused_layers drops them): the operands flat, their counts, the group sizes."""
        got = self._stack_args.get(n)
        if got is None:
            weights, counts, group_sizes = [], [], []
            for qkv, o, gate_up, down, gs in self.layer_operands[:n]:
                for w in (qkv, o, gate_up, down):
                    weights += w
                    counts.append(len(w))
                group_sizes += gs
            got = self._stack_args[n] = (weights, counts, group_sizes)
        return got

    def rope_long_for(self, num_tokens: int) -> bool:
        """LongRoPE: whether a sequence of num_tokens tokens runs on the long rows (rope_row_offset): it is
        longer than the original context, so every position takes the long factors (transformers' rule for
        a forward; Phi-3's generate recomputes the cache when a sequence grows past it, and so does the
        scheduler: SchedulerConfig.rope_switch_len, Request.rope_long)."""
        return bool(self.rope_row_offset) and num_tokens > self.rope_original

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor,           # [T] int64
                md: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                num_layers: int | None = None) -> torch.Tensor | None:  # logits [N, vocab] fp32
        """num_layers: run only the first num_layers layers, then the final norm and LM head
        (layer-skip self-drafting; their KV goes to the same caches). Tensor-parallel workers
        return None (rank 0 gathers the logits)."""
        c = self.config
        T = input_ids.shape[0]
        q_size, kv_size, D = c.q_size, c.kv_size, c.head_dim
        Dc = self.cache_head_dim
        eps = c.rms_norm_eps
        tp = self.tp
        if tp is not None:  # vocabulary-parallel: ids outside this rank's slice look up row 0, zeroed
            v0, v1 = self.plan.vocab_range
            outside = (input_ids < v0) | (input_ids >= v1)
            input_ids = (input_ids - v0).masked_fill_(outside, 0)
        if isinstance(self.embed, Int8Weight):  # a packed Q8_0 table: the rows decoded on lookup
            residual = ops.int8_embedding(input_ids, self.embed, self.dtype)
        else:
            residual = F.embedding(input_ids, self.embed)  # [T, hidden], a fresh tensor (updated in place)
        if tp is not None:
            residual.masked_fill_(outside[:, None], 0)
            tp.all_reduce(residual)
        h = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        layers = self.layers[:num_layers]
        dr = md.decode_rows
        if self.fused_layers and tp is None and self.kv_observer is None and not self.op_by_op:
            h = self._fused_forward(h, residual, md, kv_caches, layers)
            layers = []  # done
        for i, L in enumerate(layers):
            if i > 0 and tp is None:  # (tensor parallel: done by the previous layer's down projection)
                ops.fused_add_rms_norm(h, residual, L.input_norm, eps)
            # attention
            qkv = ops.linear(h, L.qkv, L.qkv_bias, decode_rows=dr)  # [T, q + 2 kv]
            q = qkv[:, :q_size]
            k = qkv[:, q_size:q_size + kv_size]
            v = qkv[:, q_size + kv_size:]
            if L.q_norm is not None:    # Qwen3: each head RMS-normed on its own (fresh [T, q] / [T, kv] tensors)
                q = ops.rms_norm(q.reshape(-1, D), L.q_norm, eps).view(T, -1)
                k = ops.rms_norm(k.reshape(-1, D), L.k_norm, eps).view(T, -1)
            ops.rotary_embedding(md.positions, q, k, self.cos_sin_cache, D, True)
            kc, vc = kv_caches[i]
            ks, vs = self.kv_scales[i]
            if self.kv_observer is not None:
                self.kv_observer(i, k.view(T, c.num_kv_heads, D), v.view(T, c.num_kv_heads, D))
            kh, vh, qh = k.view(T, c.num_kv_heads, D), v.view(T, c.num_kv_heads, D), q.view(T, c.num_heads, D)
            if Dc != D:  # zero-padded rows for a head_dim the attention kernel lacks (cache_head_dim)
                kh, vh, qh = F.pad(kh, (0, Dc - D)), F.pad(vh, (0, Dc - D)), F.pad(qh, (0, Dc - D))
            ops.reshape_and_cache(kh, vh, kc, vc, md.slot_mapping, ks, vs)
            attn = ops.paged_attention(qh, kc, vc, md.block_tables, md.seq_lens,
                                       md.query_start_loc, self.scale, k_scale=ks, v_scale=vs,
                                       sliding_window=self.layer_windows[i])
            if Dc != D:
                attn = attn[..., :D].contiguous()
            if tp is None:
                h = ops.linear(attn.view(T, q_size), L.o, decode_rows=dr)
                ops.fused_add_rms_norm(h, residual, L.post_norm, eps)
            else:  # row-parallel: the partial products summed over the ranks, then add + norm
                h = tp.linear_all_reduce(attn.view(T, q_size), L.o, residual, L.post_norm, eps)
            # MLP
            act = ops.silu_and_mul(ops.linear(h, L.gate_up, decode_rows=dr))
            if tp is None:
                h = ops.linear(act, L.down, decode_rows=dr)
            elif i + 1 < len(layers):  # the next layer's input add + norm as the AllReduce's epilogue
                h = tp.linear_all_reduce(act, L.down, residual, layers[i + 1].input_norm, eps)
            else:
                h = tp.linear_all_reduce(act, L.down)
        # final norm and LM head only on the rows that need logits
        idx = md.logits_indices
        hs, rs = h.index_select(0, idx), residual.index_select(0, idx)
        ops.fused_add_rms_norm(hs, rs, self.norm, eps)
        logits = ops.linear(hs, self.lm_head, decode_rows=-1 if dr < 0 else hs.shape[0]).float()
        if tp is None:
            return logits
        # vocabulary-parallel LM head: rank 0 gathers the slices (the workers get None)
        return tp.gather_logits(logits, self.plan.vocab_shard, self.full_config.vocab_size)
