"""GPTQ quantization (Frantar et al., 2022) of a float model's projections to INT4 (Int4Weight).

gptq_quantize: one weight W [N, K] given H = sum over calibration tokens of x x^T (the inputs of
that linear layer): columns are quantized one at a time (in order of decreasing H diagonal with
act_order), and each column's rounding error is spread over the not yet quantized columns through
the Cholesky factor of H^-1 (in blocks of 128 columns, with lazy updates), which minimises
||X W^T - X Q^T|| much better than rounding to nearest. Group parameters (asymmetric: fp16 scale,
min = -scale * zero in fp16, exactly what Int4Weight decodes) are fixed when the first column of
a group is reached, from the error-updated weights; the error of each column is measured
against that exact decoded value.

gptq_quantize_model: layer by layer (each layer's inputs come from the already quantized layers
before it), the fused q/k/v and gate/up weights share an input (one H, one act-order perm).
The inputs are captured by wrapping decodekit.ops.linear while a calibration forward runs.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from .int4 import Int4Weight


def _group_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit grid of each row of w [N, G] (float64): (scale, min) as stored (fp16),
    the range widened to include 0 so that zero is exactly a code. The scale is at least fp16's smallest
    subnormal (2^-24): a floor below it (was 1e-8) rounds to a zero scale in fp16, and a group of zeros (an
    all-zero row, dead inputs) then got zero = 0 / 0 = NaN, a NaN min, and NaN spread along the whole row."""
    lo = w.amin(dim=1).clamp(max=0)
    hi = w.amax(dim=1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=2.0 ** -24).half()
    zero = torch.round(-lo / scale.double()).clamp(0, 15)
    mins = (-(scale.double() * zero)).half()
    return scale, mins


def gptq_quantize(w: torch.Tensor,      # [N, K] float
                  h: torch.Tensor,      # [K, K] float64: sum of x x^T over calibration inputs
                  group_size: int = 128,
                  act_order: bool = True,
                  damp: float = 0.01,   # fraction of mean(diag(H)) added to the diagonal
                  block: int = 128) -> Int4Weight:
    N, K = w.shape
    G = group_size
    if G not in (32, 64, 128) or K % G:
        raise ValueError(f"gptq_quantize: group_size must be 32, 64 or 128 and divide K = {K}, got {G}")
    if tuple(h.shape) != (K, K):
        raise ValueError(f"gptq_quantize: H must be [{K}, {K}], got {tuple(h.shape)}")
    W = w.detach().to(torch.float64).clone()
    H = h.detach().to(torch.float64).clone()
    if not bool(torch.isfinite(W).all()):
        raise ValueError("gptq_quantize: the weight holds inf or NaN values")
    if not bool(torch.isfinite(H).all()):   # (Cholesky would fail with "not positive-definite")
        raise ValueError("gptq_quantize: H holds inf or NaN values (the calibration inputs of this layer are not "
                         "finite)")
    dead = torch.diag(H) == 0  # inputs never active: weight irrelevant, keep H invertible
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
    H += torch.eye(K, dtype=H.dtype) * (damp * torch.diag(H).mean())
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    codes = torch.empty(N, K, dtype=torch.uint8)
    scales = torch.empty(N, K // G, dtype=torch.float16)
    mins = torch.empty_like(scales)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1 = W[:, i1:i2].clone()
        Err = torch.zeros_like(W1)
        Hb = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % G == 0:  # the group's grid, from the weights as updated so far
                g = col // G
                grp = torch.cat([W1[:, i:], W[:, i2:]], dim=1)[:, :G]
                s, m = _group_params(grp)
                scales[:, g], mins[:, g] = s, m
                sd, md = s.double(), m.double()
            q = torch.round((W1[:, i] - md) / sd).clamp(0, 15)
            codes[:, col] = q.to(torch.uint8)
            deq = (sd.float() * q.float() + md.float()).double()  # what Int4Weight decodes (fp32)
            err = (W1[:, i] - deq) / Hb[i, i]
            W1[:, i:] -= err[:, None] * Hb[i, i:][None, :]
            Err[:, i] = err
        W[:, i2:] -= Err @ Hinv[i1:i2, i2:]
    q = codes.view(N, K // G, G)
    packed = (q[:, :, : G // 2] | (q[:, :, G // 2:] << 4)).reshape(N, K // 2).contiguous()
    return Int4Weight(packed, scales, mins, G, perm)


class _Stop(Exception):
    pass


@contextlib.contextmanager
def _capture_inputs(targets: dict[int, str], hessians: dict[str, torch.Tensor], stop_after: str | None):
    """While active, decodekit.ops.linear adds x x^T of its input to hessians[name] for the weights
    whose id() is in targets; after stop_after's input, the forward is abandoned (_Stop)."""
    from decodekit import ops
    orig = ops.linear

    def linear(x, weight, bias=None, decode_rows=-1):
        name = targets.get(id(weight))
        if name is not None:
            xf = x.detach().reshape(-1, x.shape[-1]).to(torch.float64).cpu()
            hessians[name] = hessians.get(name, 0) + xf.t() @ xf
            if name == stop_after:
                raise _Stop()
        return orig(x, weight, bias, decode_rows)

    ops.linear = linear
    try:
        yield
    finally:
        ops.linear = orig


def gptq_quantize_model(model, run_calibration: Callable[[], None], group_size: int = 128,
                        act_order: bool = True, damp: float = 0.01) -> int:
    """Quantizes every projection of a LlamaModel (decodekit.models) with GPTQ, in place, layer
    by layer. run_calibration: runs the model forward over the calibration tokens (e.g. a prefill
    probe); it is called once per layer. Returns the number of weights quantized (projections
    whose K is not a multiple of group_size stay float)."""
    op_by_op, model.op_by_op = model.op_by_op, True   # the capture hooks ops.linear: no fused layers
    try:
        return _gptq_layers(model, run_calibration, group_size, act_order, damp)
    finally:
        model.op_by_op = op_by_op
        model.refresh_fused_layers()   # the layers' weights changed


_HF_NAMES = {"qkv": "q/k/v_proj", "o": "o_proj", "gate_up": "gate/up_proj", "down": "down_proj"}


def _gptq_layers(model, run_calibration, group_size: int, act_order: bool, damp: float) -> int:
    done = 0
    for li, L in enumerate(model.layers):
        names = [n for n in ("qkv", "o", "gate_up", "down") if isinstance(getattr(L, n), torch.Tensor)
                 and getattr(L, n).shape[1] % group_size == 0]
        if not names:
            continue
        hessians: dict[str, torch.Tensor] = {}
        targets = {id(getattr(L, n)): n for n in names}
        with _capture_inputs(targets, hessians, stop_after=names[-1]), contextlib.suppress(_Stop):
            run_calibration()
        for n in names:
            w = getattr(L, n)
            if n not in hessians:
                raise RuntimeError(f"GPTQ calibration: layer {li} {n} saw no input")
            try:
                q = gptq_quantize(w.float().cpu(), hessians[n], group_size, act_order, damp)
            except ValueError as e:
                raise ValueError(f"GPTQ: layer {li} {_HF_NAMES[n]}: {e}") from None
            setattr(L, n, q.to(w.device))
            done += 1
    return done


def calibration_forward(model, seqs: list[list[int]], block_size: int = 16) -> torch.Tensor:
    """One batched prefill of `seqs` (lists of token ids) through a LlamaModel on a temporary KV
    cache; returns the logits [sum of lengths, vocab]. Batching several short sequences keeps the
    O(n^2) attention of calibration cheap."""
    from decodekit.models import AttentionMetadata
    dev = model.device
    ids, pos, slots, tables, qsl, lens = [], [], [], [], [0], []
    nb = 0
    for s in seqs:
        n = len(s)
        b = -(-n // block_size)
        tables.append(list(range(nb, nb + b)))
        ids += s
        pos += list(range(n))
        slots += [nb * block_size + j for j in range(n)]
        nb += b
        qsl.append(qsl[-1] + n)
        lens.append(n)
    maxb = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (maxb - len(t)) for t in tables], dtype=torch.int32, device=dev)
    kv = model.allocate_kv_cache(nb, block_size)
    i32 = dict(dtype=torch.int32, device=dev)
    md = AttentionMetadata(torch.tensor(pos, device=dev), torch.tensor(slots, device=dev), bt,
                           torch.tensor(lens, **i32), torch.tensor(qsl, **i32), torch.arange(len(ids), device=dev))
    return model.forward(torch.tensor(ids, device=dev), md, kv)


def calibration_text() -> str:
    """English technical prose available offline on every Python: the pydoc topic texts."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))
