"""Configuration records shared by the loader, the model, the engine and the CLI."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

# The model keeps a [max_position_embeddings, head_dim] rope table: a corrupt context length (2**40) would
# be an out-of-memory kill, not an error. 2**24 is 16x the longest Llama-family context in use (1M).
MAX_POSITION_EMBEDDINGS = 1 << 24
ROPE_SCALING_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# Head dims the CUDA attention kernels take (csrc/cuda/launchers.h kPagedAttentionHeadDims).
CUDA_ATTENTION_HEAD_DIMS = (64, 128, 256)


def cuda_cache_head_dim(head_dim: int) -> int | None:
    """The KV cache row width for head_dim on CUDA: the smallest head dim the attention kernels take that is
    >= head_dim (the engine zero-pads to it: models/llama.py cache_head_dim), None past the largest."""
    return next((d for d in CUDA_ATTENTION_HEAD_DIMS if d >= head_dim), None)


def hf_sliding_window(cfg: dict, arch: str, num_layers: int, source: str, as_int,
                      error=ValueError) -> tuple[int | None, list[int] | None]:
    """(window, windowed layers or None for all) as transformers reads an HF config.json: Mistral's
    `sliding_window` on every layer (absent: 4096, the MistralConfig default; null: none); Qwen2's (Qwen3's) only
    with use_sliding_window, on the layers from max_window_layers on (or those `layer_types` names
    "sliding_attention"); Llama: none. as_int(value, what, minimum=...) checks an integer (the loader's
    config_int; the planner's own), `error` is raised for a layer_types list of the wrong length. Shared by
    the HF loader and the planner so both read a model the same way."""
    layers = None
    if arch == "mistral":
        v = cfg.get("sliding_window", 4096)
    elif arch == "phi3":
        v = cfg.get("sliding_window")
    elif arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        types = cfg.get("layer_types")
        if isinstance(types, list):
            if len(types) != num_layers:
                raise error(f"{source}: layer_types has {len(types)} entries, num_hidden_layers is {num_layers}")
            bad = next((t for t in types if t not in ("full_attention", "sliding_attention")), None)
            if bad is not None:
                raise error(f"{source}: layer_types entries must be \"full_attention\" or \"sliding_attention\", "
                            f"got {bad!r}")
            layers = [i for i, t in enumerate(types) if t == "sliding_attention"]
        else:
            first = as_int(cfg.get("max_window_layers", 28), f"{source}: max_window_layers", minimum=0)
            layers = list(range(first, num_layers))
        v = cfg.get("sliding_window", 4096) if layers else None
    else:
        v = None
    if v is None:
        return None, None
    return as_int(v, f"{source}: sliding_window"), layers


def check_rope_scaling(scaling) -> None:
    """Raises ValueError naming the rope_scaling field that the model's rope table cannot use
    (decodekit.ops.reference.rope_inv_freq: default, linear {factor}, llama3 {factor,
    original_max_position_embeddings, low_freq_factor < high_freq_factor}, yarn {factor,
    original_max_position_embeddings, optional beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim,
    truncate}, longrope {short_factor, long_factor (lists of numbers > 0), original_max_position_embeddings,
    optional factor, attention_factor})."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}} or null, "
                         f"got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"rope_scaling rope_type {kind!r} is not supported (supported: "
                         f"{', '.join(ROPE_SCALING_TYPES)})")
    if kind == "default":
        return
    need = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings"),
            "yarn": ("factor", "original_max_position_embeddings"),
            "longrope": ("short_factor", "long_factor", "original_max_position_embeddings")}[kind]
    for key in need:
        if key not in scaling:
            raise ValueError(f"rope_scaling ({kind}) lacks {key!r} (needs {', '.join(need)})")
    for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "beta_fast",
                "beta_slow", "attention_factor"):
        if key in scaling and (not _number(scaling[key]) or scaling[key] <= 0) and \
                not (kind in ("yarn", "longrope") and key not in need and scaling[key] is None):
            raise ValueError(f"rope_scaling.{key} must be a number > 0, got {scaling[key]!r}")
    orig = scaling.get("original_max_position_embeddings")
    if _number(orig) and (not float(orig).is_integer() or orig > MAX_POSITION_EMBEDDINGS):
        raise ValueError(f"rope_scaling.original_max_position_embeddings must be an integer in "
                         f"[1, {MAX_POSITION_EMBEDDINGS}], got {orig!r}")
    for key in ("mscale", "mscale_all_dim"):        # (yarn: 0 / None leave the default attention factor)
        if scaling.get(key) is not None and (not _number(scaling[key]) or scaling[key] < 0):
            raise ValueError(f"rope_scaling.{key} must be a number >= 0, got {scaling[key]!r}")
    for key in ("short_factor", "long_factor"):
        if key in scaling and (not isinstance(scaling[key], (list, tuple)) or not scaling[key] or not all(
                _number(x) and x > 0 for x in scaling[key])):
            raise ValueError(f"rope_scaling.{key} must be a non-empty list of numbers > 0 (one per rotary "
                             f"frequency), got {scaling[key]!r:.120}")
    if "truncate" in scaling and not isinstance(scaling["truncate"], bool):
        raise ValueError(f"rope_scaling.truncate must be true or false, got {scaling['truncate']!r}")
    if kind == "llama3" and float(scaling.get("low_freq_factor", 1.0)) >= float(scaling.get("high_freq_factor", 4.0)):
        raise ValueError(f"rope_scaling.low_freq_factor ({scaling.get('low_freq_factor', 1.0)}) must be below "
                         f"high_freq_factor ({scaling.get('high_freq_factor', 4.0)})")


@dataclass
class ModelConfig:
    """Architecture of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None        # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False            # Qwen2: bias on q/k/v projections
    qk_norm: bool = False                   # Qwen3: RMSNorm over each q / k head (weights [head_dim]) before RoPE
    architecture: str = "llama"             # llama | mistral | qwen2 | qwen3 | phi3 | smollm2 (the same graph;
                                            # qwen3 adds qk_norm; phi3's fused qkv / gate_up are split at load)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""
    # sliding-window attention (Mistral v0.1, Qwen2 with use_sliding_window): each query of a windowed layer
    # sees only its last sliding_window positions (itself included). None: no window.
    sliding_window: int | None = None
    # the layers that use the window (Qwen2: those from max_window_layers on); None: all of them
    sliding_window_layers: list[int] | None = None
    # RoPE on the first rotary_dim = int(head_dim * partial_rotary_factor) features of each head (Phi-4-mini:
    # 0.75); the rest pass through
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"ModelConfig.{f} must be a positive int, got {v!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                                or isinstance(self.sliding_window, bool) or self.sliding_window <= 0):
            raise ValueError(f"ModelConfig.sliding_window must be a positive int or None, got {self.sliding_window!r}")
        if self.sliding_window_layers is not None:
            layers = self.sliding_window_layers
            if not isinstance(layers, (list, tuple)) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.num_layers for i in layers):
                raise ValueError(f"ModelConfig.sliding_window_layers must be a list of layer indices in "
                                 f"[0, num_layers={self.num_layers}) or None, got {layers!r}")
            self.sliding_window_layers = sorted(set(layers))
        if self.max_position_embeddings > MAX_POSITION_EMBEDDINGS:
            raise ValueError(f"ModelConfig.max_position_embeddings must be in [1, {MAX_POSITION_EMBEDDINGS}], "
                             f"got {self.max_position_embeddings}")
        if not _number(self.rope_theta) or self.rope_theta <= 0:
            raise ValueError(f"ModelConfig.rope_theta must be a finite number > 0, got {self.rope_theta!r}")
        if not _number(self.rms_norm_eps) or self.rms_norm_eps < 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be a finite number >= 0, got {self.rms_norm_eps!r}")
        if self.partial_rotary_factor == 1.0 and self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even (RoPE rotates pairs of features), got {self.head_dim}")
        if not _number(self.partial_rotary_factor) or not 0 < self.partial_rotary_factor <= 1 or \
                self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ValueError(f"ModelConfig.partial_rotary_factor must be in (0, 1] with int(head_dim * factor) even "
                             f"and >= 2 (head_dim {self.head_dim}), got {self.partial_rotary_factor!r}")
        self._fill_context_scaling()
        check_rope_scaling(self.rope_scaling)
        s = self.rope_scaling
        if isinstance(s, dict) and s.get("rope_type") == "longrope":
            for key in ("short_factor", "long_factor"):
                if isinstance(s.get(key), (list, tuple)) and len(s[key]) != self.rotary_dim // 2:
                    raise ValueError(f"rope_scaling.{key} has {len(s[key])} entries; the rotary dimension "
                                     f"{self.rotary_dim} has {self.rotary_dim // 2} frequencies")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")

    def _fill_context_scaling(self) -> None:
        """YaRN's and LongRoPE's defaults as transformers fills them: original_max_position_embeddings =
        max_position_embeddings when absent; a null factor = max_position_embeddings /
        original_max_position_embeddings (Phi-3 derives its LongRoPE attention factor from that ratio)."""
        s = self.rope_scaling
        if not isinstance(s, dict) or s.get("rope_type", s.get("type")) not in ("yarn", "longrope"):
            return
        s = dict(s)
        s["rope_type"] = s.get("rope_type") or s.get("type")
        s.pop("type", None)
        if s.get("original_max_position_embeddings") is None:
            s["original_max_position_embeddings"] = self.max_position_embeddings
        if s.get("factor") is None and _number(s["original_max_position_embeddings"]) \
                and s["original_max_position_embeddings"] > 0:
            s["factor"] = self.max_position_embeddings / s["original_max_position_embeddings"]
        self.rope_scaling = s

    @property
    def context_limit(self) -> int:
        """The longest context the model takes (vLLM's derived max_model_len, the default max_model_len):
        max_position_embeddings, or with YaRN original_max_position_embeddings x factor when longer (Qwen2.5 /
        Qwen3 add {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768} to a
        32768-position config to serve 131072)."""
        s = self.rope_scaling
        if isinstance(s, dict) and s.get("rope_type") == "yarn":
            ext = int(s["original_max_position_embeddings"] * s["factor"])
            return min(max(self.max_position_embeddings, ext), MAX_POSITION_EMBEDDINGS)
        return self.max_position_embeddings

    @property
    def rotary_dim(self) -> int:
        """The features of each head that RoPE rotates (head_dim unless partial_rotary_factor < 1)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_window(self, layer: int) -> int:
        """Layer `layer`'s attention window as paged_attention takes it (0: the whole context)."""
        if self.sliding_window is None:
            return 0
        if self.sliding_window_layers is not None and layer not in self.sliding_window_layers:
            return 0
        return self.sliding_window

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
