"""Model shapes for the planner: presets, HF `config.json`, GGUF metadata; weight formats.

Conventions (chosen so the seed documents' numbers come out, see docs in `roofline`):

* Parameters are counted from the architecture: embedding V*d, LM head V*d unless tied,
  per layer q/k/v/o (+ q/k/v biases for Qwen2), gate/up/down 3*d*I, two RMSNorm vectors,
  and the final norm. Llama-3-8B: 8.03e9, Llama-3-70B: 70.55e9 (the seeds' "16 GB" and
  "140 GB" in bf16).
* A weight format stores every parameter at its bit width (the seeds' "16 GB in BF16",
  "8-bit", "4-bit"), except formats that name the classes separately (`q4_1`: the engine's
  GGUF SmolLM2, Q4_1 projections, a Q8_0 embedding, fp32 norms) and GGUF files, whose
  stored tensor bytes are used as they are.
* INT4 adds a 16-bit scale per group of `group_size` weights (4 + 16/g bits); the seeds'
  "35 GB for a 4-bit 70B" ignores scales, which is `group_size=0`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

from ..config import MAX_POSITION_EMBEDDINGS, cuda_cache_head_dim, hf_sliding_window

# bytes per element of the KV cache / activations by dtype name
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (Llama family: GQA attention, gated MLP, RMSNorm).

    stored_bytes: for GGUF files, the bytes each class of tensor occupies on disk
    ({"embed", "lm_head", "linear", "norm"}), used by the `stored` weight format.
    """
    name: str
    vocab: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    stored_bytes: dict | None = None
    stored_format: str | None = None
    sliding_window: int = 0          # tokens a windowed layer attends to (0: none)
    window_layers: int = 0           # how many layers are windowed (Mistral v0.1: all; Qwen2: from max_window_layers)
    context_limit: int = 0           # the longest context (prompt + output) the model takes (0: unknown, unchecked)

    def __post_init__(self):
        for f in ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"model {self.name!r}: {f} must be a positive integer (got {v!r})")
        for f in ("sliding_window", "window_layers", "context_limit"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"model {self.name!r}: {f} must be a non-negative integer (got {v!r})")
        if self.window_layers > self.n_layers or (self.window_layers > 0) != (self.sliding_window > 0):
            raise ValueError(f"model {self.name!r}: window_layers ({self.window_layers}) must be 1..n_layers "
                             f"({self.n_layers}) with a sliding_window, 0 without one")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model {self.name!r}: n_heads ({self.n_heads}) must be a multiple of "
                             f"n_kv_heads ({self.n_kv_heads})")

    # ---- parameter counts (elements) ----
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def params_embed(self) -> int:
        return self.vocab * self.hidden

    @property
    def params_lm_head(self) -> int:
        """0 when tied: the embedding table is the LM head (stored and read once)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params_per_layer_linear(self) -> int:
        d = self.hidden
        attn = d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return attn + bias + 3 * d * self.intermediate

    @property
    def params_linear(self) -> int:
        return self.n_layers * self.params_per_layer_linear

    @property
    def params_norm(self) -> int:
        return (2 * self.n_layers + 1) * self.hidden

    @property
    def params(self) -> int:
        """All parameters (tied embeddings counted once)."""
        return self.params_embed + self.params_lm_head + self.params_linear + self.params_norm

    @property
    def cache_head_dim(self) -> int:
        """The KV cache row width on a GPU: head_dim, or the next size the CUDA attention takes (64 /
        128 / 256: config.cuda_cache_head_dim; the engine zero-pads to it: Phi-3's 96 -> 128)."""
        return cuda_cache_head_dim(self.head_dim) or self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV cache bytes per token, all layers: 2 (K and V) * layers * kv_heads * cache_head_dim * bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.cache_head_dim * dtype_bytes(kv_dtype, "kv_dtype")

    def attended_context(self, context: float) -> float:
        """The keys a decode step reads per layer, averaged over the layers: `context`, except that a
        windowed layer reads at most `sliding_window` of them (KV bytes and attention FLOPs scale with it)."""
        w = self.window_layers
        return ((self.n_layers - w) * context + w * min(context, self.sliding_window)) / self.n_layers

    def held_context(self, context: float, block_size: int = 16) -> float:
        """The KV tokens a sequence at `context` keeps cached: all of them, unless every layer is windowed -
        the engine then frees the blocks wholly before the window (a window and a block's worth remain)."""
        if self.sliding_window and self.window_layers == self.n_layers:
            return min(context, self.sliding_window + block_size)
        return context


def dtype_bytes(name: str, field: str = "dtype") -> int:
    if name not in DTYPE_BYTES:
        raise ValueError(f"{field} must be one of {', '.join(KV_DTYPES)} (got {name!r})")
    return DTYPE_BYTES[name]


def _llama(name, vocab, hidden, layers, heads, kv, inter, head_dim=128, tied=False, bias=False, ctx=0):
    return ModelSpec(name, vocab, hidden, layers, heads, kv, head_dim, inter, tied, bias, context_limit=ctx)


# context_limit: the published config.json's max_position_embeddings, the longest of the checkpoints a preset's
# aliases name (llama3-8b also stands for Llama-3.1-8B: 131072; Llama-3-8B itself takes 8192); a longer
# (e.g. YaRN-extended) variant is planned from its own config.json
PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": _llama("Llama-3-8B", 128256, 4096, 32, 32, 8, 14336, ctx=131072),
    "llama3-70b": _llama("Llama-3-70B", 128256, 8192, 80, 64, 8, 28672, ctx=131072),
    "llama3-405b": _llama("Llama-3.1-405B", 128256, 16384, 126, 128, 8, 53248, ctx=131072),
    "qwen2.5-7b": _llama("Qwen2.5-7B", 152064, 3584, 28, 28, 4, 18944, bias=True, ctx=131072),
    "qwen2.5-72b": _llama("Qwen2.5-72B", 152064, 8192, 80, 64, 8, 29568, bias=True, ctx=131072),
    "qwen3-8b": _llama("Qwen3-8B", 151936, 4096, 36, 32, 8, 12288, ctx=40960),
    "smollm2-135m": _llama("SmolLM2-135M", 49152, 576, 30, 9, 3, 1536, head_dim=64, tied=True, ctx=8192),
    "phi-4-mini": _llama("Phi-4-mini", 200064, 3072, 32, 24, 8, 8192, tied=True, ctx=131072),
    "mistral-7b-v0.1": dataclasses.replace(_llama("Mistral-7B-v0.1", 32000, 4096, 32, 32, 8, 14336, ctx=32768),
                                           sliding_window=4096, window_layers=32),
}
_ALIASES = {"llama38b": "llama3-8b", "llama318b": "llama3-8b", "metallama38b": "llama3-8b",
            "llama370b": "llama3-70b", "llama3170b": "llama3-70b", "llama3370b": "llama3-70b",
            "metallama370b": "llama3-70b", "llama3405b": "llama3-405b", "llama31405b": "llama3-405b",
            "qwen257b": "qwen2.5-7b", "qwen2572b": "qwen2.5-72b", "qwen38b": "qwen3-8b", "smollm2135m": "smollm2-135m",
            "phi4mini": "phi-4-mini", "phi4mini38b": "phi-4-mini"}


def _key(name: str) -> str:
    k = re.sub(r"[^a-z0-9]", "", name.lower().split("/")[-1])
    return re.sub(r"(instruct|chat|hf)$", "", k)


def load_model(spec: str) -> ModelSpec:
    """A preset name (llama3-8b, llama3-70b, llama3-405b, qwen2.5-7b, qwen2.5-72b, qwen3-8b, smollm2-135m, phi-4-mini,
    spelling-insensitive), a Hugging Face `config.json` (or its directory), or a `.gguf` file."""
    if not isinstance(spec, str) or not spec:
        raise ValueError("model must be a preset name or a config.json / .gguf path")
    if os.path.isdir(spec):
        if not os.path.exists(os.path.join(spec, "config.json")):
            raise ValueError(f"model: the directory {spec!r} has no config.json")
        return from_hf_config(os.path.join(spec, "config.json"))
    if spec.endswith(".json"):
        return from_hf_config(spec)
    if spec.endswith(".gguf"):
        return from_gguf(spec)
    if spec in PRESETS:
        return PRESETS[spec]
    k = _key(spec)
    if k in _ALIASES:
        return PRESETS[_ALIASES[k]]
    raise ValueError(f"model: unknown preset {spec!r}; allowed: {', '.join(PRESETS)} "
                     "or a config.json / .gguf path")


def _as_int(value, what: str, minimum: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"model: {what} must be an integer >= {minimum} (got {value!r})")
    return value


def _hf_window(c: dict, n_layers: int, path: str) -> dict:
    """sliding_window / window_layers as the engine's HF loader reads them (config.hf_sliding_window)."""
    w, layers = hf_sliding_window(c, c.get("model_type"), n_layers, path, _as_int)
    if w is None or layers == []:
        return {}
    return {"sliding_window": w, "window_layers": n_layers if layers is None else len(layers)}


def _hf_context_limit(c: dict, path: str) -> int:
    """The engine's context_limit (config.ModelConfig.context_limit): max_position_embeddings, or with YaRN
    original_max_position_embeddings x factor when longer; 0 when the config gives none."""
    mpe = c.get("max_position_embeddings")
    limit = 0 if mpe is None else _as_int(mpe, f"{path}: max_position_embeddings")
    s = c.get("rope_scaling")
    if isinstance(s, dict) and (s.get("rope_type") or s.get("type")) == "yarn":
        orig, factor = s.get("original_max_position_embeddings"), s.get("factor")
        if isinstance(orig, (int, float)) and isinstance(factor, (int, float)) and orig > 0 and factor > 0 \
                and math.isfinite(orig * factor):
            limit = max(limit, int(orig * factor))
    return min(limit, MAX_POSITION_EMBEDDINGS)


def from_hf_config(path: str) -> ModelSpec:
    """Shape from a Hugging Face config.json (Llama / Qwen2 / Mistral style keys)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"model: no such file {path!r}")
    try:
        with open(path) as f:
            c = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"model: {path} is not a JSON config ({e})") from None
    if not isinstance(c, dict):
        raise ValueError(f"model: {path} is not a config.json (a JSON object of the model's shape; "
                         f"got a {type(c).__name__})")
    try:
        get = lambda k, minimum=1: _as_int(c[k], f"{path}: {k}", minimum)  # noqa: E731
        d, heads, layers = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
        kv = c.get("num_key_value_heads")
        hd = c.get("head_dim")
        return ModelSpec(
            name=c.get("_name_or_path") or os.path.basename(os.path.dirname(os.path.abspath(path))) or "model",
            vocab=get("vocab_size"), hidden=d, n_layers=layers, n_heads=heads,
            n_kv_heads=heads if kv is None else _as_int(kv, f"{path}: num_key_value_heads"),
            head_dim=(_as_int(hd, f"{path}: head_dim") if hd is not None
                      else 128 if c.get("model_type") == "qwen3" else d // heads),
            intermediate=get("intermediate_size"),
            tied_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
            context_limit=_hf_context_limit(c, path),
            **_hf_window(c, layers, path))
    except KeyError as e:
        raise ValueError(f"model: {path} lacks {e.args[0]!r}") from None


def from_gguf(path: str) -> ModelSpec:
    """Shape and stored tensor bytes from a GGUF file's metadata (the `gguf` package)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"model: no such file {path!r}")
    import gguf
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 -- the reader raises ValueError, struct / numpy errors on a bad file
        raise ValueError(f"model: {path} is not a readable GGUF file ({type(e).__name__}: {e})") from None

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v

    arch = field("general.architecture", "llama")

    def get(k, default=None):
        v = field(f"{arch}.{k}", default)
        if v is None:
            raise ValueError(f"model: {path} lacks the GGUF metadata {arch}.{k}")
        return v

    d = _as_int(get("embedding_length"), f"{path}: {arch}.embedding_length")
    heads = _as_int(get("attention.head_count"), f"{path}: {arch}.attention.head_count")
    names = {t.name for t in r.tensors}
    vocab = field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens", []) or [])
    stored = {"embed": 0, "lm_head": 0, "linear": 0, "norm": 0}
    types = set()
    for t in r.tensors:
        cls = ("embed" if t.name == "token_embd.weight" else "lm_head" if t.name == "output.weight"
               else "norm" if len(t.shape) == 1 or t.name.endswith("_norm.weight") else "linear")
        stored[cls] += int(t.n_bytes)
        if cls == "linear":
            types.add(t.tensor_type.name)
    return ModelSpec(
        name=str(field("general.name", os.path.basename(path))), vocab=int(vocab), hidden=d,
        n_layers=int(get("block_count")), n_heads=heads, n_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", d // heads)), intermediate=int(get("feed_forward_length")),
        tied_embeddings="output.weight" not in names, qkv_bias="blk.0.attn_q.bias" in names,
        stored_bytes=stored, stored_format="gguf " + "/".join(sorted(types)),
        context_limit=min(int(get("context_length", 0) or 0), MAX_POSITION_EMBEDDINGS))


# ---------------------------------------------------------------------------- weight formats
WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4", "q4_1", "stored")


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How weights are stored (bits per element by tensor class) and which rate multiplies them.

    compute: the FLOP rate used for the matmuls ("bf16": weight-only formats dequantize to
    the activation type; "fp8": W8A8 on fp8 tensor cores). family: which measured GEMV
    efficiency applies (dense, int4, int8, fp8).
    """
    name: str
    linear_bits: float
    embed_bits: float
    norm_bits: float
    compute: str
    family: str
    embed_family: str
    note: str = ""

    def bytes_by_class(self, m: ModelSpec) -> dict[str, float]:
        """Stored bytes of each tensor class: embed, lm_head, linear, norm."""
        if self.name == "stored":
            if not m.stored_bytes:
                raise ValueError(f"weights: 'stored' needs a GGUF model (got {m.name!r})")
            return {k: float(v) for k, v in m.stored_bytes.items()}
        return {"embed": m.params_embed * self.embed_bits / 8, "lm_head": m.params_lm_head * self.embed_bits / 8,
                "linear": m.params_linear * self.linear_bits / 8, "norm": m.params_norm * self.norm_bits / 8}

    def total_bytes(self, m: ModelSpec) -> float:
        return sum(self.bytes_by_class(m).values())


def weight_format(name: str, group_size: int = 128, model: ModelSpec | None = None) -> WeightFormat:
    """bf16 / fp16 (2 B), fp8 (W8A8, 1 B), int8 (weight-only, per-channel scales ~0),
    int4 (weight-only, 4 + 16/group_size bits; group_size=0: 4 bits, the seeds' convention),
    q4_1 (the engine's GGUF SmolLM2: Q4_1 projections 5 bits, Q8_0 embedding 8.5 bits, fp32 norms),
    stored (a GGUF file's own tensor bytes)."""
    if not isinstance(group_size, int) or group_size < 0:
        raise ValueError(f"group_size must be an integer >= 0 (0 = no scales; got {group_size!r})")
    if name in ("bf16", "fp16"):
        return WeightFormat(name, 16, 16, 16, "bf16", "dense", "dense")
    if name == "fp8":
        return WeightFormat(name, 8, 8, 8, "fp8", "fp8", "fp8", "W8A8 e4m3, per-channel scales (not counted)")
    if name == "int8":
        return WeightFormat(name, 8, 8, 8, "bf16", "int8", "int8", "weight-only, per-channel scales (not counted)")
    if name == "int4":
        bits = 4 + (16 / group_size if group_size else 0)
        note = (f"4 bits + a 16-bit scale per {group_size} weights = {bits:.4g} bits" if group_size
                else "4 bits, scales not counted (the seeds' convention)")
        return WeightFormat(name, bits, bits, bits, "bf16", "int4", "int4", note)
    if name == "q4_1":
        return WeightFormat(name, 5, 8.5, 32, "bf16", "int4", "int8",
                            "GGUF Q4_1 projections (4 bits + fp16 scale and min per 32 = 5 bits), "
                            "Q8_0 embedding (8.5 bits), fp32 norms")
    if name == "stored":
        kinds = (model.stored_format or "") if model is not None else ""
        fam = "int4" if re.search(r"Q[2-6]", kinds) else "int8" if "Q8" in kinds else "dense"
        return WeightFormat(name, 0, 0, 0, "bf16", fam, "int8" if fam != "dense" else "dense",
                            f"the GGUF file's own tensor bytes ({kinds or 'unknown types'})")
    raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)} (got {name!r})")
