"""decoder_layer: one Llama-family layer per op call (csrc/decoder_layer.cpp).

The op issues the model's op-by-op sequence (models/llama.py) from C++, so it must equal that
sequence bit for bit (the engine's outputs may not depend on which path ran), and both must agree
with the float64 reference (reference.decoder_layer). Outputs, workspace and unwritten cache slots
are poisoned with NaN first."""
import pytest
import torch
from torch.library import opcheck

from dk_testing import DEVICES, DTYPES, cuda_only, randn
from decodekit import ops
from decodekit.ops import reference as ref
from decodekit.quant import Int4Weight, Int8Weight
from decodekit.quant.int4 import quantize_rtn

HIDDEN, INTER = 128, 192

# (num_q_heads, num_kv_heads, head_dim, block_size): GQA group 3 (SmolLM2), MHA, group 4
CONFIGS = [(9, 3, 64, 16), (4, 4, 128, 32), (8, 2, 64, 16)]
CASES = {  # name: (context lengths incl. new tokens, new tokens per sequence)
    "decode": ([15, 16, 17, 100], [1, 1, 1, 1]),
    "mixed": ([37, 50, 1], [13, 50, 1]),  # a prefill chunk starting mid-block, a whole prompt, a decode
}
# weight formats per projection (qkv, o, gate_up, down): int4 with a group size, int8 (G = 32), or dense
# ("a": INT4 with the CPU's AMX copy, ops.prepare_amx_rows: the fused layer gets it as the 4th operand; "o": held
# only as that copy, drop_stored=True: qweight / scales / mins are [N, 0] placeholders)
FORMATS = {"int4-g32": ("i4/32",) * 4, "mixed": ("i4/64", "i8", "i4/32", "i8"), "dense": ("dense",) * 4,
           "dense-mixed": ("dense", "i4/32", "i8", "dense"), "int4-amx": ("i4/32a", "i4/64a", "i8", "i4/64a"),
           "int4-copy-only": ("i4/32o", "i4/64o", "i8", "i4/64o"), "int8-amx": ("i8o", "i8a", "i8o", "i8")}


def _packed(fmt: str, n: int, k: int, gen: torch.Generator, dtype=torch.float32):
    w = torch.randn(n, k, generator=gen) * k ** -0.5
    if fmt == "dense":
        return w.to(dtype)
    if fmt.startswith("i8"):
        scales = (w.view(n, k // 32, 32).abs().amax(2) / 127).clamp_min(1e-6).half()
        q = torch.round(w.view(n, k // 32, 32) / scales.float()[:, :, None]).clamp(-127, 127).to(torch.int8)
        return Int8Weight(q.view(n, k).contiguous(), scales.contiguous(), 32)
    return quantize_rtn(w, int(fmt.split("/")[1].rstrip("ao")))


def _layer(hq, hk, d, fmts, bias, dtype, device, gen, qk=False):
    """(weights, qkv bias, norms: [input, post] (+ [q_norm, k_norm] with qk, Qwen3's head norms))."""
    q, kv = hq * d, hk * d
    ws = [_packed(f, n, k, gen, dtype) for f, (n, k) in zip(fmts, [(q + 2 * kv, HIDDEN), (HIDDEN, q),
                                                                  (2 * INTER, HIDDEN), (HIDDEN, INTER)])]
    ws = [w.to(device) for w in ws]
    for f, w in zip(fmts, ws):
        if f[-1] in "ao" and w.device.type == "cpu" and ops.int4_amx_rows_available():
            ops.prepare_amx_rows(w, drop_stored=f.endswith("o"))
    qkv_bias = randn((q + 2 * kv,), dtype, device, gen, 0.1) if bias else None
    norms = [(1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(dtype).to(device) for _ in range(2)]
    if qk:
        norms += [(1 + 0.3 * torch.randn(d, generator=gen)).to(dtype).to(device) for _ in range(2)]
    return ws, qkv_bias, norms


def _inputs(ctx_lens, new_lens, hk, d, bs, kv_dtype, dtype, device, gen):
    need = [(c + bs - 1) // bs for c in ctx_lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    bt = torch.full((len(ctx_lens), max(need) + 1), -7, dtype=torch.int32)
    used, slots, positions = 0, [], []
    for i, (c, n) in enumerate(zip(ctx_lens, new_lens)):
        blocks = perm[used:used + need[i]]
        used += need[i]
        bt[i, :need[i]] = blocks.to(torch.int32)
        for p in range(c - n, c):
            positions.append(p)
            slots.append(int(blocks[p // bs]) * bs + p % bs)
    T = sum(new_lens)
    kc = randn((num_blocks, hk, bs, d), torch.float32, "cpu", gen).to(kv_dtype).to(device)
    vc = randn((num_blocks, hk, bs, d), torch.float32, "cpu", gen).to(kv_dtype).to(device)
    md = dict(positions=torch.tensor(positions, device=device), slot_mapping=torch.tensor(slots, device=device),
              block_tables=bt.to(device), seq_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device),
              query_start_loc=torch.tensor([0] + torch.tensor(new_lens).cumsum(0).tolist(), dtype=torch.int32,
                                           device=device))
    hidden = randn((T, HIDDEN), dtype, device, gen)
    residual = randn((T, HIDDEN), dtype, device, gen)
    return hidden, residual, kc, vc, md


def _unfused(hidden, residual, kc, vc, ws, qkv_bias, norms, add_input, hq, hk, d, cs, md, scale, ks, vs, window,
             dr=-1):
    """models/llama.py's layer body, op by op (dr: decode_rows)."""
    T = hidden.shape[0]
    q_size, kv_size = hq * d, hk * d
    if add_input:
        ops.fused_add_rms_norm(hidden, residual, norms[0], 1e-5)
    qkv = ops.linear(hidden, ws[0], qkv_bias, decode_rows=dr)
    q, k, v = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size], qkv[:, q_size + kv_size:]
    if len(norms) == 4:     # Qwen3 (models/llama.py): each head normed, as fresh tensors
        q = ops.rms_norm(q.reshape(-1, d), norms[2], 1e-5).view(T, -1)
        k = ops.rms_norm(k.reshape(-1, d), norms[3], 1e-5).view(T, -1)
    ops.rotary_embedding(md["positions"], q, k, cs, d, True)
    ops.reshape_and_cache(k.view(T, hk, d), v.view(T, hk, d), kc, vc, md["slot_mapping"], ks, vs)
    attn = ops.paged_attention(q.view(T, hq, d), kc, vc, md["block_tables"], md["seq_lens"], md["query_start_loc"],
                               scale, k_scale=ks, v_scale=vs, sliding_window=window)
    h = ops.linear(attn.view(T, q_size), ws[1], decode_rows=dr)
    ops.fused_add_rms_norm(h, residual, norms[1], 1e-5)
    return ops.linear(ops.silu_and_mul(ops.linear(h, ws[2], decode_rows=dr)), ws[3], decode_rows=dr)


def _fused(hidden, residual, kc, vc, ws, qkv_bias, norms, add_input, hq, hk, d, cs, md, scale, ks, vs, window,
           dr=-1):
    T = hidden.shape[0]
    operands = [ops.projection_operands(w) for w in ws]
    nan = float("nan")
    work = torch.full((ops.decoder_layer_workspace_numel(T, hq * d, hk * d, INTER) + 5,), nan, dtype=hidden.dtype,
                      device=hidden.device)
    out = torch.full_like(hidden, nan)
    ops.decoder_layer(out, hidden, residual, work, kc, vc, operands[0][0], qkv_bias, operands[1][0], operands[2][0],
                      operands[3][0], [o[1] for o in operands], norms[0], norms[1], add_input, 1e-5,
                      md["positions"], cs, True, md["slot_mapping"], md["block_tables"], md["seq_lens"],
                      md["query_start_loc"], hq, hk, d, scale, ks, vs, window, *(norms[2:] or [None, None]), dr)
    return out


def _run_both(case, config, fmt, dtype, device, gen, kv_fp8=False, bias=False, add_input=True, window=0, qk=False):
    hq, hk, d, bs = config
    ws, qkv_bias, norms = _layer(hq, hk, d, FORMATS[fmt], bias, dtype, device, gen, qk)
    kv_dtype = torch.float8_e4m3fn if kv_fp8 else dtype
    hidden, residual, kc, vc, md = _inputs(*CASES[case], hk, d, bs, kv_dtype, dtype, device, gen)
    ks = vs = None
    if kv_fp8:
        ks = (0.02 + torch.rand(hk, generator=gen)).to(device)
        vs = (0.02 + torch.rand(hk, generator=gen)).to(device)
    cs = ref.rope_cos_sin_cache(256, d, 10000.0).to(device)
    args = (ws, qkv_bias, norms, add_input, hq, hk, d, cs, md, d ** -0.5, ks, vs, window)
    a = (hidden.clone(), residual.clone(), kc.clone(), vc.clone())
    b = (hidden.clone(), residual.clone(), kc.clone(), vc.clone())
    out_a = _unfused(*a, *args)
    out_b = _fused(*b, *args)
    return (out_a, *a[1:]), (out_b, *b[1:]), (hidden, residual, kc, vc, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", list(CASES))
def test_decoder_layer_matches_op_sequence(case, config, fmt, dtype, device, gen):
    fmts = FORMATS[fmt]
    cuda_rejects = "i8" in fmts or (dtype == torch.float32 and any(f.startswith("i4") for f in fmts))
    if device == "cuda" and case == "mixed" and cuda_rejects:
        with pytest.raises(ValueError, match="decoder_layer on CUDA"):  # past the CUDA GEMV rows: INT4 + fp16/bf16
            _run_both(case, config, fmt, dtype, device, gen)
        return
    unfused, fused, _ = _run_both(case, config, fmt, dtype, device, gen, bias=config[0] == 9,
                                  add_input=case == "decode")
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), unfused, fused):
        assert not torch.isnan(b.float()).any(), f"{name}: NaN (unwritten poison?)"
        assert torch.equal(a, b), f"{name}: fused differs from the op sequence ({(a != b).sum()} elements)"


# (context lengths, new tokens, decode-phase sequences first): 12 decode rows (two blocks, a sequence across
# them) then 24 prompt rows, or 4 (padded to PREFILL_ROWS_MIN)
SPLIT_CASES = {"decode+prefill": ([40, 17, 9, 60, 30], [6, 1, 5, 20, 4], 3),
               "decode+short-prefill": ([40, 17, 9, 25], [6, 1, 5, 4], 3)}


def _sub_md(md, ctx, new, idx):
    """The metadata of sequences idx alone (their rows, block tables, lengths)."""
    starts = [sum(new[:i]) for i in range(len(new))]
    rows = [r for i in idx for r in range(starts[i], starts[i] + new[i])]
    sub = {k: md[k][rows] for k in ("positions", "slot_mapping")}
    sub["block_tables"] = md["block_tables"][idx]
    sub["seq_lens"] = md["seq_lens"][idx]
    sub["query_start_loc"] = torch.tensor([0] + torch.tensor([new[i] for i in idx]).cumsum(0).tolist(),
                                          dtype=torch.int32)
    return sub, rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["int4-g32", "mixed", "dense", "int4-amx", "int4-copy-only"])
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_decoder_layer_decode_rows_batch_invariant(case, fmt, dtype, gen):
    """decode_rows: the fused layer equals the op sequence with the same split, and every sequence's rows (output,
    residual) are bit for bit those of the sequence run alone (a decode sequence's rows all decode rows, a prompt's
    none), the KV cache too."""
    if fmt == "dense" and dtype == torch.bfloat16:
        pytest.skip("dense bf16 prompt rows past dense_route's rows: torch's GEMM (not row-invariant)")
    ctx, new, nd = SPLIT_CASES[case]
    hq, hk, d, bs = 9, 3, 64, 16
    ws, qkv_bias, norms = _layer(hq, hk, d, FORMATS[fmt], True, dtype, "cpu", gen)
    hidden, residual, kc, vc, md = _inputs(ctx, new, hk, d, bs, dtype, dtype, "cpu", gen)
    cs = ref.rope_cos_sin_cache(256, d, 10000.0)
    args = (ws, qkv_bias, norms, True, hq, hk, d, cs)
    D = sum(new[:nd])
    outs = []
    for fn in (_unfused, _fused):
        st = (hidden.clone(), residual.clone(), kc.clone(), vc.clone())
        outs.append((fn(*st, *args, md, d ** -0.5, None, None, 0, D), *st[1:]))
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), *outs):
        assert not torch.isnan(b.float()).any(), f"{name}: NaN (unwritten poison?)"
        assert torch.equal(a, b), f"{name}: fused differs from the op sequence ({(a != b).sum()} elements)"
    out, res, kcb, vcb = outs[1]
    for i in range(len(new)):
        sub, rows = _sub_md(md, ctx, new, [i])
        st = (hidden[rows].clone(), residual[rows].clone(), kc.clone(), vc.clone())
        alone = _fused(*st, *args, sub, d ** -0.5, None, None, 0, new[i] if i < nd else 0)
        assert torch.equal(alone, out[rows]), f"sequence {i}: its rows differ from the batch's"
        assert torch.equal(st[1], res[rows]), f"sequence {i}: residual differs"
        slots = sub["slot_mapping"]
        for c_alone, c_batch in ((st[2], kcb), (st[3], vcb)):
            flat_a, flat_b = c_alone.transpose(1, 2).flatten(0, 1), c_batch.transpose(1, 2).flatten(0, 1)
            assert torch.equal(flat_a[slots], flat_b[slots]), f"sequence {i}: cached K/V differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 7, 40])
@pytest.mark.parametrize("case", list(CASES))
def test_decoder_layer_sliding_window_matches_op_sequence(case, window, device, gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    unfused, fused, _ = _run_both(case, (9, 3, 64, 16), "int4-g32", torch.bfloat16, device,
                                  torch.Generator().manual_seed(seed), window=window)
    full, _, _ = _run_both(case, (9, 3, 64, 16), "int4-g32", torch.bfloat16, device,
                           torch.Generator().manual_seed(seed))
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), unfused, fused):
        assert torch.equal(a, b), name
    assert not torch.equal(unfused[0], full[0])  # (the window is passed on: contexts are longer than 7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["int4-g32", "dense", "mixed"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", list(CASES))
def test_decoder_layer_qk_norm_matches_op_sequence(case, config, fmt, device, gen):
    """Qwen3's q / k head norms inside the op: bitwise the op sequence (which norms [T * heads, D] rows), and
    they change the result."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda" and case == "mixed" and fmt != "dense" and ("i8" in FORMATS[fmt] or dtype == torch.float32):
        pytest.skip("past the CUDA GEMV rows (test_decoder_layer_matches_op_sequence covers the refusal)")
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    unfused, fused, _ = _run_both(case, config, fmt, dtype, device, torch.Generator().manual_seed(seed), qk=True)
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), unfused, fused):
        assert not torch.isnan(b.float()).any(), name
        assert torch.equal(a, b), f"{name}: fused differs from the op sequence ({(a != b).sum()} elements)"
    plain, _, _ = _run_both(case, config, fmt, dtype, device, torch.Generator().manual_seed(seed))
    assert not torch.equal(plain[0], fused[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [(9, 3, 64, 16), (8, 2, 64, 16)], ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
def test_decoder_layer_fp8_kv(config, device, gen):
    unfused, fused, _ = _run_both("mixed", config, "int4-g32", torch.bfloat16, device, gen, kv_fp8=True)
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), unfused, fused):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b), name


# Against float64: 4 packed GEMMs, attention, 2 norms and SwiGLU, each output rounded to the dtype, so
# the error is a few of one stage's (dk_testing.TOL); measured relative to the output's largest value
# (single elements may cancel). Largest seen over these cases: fp32 9.5e-7, fp16 9.1e-4, bf16 7.1e-3;
# the bounds leave ~4-5x.
REL_TOL = {torch.float32: 5e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("fmt", ["mixed", "dense-mixed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}x{}-d{}-b{}".format(*c))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("window,qk", [(0, False), (5, False), (0, True)])
def test_decoder_layer_vs_float64(case, config, dtype, fmt, window, qk, gen):
    hq, hk, d, bs = config
    _, fused, (hidden, residual, kc, vc, args) = _run_both(case, config, fmt, dtype, "cpu", gen, bias=True,
                                                           window=window, qk=qk)
    ws, qkv_bias, norms, add_input, _, _, _, cs, md, scale, ks, vs, _ = args
    operands = [ops.projection_operands(w) for w in ws]
    want = ref.decoder_layer(hidden.double(), residual.double(), kc.double(), vc.double(), operands[0][0],
                             qkv_bias.double(), operands[1][0], operands[2][0], operands[3][0],
                             [o[1] for o in operands], norms[0].double(), norms[1].double(), add_input, 1e-5,
                             md["positions"], cs, True, md["slot_mapping"], md["block_tables"], md["seq_lens"],
                             md["query_start_loc"], hq, hk, d, scale, sliding_window=window,
                             q_norm=norms[2].double() if qk else None, k_norm=norms[3].double() if qk else None)
    for name, got, exp in zip(("out", "residual", "key_cache", "value_cache"), fused, want):
        err = (got.double() - exp).abs().max().item()
        assert err <= REL_TOL[dtype] * exp.abs().max().item(), f"{name} [{dtype}]: max error {err}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 7, 32, 33, 127, 128, 131])
def test_decoder_layer_dense_routes(rows, dtype, gen):
    """Dense projections go where ops.linear sends them (on the CPU: ops.dense_route's dense_gemm,
    torch or fp32-upcast GEMM by rows; the rows here straddle every route's boundaries): bitwise equal,
    which the routes' different summation orders would break if the two sides disagreed."""
    CASES[f"rows{rows}"] = ([rows + 5], [rows])
    try:
        unfused, fused, _ = _run_both(f"rows{rows}", (9, 3, 64, 16), "dense", dtype, "cpu", gen, bias=True)
    finally:
        del CASES[f"rows{rows}"]
    for name, a, b in zip(("out", "residual", "key_cache", "value_cache"), unfused, fused):
        assert not torch.isnan(b.float()).any(), f"{name}: NaN (unwritten poison?)"
        assert torch.equal(a, b), f"{name}: fused differs from the op sequence ({(a != b).sum()} elements)"


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_route_is_a_partition_and_linear_follows_it(dtype, gen, monkeypatch):
    """dense_route's (dense_min_m, dense_max_m, upcast_min_m) splits the rows into dense_gemm, torch and the
    fp32 upcast; ops.linear sends each M where the route says (dense_gemm calls counted)."""
    lo, hi, upcast = ops.dense_route(dtype)
    assert 1 <= lo and hi < upcast and (hi < lo or hi <= 64)   # dense_gemm takes at most 64 rows
    with pytest.raises(RuntimeError, match="'dtype' must be float32, bfloat16 or float16"):
        torch.ops.decodekit.dense_route(torch.float64)
    calls = []
    real = ops.dense_gemm
    monkeypatch.setattr(ops, "dense_gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    w = randn((24, 40), dtype, "cpu", gen, 0.1)
    for M in sorted({1, 2, lo, hi, hi + 1, 33, 129}):
        if M < 1:
            continue
        calls.clear()
        ops.linear(randn((M, 40), dtype, "cpu", gen), w)
        assert bool(calls) == (lo <= M <= hi), (M, (lo, hi, upcast))


def test_decoder_layer_errors(gen):
    hq, hk, d, bs = 9, 3, 64, 16
    ws, qkv_bias, norms = _layer(hq, hk, d, FORMATS["int4-g32"], False, torch.float32, "cpu", gen)
    hidden, residual, kc, vc, md = _inputs([5], [5], hk, d, bs, torch.float32, torch.float32, "cpu", gen)
    operands = [ops.projection_operands(w) for w in ws]
    cs = ref.rope_cos_sin_cache(64, d, 10000.0)

    def call(work_numel=None, heads=hq, groups=(32, 32, 32, 32), qkv=None, qk=(None, None)):
        n = ops.decoder_layer_workspace_numel(5, hq * d, hk * d, INTER) if work_numel is None else work_numel
        torch.ops.decodekit.decoder_layer(
            torch.empty_like(hidden), hidden.clone(), residual.clone(), torch.empty(n), kc, vc,
            operands[0][0] if qkv is None else qkv, None, operands[1][0], operands[2][0], operands[3][0], list(groups),
            norms[0], norms[1], True, 1e-5, md["positions"], cs, True, md["slot_mapping"],
            md["block_tables"], md["seq_lens"], md["query_start_loc"], heads, hk, d, 0.125, None, None, 0, *qk)

    call()
    with pytest.raises(RuntimeError, match="'workspace' must have at least"):
        call(work_numel=100)
    with pytest.raises(RuntimeError, match="'qkv_weight' must have"):
        call(heads=6)
    with pytest.raises(RuntimeError, match="'group_sizes' must hold 4"):
        call(groups=(32, 32, 32))
    with pytest.raises(RuntimeError, match="'qkv_weight' must hold 3 or 4 tensors"):
        call(qkv=[])
    with pytest.raises(RuntimeError, match="'qkv_weight' must hold 3 or 4 tensors"):
        call(qkv=operands[0][0][:3] + [operands[0][0][0]] * 2)
    with pytest.raises(RuntimeError, match="'packed'"):  # a 4th INT4 operand is int4_gemm's packed copy
        call(qkv=operands[0][0][:3] + [operands[0][0][0]])
    with pytest.raises(RuntimeError, match="'q_norm / k_norm' must be given both or neither"):
        call(qk=(torch.ones(d), None))
    with pytest.raises(RuntimeError, match="weight"):   # rms_norm names the head norm's wrong length
        call(qk=(torch.ones(d + 1), torch.ones(d)))


def test_decoder_layer_opcheck(gen):
    _, _, (hidden, residual, kc, vc, args) = _run_both("mixed", (9, 3, 64, 16), "mixed", torch.float32, "cpu", gen)
    ws, qkv_bias, norms, add_input, hq, hk, d, cs, md, scale, ks, vs, _ = args
    operands = [ops.projection_operands(w) for w in ws]
    T = hidden.shape[0]
    work = torch.empty(ops.decoder_layer_workspace_numel(T, hq * d, hk * d, INTER))
    opcheck(torch.ops.decodekit.decoder_layer.default,
            (torch.empty_like(hidden), hidden, residual, work, kc, vc, operands[0][0], None, operands[1][0],
             operands[2][0], operands[3][0], [o[1] for o in operands], norms[0], norms[1], True, 1e-5,
             md["positions"], cs, True, md["slot_mapping"], md["block_tables"], md["seq_lens"],
             md["query_start_loc"], hq, hk, d, scale, None, None, 9))
    opcheck(torch.ops.decodekit.decoder_layer.default,      # with Qwen3's head norms
            (torch.empty_like(hidden), hidden, residual, work, kc, vc, operands[0][0], None, operands[1][0],
             operands[2][0], operands[3][0], [o[1] for o in operands], norms[0], norms[1], True, 1e-5,
             md["positions"], cs, True, md["slot_mapping"], md["block_tables"], md["seq_lens"],
             md["query_start_loc"], hq, hk, d, scale, None, None, 0, torch.ones(d) * 1.5, torch.ones(d) * 0.5))


@pytest.mark.parametrize("quantization,dtype", [("int4-rtn", "auto"), (None, "auto"), (None, "bfloat16"),
                                                (None, "float16"), ("fp8", "auto")])
def test_model_fused_layers_equal_op_by_op(quantization, dtype, monkeypatch):
    """The engine's outputs (tokens and logprobs) do not depend on the path: decoder_layer where every
    projection is packed or dense, op by op otherwise (DECODEKIT_FUSED_LAYERS=0; fp8 never fuses).
    Two fresh engines: a second run in the same one would hit the prefix cache (other GEMM shapes)."""
    from decodekit import LLM, SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=12, logprobs=3, ignore_eos=True)
    prompts = [[5, 9, 200, 31, 7] * 7, [11, 12], [400]]
    results = []
    for env in ("1", "0"):
        monkeypatch.setenv("DECODEKIT_FUSED_LAYERS", env)
        llm = LLM(model="random:tiny-gqa4", quantization=quantization, dtype=dtype)
        assert llm.llm_engine.runner.model.fused_layers == (quantization != "fp8" and env == "1")
        results.append(llm.generate(prompts, sp))
    for x, y in zip(*results):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert x.outputs[0].logprobs == y.outputs[0].logprobs


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=cuda_only)])
def test_decoder_layer_cuda_vs_cpu(device, gen):
    """The CUDA registration runs the CUDA kernels in the same sequence: close to the CPU's result."""
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    got = _run_both("mixed", (9, 3, 64, 16), "int4-g32", torch.bfloat16, device, torch.Generator().manual_seed(seed))
    want = _run_both("mixed", (9, 3, 64, 16), "int4-g32", torch.bfloat16, "cpu", torch.Generator().manual_seed(seed))
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a.cpu().float(), b.float(), atol=5e-2, rtol=5e-2)


# ---- decoder_layers: a stack of layers in one op call (csrc/decoder_layer.cpp) --------------------------------
# per layer: (weight formats, sliding window); odd and even counts (the layers' buffers alternate)
STACKS = {"one": [("int4-g32", 0)], "two": [("mixed", 0), ("dense-mixed", 5)],
          "two-packed": [("int4-g32", 0), ("mixed", 3)],   # (also on CUDA: packed formats only)
          "three": [("int4-g32", 0), ("mixed", 7), ("int4-amx", 0)]}


def _stack_inputs(stack, case, config, dtype, device, gen, kv_fp8=False, qk=False):
    hq, hk, d, bs = config
    layers = [(*_layer(hq, hk, d, FORMATS[fmt], True, dtype, device, gen, qk), window) for fmt, window in STACKS[stack]]
    kv_dtype = torch.float8_e4m3fn if kv_fp8 else dtype
    hidden, residual, kc, vc, md = _inputs(*CASES[case], hk, d, bs, kv_dtype, dtype, device, gen)
    caches = [(kc, vc)] + [(randn(kc.shape, torch.float32, "cpu", gen).to(kv_dtype).to(device),
                            randn(vc.shape, torch.float32, "cpu", gen).to(kv_dtype).to(device)) for _ in layers[1:]]
    scales = [((0.02 + torch.rand(hk, generator=gen)).to(device), (0.02 + torch.rand(hk, generator=gen)).to(device))
              if kv_fp8 else (None, None) for _ in layers]
    cs = ref.rope_cos_sin_cache(256, d, 10000.0).to(device)
    return layers, hidden, residual, caches, scales, md, cs


def _stack_flat(layers):
    """decoder_layers' per-layer lists: weights flat, counts, biases, group sizes, norms, windows, head norms."""
    weights, counts, groups = [], [], []
    for ws, _, _, _ in layers:
        for w in ws:
            operands, g = ops.projection_operands(w)
            weights += operands
            counts.append(len(operands))
            groups.append(g)
    qk = len(layers[0][2]) == 4
    return (weights, counts, [b for _, b, _, _ in layers], groups, [n[0] for _, _, n, _ in layers],
            [n[1] for _, _, n, _ in layers], [w for *_, w in layers], [n[2] for _, _, n, _ in layers] if qk else None,
            [n[3] for _, _, n, _ in layers] if qk else None)


def _run_stack(layers, hidden, residual, caches, scales, md, cs, config, add_input, dr=-1):
    """(one decoder_layers call, the same layers as decoder_layer calls): (out, residual, caches) each, the inputs
    cloned; outputs and workspaces poisoned."""
    hq, hk, d, _ = config
    T, nan = hidden.shape[0], float("nan")
    numel = ops.decoder_layer_workspace_numel(T, hq * d, hk * d, INTER) + 3
    meta = (md["positions"], cs, True, md["slot_mapping"], md["block_tables"], md["seq_lens"], md["query_start_loc"],
            hq, hk, d, d ** -0.5)
    results = []
    for stacked in (True, False):
        h, r = hidden.clone(), residual.clone()
        kv = [(k.clone(), v.clone()) for k, v in caches]
        work = torch.full((numel,), nan, dtype=h.dtype, device=h.device)
        out = torch.full_like(h, nan)
        if stacked:
            weights, counts, biases, groups, inn, post, windows, qn, kn = _stack_flat(layers)
            ops.decoder_layers(out, h, r, work, [k for k, _ in kv], [v for _, v in kv], weights, counts, biases,
                               groups, inn, post, add_input, 1e-5, *meta, [s[0] for s in scales],
                               [s[1] for s in scales], windows, qn, kn, dr)
        else:
            for i, (ws, bias, norms, window) in enumerate(layers):
                operands = [ops.projection_operands(w) for w in ws]
                ops.decoder_layer(out, h, r, work, *kv[i], operands[0][0], bias, operands[1][0], operands[2][0],
                                  operands[3][0], [o[1] for o in operands], norms[0], norms[1], add_input or i > 0,
                                  1e-5, *meta, *scales[i], window, *(norms[2:] or [None, None]), dr)
                h, out = out, torch.full_like(h, nan)
            out = h
        results.append((out, r, kv))
    return results


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", ["plain", "fp8-kv", "qk-norm", "no-add"])
def test_decoder_layers_equal_decoder_layer_calls(variant, case, stack, dtype, device, gen):
    """decoder_layers is decoder_layer on each layer in turn: bitwise the same outputs, residual and caches."""
    config = (9, 3, 64, 16)
    if device == "cuda" and (case == "mixed" or any("dense" in f or "amx" in f for f, _ in STACKS[stack])):
        pytest.skip("CUDA: the GEMV rows and packed formats only (test_decoder_layer_matches_op_sequence)")
    inputs = _stack_inputs(stack, case, config, dtype, device, gen, kv_fp8=variant == "fp8-kv",
                           qk=variant == "qk-norm")
    stacked, calls = _run_stack(*inputs, config, add_input=variant != "no-add")
    assert not torch.isnan(stacked[0].float()).any(), "out: NaN (unwritten poison?)"
    assert torch.equal(stacked[0], calls[0]) and torch.equal(stacked[1], calls[1])
    for (k1, v1), (k2, v2) in zip(stacked[2], calls[2]):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoder_layers_decode_rows_and_float64(dtype, gen):
    """decode_rows passes through (bitwise the calls with it), and the stack agrees with reference.decoder_layers in
    float64 within the one-layer bound times the layer count (each layer's error feeds the next)."""
    config = (9, 3, 64, 16)
    hq, hk, d, _ = config
    layers, hidden, residual, caches, scales, md, cs = _stack_inputs("three", "mixed", config, dtype, "cpu", gen)
    stacked, calls = _run_stack(layers, hidden, residual, caches, scales, md, cs, config, True, dr=2)
    assert torch.equal(stacked[0], calls[0]) and torch.equal(stacked[1], calls[1])
    weights, counts, biases, groups, inn, post, windows, qn, kn = _stack_flat(layers)
    dbl = (lambda xs: [None if x is None else (x.double() if x.is_floating_point() and x.dtype.itemsize >= 2 else x)
                       for x in xs])
    want = ref.decoder_layers(hidden.double(), residual.double(), [k.double() for k, _ in caches],
                              [v.double() for _, v in caches], weights, counts, dbl(biases), groups, dbl(inn),
                              dbl(post), True, 1e-5, md["positions"], cs, True, md["slot_mapping"],
                              md["block_tables"], md["seq_lens"], md["query_start_loc"], hq, hk, d, d ** -0.5,
                              [], [], windows, [], [])
    got = stacked[0].double()
    err = (got - want[0]).abs().max().item()
    assert err <= 3 * REL_TOL[dtype] * want[0].abs().max().item(), f"out [{dtype}]: max error {err}"


def test_decoder_layers_errors(gen):
    config = (9, 3, 64, 16)
    hq, hk, d, _ = config
    layers, hidden, residual, caches, scales, md, cs = _stack_inputs("two", "decode", config, torch.float32, "cpu", gen)
    weights, counts, biases, groups, inn, post, windows, _, _ = _stack_flat(layers)
    work = torch.empty(ops.decoder_layer_workspace_numel(hidden.shape[0], hq * d, hk * d, INTER))
    kcs, vcs = [k for k, _ in caches], [v for _, v in caches]

    def call(**over):
        a = dict(out=torch.empty_like(hidden), hidden=hidden.clone(), kcs=kcs, vcs=vcs, weights=weights,
                 counts=counts, biases=biases, groups=groups, inn=inn, post=post, ks=[], windows=windows)
        a.update(over)
        torch.ops.decodekit.decoder_layers(
            a["out"], a["hidden"], residual.clone(), work, a["kcs"], a["vcs"], a["weights"], a["counts"], a["biases"],
            a["groups"], a["inn"], a["post"], True, 1e-5, md["positions"], cs, True, md["slot_mapping"],
            md["block_tables"], md["seq_lens"], md["query_start_loc"], hq, hk, d, 0.125, a["ks"], [], a["windows"],
            [], [], -1)

    call()
    for over, msg in [(dict(kcs=[], vcs=[]), "'key_caches' must hold at least one"),
                      (dict(vcs=vcs[:1]), "'value_caches' must have 2 entries"),
                      (dict(counts=counts[:7]), "'weight_counts' must have 8 entries"),
                      (dict(counts=counts[:7] + [5]), r"'weight_counts' entries must be in \[1, 4\]"),
                      (dict(weights=weights[:-1]), "'weights' must have"),
                      (dict(biases=biases[:1]), "'qkv_biases' must have 2 entries"),
                      (dict(groups=groups[:4]), "'group_sizes' must have 8 entries"),
                      (dict(inn=inn[:1]), "'input_norms' must have 2"),
                      (dict(ks=[None]), "'k_scales' must have 2 entries .one per layer. or none"),
                      (dict(windows=[0]), "'sliding_windows' must have 2")]:
        with pytest.raises(RuntimeError, match=msg):
            call(**over)
    h = hidden.clone()
    with pytest.raises(RuntimeError, match="'out' and 'hidden' must be different"):
        call(out=h, hidden=h)
    with pytest.raises(RuntimeError, match="'qkv_weight' must hold"):  # a layer's own checks name the projection
        call(counts=[2] + counts[1:], weights=weights[:2] + weights[3:])


def test_decoder_layers_opcheck(gen):
    config = (9, 3, 64, 16)
    hq, hk, d, _ = config
    layers, hidden, residual, caches, scales, md, cs = _stack_inputs("two", "mixed", config, torch.float32, "cpu",
                                                                     gen, qk=True)
    weights, counts, biases, groups, inn, post, windows, qn, kn = _stack_flat(layers)
    work = torch.empty(ops.decoder_layer_workspace_numel(hidden.shape[0], hq * d, hk * d, INTER))
    opcheck(torch.ops.decodekit.decoder_layers.default,
            (torch.empty_like(hidden), hidden, residual, work, [k for k, _ in caches], [v for _, v in caches],
             weights, counts, biases, groups, inn, post, True, 1e-5, md["positions"], cs, True, md["slot_mapping"],
             md["block_tables"], md["seq_lens"], md["query_start_loc"], hq, hk, d, d ** -0.5, [], [], windows, qn, kn,
             -1))


@pytest.mark.parametrize("num_layers", [0, 1, 2, None])
def test_model_fused_stack_prefixes(num_layers):
    """LlamaModel.forward(num_layers=n) (layer-skip drafting: the first n layers, then the LM head) through
    decoder_layers equals the op-by-op path, n = 0 (no layer) included."""
    from decodekit import LLM
    eng = LLM(model="random:tiny-gqa4").llm_engine
    model, runner = eng.runner.model, eng.runner
    assert model.fused_layers
    ids, md = runner.prepare_seqs([[5, 9, 200, 31], [7]], [0, 0], [[0], [1]], [1, 1])
    got = model.forward(ids, md, runner.kv_caches, num_layers=num_layers)
    model.op_by_op = True
    want = model.forward(ids, md, runner.kv_caches, num_layers=num_layers)
    assert torch.equal(got, want)
