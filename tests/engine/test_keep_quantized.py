"""EngineArgs.keep_quantized, --weight-format auto: quantized checkpoints stay packed on the CPU, and on CUDA
when their dequantized weights would take over half of the GPU memory budget (a 70B GPTQ checkpoint would not
fit dense); explicit packed / dequantized win."""
import types

import pytest
import torch

from decodekit import ops
from decodekit.engine.args import EngineArgs, dense_weights_too_large

H200, H100 = 141 * 2**30, 80 * 2**30


def test_dense_weights_too_large():
    assert dense_weights_too_large(70_600_000_000, torch.bfloat16, H200, 0.9)       # 141 GB dense > 63 GB
    assert not dense_weights_too_large(70_600_000_000, torch.bfloat16, H200, 0.9, 4)  # 35 GB a rank
    assert not dense_weights_too_large(8_030_000_000, torch.bfloat16, H200, 0.9)    # 16 GB
    assert dense_weights_too_large(8_030_000_000, torch.bfloat16, H100, 0.3)        # 16 GB > 12 GB
    assert dense_weights_too_large(8_030_000_000, torch.float32, H100, 0.7)         # 32 GB > 28 GB
    assert not dense_weights_too_large(8_030_000_000, torch.float16, H100, 0.7)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA build on a GPU of `memory` bytes, as far as keep_quantized looks."""
    state = {"memory": H100}
    monkeypatch.setattr(ops, "_has_kernel", lambda op, dev: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)     # (EngineArgs checks device="cuda" exists)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: types.SimpleNamespace(total_memory=state["memory"]))
    return state


def test_keep_quantized_on_cuda(fake_cuda):
    big = EngineArgs(model="random:llama3-8b", device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3)
    assert big.keep_quantized()            # 16 GB dense > half of 24 GB
    fake_cuda["memory"] = H200
    assert not big.keep_quantized()        # fits: dequantized (measured faster)
    assert EngineArgs(model="random:llama3-8b", device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3,
                      weight_format="packed").keep_quantized()
    fake_cuda["memory"] = 8 * 2**30
    assert not EngineArgs(model="random:llama3-8b", device="cuda", dtype="bfloat16", gpu_memory_utilization=0.9,
                          weight_format="dequantized").keep_quantized()
    assert EngineArgs(model="random:llama3-8b", device="cuda", dtype="bfloat16",
                      tensor_parallel_size=2).keep_quantized()   # 8 GB a rank > 3.6 GB
    assert not EngineArgs(model="random:smollm2-135m", device="cuda", dtype="bfloat16").keep_quantized()
    assert not EngineArgs(model="/no/such/model.gguf", device="cuda").keep_quantized()  # the loader reports it


def test_keep_quantized_on_cpu():
    assert EngineArgs(device="cpu").keep_quantized() == ops._has_kernel("int4_gemm", torch.device("cpu"))
    assert not EngineArgs(device="cpu", weight_format="dequantized").keep_quantized()
