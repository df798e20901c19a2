"""Engine options, shared by LLM(...), LLMEngine, the CLI and (later) the server."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30}


def _json_object(text: str) -> dict:
    """argparse type: a JSON object (argparse names the option in its error)."""
    import json
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r:.60}")
    return v


def dense_weights_too_large(num_params: int, dtype: torch.dtype, gpu_bytes: int, gpu_memory_utilization: float,
                            tensor_parallel_size: int = 1) -> bool:
    """Whether a model's weights, dequantized to dtype and split over the ranks, would take more than half of one
    GPU's budget (gpu_bytes x gpu_memory_utilization): then a quantized checkpoint stays packed (keep_quantized),
    leaving the rest for the KV cache and activations."""
    dense = num_params * dtype.itemsize / max(1, tensor_parallel_size)
    return dense > 0.5 * gpu_bytes * gpu_memory_utilization


def parse_bytes(value) -> int:
    """1073741824, "1GiB", "512MiB", "2g" -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"kv_cache_memory must be a size such as 2GiB, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"kv_cache_memory must be a size such as 2GiB or 512MiB, got {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "bfloat16", "float16")
WEIGHT_FORMATS = ("auto", "packed", "dequantized")
QUANTIZATIONS = (None, "int4-rtn", "int4-gptq", "fp8")
# Default k per drafter. n-gram drafts cost nothing to make, so its cap is higher: k + 1 = 7 rows
# still run in the CPU's multi-row INT4 kernels (8 at most; a 9-row step falls to the tiled GEMM:
# 1.6x a 7-row step), and the adaptive k backs off where drafts miss. Model drafters pay a
# forward per draft token. Measured on the embedded model (bench/results/20261202-1440_cpu_epyc_spec_ngram.md).
SPEC_DEFAULT_K = {"ngram": 6, "layerskip": 4, "draft": 4}
# Shortest n-gram matched by default: single-token matches ("the", ",") mostly propose the wrong
# continuation, and each rejected draft still costs a verification row (same results as above).
SPEC_NGRAM_MIN = 2


@dataclass
class EngineArgs:
    model: str | None = None              # None: the embedded SmolLM2-135M-Instruct
    dtype: str = "auto"                   # auto: float32 on CPU, bfloat16 on CUDA
    device: str = "auto"                  # auto: cuda if available else cpu
    block_size: int = 16
    kv_cache_memory: str | int = "1GiB"   # CPU: bytes of KV cache
    kv_cache_dtype: str = "auto"          # auto: the model's dtype; fp8 (= fp8_e4m3): half the bytes of bf16;
                                          # bfloat16 / float16: a float32 model's cache at half the bytes (CPU)
    quantization: str | None = None       # "int4-rtn" / "int4-gptq" / "fp8": quantize projection weights at load
    quantize_lm_head: bool = True         # int4-rtn on the CPU: the LM head too, as INT8 (Q8_0); False keeps it float
    weight_format: str = "auto"           # GGUF Q4_0/Q4_1/Q8_0: "packed" (INT4/INT8 kernels), "dequantized";
                                          # auto: packed on the CPU
    gpu_memory_utilization: float = 0.9   # CUDA: fraction of device memory for weights+activations+KV
    max_model_len: int | None = None      # default: the model's context length
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    seed: int | None = None               # makes unseeded requests reproducible
    batch_invariant: bool | None = None   # CPU: a request's tokens do not depend on its batch (see
                                          # resolved_batch_invariant; None: auto)
    decode_graphs: str = "auto"           # auto: "cuda" on CUDA (graph per batch bucket), "off" on CPU
    progress: bool = False                # loader progress bar
    speculative: str | None = None        # "ngram" | "layerskip" | "draft": speculative decoding (exact)
    num_speculative_tokens: int | None = None  # k: draft tokens verified per step at most (None: the
                                          # drafter's default, SPEC_DEFAULT_K)
    spec_adaptive: bool = True            # pick k per request from its acceptance rate and measured costs
    spec_draft_model: str | None = None   # speculative="draft": the draft model (same tokenizer)
    spec_layers: int | None = None        # speculative="layerskip": target layers the drafter runs
                                          # (default num_layers // 4)
    spec_ngram_min: int | None = None     # speculative="ngram": n-gram lengths tried, longest first
    spec_ngram_max: int = 4               # (min None: SPEC_NGRAM_MIN, or spec_ngram_max if smaller)
    tensor_parallel_size: int = 1         # ranks the model is split over (decodekit.distributed)
    tp_allreduce: str = "auto"            # auto: decodekit's own AllReduce where built, else torch.distributed
                                          # (gloo on CPU, NCCL on CUDA); "torch" forces the latter; "custom"
    tp_fused_allreduce: bool = False      # row-parallel GEMM and AllReduce overlapped in column chunks
    tp_timeout: float = 300.0             # seconds a collective may wait for a peer before failing
    reasoning_parser: str | None = None   # "deepseek_r1" | "qwen3": guides constrain the answer after the
                                          # model's <think> ... </think> (sampling/reasoning.py); the server
                                          # also returns the reasoning apart (reasoning_content)
    generation_config: str = "auto"       # default sampling fields: "auto" (the model's generation_config.json
                                          # / GGUF general.sampling.*), "vllm" (none), or a path (vLLM's flag;
                                          # engine/generation_config.py)
    override_generation_config: dict | None = None  # HF-named fields over those (e.g. {"temperature": 0.5})

    def __post_init__(self):
        if self.dtype not in ("auto", *_DTYPES):
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        if str(self.device).startswith("cuda"):  # a clear error here, not a driver error deep in the model load
            try:
                index = torch.device(self.device).index
            except RuntimeError:
                raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}") from None
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                raise ValueError(f"device {self.device!r}: no CUDA device is visible (use cpu or auto)")
            if index is not None and not 0 <= index < count:
                raise ValueError(f"device {self.device!r}: the CUDA device index must be in [0, {count - 1}]")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128; got {self.block_size!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype in ("bfloat16", "float16"):
            self.resolved_kv_cache_dtype()   # ValueError where the model's dtype and device cannot take it
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(str(q) for q in QUANTIZATIONS)}; "
                             f"got {self.quantization!r}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format must be one of {', '.join(WEIGHT_FORMATS)}; got {self.weight_format!r}")
        if not isinstance(self.quantize_lm_head, bool):
            raise ValueError(f"quantize_lm_head must be a bool, got {self.quantize_lm_head!r}")
        if parse_bytes(self.kv_cache_memory) <= 0:
            raise ValueError(f"kv_cache_memory must be > 0, got {self.kv_cache_memory!r}")
        if not (0.05 <= float(self.gpu_memory_utilization) <= 0.99):
            raise ValueError(f"gpu_memory_utilization must be in [0.05, 0.99], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"max_model_len must be a positive int, got {self.max_model_len!r}")
        if self.decode_graphs not in ("auto", "off", "static", "cuda"):
            raise ValueError(f"decode_graphs must be auto, off, static or cuda; got {self.decode_graphs!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an int in [0, 2^63), got {self.seed!r}")
        self._check_spec()
        self._check_tp()
        if self.batch_invariant not in (None, True, False):
            raise ValueError(f"batch_invariant must be a bool or None (auto), got {self.batch_invariant!r}")
        if self.batch_invariant and self.tensor_parallel_size > 1:
            raise ValueError("batch_invariant=True needs tensor_parallel_size 1 (the row-parallel GEMMs and "
                             "their AllReduce are not split by rows)")
        from decodekit.sampling.reasoning import get_reasoning_parser
        get_reasoning_parser(self.reasoning_parser)     # ValueError naming the choices

    def _check_tp(self) -> None:
        n = self.tensor_parallel_size
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
            raise ValueError(f"tensor_parallel_size must be an int in [1, 64], got {n!r}")
        if self.tp_allreduce not in ("auto", "torch", "custom"):
            raise ValueError(f"tp_allreduce must be auto, torch or custom; got {self.tp_allreduce!r}")
        if not isinstance(self.tp_timeout, (int, float)) or not 1 <= self.tp_timeout <= 86400:
            raise ValueError(f"tp_timeout must be in [1, 86400] seconds, got {self.tp_timeout!r}")
        if n > 1 and self.quantization == "int4-gptq":
            raise ValueError("quantization 'int4-gptq' runs GPTQ on the whole model and cannot be combined with "
                             "tensor_parallel_size > 1; quantize once with `decodekit quantize` and load the result")

    def _check_spec(self) -> None:
        from decodekit.engine.spec_decode import SPEC_METHODS
        if self.speculative not in (None, *SPEC_METHODS):
            raise ValueError(f"speculative must be one of {', '.join(SPEC_METHODS)} or None; got {self.speculative!r}")
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = SPEC_DEFAULT_K.get(self.speculative, 4)
        for name, lo, hi in (("num_speculative_tokens", 1, 32), ("spec_ngram_max", 1, 64), ("spec_ngram_min", 1, 64)):
            if name == "spec_ngram_min" and self.spec_ngram_min is None:   # the max is valid by now
                self.spec_ngram_min = min(SPEC_NGRAM_MIN, self.spec_ngram_max)
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
        if self.spec_ngram_min > self.spec_ngram_max:
            raise ValueError(f"spec_ngram_min ({self.spec_ngram_min}) must be <= spec_ngram_max ({self.spec_ngram_max})")
        if self.spec_layers is not None and (not isinstance(self.spec_layers, int) or isinstance(self.spec_layers, bool)
                                             or self.spec_layers < 1):
            raise ValueError(f"spec_layers must be an int >= 1, got {self.spec_layers!r}")
        if not isinstance(self.spec_adaptive, bool):
            raise ValueError(f"spec_adaptive must be a bool, got {self.spec_adaptive!r}")
        if self.speculative == "draft" and not self.spec_draft_model:
            raise ValueError("speculative='draft' needs spec_draft_model (a smaller model with the same tokenizer)")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def keep_quantized(self) -> bool:
        """Whether quantized checkpoints' weights (GGUF Q4_0 / Q4_1 / Q8_0, GPTQ / AWQ) stay packed: asked for, or
        (auto) on the CPU (its kernels are tested and measured faster than dense weights), and on CUDA when the
        dequantized weights would take more than half of this GPU's gpu_memory_utilization budget (a 70B GPTQ
        checkpoint: 140 GB dense, 35 GB packed); a model that fits dense is dequantized (the H200 run of
        2026-12-04 measured bf16 decode faster than the INT4 kernels: 162 vs 122 tok/s on Llama-3-8B)."""
        if self.weight_format != "auto":
            return self.weight_format == "packed"
        from decodekit.ops import _has_kernel
        dev = self.resolved_device()
        if not _has_kernel("int4_gemm", dev):
            return False
        if dev.type == "cpu":
            return True
        try:
            from decodekit.loader import load_config
            from decodekit.loader.random import num_params
            n = num_params(load_config(self.model))
        except Exception:  # the loader reports a missing / malformed model itself
            return False
        total = torch.cuda.get_device_properties(dev).total_memory
        return dense_weights_too_large(n, self.resolved_dtype(), total, self.gpu_memory_utilization,
                                       self.tensor_parallel_size)

    def resolved_kv_cache_dtype(self) -> torch.dtype:
        """The KV cache's element type: the model's dtype (auto), float8_e4m3fn (scales:
        LlamaModel.calibrate_kv_scales), or bfloat16 / float16: the model's own dtype, or on the CPU a
        float32 model's cache at half the bytes (each K/V element rounded to nearest even when written)."""
        if self.kv_cache_dtype == "auto":
            return self.resolved_dtype()
        if self.kv_cache_dtype in ("fp8", "fp8_e4m3"):
            return torch.float8_e4m3fn
        from decodekit.ops import kv_cache_dtype_ok
        kv, model, dev = getattr(torch, self.kv_cache_dtype), self.resolved_dtype(), self.resolved_device()
        if not kv_cache_dtype_ok(model, kv, dev):
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} needs a {self.kv_cache_dtype} model, or a float32 "
                             f"model on the CPU; this engine runs {str(model).replace('torch.', '')} on {dev.type} "
                             f"(use auto or fp8)")
        return kv

    def resolved_batch_invariant(self) -> bool:
        """Whether each step splits its rows so that every row's bits are those it gets in any batch (ModelRunner,
        AttentionMetadata.decode_rows; CPU only): decode-phase rows (decode steps, verification) with the one-row
        GEMV's arithmetic at any count, prompt rows in one block of at least 17 on the many-row kernels. A request's
        tokens then do not depend on what else is in the batch, and greedy speculative decoding gives plain
        decoding's tokens in any batch. Auto (None): on for float32 / float16 CPU engines (32-sequence decode steps
        0.93-1.0x as fast), and bfloat16 ones with speculative decoding, at tensor_parallel_size 1 (bfloat16 decode
        batches past 16 sequences run ~1.4x faster on the bf16-product kernels without it). CUDA: not available."""
        dev = self.resolved_device()
        if self.batch_invariant and dev.type != "cpu":
            raise ValueError(f"batch_invariant=True is available on the CPU only (device {dev}); leave it unset")
        if self.batch_invariant is not None:
            return self.batch_invariant
        return (dev.type == "cpu" and self.tensor_parallel_size == 1
                and (self.resolved_dtype() != torch.bfloat16 or self.speculative is not None))

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolved_device().type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    @staticmethod
    def add_cli_args(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("engine")
        g.add_argument("--model", default=None,
                       help="GGUF file, HF model directory or random:PRESET (default: embedded SmolLM2-135M-Instruct)")
        g.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES],
                       help="weight/activation dtype (auto: float32 on CPU, bfloat16 on CUDA). On the CPU float32 is "
                            "exact (HF-transformers-identical greedy tokens) and batch-invariant (--batch-invariant); "
                            "bfloat16 is faster for batches and prefill (INT4/INT8 GEMMs of 9+ rows run bf16 products "
                            "on AMX or AVX512-BF16) but is batch-invariant only with --batch-invariant or --spec")
        g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default 16)")
        g.add_argument("--kv-cache-memory", default="1GiB", help="KV-cache size on CPU, e.g. 2GiB (default 1GiB)")
        g.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                       help="KV-cache element type: auto (the model's dtype); fp8 (e4m3 with per-layer, "
                            "per-KV-head scales calibrated by one prefill at start-up: half the bytes of a 16-bit "
                            "cache, a quarter of fp32, so more tokens and faster long-context decode); bfloat16 / "
                            "float16 (on the CPU a float32 model's cache at half the bytes, K/V rounded once; "
                            "elsewhere only the model's own dtype)")
        g.add_argument("--quantization", default=None, choices=["int4-rtn", "int4-gptq", "fp8"],
                       help="quantize a float checkpoint's projection weights at load: int4-rtn (round to nearest, "
                            "groups of 32, fp16 scale and min; decoded by the INT4 kernels) or int4-gptq (GPTQ "
                            "with act-order, groups of up to 128, calibrated on 4 x 256 tokens of built-in English "
                            "text: slower to load, closer to the float model) or fp8 (W8A8: e4m3 weights with per-channel "
                            "scales, activations quantized per token; fp8 tensor cores on CUDA). Weights a "
                            "checkpoint already packs (GPTQ / AWQ, GGUF Q4 / Q8) stay as they are, unless "
                            "--weight-format dequantizes them first (CUDA's auto does when they fit): then they are "
                            "quantized again from their decoded values")
        g.add_argument("--no-quantize-lm-head", dest="quantize_lm_head", action="store_false",
                       help="with --quantization int4-rtn on the CPU, keep the LM head (and a tied embedding) in float "
                            "instead of INT8 groups of 32 (llama.cpp's Q8_0)")
        g.add_argument("--weight-format", default="auto", choices=list(WEIGHT_FORMATS),
                       help="GGUF Q4_0/Q4_1/Q8_0 projections and Q8_0 embedding: packed (INT4/INT8 kernels read "
                            "~4.5/8.5 bits per weight) or dequantized at load; auto: packed on the CPU, on CUDA when the "
                            "dequantized weights would take over half the GPU memory budget (GPTQ / AWQ likewise)")
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="fraction of GPU memory the engine may use (default 0.9)")
        g.add_argument("--max-model-len", type=int, default=None,
                       help="max prompt + output tokens per request (default: the model's context)")
        g.add_argument("--max-num-seqs", type=int, default=256, help="max concurrent sequences (default 256)")
        g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                       help="token budget of one step; prefills are chunked to it (default 2048)")
        g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                       help="disable automatic prefix caching")
        g.add_argument("--seed", type=int, default=None, help="seed for unseeded requests")
        g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                       help="CPU: compute every row of a step as it would be computed in any batch, so a request's "
                            "tokens do not depend on the other requests (default: on for float32 / float16, and "
                            "for bfloat16 with --spec)")
        g.add_argument("--decode-graphs", default="auto", choices=["auto", "off", "static", "cuda"],
                       help="decode steps on padded static buffers, captured as CUDA graphs per batch bucket "
                            "(auto: cuda on GPU, off on CPU)")
        from decodekit.sampling.reasoning import REASONING_PARSERS
        g.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                       help="the model thinks in <think> ... </think> before answering (deepseek_r1: DeepSeek-R1, its "
                            "distills, QwQ; qwen3: Qwen3): structured-output guides apply to the answer after it, "
                            "and the server returns the thinking as reasoning_content")
        g.add_argument("--generation-config", default="auto",
                       help="default sampling parameters of requests that leave them out: auto (the model's "
                            "generation_config.json or GGUF general.sampling.*), vllm (none), or a directory / "
                            "generation_config.json path (vLLM's flag; default auto)")
        g.add_argument("--override-generation-config", type=_json_object, default=None, metavar="JSON",
                       help="HF-named sampling defaults over the generation config, e.g. "
                            "'{\"temperature\": 0.5, \"max_new_tokens\": 256}'")
        s = p.add_argument_group("speculative decoding (exact: same output distribution)")
        s.add_argument("--spec", dest="speculative", default=None, choices=["ngram", "layerskip", "draft"],
                       help="drafter: ngram (prompt lookup), layerskip (the target's first --spec-layers layers), "
                            "draft (--spec-draft-model)")
        s.add_argument("--spec-k", dest="num_speculative_tokens", type=int, default=None,
                       help="draft tokens per step at most (default 6 for ngram, 4 for the model drafters)")
        s.add_argument("--spec-fixed-k", dest="spec_adaptive", action="store_false",
                       help="always draft k tokens (default: adapt k to each request's acceptance rate)")
        s.add_argument("--spec-draft-model", default=None, help="draft model for --spec draft (same tokenizer)")
        s.add_argument("--spec-layers", type=int, default=None,
                       help="layers of the target the layerskip drafter runs (default num_layers // 4)")
        s.add_argument("--spec-ngram-min", type=int, default=None,
                       help="shortest n-gram matched (default 2, or --spec-ngram-max if smaller)")
        s.add_argument("--spec-ngram-max", type=int, default=4, help="longest n-gram matched (default 4)")

        t = p.add_argument_group("tensor parallelism")
        t.add_argument("--tensor-parallel-size", "--tp", dest="tensor_parallel_size", type=int, default=1,
                       help="split the model over N ranks (spawned on this machine, or started by torchrun; "
                            "default 1)")
        t.add_argument("--tp-allreduce", default="auto", choices=["auto", "torch", "custom"],
                       help="AllReduce: auto (decodekit's own where built, else torch.distributed), torch "
                            "(gloo on CPU, NCCL on CUDA) or custom")
        t.add_argument("--tp-fused-allreduce", action="store_true",
                       help="overlap each row-parallel GEMM with its AllReduce (output columns in chunks)")
        t.add_argument("--tp-timeout", type=float, default=300.0,
                       help="seconds a collective waits for a peer before the engine fails (default 300)")

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})
