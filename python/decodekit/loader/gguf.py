"""GGUF files (llama.cpp's format) read with the `gguf` package.

Hyperparameters come from the {arch}.* metadata, the tokenizer from tokenizer.ggml.*, and the
tensors are dequantized one at a time with gguf.quants.dequantize (the same routine
transformers' GGUF loader uses), so loading stays within about one tensor of the final weights.

llama.cpp's converter permutes the rows of q_proj/k_proj of "llama" models so that its
interleaved (GPT-J style) rope can be used; the loader undoes it exactly as transformers'
LlamaTensorProcessor._reverse_permute_weights does, which gives back HF's rotate-half (NeoX)
order. The permutation moves whole rows, so it applies to packed quantized rows as well
(GGUFTensorInfo.hf_rows).
"""
from __future__ import annotations

import dataclasses

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from ..config import MAX_POSITION_EMBEDDINGS, ModelConfig
from ._common import (ModelLoadError, check_tokenizer_fits, check_weights, config_float, config_int,
                      expected_weight_shapes, progress)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")
# tensor types this loader is tested on; others that gguf.quants can dequantize also load
TESTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",     # qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# a big-endian file's block types (those llama.cpp's gguf_convert_endian.py converts): the offsets of the fp16
# fields it swaps in each block (MXFP4 / NVFP4: none)
_SWAPPED_FP16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "MXFP4": (), "NVFP4": ()}
# not weights: llama 3.1+ rope frequency factors and Phi-3's LongRoPE factors (folded into ModelConfig.rope_scaling)
_NON_WEIGHTS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
# Phi-3's fused projections: GGUF name -> the HF name loader._common.fused_parts splits
_FUSED_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name (None when it is not a supported weight)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def reverse_permute(w: Any, n_head: int):
    """Undoes llama.cpp's q/k row permutation (interleaved rope -> HF rotate-half), along the
    first axis of a numpy array or torch tensor: reshape(n_head, dim, 2, ...).swapaxes(1, 2)."""
    shape = tuple(w.shape)
    dim = shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *shape[1:]).swapaxes(2, 1).reshape(shape)


def permute(w: Any, n_head: int):
    """llama.cpp's converter permutation (HF rotate-half -> interleaved): the inverse of reverse_permute."""
    shape = tuple(w.shape)
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _reader_class():
    import gguf

    class _Reader(gguf.GGUFReader):
        """GGUFReader over a plain-ndarray view of its memory map: slicing a np.memmap runs
        memmap.__array_finalize__ on each of the ~250k slices the metadata parse takes (twice as
        slow); the view still reads the mapped file lazily and keeps the mapping alive."""

        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return _Reader


def open_reader(path: str):
    """A gguf.GGUFReader (read-only, memory-mapped) for `path` (kept as reader.path: split files open their
    other shards from it)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        head = f.read(8)
    magic = head[:4]
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')")
    if len(head) == 8:
        version = int.from_bytes(head[4:], "little")
        version = version if version & 0xFFFF else int.from_bytes(head[4:], "big")   # (a big-endian file)
        if version == 1 or 3 < version < 0x10000:     # (0 or a huge number: a corrupt header, the reader's error)
            raise ModelLoadError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are; "
                                 f"{'version 1 files predate August 2023' if version == 1 else 'a newer format'}: "
                                 f"convert the model again with a current llama.cpp)")
    try:
        reader = _reader_class()(path, "r")
    except Exception as e:  # the gguf package raises ValueError / struct errors on bad files
        m = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(e))
        if m:
            raise ModelLoadError(f"{path}: a tensor has GGML type id {m.group(1)}, which the installed gguf package "
                                 f"does not know (31-33 were llama.cpp's since-removed Q4_0_4_4 / Q4_0_4_8 / "
                                 f"Q4_0_8_8; newer ids need a newer gguf package): re-quantize the model, e.g. to "
                                 f"Q4_0") from e
        size = os.path.getsize(path)
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({size} bytes; a complete download is the "
                             f"size its source lists): the gguf reader failed with {type(e).__name__}: {e}") from e
    reader.path = path
    return reader


def read_gguf_metadata(source) -> dict[str, Any]:
    """All metadata key/values of a GGUF file (path or GGUFReader) as plain Python values:
    str, int, float, bool, or lists of them."""
    import gguf
    reader = open_reader(source) if isinstance(source, (str, os.PathLike)) else source
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types:
            continue
        value = field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY and not isinstance(value, list):
            value = list(value)
        meta[key] = value
    return meta


@dataclass
class GGUFTensorInfo:
    """One tensor of a GGUF file, not yet dequantized.

    name: the GGUF name (blk.0.attn_q.weight); hf_name: the Hugging Face name (None for
    non-weights such as rope_freqs.weight); quant_type: gguf.GGMLQuantizationType; shape: the
    logical shape in HF order ([out_features, in_features]); data: the raw numpy view into the
    memory-mapped file (for block-quantized types uint8 [rows, bytes_per_row]); unpermute_heads:
    the head count whose row permutation must be undone (q/k of llama models) or None; swapped: the
    file's byte order is not the host's (native() gives the data in the host's).
    """
    name: str
    hf_name: str | None
    quant_type: Any
    shape: tuple[int, ...]
    data: np.ndarray
    unpermute_heads: int | None = None
    swapped: bool = False       # the file's byte order is not the host's (a big-endian file)

    @property
    def type_name(self) -> str:
        return self.quant_type.name

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def block_size(self) -> tuple[int, int]:
        """(elements per block, bytes per block) of the quant type."""
        import gguf
        return gguf.GGML_QUANT_SIZES[self.quant_type]

    def native(self) -> np.ndarray:
        """The data in the host's byte order: `data` itself, or for a big-endian file a copy with each
        number swapped -- the floats, BF16, and the fp16 fields of the block types llama.cpp's
        gguf_convert_endian.py swaps (other block types are refused: their bytes cannot be told apart)."""
        d = self.data
        if not self.swapped:
            return d
        if d.dtype != np.uint8:     # F32 / F16 / F64 / ints: the reader gave them the file's byte order
            return d.astype(d.dtype.newbyteorder("="))
        if self.type_name == "BF16":
            return np.ascontiguousarray(d).view(np.uint16).byteswap().view(np.uint8)
        fields = _SWAPPED_FP16_FIELDS.get(self.type_name)
        if fields is None:
            raise ModelLoadError(f"tensor {self.name}: a big-endian GGUF file's {self.type_name} blocks cannot be "
                                 f"read (big-endian files hold F32, F16, BF16, "
                                 f"{', '.join(_SWAPPED_FP16_FIELDS)}): convert the file to little-endian with "
                                 f"gguf's gguf_convert_endian.py FILE little")
        blocks = np.array(d).reshape(-1, self.block_size[1])
        for off in fields:
            blocks[:, [off, off + 1]] = blocks[:, [off + 1, off]]
        return blocks.reshape(d.shape)

    def hf_rows(self, array: Any = None):
        """`array` (default: the raw data) with its rows in HF order: the llama.cpp q/k
        permutation undone. Works on packed quantized rows (rows are permuted whole)."""
        a = self.native() if array is None else array
        return reverse_permute(a, self.unpermute_heads) if self.unpermute_heads else a

    def raw_bytes(self) -> np.ndarray:
        """The packed data, rows in HF order, as an owning uint8 array [rows, bytes_per_row]."""
        rows = self.shape[0] if len(self.shape) > 1 else 1
        raw = np.ascontiguousarray(self.native()).view(np.uint8).reshape(rows, -1)
        return np.ascontiguousarray(self.hf_rows(raw))

    def dequantize(self, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> torch.Tensor:
        """The tensor as a `dtype` torch tensor on `device`, HF layout and row order."""
        import gguf
        qt = self.quant_type
        data = self.native()
        if qt == gguf.GGMLQuantizationType.F32:
            t = torch.from_numpy(np.array(data, dtype=np.float32))
        elif qt == gguf.GGMLQuantizationType.F16:
            t = torch.from_numpy(np.array(data, dtype=np.float16))
            t = t if dtype == torch.float16 else t.float()
        elif qt == gguf.GGMLQuantizationType.BF16:
            t = torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16)
            t = t if dtype == torch.bfloat16 else t.float()
        else:
            try:
                t = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(data, qt)))
            except NotImplementedError as e:
                raise ModelLoadError(f"tensor {self.name}: quant type {qt.name} cannot be dequantized (decodekit "
                                     f"reads F32, F16, BF16 and the types gguf.quants dequantizes)") from e
        t = t.reshape(self.shape)
        if self.unpermute_heads:
            t = reverse_permute(t, self.unpermute_heads)
        return t.to(device=device, dtype=dtype).contiguous()


def per_layer_value(v: Any) -> Any:
    """A hyperparameter llama.cpp also reads as one value per layer (head_count, head_count_kv,
    feed_forward_length): a list of equal values is that value; anything else is returned as is."""
    if isinstance(v, list) and v and all(type(x) is type(v[0]) and x == v[0] for x in v):
        return v[0]
    return v


def split_paths(path: str, meta: dict[str, Any]) -> list[str]:
    """The files of a model split by llama.cpp's gguf-split (PREFIX-00001-of-00003.gguf ...), first one first;
    [path] for a whole file. ModelLoadError for a shard other than the first, or a name not of that form."""
    n, no = meta.get("split.count", 1), meta.get("split.no", 0)
    if not isinstance(n, int) or n <= 1:
        return [path]
    tail = f"-{no + 1:05d}-of-{n:05d}.gguf" if isinstance(no, int) else ""
    if no != 0:
        raise ModelLoadError(f"{path}: this file is part {no + 1 if isinstance(no, int) else no!r} of a model split "
                             f"in {n} (gguf-split): pass the first part, "
                             f"{os.path.basename(path)[:-len(tail)] if tail and path.endswith(tail) else 'PREFIX'}"
                             f"-00001-of-{n:05d}.gguf")
    if not path.endswith(tail):
        raise ModelLoadError(f"{path}: the first of {n} parts of a split model (gguf-split), but not named "
                             f"PREFIX{tail}, so its other parts cannot be found: rename the parts as gguf-split "
                             f"names them, or merge them with llama-gguf-split --merge")
    return [path[:-len(tail)] + f"-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def read_gguf_tensors(source, meta: dict[str, Any] | None = None) -> Iterator[GGUFTensorInfo]:
    """Yields every tensor of a GGUF file (path or GGUFReader) as a GGUFTensorInfo, in file
    order, without dequantizing anything. The raw quant type and bytes stay reachable
    (info.quant_type, info.data, info.raw_bytes()) for loaders that keep weights packed. The first
    part of a split model (gguf-split: split.count > 1) yields the tensors of all its parts."""
    reader = open_reader(source) if isinstance(source, (str, os.PathLike)) else source
    if meta is None:
        meta = read_gguf_metadata(reader)
    arch = meta.get("general.architecture", "")
    def count(v):  # a bad value is config_from_gguf's error to report; here it only means "no permutation"
        v = per_layer_value(v)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    n_head = count(meta.get(f"{arch}.attention.head_count"))
    n_kv = count(meta.get(f"{arch}.attention.head_count_kv", n_head))
    readers = [reader]
    path = getattr(reader, "path", None)
    if path is not None and isinstance(meta.get("split.count"), int) and meta["split.count"] > 1:
        paths = split_paths(path, meta)
        for i, p in enumerate(paths[1:], 1):
            if not os.path.isfile(p):
                raise ModelLoadError(f"{path}: part {i + 1} of this split model is missing: {p}")
            readers.append(open_reader(p))
            no = read_gguf_metadata(readers[-1]).get("split.no")
            if no != i:
                raise ModelLoadError(f"{p}: split.no is {no!r}, expected {i} (part {i + 1} of {len(paths)})")
        want = meta.get("split.tensors.count")
        got = sum(len(r.tensors) for r in readers)
        if isinstance(want, int) and got != want:
            raise ModelLoadError(f"{path}: the {len(paths)} parts hold {got} tensors, split.tensors.count says "
                                 f"{want}")
    for r in readers:
        swapped = getattr(r, "byte_order", "I") == "S"
        for t in r.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists ne0 (innermost) first
            heads = None
            if arch == "llama":
                if ".attn_q." in t.name:
                    heads = n_head
                elif ".attn_k." in t.name:
                    heads = n_kv if n_head else None
            yield GGUFTensorInfo(t.name, hf_name(t.name), t.tensor_type, shape, t.data, heads, swapped)


def _llama3_factors(theta: float, dim: int, factor: float, low: float, high: float, old: int) -> np.ndarray:
    """llama.cpp's rope_freqs.weight for HF's llama3 rope scaling (convert_hf_to_gguf.py)."""
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi / (1.0 / theta ** (i / dim))
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float64)


def _rope_scaling(meta: dict, arch: str, freqs: np.ndarray | None, theta: float, head_dim: int,
                  longrope: tuple[np.ndarray, np.ndarray] | None = None) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if factor is None:      # llama.cpp's older key (files converted before November 2023), read as it reads it
        factor = meta.get(f"{arch}.rope.scale_linear")
    orig = meta.get(f"{arch}.rope.scaling.original_context_length")
    if longrope is not None:
        # Phi-3 long-context: the converter stores LongRoPE's short / long factors as tensors and the attention
        # factor it derived (ModelConfig derives factor from the context lengths, as transformers)
        out = {"rope_type": "longrope", "short_factor": [float(x) for x in np.asarray(longrope[0]).reshape(-1)],
               "long_factor": [float(x) for x in np.asarray(longrope[1]).reshape(-1)]}
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        attn = meta.get(f"{arch}.rope.scaling.attn_factor")
        if attn:
            out["attention_factor"] = float(attn)
        return out
    if freqs is not None:
        # Llama 3.1+: the converter stores the per-frequency divisors instead of the parameters.
        freqs = np.asarray(freqs, dtype=np.float64).reshape(-1)
        if np.allclose(freqs, 1.0):
            return None
        f = float(freqs.max())
        for old in ([int(orig)] if orig else []) + [8192, 4096, 2048, 16384, 32768, 131072]:
            for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 8.0)):
                cand = _llama3_factors(theta, head_dim, f, low, high, old)
                if cand.shape == freqs.shape and np.allclose(cand, freqs, rtol=1e-4, atol=1e-6):
                    return {"rope_type": "llama3", "factor": f, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": old}
        raise ModelLoadError("rope_freqs.weight does not match Llama 3 rope scaling for any usual "
                             "(low_freq_factor, high_freq_factor, original context); not supported")
    if kind is None:        # llama.cpp's default scaling type: a factor alone scales linearly
        kind = "linear"
    if kind == "none" or (factor in (None, 0.0, 1.0) and kind != "yarn"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(factor or 1.0)}
        if orig:        # (absent: the context length, as llama.cpp's n_ctx_orig_yarn; ModelConfig fills it)
            out["original_max_position_embeddings"] = int(orig)
        attn = meta.get(f"{arch}.rope.scaling.attn_factor")
        if attn:
            out["attention_factor"] = float(attn)
        # what convert_hf_to_gguf.py writes from the HF rope parameters of the same names
        # (yarn_attn_factor: transformers' attention_factor)
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                          ("yarn_attn_factor", "attention_factor")):
            v = meta.get(f"{arch}.rope.scaling.{key}")
            if v is not None:
                out[name] = float(v)
        log_mul = meta.get(f"{arch}.rope.scaling.yarn_log_multiplier")
        if log_mul:     # llama.cpp: attention factor mscale(factor, 1) / mscale(factor, log_mul), as transformers'
            out.update(mscale=1.0, mscale_all_dim=float(log_mul))
        ext = meta.get(f"{arch}.rope.scaling.yarn_ext_factor")
        if ext is not None and float(ext) != 1.0:
            raise ModelLoadError(f"{arch}.rope.scaling.yarn_ext_factor {ext} is not supported (YaRN mixes in "
                                 f"extrapolation fully, 1.0, as transformers does)")
        return out
    raise ModelLoadError(f"unsupported GGUF rope scaling type {kind!r}")


# keys llama.cpp reads as one value or one per layer (get_key_or_arr)
_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def config_from_gguf(meta: dict[str, Any], infos: list[GGUFTensorInfo], source: str = "GGUF file") -> ModelConfig:
    """The ModelConfig of a GGUF file from its metadata and tensor list (source: the file, named in
    errors, which name the metadata key and the values allowed)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{source}: GGUF architecture {arch!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)})")

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        if v is None and required:
            raise ModelLoadError(f"{source}: GGUF metadata lacks {arch}.{key}")
        return v

    def integer(key: str, value: Any, maximum: int | None = None) -> int:
        if isinstance(value, list) and key in _PER_LAYER_KEYS:
            value = per_layer_value(value)
            if isinstance(value, list):
                raise ModelLoadError(f"{source}: GGUF metadata {arch}.{key} gives each layer its own value "
                                     f"({value[:8]}{' ...' if len(value) > 8 else ''}); layers of different sizes are "
                                     f"not supported")
        return config_int(value, f"{source}: GGUF metadata {arch}.{key}", maximum=maximum)

    by_name = {i.name: i for i in infos}
    hidden = integer("embedding_length", get("embedding_length", required=True))
    heads = integer("attention.head_count", get("attention.head_count", required=True))
    kv_heads = integer("attention.head_count_kv", get("attention.head_count_kv") or heads)
    if heads % kv_heads:
        raise ModelLoadError(f"{source}: GGUF metadata {arch}.attention.head_count ({heads}) must be a multiple "
                             f"of {arch}.attention.head_count_kv ({kv_heads})")
    head_key = "attention.key_length" if get("attention.key_length") else "rope.dimension_count"
    if not get(head_key) and hidden % heads:
        raise ModelLoadError(f"{source}: GGUF metadata {arch}.embedding_length ({hidden}) must be a multiple of "
                             f"{arch}.attention.head_count ({heads})")
    head_dim = integer(head_key, get(head_key) or hidden // heads)
    if head_key == "rope.dimension_count" and arch == "phi3":
        head_dim = hidden // heads      # Phi-3 (Phi-4-mini): rope.dimension_count may be a part of the head
    rope_dim = get("rope.dimension_count")
    partial = 1.0
    if rope_dim is not None and rope_dim != head_dim:
        rope_dim = integer("rope.dimension_count", rope_dim, maximum=head_dim)
        if arch != "phi3":
            raise ModelLoadError(f"{source}: partial rotary embeddings (rope.dimension_count {rope_dim} < head_dim "
                                 f"{head_dim}) are supported for phi3 only, not {arch}")
        partial = rope_dim / head_dim
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise ModelLoadError(f"{source}: GGUF file has no token_embd.weight")
    vocab = integer("vocab_size", get("vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ()) or embd.shape[0])
    theta = config_float(get("rope.freq_base", 10000.0), f"{source}: GGUF metadata {arch}.rope.freq_base")
    eps = config_float(get("attention.layer_norm_rms_epsilon", 1e-5),
                       f"{source}: GGUF metadata {arch}.attention.layer_norm_rms_epsilon", positive=False)
    freqs = by_name["rope_freqs.weight"].dequantize().numpy() if "rope_freqs.weight" in by_name else None
    longrope = None
    if "rope_factors_short.weight" in by_name or "rope_factors_long.weight" in by_name:
        if "rope_factors_short.weight" not in by_name or "rope_factors_long.weight" not in by_name:
            raise ModelLoadError(f"{source}: GGUF file has one of rope_factors_short.weight / "
                                 f"rope_factors_long.weight but not the other (LongRoPE needs both)")
        longrope = tuple(by_name[n].dequantize(torch.float64).numpy()
                         for n in ("rope_factors_short.weight", "rope_factors_long.weight"))
    try:
        scaling = _rope_scaling(meta, arch, freqs, theta, head_dim, longrope)
    except (TypeError, ValueError) as e:  # ModelLoadError too: name the file
        raise ModelLoadError(f"{source}: GGUF rope scaling ({arch}.rope.scaling.*, rope_freqs.weight): {e}") from e
    name = str(meta.get("general.name", ""))
    label = arch
    if arch == "llama":
        text = (name + " " + str(meta.get("general.basename", ""))).lower()
        label = "mistral" if "mistral" in text else "smollm2" if "smollm" in text else "llama"
    eos = meta.get("tokenizer.ggml.eos_token_id")
    window = get("attention.sliding_window") if arch == "phi3" else None   # (0: none, as llama.cpp)
    window = integer("attention.sliding_window", window) if window else None
    try:
        return ModelConfig(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=integer("feed_forward_length", get("feed_forward_length", required=True)),
            num_layers=integer("block_count", get("block_count", required=True)),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=eps,
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=integer("context_length", get("context_length", 4096),
                                            maximum=MAX_POSITION_EMBEDDINGS),
            tie_word_embeddings="output.weight" not in by_name,
            attention_bias=any(n.endswith(".attn_q.bias") for n in by_name),
            qk_norm=any(n.endswith(".attn_q_norm.weight") for n in by_name),
            architecture=label, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[int(eos)] if isinstance(eos, int) else [], name=name, sliding_window=window,
            partial_rotary_factor=partial)
    except ValueError as e:
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"{source}: {e}") from e


# Linear-layer weights that may stay packed (keep_quantized): the projections, not the embedding.
_PACKABLE_SUFFIXES = ("_proj.weight",)
# Q8_0 tensors that may stay packed: the projections, the token embedding (rows decoded on lookup) and the LM head.
_PACKABLE_INT8 = ("model.embed_tokens.weight", "lm_head.weight")


def shard_info(info: GGUFTensorInfo, plan) -> GGUFTensorInfo | None:
    """This rank's slice of a tensor as a GGUFTensorInfo over the same memory map (nothing read yet),
    or None when the slice does not fall on the quant type's blocks (the caller cuts after loading).
    Rows of heads keep llama.cpp's within-head permutation, so a head-aligned row slice is undone
    with the slice's own head count."""
    sel = plan.selection(info.hf_name)
    if sel is None or len(info.shape) != 2:
        return info
    dim, a, b = sel
    rows, cols = info.shape
    if dim == 0:
        heads = None
        if info.unpermute_heads:
            per = rows // info.unpermute_heads
            if a % per or b % per:
                return None
            heads = (b - a) // per
        return dataclasses.replace(info, shape=(b - a, cols), data=info.data[a:b], unpermute_heads=heads)
    n_el, n_bytes = info.block_size
    if a % n_el or b % n_el:
        return None
    data = info.data.reshape(rows, -1)
    per_el = data.shape[1] // (cols // n_el)  # array elements per block (bytes, or 1 for float types)
    return dataclasses.replace(info, shape=(rows, b - a), data=data[:, a // n_el * per_el:b // n_el * per_el])


def unfuse_infos(cfg: ModelConfig, infos: list[GGUFTensorInfo], source: str) -> list[GGUFTensorInfo]:
    """Phi-3's fused attn_qkv / ffn_up (gate rows, then up rows) as one GGUFTensorInfo per part: row slices of
    the same memory map (rows are whole quant blocks), so every part loads, packs and shards as any weight."""
    from ._common import fused_parts
    out = []
    for info in infos:
        m = _LAYER_RE.fullmatch(info.name) if cfg.architecture == "phi3" else None
        fused = f"model.layers.{m.group(1)}.{_FUSED_NAMES[m.group(2)]}" if m and m.group(2) in _FUSED_NAMES \
            else None
        parts = fused_parts(cfg, fused) if fused else None
        if parts is None or (m.group(2) == "ffn_up.weight" and info.shape[0] == cfg.intermediate_size):
            out.append(info)        # (an ffn_up of intermediate_size rows is the plain up projection)
            continue
        if len(info.shape) != 2 or info.shape[0] != parts[-1][2]:
            raise ModelLoadError(f"{source}: tensor {info.name} has shape {info.shape}, the configuration implies "
                                 f"{(parts[-1][2], cfg.hidden_size)} ({'q, k, v' if 'qkv' in fused else 'gate, up'} "
                                 f"rows)")
        out += [dataclasses.replace(info, hf_name=n, shape=(b - a, info.shape[1]), data=info.data[a:b])
                for n, a, b in parts]
    return out


def check_readable(infos: list[GGUFTensorInfo], source: str) -> None:
    """Every weight's tensor type can be read (checked on one block of zeros per type, before any weight is
    loaded): ModelLoadError naming the file, the tensor and its type otherwise."""
    seen = set()
    for info in infos:
        key = (info.quant_type, info.swapped, info.data.dtype)
        if info.hf_name is None or key in seen:
            continue
        n_el, n_bytes = info.block_size
        probe = dataclasses.replace(info, shape=(n_el,), unpermute_heads=None,
                                    data=np.zeros(n_bytes if info.data.dtype == np.uint8 else n_el, info.data.dtype))
        try:
            probe.dequantize()
        except ModelLoadError as e:
            raise ModelLoadError(f"{source}: {e}") from e
        seen.add(key)


def load_gguf(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
              progress_bar: bool = True, keep_quantized: bool = False, shard=None):
    """(config, weights, tokenizer) of a GGUF file; weights dequantized tensor by tensor, except,
    with keep_quantized, the Q4_0 / Q4_1 / Q8_0 projection weights and the Q8_0 embedding / LM head:
    those become packed decodekit.quant.Int4Weight / Int8Weight (byte for byte the file's blocks)."""
    from ..tokenizer import Tokenizer

    reader = open_reader(path)
    meta = read_gguf_metadata(reader)
    infos = list(read_gguf_tensors(reader, meta))
    cfg = config_from_gguf(meta, infos, source=path)
    infos = unfuse_infos(cfg, infos, path)
    expected = expected_weight_shapes(cfg)
    for info in infos:  # before any row permutation is undone (it needs the configured head counts)
        want = expected.get(info.hf_name)
        if want is not None and info.shape != want:
            raise ModelLoadError(f"{path}: tensor {info.name} ({info.hf_name}) has shape {info.shape}, the "
                                 f"configuration implies {want}")
    check_readable(infos, path)
    tokenizer = Tokenizer.from_gguf_metadata(meta, name=os.path.basename(path), source=path)
    check_tokenizer_fits(tokenizer, cfg, path)
    cfg.eos_token_ids = list(tokenizer.eos_token_ids)
    cfg.bos_token_id = tokenizer.bos_token_id
    weights: dict[str, torch.Tensor] = {}
    plan = shard(cfg) if shard is not None else None
    for info in progress(infos, len(infos), f"loading {os.path.basename(path)}", progress_bar):
        if info.name in _NON_WEIGHTS:
            continue
        if info.hf_name is None:
            raise ModelLoadError(f"{path}: tensor {info.name!r} is not part of a supported "
                                 f"{meta.get('general.architecture')} model")
        if plan is not None:
            cut = shard_info(info, plan)
            if cut is None:  # not on block boundaries: load whole, then keep the slice
                from ..distributed.sharding import shard_weight
                weights[info.hf_name] = shard_weight(info.hf_name, info.dequantize(dtype, device), plan)
                continue
            info = cut
        if keep_quantized and info.type_name in ("Q4_0", "Q4_1") and info.hf_name.endswith(_PACKABLE_SUFFIXES):
            from ..quant import from_gguf_q4_0, from_gguf_q4_1
            conv = from_gguf_q4_1 if info.type_name == "Q4_1" else from_gguf_q4_0
            weights[info.hf_name] = conv(info.raw_bytes(), info.shape).to(device)
            continue
        if keep_quantized and info.type_name == "Q8_0" and (info.hf_name in _PACKABLE_INT8 or
                                                            info.hf_name.endswith(_PACKABLE_SUFFIXES)):
            from ..quant import from_gguf_q8_0
            weights[info.hf_name] = from_gguf_q8_0(info.raw_bytes(), info.shape).to(device)
            continue
        weights[info.hf_name] = info.dequantize(dtype, device)
    check_weights(cfg, weights, path, plan)
    return cfg, weights, tokenizer
