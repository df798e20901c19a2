"""The Llama model over the paged KV cache vs HF transformers with the same weights."""
import pytest
import torch

from decodekit.config import ModelConfig
from decodekit.models import AttentionMetadata, LlamaModel

transformers = pytest.importorskip("transformers")


def _hf_model(bias: bool, gen_seed: int = 0, tie: bool = False, window: int | None = None):
    """window (Qwen2 only): sliding window on layers 1 and 2 (max_window_layers 1)."""
    torch.manual_seed(gen_seed)
    if bias:
        sw = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
        cfg = transformers.Qwen2Config(vocab_size=211, hidden_size=72, intermediate_size=100, num_hidden_layers=3,
                                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                                       rope_theta=10000.0, tie_word_embeddings=tie, rms_norm_eps=1e-6,
                                       attn_implementation="eager", **sw)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=211, hidden_size=72, intermediate_size=100, num_hidden_layers=3,
                                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                                       rope_theta=500000.0, tie_word_embeddings=tie, rms_norm_eps=1e-5,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # HF initialises norms to 1; make them non-trivial
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    rope = dict(cfg.rope_parameters)  # transformers 5 keeps theta and scaling together here
    theta = rope.pop("rope_theta")
    ours = ModelConfig(vocab_size=211, hidden_size=72, intermediate_size=100, num_layers=3, num_heads=9,
                       num_kv_heads=3, head_dim=8, rms_norm_eps=cfg.rms_norm_eps, rope_theta=theta,
                       rope_scaling=rope, max_position_embeddings=256,
                       tie_word_embeddings=tie, attention_bias=bias, sliding_window=window,
                       sliding_window_layers=[1, 2] if window else None)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, LlamaModel(ours, weights)


def _run_paged(model: LlamaModel, seqs: list[list[int]], chunks: list[list[int]], block_size: int = 4):
    """Feeds each sequence in chunks (sizes per step), all sequences batched per step; returns
    the logits of every token position of every sequence, gathered per sequence."""
    num_blocks = 64
    kv = model.allocate_kv_cache(num_blocks, block_size)
    perm = torch.randperm(num_blocks).tolist()  # scattered block ids
    tables, nb = [], 0
    for s in seqs:
        n = (len(s) + block_size - 1) // block_size
        tables.append(perm[nb:nb + n])
        nb += n
    maxb = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (maxb - len(t)) for t in tables], dtype=torch.int32)
    done = [0] * len(seqs)
    logits = [[] for _ in seqs]
    for step in range(len(chunks[0])):
        ids, pos, slots, qsl, lens, rows = [], [], [], [0], [], []
        for i, s in enumerate(seqs):
            n = chunks[i][step]
            for j in range(done[i], done[i] + n):
                ids.append(s[j]); pos.append(j)
                slots.append(tables[i][j // block_size] * block_size + j % block_size)
            rows += list(range(qsl[-1], qsl[-1] + n))
            qsl.append(qsl[-1] + n); lens.append(done[i] + n)
        md = AttentionMetadata(torch.tensor(pos), torch.tensor(slots), bt, torch.tensor(lens, dtype=torch.int32),
                               torch.tensor(qsl, dtype=torch.int32), torch.tensor(rows))
        out = model.forward(torch.tensor(ids), md, kv)
        for i in range(len(seqs)):
            logits[i].append(out[qsl[i]:qsl[i + 1]])
            done[i] += chunks[i][step]
    return [torch.cat(l) for l in logits]


@pytest.mark.parametrize("bias", [False, True], ids=["llama3-rope", "qwen2-bias"])
@pytest.mark.parametrize("tie", [False, True])
def test_matches_hf_with_chunked_prefill_and_decode(bias, tie):
    hf, ours = _hf_model(bias, tie=tie)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (13, 1, 30)]
    # step 1: prefill chunks of different sizes; then decode one token at a time
    chunks = [[5, 4, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [17, 9, 1, 1, 1, 1]]
    got = _run_paged(ours, seqs, chunks)
    for s, lg in zip(seqs, got):
        with torch.no_grad():
            want = hf(torch.tensor([s])).logits[0].float()
        torch.testing.assert_close(lg, want[: lg.shape[0]], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("window", [1, 5, 12])
def test_sliding_window_logits_match_hf(window):
    """Qwen2 with use_sliding_window on layers 1-2 (layer 0 full): logits at every position of sequences
    several windows long, through chunked prefill (chunks starting mid-block) and decode steps."""
    hf, ours = _hf_model(True, window=window)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (40, 7, 33)]
    chunks = [[11, 9, 15, 1, 1, 1, 1], [3, 4, 0, 0, 0, 0, 0], [1, 20, 8, 1, 1, 1, 1]]
    got = _run_paged(ours, seqs, chunks)
    full = _run_paged(_hf_model(True)[1], seqs, chunks)
    for s, lg, lf in zip(seqs, got, full):
        with torch.no_grad():
            want = hf(torch.tensor([s])).logits[0].float()
        torch.testing.assert_close(lg, want[: lg.shape[0]], atol=2e-4, rtol=2e-4)
        if len(s) > window + 1:
            assert not torch.allclose(lg, lf[: lg.shape[0]], atol=1e-3)  # (the window matters)


def _hf_qwen3(tie: bool, window: int | None = None):
    """A tiny Qwen3 (q / k head norms; head_dim 16 where hidden / heads is 8; GQA group 3) and the same weights
    in decodekit's model."""
    torch.manual_seed(3)
    sw = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1) if window else {}
    cfg = transformers.Qwen3Config(vocab_size=211, hidden_size=72, intermediate_size=100, num_hidden_layers=3,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=16,
                                   max_position_embeddings=256, rope_theta=1000000.0, tie_word_embeddings=tie,
                                   rms_norm_eps=1e-6, attn_implementation="eager", **sw)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    ours = ModelConfig(vocab_size=211, hidden_size=72, intermediate_size=100, num_layers=3, num_heads=9,
                       num_kv_heads=3, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=256, tie_word_embeddings=tie, qk_norm=True, architecture="qwen3",
                       sliding_window=window, sliding_window_layers=[1, 2] if window else None)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, LlamaModel(ours, weights)


@pytest.mark.parametrize("tie,window", [(False, None), (True, None), (False, 6)])
def test_qwen3_matches_hf(tie, window):
    """Qwen3: each q / k head RMS-normed before RoPE; logits at every position through chunked prefill and
    decode steps (sliding window on layers 1-2 too)."""
    hf, ours = _hf_qwen3(tie, window)
    assert ours.fused_layers    # decoder_layers with the q / k head norms (the CPU's one call for all layers)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (23, 2, 31)]
    chunks = [[7, 11, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0], [1, 20, 6, 1, 1, 1, 1]]
    got = _run_paged(ours, seqs, chunks)
    for s, lg in zip(seqs, got):
        with torch.no_grad():
            want = hf(torch.tensor([s])).logits[0].float()
        torch.testing.assert_close(lg, want[: lg.shape[0]], atol=2e-4, rtol=2e-4)
    ours.op_by_op = True        # the same ops issued from Python: the same bits
    assert all(torch.equal(a, b) for a, b in zip(_run_paged(ours, seqs, chunks), got))
    ours.op_by_op = False
    # the head norms matter: without them the logits are others
    for L in ours.layers:
        L.q_norm = L.k_norm = None
    plain = _run_paged(ours, seqs, chunks)
    assert not torch.allclose(plain[2], got[2], atol=1e-2)


@pytest.mark.parametrize("extra", [{}, {"beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
                                   {"mscale": 1.0, "mscale_all_dim": 0.707}, {"attention_factor": 0.8}])
def test_yarn_rope_matches_hf(extra):
    """YaRN rope scaling (Qwen2.5 / Qwen3 long-context configs): blended frequencies and the attention factor on
    cos | sin, as transformers computes them; logits through chunked prefill and decode past the original
    context (32 here)."""
    from decodekit.ops.reference import rope_attention_factor, rope_inv_freq
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, **extra}
    torch.manual_seed(5)
    cfg = transformers.Qwen2Config(vocab_size=211, hidden_size=72, intermediate_size=100, num_hidden_layers=2,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                                   rope_theta=10000.0, rms_norm_eps=1e-6, attn_implementation="eager",
                                   rope_scaling=dict(scaling))
    hf = transformers.Qwen2ForCausalLM(cfg).eval()
    ours_cfg = ModelConfig(vocab_size=211, hidden_size=72, intermediate_size=100, num_layers=2, num_heads=9,
                           num_kv_heads=3, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                           max_position_embeddings=256, attention_bias=True, rope_scaling=dict(scaling))
    inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    torch.testing.assert_close(rope_inv_freq(8, 10000.0, ours_cfg.rope_scaling).float(), inv, rtol=1e-6, atol=0)
    assert rope_attention_factor(ours_cfg.rope_scaling) == pytest.approx(af, rel=1e-12) and af != 1.0
    ours = LlamaModel(ours_cfg, {k: v.detach().clone() for k, v in hf.state_dict().items()})
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (60, 3)]
    chunks = [[20, 37, 1, 1, 1], [1, 1, 1, 0, 0]]
    got = _run_paged(ours, seqs, chunks)
    for s, lg in zip(seqs, got):
        with torch.no_grad():
            want = hf(torch.tensor([s])).logits[0].float()
        torch.testing.assert_close(lg, want[: lg.shape[0]], atol=2e-4, rtol=2e-4)


def test_yarn_config_defaults_and_errors():
    """transformers' defaults: original_max_position_embeddings = max_position_embeddings when absent, a null
    factor = their ratio; bad values name the field."""
    base = dict(vocab_size=10, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=2,
                head_dim=8, max_position_embeddings=4096)
    c = ModelConfig(**base, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    assert c.rope_scaling["original_max_position_embeddings"] == 4096
    c = ModelConfig(**base, rope_scaling={"type": "yarn", "factor": None, "original_max_position_embeddings": 1024})
    assert c.rope_scaling["factor"] == 4.0
    for bad, field in (({"beta_fast": -1}, "beta_fast"), ({"mscale": "x"}, "mscale"), ({"truncate": 1}, "truncate"),
                       ({"attention_factor": 0}, "attention_factor"), ({"factor": -2.0}, "factor")):
        with pytest.raises(ValueError, match=f"rope_scaling.{field}"):
            ModelConfig(**base, rope_scaling={"rope_type": "yarn", "factor": 2.0, **bad})
