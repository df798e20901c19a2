"""copy_blocks (copy-on-write across all layers) and swap_blocks (between caches, across
devices) against the reference; untouched blocks must stay bit-identical."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref

KV_DTYPES = DTYPES + [torch.float8_e4m3fn]


def _caches(layers, nb, dtype, device, gen, shape=(3, 16, 64)):
    out = []
    for _ in range(2 * layers):
        c = randn((nb, *shape), torch.float32, "cpu", gen).to(dtype).to(device)
        out.append(c)
    return out[:layers], out[layers:]


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 16, 64), (1, 5, 3)], ids=["hnd", "odd-bytes"])
def test_copy_blocks(shape, dtype, device, gen):
    layers, nb = 3, 23
    ks, vs = _caches(layers, nb, dtype, device, gen, shape)
    perm = torch.randperm(nb, generator=gen)
    mapping = torch.stack([perm[:7], perm[7:14]], 1).to(device)  # distinct srcs and dsts
    want_k, want_v = ref.copy_blocks(ks, vs, mapping)
    ops.copy_blocks(ks, vs, mapping)
    for got, want in zip(ks + vs, want_k + want_v):
        assert torch.equal(_bits(got), _bits(want))


def test_copy_blocks_errors(gen):
    ks, vs = _caches(2, 5, torch.bfloat16, "cpu", gen)
    with pytest.raises(RuntimeError, match="'block_mapping'\\[1, 1\\] = 5 is outside \\[0, num_blocks = 5\\)"):
        ops.copy_blocks(ks, vs, torch.tensor([[0, 1], [2, 5]]))
    with pytest.raises(RuntimeError, match="same length"):
        ops.copy_blocks(ks, vs[:1], torch.tensor([[0, 1]]))
    with pytest.raises(RuntimeError, match="'value_caches\\[1\\]' has dtype"):
        ops.copy_blocks(ks, [vs[0], vs[1].half()], torch.tensor([[0, 1]]))
    with pytest.raises(RuntimeError, match="'block_mapping' has dtype"):
        ops.copy_blocks(ks, vs, torch.tensor([[0, 1]], dtype=torch.int32))


@pytest.mark.parametrize("src_dev, dst_dev", [
    ("cpu", "cpu"),
    pytest.param("cpu", "cuda", marks=cuda_only), pytest.param("cuda", "cpu", marks=cuda_only),
    pytest.param("cuda", "cuda", marks=cuda_only)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_swap_blocks(src_dev, dst_dev, dtype, gen):
    src = randn((11, 3, 16, 64), torch.float32, "cpu", gen).to(dtype).to(src_dev)
    dst = randn((7, 3, 16, 64), torch.float32, "cpu", gen).to(dtype).to(dst_dev)
    mapping = torch.tensor([[10, 0], [3, 6], [4, 2]])
    want = ref.swap_blocks(src, dst, mapping)
    ops.swap_blocks(src, dst, mapping)
    if "cuda" in (src_dev, dst_dev):
        torch.cuda.synchronize()
    assert torch.equal(_bits(dst.cpu()), _bits(want.cpu()))


def test_swap_blocks_errors(gen):
    src = torch.zeros(4, 2, 8)
    with pytest.raises(RuntimeError, match="'block_mapping'\\[0, 1\\] = 3 is outside dst's \\[0, 3\\)"):
        ops.swap_blocks(src, torch.zeros(3, 2, 8), torch.tensor([[1, 3]]))
    with pytest.raises(RuntimeError, match="must have the block shape of 'src'"):
        ops.swap_blocks(src, torch.zeros(3, 2, 9), torch.tensor([[1, 0]]))


@pytest.mark.parametrize("device", DEVICES)
def test_block_ops_opcheck(device, gen):
    ks, vs = _caches(2, 6, torch.bfloat16, device, gen)
    opcheck(torch.ops.decodekit.copy_blocks.default, (ks, vs, torch.tensor([[0, 3], [1, 4]], device=device)))
    opcheck(torch.ops.decodekit.swap_blocks.default, (ks[0], vs[0].clone(), torch.tensor([[5, 0], [2, 1]])))
