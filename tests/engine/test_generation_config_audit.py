"""Audit of the generation-config defaults against vLLM's ModelConfig.get_diff_sampling_param (the model's
generation config, updated with --override-generation-config, then the fields that are not None), its
OpenAI server's per-field defaults, and llama.cpp's general.sampling.* GGUF keys. Cheap: no model is loaded."""
from __future__ import annotations

import json

import pytest

from decodekit.engine.generation_config import GGUF_KEYS, generation_defaults


def _cfg(tmp_path, obj_or_text) -> str:
    d = tmp_path / "g"
    d.mkdir(exist_ok=True)
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    (d / "generation_config.json").write_text(text)
    return str(d)


# --- regression: a null override unsets the model's recommendation (vLLM: config.update(override), then only the
# fields that are not None are kept); it used to be skipped, so the model's value stayed in force.
def test_null_override_unsets_the_models_field(tmp_path):
    d = _cfg(tmp_path, {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 7})
    assert generation_defaults(d, "", {"temperature": None}) == {"top_p": 0.9, "max_tokens": 7}
    assert generation_defaults(d, "", '{"max_new_tokens": null, "top_k": 20}') == \
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert generation_defaults("vllm", "", {"temperature": None}) == {}


# --- behaviour checked against vLLM (held, not changed)
def test_do_sample_false_does_not_force_greedy_and_hf_defaults_are_dropped(tmp_path):
    """vLLM reads neither do_sample nor max_length; transformers' (4.x) defaults are no recommendation."""
    d = _cfg(tmp_path, {"do_sample": False, "temperature": 0.6, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0,
                        "min_p": 0.0, "max_length": 20})
    assert generation_defaults(d, "") == {"temperature": 0.6, "min_p": 0.0}
    # an override equal to a library default is still an override (vLLM applies it after to_diff_dict)
    assert generation_defaults(d, "", {"temperature": 1.0, "top_k": 50}) == \
        {"temperature": 1.0, "top_k": 50, "min_p": 0.0}


@pytest.mark.parametrize("text, key", [('{"temperature": NaN}', "temperature"), ('{"top_p": Infinity}', "top_p"),
                                       ('{"min_p": 1.5}', "min_p"), ('{"repetition_penalty": 0}', "repetition_penalty"),
                                       ('{"temperature": "0.6"}', "temperature"), ('{"top_k": [40]}', "top_k"),
                                       ('{"max_new_tokens": NaN}', "max_new_tokens"), ('{"top_p": 0}', "top_p")])
def test_bad_values_fail_at_load_naming_file_and_key(tmp_path, text, key):
    d = _cfg(tmp_path, text)
    with pytest.raises(ValueError, match=rf"generation config \(.*generation_config\.json\).*{key}"):
        generation_defaults(d, "")


def test_nulls_are_left_out(tmp_path):
    assert generation_defaults(_cfg(tmp_path, {"temperature": None, "top_p": 0.8}), "") == {"top_p": 0.8}


def test_gguf_key_names_are_llama_cpps():
    gguf = pytest.importorskip("gguf")
    g = gguf.Keys.General
    assert GGUF_KEYS == {g.SAMPLING_TEMP: "temperature", g.SAMPLING_TOP_P: "top_p", g.SAMPLING_TOP_K: "top_k",
                         g.SAMPLING_MIN_P: "min_p", g.SAMPLING_PENALTY_REPEAT: "repetition_penalty"}


def test_server_fields_explicit_values_win_and_max_tokens_is_the_smallest():
    """An explicit field equal to the library default (temperature 1.0, top_k -1 ...) wins over the model's; a
    null one takes it; max_tokens is min(the request's or the context's room, max_new_tokens), as vLLM."""
    pytest.importorskip("fastapi")
    from decodekit.server import protocol as P
    d = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_tokens": 7}
    sp = P.sampling_params({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0, "repetition_penalty": 1.0},
                           16, None, None, d)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty) == (1.0, 1.0, -1, 0, 1.0)
    sp = P.sampling_params({"temperature": None, "top_k": 0}, 16, None, None, d)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty) == (0.6, 0.9, 0, 0.05, 1.1)
    assert P.capped_max_tokens(50, d) == 7 and P.capped_max_tokens(3, d) == 3 and P.capped_max_tokens(50, {}) == 50
    assert P.request_defaults({"use_beam_search": True}, d) == {"temperature": 0.6}
