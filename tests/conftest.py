"""pytest hooks and fixtures shared by the whole suite (helpers live in dk_testing.py)."""
from __future__ import annotations

import pytest
import torch

from dk_testing import CUDA_OK


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded per test from pytest's node id (fresh inputs per case, reproducible)."""
    import zlib
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda" in item.keywords and not CUDA_OK:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build"))
