"""Fixtures for the tokenizer tests: decodekit's tokenizer of the embedded GGUF (gguf_path and the
transformers oracle hf_tok are tests/conftest.py's)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok(gguf_path):
    from decodekit.tokenizer import Tokenizer
    return Tokenizer.from_gguf(gguf_path)
