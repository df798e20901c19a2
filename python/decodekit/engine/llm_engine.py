"""LLMEngine: add_request / step / abort over the scheduler, the model runner, the sampler
and the detokenizer. Synchronous: one step() runs one scheduled batch end to end.

A request with n > 1 becomes n child sequences (ids "<id>/<i>"), each with its own seed,
sharing the prompt's full KV blocks through the prefix cache; its RequestOutput carries
all n CompletionOutputs and is finished when every child is.
"""
from __future__ import annotations

import copy
import itertools
import logging
import numbers
import os
import time
from dataclasses import dataclass, field

import torch

from decodekit.loader import load_model, resolve_model
from decodekit.models import LlamaModel
from decodekit.quant.load import quantize_projections
from decodekit.sampling import SamplingParams
from decodekit.sampling.beam_search import BeamSearchParams
from decodekit.sampling.reasoning import get_reasoning_parser, prompt_mode
from decodekit.sampling.sampler import Sampler, SamplingMetadata, penalty_prompt, request_seeds, set_global_seed
from decodekit.tokenizer.detokenizer import IncrementalDetokenizer

from .args import EngineArgs, parse_bytes
from .beam_group import BeamGroup
from .generation_config import generation_defaults
from .kv_cache import KVCacheManager
from .model_runner import ModelRunner
from .outputs import CompletionOutput, Logprob, RequestOutput
from .prompt_logprobs import split_prompt_rows
from .prompts import encode_prompt, truncate_prompt
from .request import Request, RequestStatus, split_n
from .scheduler import ScheduledRequest, Scheduler, SchedulerConfig, SchedulerOutput
from .spec_decode import spec_metrics

log = logging.getLogger("decodekit")


@dataclass
class _Seq:
    """Engine-side state of one child sequence."""
    request: Request
    seed: int
    detok: IncrementalDetokenizer
    out: CompletionOutput
    stop_ids: frozenset
    spec: list = field(default_factory=lambda: [0, 0, 0])  # drafts, accepted, verification steps


@dataclass
class _Group:
    """All n sequences of one user request."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[_Seq]
    arrival: float
    first_token: float | None = None
    first_scheduled: float | None = None
    finished_at: float | None = None
    dirty: bool = True
    prompt_logprobs: list | None = None   # prompt_logprobs: None, then {token id: Logprob} per prompt position
    prompt_logprobs_sent: bool = False
    held: list = field(default_factory=list)  # n > 1: samples queued once the first has computed the prompt
    final_only: bool = False              # step() returns the request's output once, when it finishes

    @property
    def finished(self) -> bool:
        return all(s.out.finish_reason is not None for s in self.seqs)


def _physical_memory_bytes() -> int | None:
    """This machine's RAM (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def resolve_max_model_len(requested: int | None, cfg) -> int:
    """The engine's context length: `requested` (EngineArgs.max_model_len), else the model's. Never past
    the model's context_limit (max_position_embeddings, longer with YaRN; a sliding window does not bound
    it: the attention ops apply the window)."""
    limit = cfg.context_limit
    if requested is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's context length: {limit}; use "
                         f"max_model_len <= {limit}")
    return requested or limit


def released_window(cfg, speculative: str | None, max_model_len: int) -> int | None:
    """The window past which requests release their blocks: the model's sliding_window when every layer
    uses it (a full-attention layer needs the whole context) and a sequence can outgrow it, except with a
    draft model (its own layers read the same block tables, maybe without a window)."""
    if cfg.sliding_window is None or speculative == "draft" or cfg.sliding_window >= max_model_len:
        return None
    if any(cfg.layer_window(i) == 0 for i in range(cfg.num_layers)):
        return None
    return cfg.sliding_window


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, **kwargs):
        self.args = args = args or EngineArgs(**kwargs)
        self.reasoning = get_reasoning_parser(args.reasoning_parser)
        # SamplingParams keyword defaults the model recommends (generation_config.json, GGUF general.sampling.*;
        # vLLM's --generation-config), read before the weights so that a bad file fails fast
        kind, where = resolve_model(args.model)
        self.default_sampling = generation_defaults(args.generation_config, where if kind != "random" else "",
                                                    args.override_generation_config)
        if args.seed is not None:
            set_global_seed(args.seed)
        self.device = args.resolved_device()
        self.dtype = args.resolved_dtype()
        self.tp = None
        if args.tensor_parallel_size > 1:
            loaded = self._start_tensor_parallel()
        else:
            # Loaded straight onto the engine's device (large random presets are drawn there; the model
            # pops each tensor as it takes it, so weights never exist twice).
            keep = args.keep_quantized()
            if keep and self.device.type == "cuda" and args.weight_format == "auto":
                log.info("quantized weights kept packed on %s: dequantized they would take over half of the "
                         "gpu_memory_utilization budget (--weight-format dequantized to force it)", self.device)
            loaded = load_model(args.model, dtype=self.dtype, device=self.device, progress=args.progress,
                                keep_quantized=keep)
            if args.quantization in ("int4-rtn", "fp8"):
                quantize_projections(loaded.weights, args.quantization,
                                      lm_head_int8=args.quantization == "int4-rtn" and self.device.type == "cpu"
                                      and args.quantize_lm_head)
            self.model = LlamaModel(loaded.config, loaded.weights, dtype=self.dtype, device=self.device,
                                    max_model_len=args.max_model_len)
        self.model_config = cfg = loaded.config
        if self.default_sampling.get("top_k", -1) >= cfg.vocab_size:   # (keeps every token: no top-k)
            self.default_sampling["top_k"] = -1
        self.tokenizer = loaded.tokenizer
        self.model_source = loaded.source
        if args.quantization == "int4-gptq":
            self._quantize_gptq()
        self.draft_model = self._load_draft_model() if args.speculative == "draft" else None
        kv_dtype = args.resolved_kv_cache_dtype()
        self.model.set_kv_cache_dtype(kv_dtype, self._calibrate_kv_scales() if kv_dtype == torch.float8_e4m3fn else None)
        self.max_model_len = resolve_max_model_len(args.max_model_len, cfg)
        num_blocks = self._num_kv_blocks()
        self.kv_manager = KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=self.max_model_len, block_size=args.block_size,
            enable_prefix_caching=args.enable_prefix_caching,
            sliding_window=released_window(cfg, args.speculative, self.max_model_len),
            rope_switch_len=self.model.rope_original or None), self.kv_manager)
        graphs, graph_batch = self._decode_graph_mode()
        self.runner = ModelRunner(self.model, num_blocks, args.block_size, self.max_model_len,
                                  decode_graphs=graphs, max_batch=graph_batch,
                                  batch_invariant=args.resolved_batch_invariant())
        self.sampler = Sampler()
        self.eos_token_ids = sorted(set(cfg.eos_token_ids) | set(self.tokenizer.eos_token_ids or []))
        self.spec = self._build_spec() if args.speculative else None
        self._groups: dict[str, _Group] = {}
        self._seq_of: dict[str, _Seq] = {}
        self._beams: dict[str, BeamGroup] = {}     # beam-search requests (engine/beam_group.py)
        self._beam_of: dict[str, BeamGroup] = {}   # their beams' request ids -> group
        self._holding: dict[str, _Group] = {}      # n > 1 groups with samples not queued yet (_Group.held)
        self._ids = itertools.count()
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "steps": 0, "last_step_tokens": 0}

    def _start_tensor_parallel(self):
        """--tensor-parallel-size N: checks the model splits N ways, starts the workers (or joins
        torchrun's), loads this rank's shard; self.model becomes the driver's TPDriverModel."""
        import weakref

        from decodekit.distributed.sharding import ShardPlan
        from decodekit.distributed.parallel_state import launch_tensor_parallel
        from decodekit.distributed.worker import TPDriverModel, load_shard
        from decodekit.loader import load_config
        a = self.args
        ShardPlan(load_config(a.model), 0, a.tensor_parallel_size)  # bad sizes fail before any process starts
        self.tp = launch_tensor_parallel(a, self.device)
        self.device = self.tp.device  # "cuda" -> this rank's GPU
        try:
            loaded, local = load_shard(a, self.device, self.dtype, self.tp)
        except BaseException:
            self.tp.shutdown()
            raise
        self.model = TPDriverModel(local, self.tp)
        self._tp_finalizer = weakref.finalize(self, TPDriverModel.shutdown, self.model)
        note = local.plan.capacity_note()
        if note:
            log.warning(note)
        return loaded

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers (nothing to do with one rank); the engine is unusable after."""
        fin = getattr(self, "_tp_finalizer", None)
        if fin is not None:
            fin()

    def _build_spec(self):
        """--spec ngram | layerskip | draft: the drafter and the engine's SpecDecoder."""
        from decodekit.spec.drafters import DraftSampling, ModelDrafter, NgramDrafter
        from .spec_decode import SpecDecoder
        a, c = self.args, self.model_config
        if a.speculative == "ngram":
            drafter = NgramDrafter(a.spec_ngram_min, a.spec_ngram_max)
        elif a.speculative == "layerskip":
            L = a.spec_layers if a.spec_layers is not None else max(1, c.num_layers // 4)
            if not 1 <= L < c.num_layers:
                raise ValueError(f"spec_layers must be in [1, {c.num_layers - 1}] (the target has "
                                 f"{c.num_layers} layers), got {L}")
            drafter = ModelDrafter(self.model, "layerskip", num_layers=L)
        else:
            drafter = ModelDrafter(self.draft_model, "draft",
                                   kv_caches=self.draft_model.allocate_kv_cache(self.runner.num_blocks,
                                                                                a.block_size),
                                   max_chunk=a.max_num_batched_tokens)
        sampling = None
        if isinstance(drafter, ModelDrafter):  # sampled requests draw their drafts (seeds, EOS: the engine's)
            sampling = DraftSampling(self.sampler, lambda rid: self._seed_of(rid), self.eos_token_ids,
                                     c.vocab_size)
        return SpecDecoder(drafter, a.num_speculative_tokens, a.spec_adaptive, sampling=sampling)

    def _load_draft_model(self):
        """--spec draft: the draft model (same vocabulary as the target), on the engine's device."""
        a = self.args
        if a.spec_draft_model is None:
            raise ValueError("speculative='draft' needs spec_draft_model (a smaller model with the same tokenizer)")
        try:
            d = load_model(a.spec_draft_model, dtype=self.dtype, device=self.device, progress=a.progress,
                           keep_quantized=a.keep_quantized())
        except (ValueError, FileNotFoundError) as e:  # named as the draft's (the loader's text says "model ...")
            raise ValueError(f"spec_draft_model {a.spec_draft_model!r}: {e}") from None
        if d.config.vocab_size != self.model_config.vocab_size:
            raise ValueError(f"spec_draft_model's vocabulary ({d.config.vocab_size} tokens) differs from the "
                             f"target's ({self.model_config.vocab_size}): a draft model must share the tokenizer")
        probe = "Hello, world! 123"
        if d.tokenizer.encode(probe) != self.tokenizer.encode(probe):
            raise ValueError("spec_draft_model's tokenizer encodes text differently from the target's")
        # its rope table covers the engine's context, which may be longer than the draft's own
        m = LlamaModel(d.config, d.weights, dtype=self.dtype, device=self.device,
                       max_model_len=a.max_model_len or self.model_config.context_limit)
        m.set_kv_cache_dtype(self.dtype)
        return m

    # ------------------------------------------------------------------ sizing
    def _num_kv_blocks(self) -> int:
        per_block = self.model.kv_cache_block_bytes(self.args.block_size)
        if self.draft_model is not None:  # its pool mirrors the target's block for block
            per_block += self.draft_model.kv_cache_block_bytes(self.args.block_size)
        if self.device.type == "cuda":
            budget = self._profile_gpu_budget()
        else:
            budget = parse_bytes(self.args.kv_cache_memory)
            ram = _physical_memory_bytes()
            if ram is not None and budget > ram:  # would be OOM-killed zeroing the pool, not refused
                raise ValueError(f"kv_cache_memory ({budget / 2**30:.1f} GiB) exceeds this machine's memory "
                                 f"({ram / 2**30:.1f} GiB): it must be > 0 and fit in RAM beside the weights")
        n = budget // per_block
        if self.tp is not None:
            log.info("KV cache per rank: %d blocks of %d tokens, %.1f MiB (%d of %d KV heads)", n,
                     self.args.block_size, n * per_block / 2**20, self.model.config.num_kv_heads,
                     self.model_config.num_kv_heads)
        held = self.max_model_len
        window = released_window(self.model_config, self.args.speculative, self.max_model_len)
        if window is not None:  # a sequence holds its window and one step's tokens (the rest is released)
            held = min(held, window + self.args.max_num_batched_tokens + self.args.block_size)
        need = -(-held // self.args.block_size)
        if n < need and self.args.max_model_len is None and n >= 1 and window is None:
            # The model's full context does not fit: serve shorter sequences rather than refuse.
            self.max_model_len = int(n * self.args.block_size)
            log.warning("KV cache holds %d tokens: max_model_len lowered to %d (set kv_cache_memory to raise it)",
                        n * self.args.block_size, self.max_model_len)
        elif n < need:
            raise ValueError(f"the KV cache budget ({budget / 2**20:.0f} MiB = {n} blocks of {self.args.block_size} "
                             f"tokens) cannot hold one max_model_len={self.max_model_len} sequence ({need} blocks"
                             f"{'' if window is None else f' for its sliding window and one step'}); "
                             f"raise kv_cache_memory / gpu_memory_utilization or lower "
                             f"{'max_model_len' if window is None else 'max_num_batched_tokens'}")
        return int(n)

    # A fixed English passage: real text gives the activations the scales must cover.
    _CALIBRATION_TEXT = (
        "The history of science is the study of the development of science and scientific knowledge, "
        "including both the natural and social sciences. Science is a body of empirical, theoretical, and "
        "practical knowledge about the natural world, produced by scientists who emphasize the observation, "
        "explanation, and prediction of real-world phenomena. def add(a, b):\n    return a + b\n"
        "Q: What is 12 * 7? A: 84. Paris, Tokyo, New York; 1, 2, 3, 5, 8, 13, 21.")

    def _calibrate_kv_scales(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """fp8 KV cache: per-layer, per-head scales from one prefill of a calibration passage
        (with a temporary full-precision cache; see LlamaModel.calibrate_kv_scales)."""
        c = self.model_config
        ids = [t for t in self.tokenizer.encode(self._CALIBRATION_TEXT) if 0 <= t < c.vocab_size]
        # at most 256 tokens, and no position past the model's context (nor the engine's max_model_len)
        ids = (ids or list(range(min(64, c.vocab_size))))[:min(256, c.max_position_embeddings,
                                                                self.args.max_model_len or c.max_position_embeddings)]
        return self.model.calibrate_kv_scales(lambda: self._probe_prefill(ids))

    def _quantize_gptq(self, num_seqs: int = 4, seq_len: int = 256) -> None:
        """--quantization int4-gptq: GPTQ (act-order) of the float projections, layer by layer, on a
        batch of num_seqs x seq_len tokens of built-in English text (decodekit.quant.gptq_quantizer)."""
        from decodekit.quant.gptq_quantizer import calibration_forward, calibration_text, gptq_quantize_model
        c = self.model_config
        group = next((g for g in (128, 64, 32) if c.hidden_size % g == 0 and c.q_size % g == 0
                      and c.intermediate_size % g == 0), 32)
        n = min(seq_len, c.max_position_embeddings)
        ids = [t for t in self.tokenizer.encode(calibration_text()[: 8 * num_seqs * n]) if 0 <= t < c.vocab_size]
        ids = ids or list(range(1, c.vocab_size))
        seqs = [ids[i * n:(i + 1) * n] for i in range(num_seqs) if ids[i * n:(i + 1) * n]]
        done = gptq_quantize_model(self.model, lambda: calibration_forward(self.model, seqs), group_size=group,
                                   act_order=True)
        log.info("GPTQ: %d projection weights quantized to INT4 (groups of %d) on %d calibration tokens",
                 done, group, sum(map(len, seqs)))

    def _probe_prefill(self, ids: list[int]) -> int:
        """One prefill of `ids` outside the scheduler, on a temporary KV cache just big enough
        (start-up probes: calibration, memory profiling). Returns the probe cache's bytes."""
        bs = self.args.block_size
        probe = ModelRunner(self.model, num_blocks=-(-len(ids) // bs) + 1, block_size=bs)
        req = Request("__probe__", ids, SamplingParams(max_tokens=1))
        req.block_ids = list(range(probe.num_blocks - 1))
        probe.execute(SchedulerOutput(scheduled=[ScheduledRequest(req, len(ids), 0, True, True)],
                                      num_scheduled_tokens=len(ids)))
        return sum(k.numel() * k.element_size() * 2 for k, _ in probe.kv_caches)

    def _decode_graph_mode(self) -> tuple[str, int]:
        """(ModelRunner's decode_graphs mode, largest decode bucket): graphs up to max_num_seqs rows, fewer
        under tensor parallelism when only decodekit's AllReduce can be captured (gloo: ranks sharing a GPU)."""
        mode, rows = self.args.decode_graphs, self.args.max_num_seqs
        if mode == "auto":
            mode = "cuda" if self.device.type == "cuda" else "off"
        if mode == "cuda":
            from decodekit.ops import _has_kernel
            if self.device.type != "cuda" or not _has_kernel("paged_attention", self.device):
                log.warning("CUDA graphs need the CUDA paged_attention kernel; decode steps run eagerly")
                mode = "off"
        if mode == "cuda" and self.tp is not None:
            c, plan = self.model_config, self.model.plan
            cap = self.tp.graph_max_rows(c.hidden_size * self.dtype.itemsize, self.tp.world_size * plan.vocab_shard * 4)
            if cap < 1:
                log.warning("tensor parallelism over gloo without decodekit's AllReduce: no collective can be "
                            "captured in a CUDA graph; decode steps run eagerly")
                return "static", rows
            if cap < rows:
                log.warning("CUDA graphs for decode batches up to %d (decodekit's AllReduce buffers); larger "
                            "batches run eagerly", cap)
                rows = cap
        return mode, rows

    def _profile_gpu_budget(self) -> int:
        """Bytes left for KV after weights and a max-size forward pass's activations."""
        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        kv_probe = self._probe_prefill([0] * self.args.max_num_batched_tokens)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        total = torch.cuda.get_device_properties(dev).total_memory
        budget = int(total * self.args.gpu_memory_utilization) - (peak - kv_probe)
        torch.cuda.empty_cache()
        return max(budget, 0)

    # ------------------------------------------------------------------ requests
    def encode_prompt(self, prompt: str) -> list[int]:
        """A text prompt's token ids (encode_prompt below, with this engine's tokenizer and limits)."""
        return encode_prompt(self.tokenizer, prompt, self.max_model_len, self.model_config.vocab_size)

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.encode_prompt(prompt)
        if isinstance(prompt, dict):  # vLLM's TokensPrompt {"prompt_token_ids": [...]} / TextPrompt {"prompt": str}
            extra = set(prompt) - {"prompt_token_ids", "prompt"}
            if extra:
                raise ValueError(f"prompt dicts take 'prompt_token_ids' or 'prompt' only, not {sorted(extra)}")
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif isinstance(prompt.get("prompt"), str):
                return self._prompt_ids(prompt["prompt"])
            else:
                raise ValueError("a prompt dict needs 'prompt_token_ids' (a list of token ids) or 'prompt' (a string)")
        if isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            V = self.model_config.vocab_size
            for i, t in enumerate(ids):  # Python or numpy ints (numbers.Integral has no numpy bool), never bools
                if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < V:
                    raise ValueError(f"prompt token ids must be ints in [0, {V}); item {i} is {t!r}")
            return None, [int(t) for t in ids]
        raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def reasoning_of(self, prompt_ids) -> tuple | None:
        """(ReasoningParser, mode) of a reply to `prompt_ids` with the engine's reasoning parser (None without
        one): where its reasoning starts and ends (sampling/reasoning.py)."""
        if self.reasoning is None:
            return None
        return self.reasoning, prompt_mode(self.reasoning, self.tokenizer, prompt_ids)

    def add_request(self, request_id: str | None, prompt, params: SamplingParams | BeamSearchParams | None = None,
                    final_only: bool = False) -> str:
        """Queue a request; raises ValueError (naming the field) for invalid input, leaving
        the engine and every other request untouched. BeamSearchParams: a beam search, whose one output
        (when it finishes) holds the beam_width best hypotheses. params None: the model's defaults
        (default_sampling), max_tokens at most what the context leaves after the prompt. final_only:
        step() returns this request's output only when it finishes (vLLM's RequestOutputKind.FINAL_ONLY;
        offline generate() does not need the others, and building one per request per step is O(tokens))."""
        defaulted = params is None
        params = params or SamplingParams(**self.default_sampling)
        if isinstance(params, BeamSearchParams):
            return self._add_beam_search(request_id, prompt, params)
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams or a BeamSearchParams, got {type(params).__name__}")
        # the request's own copy: the caller may reuse or change its object once the request is queued
        params = copy.deepcopy(params)
        params.validate(vocab_size=self.model_config.vocab_size, eos_token_ids=self.eos_token_ids)
        if params.bad_words:
            params.set_bad_words_token_ids(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        request_id = self._new_id(request_id)
        text, ids = self._prompt_ids(prompt)  # lengths (empty, > max_model_len) checked by the scheduler
        kept = truncate_prompt(ids, params.truncate_prompt_tokens, self.max_model_len, params.max_tokens)
        if len(kept) < len(ids):
            text, ids = None, kept
        if defaulted:       # (no one asked for this many: a generation config's max_new_tokens, or 16)
            params.max_tokens = max(1, min(params.max_tokens, self.max_model_len - len(ids)))
        if params.guided_kind is not None:
            params.set_guided(self.tokenizer, self.eos_token_ids, self.reasoning_of(ids))
        parent = Request(request_id, ids, params)
        children = split_n(parent)
        for c in children:  # n > 1 children are "<id>/<i>": they must not meet another request's sequences
            if c.request_id in self._seq_of or c.request_id in self._beam_of:
                raise ValueError(f"request_id {request_id!r}: sequence id {c.request_id!r} is already in use "
                                 f"(ids of the form '<id>/<i>' name the samples of an n > 1 request, "
                                 f"'<id>#beam<k>' the beams of a beam search)")
        seeds = request_seeds(params)
        stop_ids = frozenset(params.stop_token_ids or []) | (
            frozenset() if params.ignore_eos else frozenset(self.eos_token_ids))
        seqs = []
        for i, child in enumerate(children):
            # a stop string's match must end past the first min_tokens tokens' text (it may begin inside it)
            detok = IncrementalDetokenizer(self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens,
                                           stop=params.stop, min_tokens=params.min_tokens,
                                           include_stop_str_in_output=params.include_stop_str_in_output)
            out = CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None,
                                   cumulative_logprob=0.0 if params.logprobs is not None else None)
            seqs.append(_Seq(child, seeds[i], detok, out, stop_ids))
        # n > 1 with prefix caching: the first sample computes the prompt, the others are queued once its full
        # blocks are cached and compute only the rest (scheduled together, each would compute all of it)
        hold = len(seqs) > 1 and self.args.enable_prefix_caching and len(ids) > self.args.block_size
        added = []
        try:
            for s in (seqs[:1] if hold else seqs):
                self.scheduler.add_request(s.request)
                added.append(s)
        except Exception:
            for s in added:
                self.scheduler.abort_request(s.request.request_id)
            raise
        g = _Group(request_id, text, ids, params, seqs, time.monotonic(), final_only=bool(final_only))
        if hold:
            g.held = seqs[1:]
            self._holding[request_id] = g
        if params.prompt_logprobs is not None:  # the first sample computes them (the others may hit its cache)
            g.prompt_logprobs = [None] * len(ids)
            seqs[0].request.prompt_logprobs_pending = len(ids) > 1
        self._groups[request_id] = g
        for s in seqs:
            self._seq_of[s.request.request_id] = s
        self.stats["prompt_tokens"] += len(ids)
        return request_id

    def _new_id(self, request_id: str | None) -> str:
        request_id = str(next(self._ids)) if request_id is None else request_id
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if request_id in self._groups or request_id in self._beams or request_id in self._beam_of:
            raise ValueError(f"request_id {request_id!r} is already in use")
        return request_id

    def _add_beam_search(self, request_id: str | None, prompt, params: BeamSearchParams) -> str:
        params = copy.deepcopy(params).validate()
        request_id = self._new_id(request_id)
        text, ids = self._prompt_ids(prompt)
        kept = truncate_prompt(ids, params.truncate_prompt_tokens, self.max_model_len, params.max_tokens)
        if len(kept) < len(ids):
            text, ids = None, kept
        # forks copy KV blocks in the runner's pool; a draft model keeps its own cache: beams recompute there
        g = BeamGroup(request_id, text, ids, params, self.eos_token_ids, self.max_model_len,
                      can_fork=self.spec is None or self.spec.method != "draft",
                      taken=lambda rid: rid in self._seq_of or rid in self._groups or rid in self._beam_of)
        for r in g.start(self.scheduler):
            self._beam_of[r.request_id] = g
        self._beams[request_id] = g
        self.stats["prompt_tokens"] += len(ids)
        return request_id

    def _seed_of(self, rid: str) -> int:
        s = self._seq_of.get(rid)
        return s.seed if s is not None else 0   # beam requests are greedy

    def _beam_update(self, g: BeamGroup, added, dropped) -> None:
        for r in dropped:
            self._beam_of.pop(r.request_id, None)
        for r in added:
            self._beam_of[r.request_id] = g

    def abort_request(self, request_id: str) -> bool:
        """Abort a request (all its samples) at any time; frees its KV blocks."""
        bg = self._beams.get(request_id)
        if bg is not None:
            if not bg.finished:
                self._beam_update(bg, [], bg.abort(self.scheduler))
            return True
        g = self._groups.get(request_id)
        if g is None:
            return False
        for s in g.seqs:
            if s.out.finish_reason is None:
                self.scheduler.abort_request(s.request.request_id)
                s.out.finish_reason = "abort"
        g.held = []
        self._holding.pop(request_id, None)
        g.dirty = True
        return True

    @property
    def num_held(self) -> int:
        """n > 1 samples not queued yet (they wait for the first to compute the prompt)."""
        return sum(len(g.held) for g in self._holding.values())

    def _release_held(self) -> None:
        """Queue the held samples of groups whose first sample has computed the prompt (or ended)."""
        for rid in [r for r, g in self._holding.items()
                    if g.seqs[0].out.token_ids or g.seqs[0].out.finish_reason is not None]:
            g = self._holding.pop(rid)
            for s in reversed(g.held):      # at the front, in order: they came with the first one
                try:
                    self.scheduler.add_request(s.request, front=True)
                except ValueError as e:     # (cannot happen: the first sample passed the same checks)
                    log.error("request %s: %s", s.request.request_id, e)
                    self._finish(s, "error", str(e))
            g.held = []

    def has_unfinished_requests(self) -> bool:
        return any(not g.finished or g.dirty for g in self._groups.values()) or bool(self._beams)

    def get_num_unfinished_requests(self) -> int:
        return sum(not g.finished for g in self._groups.values()) + sum(not g.finished for g in self._beams.values())

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns outputs of the requests that changed (new tokens or finished)."""
        if self.spec is not None:
            self.spec.propose(self.scheduler)
        so = self.scheduler.schedule()
        for sr in so.scheduled:
            if sr.is_new:
                g = self._groups.get(sr.request.parent_id or sr.request_id) or self._beam_of.get(sr.request_id)
                if g is not None and g.first_scheduled is None:
                    g.first_scheduled = time.monotonic()
                    if isinstance(g, BeamGroup):
                        g.num_cached_tokens = max(0, sr.request.num_cached_tokens)
        sampled: dict[str, list[int]] = {}
        info: dict[str, list] = {}
        if self.spec is not None:
            self.spec.on_schedule(so)
            if so.scheduled:
                self.spec.draft(so, self.runner)
        t0 = time.perf_counter()
        if not so.scheduled:    # (forks' copy-on-write pairs are due now: their blocks may change hands later)
            self.runner.copy_blocks(so.blocks_to_copy)
        else:
            logits = self.runner.execute(so)
            if any(sr.num_prompt_logits for sr in so.scheduled):
                logits = split_prompt_rows(so.scheduled, logits, self._prompt_logprobs_of, self._decode_one)
            rows = [sr for sr in so.scheduled if sr.will_sample]
            if rows:
                self._sample(rows, logits, sampled, info)
        step_seconds = time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["last_step_tokens"] = so.num_scheduled_tokens if so.scheduled else 0
        finished = self.scheduler.update_from_output(so, sampled)   # cuts tokens past max_tokens
        if self.spec is not None:
            for rid, (d, a) in self.spec.record(so, sampled, step_seconds).items():
                s = self._seq_of.get(rid)
                if s is not None:
                    s.spec[0] += d
                    s.spec[1] += a
                    s.spec[2] += 1
        now = time.monotonic()
        beams: dict[BeamGroup, None] = {}   # groups with new tables, in step order (a set's order would vary)
        for rid, toks in sampled.items():
            s = self._seq_of.get(rid)
            if s is None:
                bg = self._beam_of.get(rid)
                if bg is not None and not bg.finished:
                    self.stats["generation_tokens"] += 1
                    bg.on_sample(self.scheduler.get_request(rid) or next(
                        sr.request for sr in so.scheduled if sr.request_id == rid), info[rid])
                    beams[bg] = None
                continue
            if s.out.finish_reason is not None:
                continue
            self._on_tokens(s, toks, info.get(rid), now)
        for r in finished:
            s = self._seq_of.get(r.request_id)
            if s is not None and s.out.finish_reason is None:
                self._finish(s, r.finish_reason or "length", None)
            bg = self._beam_of.get(r.request_id)
            if bg is not None:
                self._beam_update(bg, [], bg.on_finished(r, self.scheduler))
        for bg in beams:
            if bg.ready:
                self._beam_update(bg, *bg.advance(self.scheduler))
        if self._holding:
            self._release_held()
        return self._collect(now) + self._collect_beams()

    def _collect_beams(self) -> list[RequestOutput]:
        outs = []
        for rid in [r for r, g in self._beams.items() if g.dirty]:
            g = self._beams.pop(rid)
            outs.append(g.output(self.tokenizer, self._decode_one))
        return outs

    @staticmethod
    def _token_infos(out, idx: list[int]) -> list | None:
        """Per token (raw logprob, (top ids, top logprobs, rank) or None) from a SamplerOutput."""
        if out.logprobs is None:
            return None
        return [(out.logprobs[i], (out.topk_ids[i], out.topk_logprobs[i], out.ranks[i])
                 if out.topk_ids is not None else None) for i in idx]

    def _sample(self, rows, logits, sampled: dict, info: dict) -> None:
        """Tokens (and logprob info) of the sampling rows: the plain sampler for one-row requests,
        the speculative verifier for those with drafts (logits: 1 + num_spec rows each)."""
        counts = [1 + sr.num_spec for sr in rows]
        plain = [i for i, sr in enumerate(rows) if not sr.num_spec]
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        V = self.model_config.vocab_size
        if plain:
            reqs = [rows[i].request for i in plain]
            x = logits if len(plain) == len(rows) else logits.index_select(
                0, torch.tensor([starts[i] for i in plain], device=logits.device))
            md = SamplingMetadata.build([r.sampling_params for r in reqs], [r.output_token_ids for r in reqs],
                                        [penalty_prompt(r) for r in reqs], [self._seed_of(r.request_id) for r in reqs],
                                        None,
                                        self.eos_token_ids, logits.device, V)
            lp = self._lists(self.sampler(x, md))
            for i, r in enumerate(reqs):
                sampled[r.request_id] = [lp.token_ids[i]]
                info[r.request_id] = self._token_infos(lp, [i])
        spec = [i for i, sr in enumerate(rows) if sr.num_spec]
        if spec:
            x = logits.index_select(0, torch.tensor([starts[i] + j for i in spec for j in range(counts[i])],
                                                    device=logits.device)) if plain else logits
            srs = [rows[i] for i in spec]
            toks, lp_out, lp_idx = self.spec.verify(self.sampler, x, srs,
                                                    [self._seed_of(sr.request_id) for sr in srs],
                                                    self.eos_token_ids, V)
            lp = self._lists(lp_out) if lp_out is not None else None
            for sr, t, idx in zip(srs, toks, lp_idx):
                sampled[sr.request_id] = t
                info[sr.request_id] = self._token_infos(lp, idx) if lp is not None else None

    @staticmethod
    def _lists(out):
        """A SamplerOutput with its tensors as Python lists (one device sync each)."""
        from types import SimpleNamespace
        conv = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in out.__dict__.items()}
        return SimpleNamespace(**conv)

    def _on_tokens(self, s: _Seq, toks: list[int], info, now: float) -> None:
        g = self._groups[s.request.parent_id or s.request.request_id]
        g.dirty = True
        if g.first_token is None:
            g.first_token = now
        p = g.params
        for j, tok in enumerate(toks):
            self.stats["generation_tokens"] += 1
            s.out.token_ids.append(tok)
            s.out.delta_token_ids.append(tok)
            if s.out.logprobs is not None and info is not None:
                lp, extra = info[j]
                entry = {}
                if extra is not None:  # top-N in descending order: rank i + 1
                    ids, lps, rank = extra
                    for i, (t, l) in enumerate(list(zip(ids, lps))[: p.logprobs]):
                        entry[t] = Logprob(l, i + 1, self._decode_one(t))
                    entry[tok] = Logprob(lp, rank, self._decode_one(tok))
                else:
                    entry[tok] = Logprob(lp, None, self._decode_one(tok))
                s.out.logprobs.append(entry)
                s.out.cumulative_logprob += lp
            can_stop = len(s.out.token_ids) >= p.min_tokens
            # a guide lets EOS through before min_tokens only when nothing else fits: it ends the output
            token_stop = tok in s.stop_ids and (can_stop or (p.guided_kind is not None and tok in self.eos_token_ids))
            # a stop token (EOS, stop_token_ids) ends the request without its text, unless
            # include_stop_str_in_output (vLLM's rule); its id and logprobs are still returned
            if not token_stop or p.include_stop_str_in_output:
                text = s.detok.add([tok])
                s.out.text += text
                s.out.delta_text += text
            if token_stop and p.guide_error is not None:   # the guide gave up: not a match, say so
                self._finish(s, "error", p.guide_error)
                self.scheduler.finish_request(s.request.request_id, RequestStatus.FINISHED_ERROR)
                return
            if token_stop:      # (vLLM: EOS reports no stop_reason, even when stop_token_ids lists it too)
                eos = tok == self.tokenizer.eos_token_id and not p.ignore_eos
                self._finish(s, "stop", tok if tok in (p.stop_token_ids or []) and not eos else None)
                self.scheduler.finish_request(s.request.request_id, RequestStatus.FINISHED_STOPPED)
                return
            if can_stop and s.detok.stopped:
                self._finish(s, "stop", s.detok.stop_reason, flush=False)
                self.scheduler.finish_request(s.request.request_id, RequestStatus.FINISHED_STOPPED)
                return

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _prompt_logprobs_of(self, seq_id: str) -> list | None:
        """The prompt_logprobs list of a sequence's request (None once the request is gone)."""
        s = self._seq_of.get(seq_id)
        g = self._groups.get(s.request.parent_id or seq_id) if s is not None else None
        return g.prompt_logprobs if g is not None else None

    def _finish(self, s: _Seq, reason: str, stop_reason, flush: bool = True) -> None:
        if flush and not s.detok.stopped:
            tail = s.detok.flush()
            s.out.text += tail
            s.out.delta_text += tail
            if s.detok.stopped and reason in ("length", "stop"):   # a stop string completed by the flush
                reason, stop_reason = "stop", s.detok.stop_reason
        s.out.finish_reason = reason
        s.out.stop_reason = stop_reason
        g = self._groups[s.request.parent_id or s.request.request_id]
        g.dirty = True

    def _collect(self, now: float) -> list[RequestOutput]:
        outs = []
        for rid in [r for r, g in self._groups.items() if g.dirty]:
            g = self._groups[rid]
            g.dirty = False
            done = g.finished
            if g.final_only and not done:
                continue
            if done and g.finished_at is None:
                g.finished_at = now
            cached = max(0, min((s.request.num_cached_tokens for s in g.seqs), default=0))
            metrics = {"arrival": g.arrival, "first_scheduled": g.first_scheduled, "first_token": g.first_token,
                       "finished": g.finished_at, "prompt_tokens": len(g.prompt_token_ids)}
            if self.spec is not None:
                metrics.update(spec_metrics(*(sum(s.spec[i] for s in g.seqs) for i in range(3))))
            plp = None   # in the first output after the prompt is computed and in the final one
            if g.prompt_logprobs is not None and not g.seqs[0].request.prompt_logprobs_pending and \
                    (done or not g.prompt_logprobs_sent):
                plp, g.prompt_logprobs_sent = g.prompt_logprobs, True
            ro = RequestOutput(rid, g.prompt, g.prompt_token_ids,
                               [CompletionOutput(**{**s.out.__dict__, "token_ids": list(s.out.token_ids)})
                                for s in g.seqs], done, cached, metrics, plp)
            for s in g.seqs:
                s.out.delta_text, s.out.delta_token_ids = "", []
            outs.append(ro)
            if done:
                del self._groups[rid]
                for s in g.seqs:
                    self._seq_of.pop(s.request.request_id, None)
        return outs
