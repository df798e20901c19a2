"""Tensor-parallel sharding without processes: the plan's slices and errors, packed weights cut by rows
and columns, and loaders that read only a rank's slice (GGUF through the memory map, safetensors with
get_slice, random presets) giving exactly the slice of the whole weight."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from decodekit.config import ModelConfig
from decodekit.distributed.sharding import ShardPlan, TPConfigError, shard_weight
from decodekit.loader import expected_weight_shapes, load_model
from decodekit.loader.random import preset_config


def _cfg(**kw):
    base = dict(vocab_size=1001, hidden_size=128, intermediate_size=256, num_layers=1, num_heads=8,
                num_kv_heads=2, head_dim=16)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("n, bad", [(3, "attention heads"), (16, "attention heads"), (5, "attention heads")])
def test_plan_rejects_sizes_that_do_not_split(n, bad):
    with pytest.raises(TPConfigError, match=rf"tensor_parallel_size {n}.*{bad}.*allowed sizes: \[1, 2, 4, 8\]"):
        ShardPlan(_cfg(), 0, n)


def test_plan_rejects_kv_heads_and_features():
    with pytest.raises(TPConfigError, match="KV heads"):          # 6 q heads, 4 KV heads, TP 3: 3 !| 4, 4 !| 3
        ShardPlan(_cfg(num_heads=12, num_kv_heads=4), 0, 3)
    with pytest.raises(TPConfigError, match="intermediate_size"):
        ShardPlan(_cfg(intermediate_size=250), 0, 4)
    with pytest.raises(TPConfigError, match="rank"):
        ShardPlan(_cfg(), 2, 2)


def test_plan_slices_cover_every_weight_once():
    """Over the ranks, the split weights' slices tile the full weight (KV heads: replicated when TP >
    num_kv_heads), and local shapes follow the local config."""
    for n in (1, 2, 4, 8):
        c = _cfg()
        shapes = expected_weight_shapes(c)
        plans = [ShardPlan(c, r, n) for r in range(n)]
        for name, shape in shapes.items():
            sels = [p.selection(name) for p in plans]
            if sels[0] is None:
                continue
            dim = sels[0][0]
            covered = sorted({(a, b) for _, a, b in sels})
            assert covered[0][0] == 0 and covered[-1][1] == shape[dim], name
            assert all(x[1] == y[0] for x, y in zip(covered, covered[1:])), name
            copies = n // len(covered)
            assert copies == (plans[0].kv_replication if "k_proj" in name or "v_proj" in name else 1), name
        lc = plans[0].local_config
        assert lc.num_heads == 8 // n and lc.num_kv_heads == max(1, 2 // n) and lc.intermediate_size == 256 // n
        assert lc.num_heads % lc.num_kv_heads == 0


def test_uneven_vocabulary():
    plans = [ShardPlan(_cfg(), r, 4) for r in range(4)]
    assert [p.vocab_range for p in plans] == [(0, 251), (251, 502), (502, 753), (753, 1001)][:3] + [(753, 1001)]


def _packed_cases(gen):
    from decodekit.quant import quantize_rtn
    from decodekit.quant.fp8 import quantize_fp8_weight
    from decodekit.quant.int8 import Int8Weight
    w = torch.randn(96, 256, generator=gen)
    q8 = Int8Weight(torch.randint(-127, 128, (96, 256), generator=gen, dtype=torch.int8),
                    torch.rand(96, 8, generator=gen).half() + 0.01, 32)
    return [("int4", quantize_rtn(w, 32)), ("int8", q8), ("fp8", quantize_fp8_weight(w))]


def _dense(w):
    from decodekit import ops
    from decodekit.quant import Int4Weight
    from decodekit.quant.int8 import Int8Weight
    if isinstance(w, Int4Weight):
        return ops.int4_dequantize(w, torch.float32)
    if isinstance(w, Int8Weight):
        return w.qweight.float() * w.scales.float().repeat_interleave(w.group_size, 1)
    return w.dequantize()


@pytest.mark.parametrize("kind", ["int4", "int8", "fp8"])
def test_packed_weights_cut_like_their_dense_values(kind, gen):
    """Rows (column-parallel) and group-aligned columns (row-parallel) of packed weights decode to
    exactly the slices of the decoded whole."""
    w = dict(_packed_cases(gen))[kind]
    full = _dense(w)
    c = _cfg(hidden_size=96, intermediate_size=256, num_heads=6, num_kv_heads=2, head_dim=16)
    for r in range(2):
        plan = ShardPlan(c, r, 2)
        down = shard_weight("model.layers.0.mlp.down_proj.weight", w, plan)        # [96, 256] columns 128 each
        assert torch.equal(_dense(down), full[:, r * 128:(r + 1) * 128])
        gate = shard_weight("model.layers.0.mlp.gate_proj.weight", w, plan)        # rows
        assert torch.equal(_dense(gate), full[r * 128:(r + 1) * 128]) if w.shape[0] >= 256 else True
        # the slices own their storage (the whole can be freed)
        t = down.qweight
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_packed_columns_off_the_groups_fail_clearly(gen):
    from decodekit.quant import quantize_rtn
    w = quantize_rtn(torch.randn(64, 96 * 4, generator=gen), 32)               # 384 columns / 8 = 48 each
    plan = ShardPlan(_cfg(intermediate_size=384), 1, 8)
    with pytest.raises(TPConfigError, match="groups of 32"):
        shard_weight("model.layers.0.mlp.down_proj.weight", w, plan)


def _same_slices(whole: dict, part: dict, plan: ShardPlan):
    from decodekit.quant.packed import PackedWeight
    assert set(whole) == set(part)
    for name, w in whole.items():
        cut = shard_weight(name, w, plan)
        got = part[name]
        if isinstance(cut, PackedWeight):
            for f in dataclasses.fields(cut):
                a, b = getattr(cut, f.name), getattr(got, f.name)
                assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b), (name, f.name)
        else:
            assert torch.equal(cut, got), name


@pytest.mark.parametrize("rank, keep_quantized", [(2, True), (1, False)])
def test_gguf_reads_only_the_rank_slice(gguf_path, rank, keep_quantized):
    """The embedded Q4_1 GGUF (q/k rows in llama.cpp's permuted order, Q8_0 embedding) loaded as rank
    `rank` of 3 equals the whole model cut afterwards, packed or dequantized."""
    whole = load_model(gguf_path, progress=False, keep_quantized=keep_quantized)
    plan = ShardPlan(whole.config, rank, 3)
    part = load_model(gguf_path, progress=False, keep_quantized=keep_quantized,
                      shard=lambda cfg: ShardPlan(cfg, rank, 3))
    _same_slices(whole.weights, part.weights, plan)


def test_random_preset_shards(gen):
    whole = load_model("random:tiny-gqa4", progress=False)
    for r in range(4):
        plan = ShardPlan(whole.config, r, 4)
        part = load_model("random:tiny-gqa4", progress=False, shard=lambda cfg, r=r: ShardPlan(cfg, r, 4))
        _same_slices(whole.weights, part.weights, plan)


def test_safetensors_reads_only_the_rank_slice(tmp_path, hf_tok):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "m")
    hf_tok.save_pretrained(tmp_path / "m")
    whole = load_model(str(tmp_path / "m"), progress=False)
    for r in range(2):
        plan = ShardPlan(whole.config, r, 2)
        part = load_model(str(tmp_path / "m"), progress=False, shard=lambda c, r=r: ShardPlan(c, r, 2))
        _same_slices(whole.weights, part.weights, plan)      # q/k/v biases (Qwen2) too


def test_smollm2_preset_sizes():
    c = preset_config("smollm2-135m")
    assert [n for n in range(1, 10) if _ok(c, n)] == [1, 3]


def _ok(c, n):
    try:
        ShardPlan(c, 0, n)
        return True
    except TPConfigError:
        return False


def test_driver_broadcasts_the_host_copies_of_the_step_inputs():
    """On CUDA the ModelRunner keeps the host tensors each step's inputs were copied from (md.host); the
    TP driver sends those (no device-to-host copy) only for the very input_ids they belong to, and the
    workers never receive the `host` field."""
    import torch
    from decodekit.distributed.worker import _host_inputs, _to_device, _to_host
    from decodekit.models import AttentionMetadata

    def md_of(n, host=None):
        return AttentionMetadata(positions=torch.arange(n), slot_mapping=torch.arange(n), block_tables=torch.zeros(1, 2,
                                 dtype=torch.int32), seq_lens=torch.tensor([n], dtype=torch.int32),
                                 query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                                 logits_indices=torch.tensor([n - 1]), host=host)
    ids, ids_host, host_md = torch.arange(5), torch.arange(5) + 100, md_of(5)
    md = md_of(5, host=(ids, ids_host, host_md))
    got_ids, got_md = _host_inputs(ids, md)
    assert got_ids is ids_host and got_md is host_md
    other = torch.arange(5)  # equal values, another tensor: not the inputs md was built with -> copies
    got_ids, got_md = _host_inputs(other, md)
    assert got_ids is other and got_md.host is None and torch.equal(got_md.positions, md.positions)
    assert _to_host(md).host is None and _to_device(md, torch.device("cpu")).host is None


def test_cpu_runner_metadata_has_no_host_copies():
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    eng = LLMEngine(EngineArgs(model="random:tiny-gqa4", max_model_len=64, kv_cache_memory="8MiB"))
    ids, md = eng.runner.prepare_seqs([[1, 2, 3]], [0], [[0]], [1])
    assert md.host is None and ids.tolist() == [1, 2, 3] and md.positions.tolist() == [0, 1, 2]
