"""GPTQ quantizer: on correlated calibration inputs it must beat round-to-nearest on the layer
output error (the quantity it minimises), produce codes that decode to what it accounted for,
and, over a whole model, keep the logits closer to the float model's than RTN does."""
from __future__ import annotations

import pytest
import torch

from decodekit import ops
from decodekit.config import ModelConfig
from decodekit.models import LlamaModel
from decodekit.quant import Int4Weight, quantize_rtn
from decodekit.quant.gptq_quantizer import calibration_forward, calibration_text, gptq_quantize, gptq_quantize_model


def _inputs(T, K, gen):
    """Correlated activations with a few large channels (as real hidden states have)."""
    mix = torch.randn(K, K, generator=gen, dtype=torch.float64) / K ** 0.5
    x = torch.randn(T, K, generator=gen, dtype=torch.float64) @ mix
    x[:, torch.randperm(K, generator=gen)[:4]] *= 8
    return x


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group", [32, 128])
def test_gptq_beats_rtn_on_layer_error(act_order, group):
    gen = torch.Generator().manual_seed(group + act_order)
    N, K, T = 96, 256, 1024
    w = torch.randn(N, K, generator=gen) * 0.05
    x = _inputs(T, K, gen)
    q = gptq_quantize(w, x.t() @ x, group, act_order)
    assert isinstance(q, Int4Weight) and q.shape == (N, K) and (q.perm is not None) == act_order
    r = quantize_rtn(w, group)
    xt = x  # the error GPTQ minimises: on its calibration inputs
    ref = xt @ w.double().t()
    err_g = (xt @ ops.int4_dequantize(q).double().t() - ref).norm()
    err_r = (xt @ ops.int4_dequantize(r).double().t() - ref).norm()
    assert err_g < 0.7 * err_r, (err_g.item(), err_r.item())
    # the packed weight through linear (perm applied) equals its dequantized form
    xf = x[:5].float()
    torch.testing.assert_close(ops.linear(xf, q), xf @ ops.int4_dequantize(q).t(), atol=1e-4, rtol=1e-4)


def test_gptq_dead_inputs_and_errors():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 64, generator=gen)
    x = _inputs(200, 64, gen)
    x[:, 5] = 0  # an input that is never active
    q = gptq_quantize(w, x.t() @ x, 32, True)
    assert torch.isfinite(ops.int4_dequantize(q)).all()
    with pytest.raises(ValueError, match="group_size must be"):
        gptq_quantize(w, x.t() @ x, 48)
    with pytest.raises(ValueError, match="H must be"):
        gptq_quantize(w, torch.eye(32, dtype=torch.float64), 32)


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1024)
    h, i = 128, 256
    # token embeddings of low rank with a few large channels: anisotropic activations, as in real
    # models (with isotropic inputs H ~ I and GPTQ reduces to rounding to nearest)
    emb = torch.randn(300, 16) @ torch.randn(16, h) / 4
    emb[:, torch.randperm(h)[:4]] *= 6
    w = {"model.embed_tokens.weight": emb, "model.norm.weight": 1 + 0.1 * torch.randn(h),
         "lm_head.weight": torch.randn(300, h) * 0.2}
    for l in range(2):
        p = f"model.layers.{l}."
        w.update({p + "input_layernorm.weight": 1 + 0.1 * torch.randn(h),
                  p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(h),
                  p + "self_attn.q_proj.weight": torch.randn(h, h) * 0.1,
                  p + "self_attn.k_proj.weight": torch.randn(64, h) * 0.1,
                  p + "self_attn.v_proj.weight": torch.randn(64, h) * 0.1,
                  p + "self_attn.o_proj.weight": torch.randn(h, h) * 0.1,
                  p + "mlp.gate_proj.weight": torch.randn(i, h) * 0.1,
                  p + "mlp.up_proj.weight": torch.randn(i, h) * 0.1,
                  p + "mlp.down_proj.weight": torch.randn(h, i) * 0.1})
    return cfg, w


def _logits(model, ids):
    return calibration_forward(model, [ids[:100], ids[100:]])


def test_gptq_model_closer_than_rtn():
    cfg, w = _tiny_model()
    gen = torch.Generator().manual_seed(3)
    calib = torch.randint(0, 300, (512,), generator=gen).tolist()
    held = torch.randint(0, 300, (200,), generator=gen).tolist()
    ref = _logits(LlamaModel(cfg, dict(w)), held)
    g = LlamaModel(cfg, dict(w))
    assert gptq_quantize_model(g, lambda: calibration_forward(g, [calib[i:i + 128] for i in range(0, 512, 128)]),
                               group_size=32) == 8
    assert all(isinstance(getattr(L, n), Int4Weight) for L in g.layers for n in ("qkv", "o", "gate_up", "down"))
    r = LlamaModel(cfg, {k: quantize_rtn(v, 32) if k.endswith("_proj.weight") else v for k, v in w.items()})
    err_g = (_logits(g, held) - ref).norm()
    err_r = (_logits(r, held) - ref).norm()
    assert err_g < 0.9 * err_r, (err_g.item(), err_r.item())


def test_calibration_text():
    t = calibration_text()
    assert len(t) > 100_000 and "the" in t
