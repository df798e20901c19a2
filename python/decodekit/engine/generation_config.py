"""Default sampling parameters recommended by the model (vLLM's --generation-config / --override-generation-config).

A Hugging Face directory's generation_config.json, or a GGUF file's general.sampling.* keys (llama.cpp's), may
recommend temperature, top_p, top_k, min_p, repetition_penalty and (HF) max_new_tokens. With generation_config
"auto" (the default, as vLLM) those become the defaults of requests that leave the field out: the server's
/v1/completions and /v1/chat/completions and LLM.generate / LLM.chat called without SamplingParams
(LLM.get_default_sampling_params). max_new_tokens caps max_tokens. "vllm" ignores the model's file; a
directory or file path reads that generation_config.json instead; override_generation_config's fields
replace those (a null one unsets the model's). Explicit request fields always win.

As vLLM (transformers' GenerationConfig.to_diff_dict): an HF file's values equal to transformers' own defaults
(temperature 1, top_p 1, top_k 50, repetition_penalty 1) are not recommendations and are dropped, and
do_sample is not read. top_k 0 (HF's "off") is -1. Bad values fail at load, naming the file and the key.
"""
from __future__ import annotations

import json
import logging
import os

log = logging.getLogger("decodekit")

HF_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
_HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
             "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty"}


def _is_hf_default(key: str, value) -> bool:
    """transformers' own default (not a recommendation); a bool never is (true is not temperature 1.0)."""
    return not isinstance(value, bool) and key in _HF_DEFAULTS and value == _HF_DEFAULTS[key]


def _read_json(path: str) -> dict:
    from decodekit.loader import ModelLoadError
    from decodekit.loader._common import read_json_object
    try:
        return read_json_object(path)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read the generation config ({e})") from e


def model_generation_config(source: str) -> tuple[dict, str | None]:
    """(the sampling fields a model recommends in HF names, where they were read) for a loaded model's source:
    an HF directory's generation_config.json (values equal to transformers' defaults dropped), a GGUF file's
    general.sampling.* keys; ({}, None) when it has none (random: presets, files without them)."""
    if os.path.isdir(source):
        path = os.path.join(source, "generation_config.json")
        if not os.path.isfile(path):
            return {}, None
        raw = _read_json(path)
        return {k: raw[k] for k in HF_KEYS if raw.get(k) is not None and not _is_hf_default(k, raw[k])}, path
    if os.path.isfile(source) and source.endswith(".gguf"):
        from decodekit.loader import read_gguf_metadata
        meta = read_gguf_metadata(source)
        import numpy as np      # (llama.cpp stores float32: 0.6 reads back 0.6000000238; keep its shortest spelling)
        got = {name: float(str(np.float32(meta[key]))) if isinstance(meta[key], float) else meta[key]
               for key, name in GGUF_KEYS.items() if meta.get(key) is not None}
        return got, (source if got else None)
    return {}, None


def generation_defaults(setting: str, source: str, override: dict | None = None) -> dict:
    """SamplingParams keyword defaults (temperature, top_p, top_k, min_p, repetition_penalty, max_tokens) from
    `setting` ("auto": the model's own, see model_generation_config; "vllm": none; else the path of a
    directory holding generation_config.json, or of that file) updated with `override` (HF key names).
    ValueError naming the file / field and the values allowed."""
    if not isinstance(setting, str) or not setting:
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a path to a generation_config.json "
                         f"(or its directory), got {setting!r}")
    if setting == "vllm":
        found, where = {}, None
    elif setting == "auto":
        found, where = model_generation_config(source)
    else:
        path = os.path.join(setting, "generation_config.json") if os.path.isdir(setting) else setting
        if not os.path.isfile(path):
            raise ValueError(f"generation_config: no such file {path!r} (give 'auto', 'vllm', or a directory "
                             f"holding generation_config.json)")
        raw = _read_json(path)
        found = {k: raw[k] for k in HF_KEYS if raw.get(k) is not None and not _is_hf_default(k, raw[k])}
        where = path
    if override is not None:
        if isinstance(override, str):
            try:
                override = json.loads(override)
            except ValueError as e:
                raise ValueError(f"override_generation_config must be a JSON object, got {override!r:.80} ({e})") \
                    from None
        if not isinstance(override, dict):
            raise ValueError(f"override_generation_config must be an object of {', '.join(HF_KEYS)}, got "
                             f"{override!r:.80}")
        bad = next((k for k in override if k not in HF_KEYS), None)
        if bad is not None:
            raise ValueError(f"override_generation_config: unknown key {bad!r} (allowed: {', '.join(HF_KEYS)})")
        # (as vLLM's dict update: a null override unsets the model's field, leaving the library default)
        found = {k: v for k, v in {**found, **override}.items() if v is not None}
        where = f"{where} + override_generation_config" if where else "override_generation_config"
    for k, v in found.items():     # (a bool is no number here: true would pass as temperature 1.0)
        integral = k in ("top_k", "max_new_tokens")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integral and not float(v).is_integer()):
            raise ValueError(f"generation config ({where}): {k} must be {'an integer' if integral else 'a number'}, "
                             f"got {json.dumps(v)[:60]}")
        if integral:
            found[k] = int(v)
    out = {("max_tokens" if k == "max_new_tokens" else k): v for k, v in found.items()}
    if out.get("top_k") == 0:
        out["top_k"] = -1           # HF: 0 = no top-k
    from decodekit.sampling import SamplingParams
    try:
        SamplingParams(**out).validate()
    except (TypeError, ValueError) as e:    # (named as the file names it)
        raise ValueError(f"generation config ({where}): {str(e).replace('SamplingParams.max_tokens', 'max_new_tokens')}") \
            from None
    if out:
        log.warning("default sampling parameters from %s: %s (requests' own fields win; "
                    "--generation-config vllm ignores them)", where, out)
    return out
