"""quantize_int8 (int4-rtn's LM head on the CPU): llama.cpp's Q8_0 rounding, checked element by element."""
import numpy as np
import pytest
import torch

from decodekit.quant import Int8Weight, from_gguf_q8_0, quantize_int8, to_gguf_q8_0


@pytest.mark.parametrize("shape,group", [((7, 96), 32), ((3, 128), 64), ((1, 32), 32)])
def test_round_to_nearest_within_half_a_step(shape, group):
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    w = torch.randn(shape, generator=g) * torch.logspace(-3, 2, shape[1])[None, :]   # groups of very different size
    w[0, :group] = 0                                                                  # an all-zero group
    q = quantize_int8(w, group)
    assert isinstance(q, Int8Weight) and q.qweight.shape == shape and q.scales.dtype == torch.float16
    d = q.scales.float().repeat_interleave(group, 1)
    back = d * q.qweight.float()
    assert (q.qweight[0, :group] == 0).all() and (back[0, :group] == 0).all()
    err = (back - w).abs()
    assert (err <= d / 2 * (1 + 1e-6) + 1e-30).all()       # nearest code for the (fp16) step actually stored
    assert q.qweight.abs().max() <= 127
    amax = w.abs().reshape(shape[0], -1, group).amax(-1)
    torch.testing.assert_close(q.scales.float(), (amax / 127).half().float())
    if group == 32:     # the GGUF Q8_0 bytes round-trip
        r = from_gguf_q8_0(to_gguf_q8_0(q), shape)
        assert torch.equal(r.qweight, q.qweight) and torch.equal(r.scales, q.scales)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_int8(torch.ones(2, 40))
    np.testing.assert_equal(quantize_int8(torch.ones(1, 32)).qweight.numpy(), np.full((1, 32), 127, np.int8))
