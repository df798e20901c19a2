"""rotary_embedding vs the float64 reference, plus the cos/sin table and Llama-3 scaling."""
import math

import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, assert_close, randn
from decodekit import ops
from decodekit.ops import reference as ref

# (num_q_heads, num_kv_heads, head_size, rot_dim)
HEADS = [(9, 3, 64, 64), (32, 8, 128, 128), (8, 8, 128, 64), (3, 1, 80, 80)]
NUM_TOKENS = [1, 7, 83, 4096]
MAX_POS = 8192


def _qkv(tokens, hq, hk, d, dtype, device, gen):
    """q and k as views into a fused [T, (hq + 2 hk) * d] QKV buffer, as the engine lays them out."""
    qkv = randn((tokens, (hq + 2 * hk) * d), dtype, device, gen)
    q = qkv[:, : hq * d]
    k = qkv[:, hq * d: (hq + hk) * d]
    return qkv, q, k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "x".join(map(str, h)))
@pytest.mark.parametrize("tokens", NUM_TOKENS)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(tokens, heads, dtype, device, is_neox, gen):
    hq, hk, d, rot = heads
    cache = ref.rope_cos_sin_cache(MAX_POS, rot, theta=10000.0).to(device)
    qkv, q, k = _qkv(tokens, hq, hk, d, dtype, device, gen)
    v_before = qkv[:, (hq + hk) * d:].clone()
    pos = torch.randint(0, MAX_POS, (tokens,), generator=gen).to(device)
    exp_q, exp_k = ref.rotary_embedding(pos, q.double(), k.double(), cache.double(), d, is_neox)
    ops.rotary_embedding(pos, q, k, cache, d, is_neox)
    assert_close(q, exp_q, dtype, "rope q")
    assert_close(k, exp_k, dtype, "rope k")
    assert torch.equal(qkv[:, (hq + hk) * d:], v_before), "rope wrote into V"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_3d_query_only(dtype, device, gen):
    # [T, H, D] layout, no key, positions in the order the engine gives (not sorted).
    q = randn((11, 6, 64), dtype, device, gen)
    cache = ref.rope_cos_sin_cache(4096, 64, theta=500000.0).to(device)
    pos = torch.tensor([0, 4095, 17, 17, 1, 2, 3, 1000, 999, 5, 64], device=device)
    exp_q, _ = ref.rotary_embedding(pos, q.double(), None, cache.double(), 64, True)
    ops.rotary_embedding(pos, q, None, cache, 64, True)
    assert_close(q, exp_q, dtype, "rope 3d")


def test_position_zero_is_identity():
    q = torch.randn(1, 4 * 64)
    cache = ref.rope_cos_sin_cache(16, 64, theta=10000.0)
    q2 = q.clone()
    ops.rotary_embedding(torch.tensor([0]), q2, None, cache, 64, True)
    torch.testing.assert_close(q2, q, atol=0, rtol=0)


def test_rope_matches_complex_rotation():
    # GPT-J style is multiplication of (x0 + i x1) by e^{i pos freq}: an independent oracle.
    d, pos, theta = 32, 123, 10000.0
    x = torch.randn(1, d, dtype=torch.float64)
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.view(1, d // 2, 2).contiguous()) * torch.polar(torch.ones(d // 2, dtype=torch.float64), pos * freqs)
    expected = torch.view_as_real(z).reshape(1, d)
    cache = ref.rope_cos_sin_cache(200, d, theta, dtype=torch.float64)
    got, _ = ref.rotary_embedding(torch.tensor([pos]), x, None, cache, d, is_neox=False)
    torch.testing.assert_close(got, expected)
    xf = x.float()
    ops.rotary_embedding(torch.tensor([pos]), xf, None, cache.float(), d, False)
    torch.testing.assert_close(xf.double(), expected, atol=1e-5, rtol=1e-5)


def test_llama3_scaling():
    # Llama-3.1 config: factor 8, low 1, high 4, original context 8192.
    s = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}
    base = ref.rope_inv_freq(128, 500000.0)
    scaled = ref.rope_inv_freq(128, 500000.0, s)
    wavelen = 2 * math.pi / base
    hi = wavelen < 8192 / 4      # short wavelengths: unchanged
    lo = wavelen > 8192 / 1      # long wavelengths: divided by the factor
    assert hi.any() and lo.any()
    torch.testing.assert_close(scaled[hi], base[hi])
    torch.testing.assert_close(scaled[lo], base[lo] / 8)
    mid = ~hi & ~lo              # in between: a smooth blend, monotone in the wavelength
    assert ((scaled[mid] <= base[mid]) & (scaled[mid] >= base[mid] / 8)).all()
    with pytest.raises(ValueError, match="not supported"):
        ref.rope_inv_freq(64, 10000.0, {"rope_type": "dynamic", "factor": 2.0})


def test_rotary_embedding_errors():
    cache = ref.rope_cos_sin_cache(16, 64, 10000.0)
    q = torch.randn(2, 128)
    with pytest.raises(RuntimeError, match="'positions'.*outside"):
        ops.rotary_embedding(torch.tensor([0, 16]), q, None, cache, 64)
    with pytest.raises(RuntimeError, match="'query' last dim 128 is not a multiple of head_size 48"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, None, ref.rope_cos_sin_cache(16, 48, 1e4), 48)
    with pytest.raises(RuntimeError, match="'positions' has dtype"):
        ops.rotary_embedding(torch.tensor([0, 1], dtype=torch.int32), q, None, cache, 64)
    with pytest.raises(RuntimeError, match="'cos_sin_cache'.*rot_dim"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, None, torch.randn(16, 66), 64)
    with pytest.raises(RuntimeError, match="'key'.*num_tokens"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, torch.randn(3, 64), cache, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype, device, gen):
    _, q, k = _qkv(5, 9, 3, 64, dtype, device, gen)
    cache = ref.rope_cos_sin_cache(64, 64, 10000.0).to(device)
    pos = torch.randint(0, 64, (5,), generator=gen).to(device)
    opcheck(torch.ops.decodekit.rotary_embedding.default, (pos, q.clone(), k.clone(), cache, 64, True))
