"""custom_all_reduce and gemm_allreduce on CUDA through IPC (tests/ops/test_allreduce.py covers the CPU).

CUDA IPC lets several processes on one GPU map each other's buffers, so world sizes 2 and 4 run on a
single GPU (or one rank per GPU when there are enough): processes spawned with a gloo group (NCCL
refuses two ranks on one GPU), each with a CustomAllReduce over cudaIpc handles. Results are compared
with the float64 sum of every rank's inputs (the same bounds as the CPU tests) and must be bitwise
identical across ranks; gemm_allreduce with and without the residual + RMSNorm epilogue, fused (M <= 16)
and cuBLAS + all-reduce (M > 16), and with INT4 / fp8 shards (fused, or their GEMM + all-reduce); a CUDA graph of both ops replayed on new inputs; a peer that never
arrives makes the kernel trap, and timeout_report() names it. Kernels of processes sharing a GPU take
turns (time slicing), so each wait can last a time slice: the tests use few calls.
"""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

from dk_testing import CUDA_OK
from decodekit.ops import reference as ref
from test_allreduce import DTYPES, U, _free_port, bits, check_allreduce, gemm_bound, rand
from test_allreduce_quant import bound as quant_bound
from test_allreduce_quant import fp8_terms, int4_terms

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason="needs a CUDA GPU and a CUDA build")]


def rank_sum(ts: list[torch.Tensor]) -> torch.Tensor:
    """fp32 sum in rank order, rounded to the inputs' dtype (what every rank computes)."""
    acc = ts[0].float()
    for t in ts[1:]:
        acc = acc + t.float()
    return acc.to(ts[0].dtype)


def _init(rank: int, ws: int, port: int):
    import torch.distributed as dist
    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # the bound assumes fp32 sums
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    return dist


def _worker(rank: int, ws: int, port: int, out_dir: str) -> None:
    from decodekit import ops
    from decodekit.distributed.custom_allreduce import CustomAllReduce
    dist = _init(rank, ws, port)
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(99 + rank)
    res = {}
    car = CustomAllReduce(device=dev, max_bytes=1 << 20, timeout_s=60)
    for dtype in DTYPES:
        for n in (1, 7, 1001, 65537, 250000 // (4 // torch.tensor([], dtype=dtype).element_size())):
            for algo in ("one_shot", "two_shot"):
                x = rand((n,), dtype, gen).to(dev)
                out = torch.full_like(x, float("nan"))
                car.all_reduce(x, out=out, algo=algo)
                res[f"ar {dtype} {n} {algo}"] = (x.cpu(), out.cpu())
    for i in range(50):  # repeated calls, alternating buffer halves and algorithms
        x = torch.full((333,), float(i + rank), device=dev)
        res[f"rep {i}"] = car.all_reduce(x, algo="two_shot" if i % 2 else "one_shot").cpu()
    for dtype in (torch.bfloat16, torch.float16):
        for M, N, K in ((1, 520, 256), (5, 1024, 200), (16, 64, 64), (40, 256, 128)):
            a = rand((M, K), dtype, gen).to(dev)
            w = rand((N, K), dtype, gen, scale=0.2).to(dev)
            b = rand((N,), dtype, gen).to(dev)
            resid = rand((M, N), dtype, gen).to(dev)
            nw = (rand((N,), dtype, gen, scale=0.5) + 1).to(dev)
            out = car.gemm_allreduce(a, w, bias=b)
            r2 = resid.clone()
            out2 = car.gemm_allreduce(a, w, bias=b, residual=r2, norm_weight=nw)
            x_exp, r_exp = out.clone(), resid.clone()
            ops.fused_add_rms_norm(x_exp, r_exp, nw, 1e-6)
            res[f"gemm {dtype} {M} {N} {K}"] = [t.cpu() for t in (a, w, b, out, out2, r2, x_exp, r_exp)]
    # packed shards: gemm_allreduce_int4 / _fp8 (fused for M <= 16, the quantized GEMM + all-reduce beyond)
    from test_allreduce_quant import fp8_weight, int4_weight
    for kind in ("int4", "fp8"):
        for dtype in (torch.bfloat16, torch.float16):
            for M, N, K in ((1, 520, 256), (9, 136, 384), (40, 256, 128)):
                a = rand((M, K), dtype, gen)
                w = int4_weight(N, K, 128 if K % 128 == 0 else 64, gen) if kind == "int4" else fp8_weight(N, K, gen)
                b = rand((N,), dtype, gen)
                out = car.gemm_allreduce(a.to(dev), w.to(dev), bias=b.to(dev))
                res[f"quant {kind} {dtype} {M} {N} {K}"] = (a, w, b, out.cpu())
    # CUDA graph: both ops captured once, replayed on new inputs (the epoch advances in device memory)
    x = torch.zeros(4099, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    a = torch.zeros(3, 128, dtype=torch.bfloat16, device=dev)
    w = rand((256, 128), torch.bfloat16, gen, scale=0.2).to(dev)
    g_out = torch.empty(3, 256, dtype=torch.bfloat16, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        car.all_reduce(x, out=y)  # warm-up (lazy initialisation outside the capture)
        car.gemm_allreduce(a, w, out=g_out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        car.all_reduce(x, out=y, algo="one_shot")
        car.all_reduce(y, out=y, algo="two_shot")  # in place
        car.gemm_allreduce(a, w, out=g_out)
    for i in range(3):
        xi, ai = rand((4099,), torch.bfloat16, gen), rand((3, 128), torch.bfloat16, gen)
        x.copy_(xi)
        a.copy_(ai)
        graph.replay()
        torch.cuda.synchronize()
        res[f"graph {i}"] = (xi, y.cpu(), ai, w.cpu(), g_out.cpu())
    car.close()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _run(fn, ws):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(fn, args=(ws, _free_port(), d), nprocs=ws, join=True, start_method="spawn")
        return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(ws)]


@pytest.mark.parametrize("ws", [2, 4])
def test_cuda_ipc_allreduce_and_gemm(ws):
    R = _run(_worker, ws)
    for key in R[0]:
        if key.startswith("ar "):
            xs, outs = [R[r][key][0] for r in range(ws)], [R[r][key][1] for r in range(ws)]
            check_allreduce(outs, xs, xs[0].dtype, f"cuda ws={ws} {key}")
        elif key.startswith("rep "):
            i = int(key.split()[1])
            for r in range(ws):
                assert torch.equal(R[r][key], torch.full((333,), float(ws * i + ws * (ws - 1) // 2))), key
        elif key.startswith("gemm "):
            a = [R[r][key][0] for r in range(ws)]
            w = [R[r][key][1] for r in range(ws)]
            b, out0 = R[0][key][2], R[0][key][3]
            exp = sum(x.double() @ y.double().T for x, y in zip(a, w)) + b.double()
            bound = gemm_bound(a, w, b, a[0].dtype)
            assert ((out0.double() - exp).abs() <= bound).all(), f"{key}: worst {(out0.double() - exp).abs().max()}"
            for r in range(ws):
                out, out2, r2, x_exp, r_exp = R[r][key][3:8]
                assert torch.equal(bits(out), bits(out0)), f"{key}: rank {r} differs from rank 0"
                assert torch.equal(out2, x_exp) and torch.equal(r2, r_exp), f"{key}: rank {r}: epilogue differs"
        elif key.startswith("quant "):
            a, w = [R[r][key][0] for r in range(ws)], [R[r][key][1] for r in range(ws)]
            b, out0 = R[0][key][2], R[0][key][3]
            exp, _ = ref.gemm_allreduce([x.double() for x in a], w, b.double())
            P, A = (int4_terms if "int4" in key else fp8_terms)(a, w)
            dtype = a[0].dtype
            # + the INT4 weights' rounding to T in the tensor-core mainloops (u_T |w| each)
            bound = quant_bound(P, A, b, dtype, a[0].shape[1], 4) + (2 * U[dtype] * sum(A) if "int4" in key else 0)
            err = (out0.double() - exp).abs()
            assert (err <= bound).all(), f"{key}: worst {err.max():.3g}"
            for r in range(ws):
                assert torch.equal(bits(R[r][key][3]), bits(out0)), f"{key}: rank {r} differs from rank 0"
        elif key.startswith("graph "):
            xs = [R[r][key][0] for r in range(ws)]
            exp_y = rank_sum([rank_sum(xs)] * ws)  # one-shot of x, then two-shot of that
            for r in range(ws):
                assert torch.equal(bits(R[r][key][1]), bits(exp_y)), f"{key}: all_reduce replay, rank {r}"
            a = [R[r][key][2] for r in range(ws)]
            w = [R[r][key][3] for r in range(ws)]
            exp = sum(x.double() @ y.double().T for x, y in zip(a, w))
            assert ((R[0][key][4].double() - exp).abs() <= gemm_bound(a, w, None, torch.bfloat16)).all(), key
            for r in range(ws):
                assert torch.equal(R[r][key][4], R[0][key][4]), f"{key}: gemm replay, rank {r}"


def _timeout_worker(rank: int, ws: int, port: int, out_dir: str) -> None:
    from decodekit.distributed.custom_allreduce import CustomAllReduce
    dist = _init(rank, ws, port)
    car = CustomAllReduce(max_bytes=1 << 16, timeout_s=0.5)
    report, err = None, None
    if rank == 0:  # rank 1 never makes this call
        try:
            car.all_reduce(torch.ones(100, device="cuda"))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (the trap surfaces as a CUDA error)
            err = str(e)
        report = car.timeout_report()
    torch.save({"report": report, "err": err}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    os._exit(0)  # rank 0's CUDA context is lost: skip the teardown


def test_cuda_peer_that_never_arrives_traps():
    R = _run(_timeout_worker, 2)
    assert R[0]["err"] is not None, "the kernel should have trapped"
    assert R[0]["report"] is not None and "waiting for rank 1" in R[0]["report"], R[0]


def test_cuda_world_size_1_matches_plain_gemm(gen):
    """World size 1 through the ops (no peers): the fused tiles against a float64 GEMM."""
    from decodekit import ops
    dev = torch.device("cuda")
    sb = ops.allreduce_signal_bytes()
    region = (sb + 4095) // 4096 * 4096
    seg = torch.empty(region + (1 << 20), dtype=torch.uint8, device=dev)
    ops.allreduce_init_signal(seg[:sb], 1, 10.0)
    bp, sp = [seg.data_ptr() + region], [seg.data_ptr()]
    for M in (1, 8, 16):
        a, w = rand((M, 1024), torch.bfloat16, gen).to(dev), rand((1000, 1024), torch.bfloat16, gen, 0.1).to(dev)
        out = ops.gemm_allreduce(a, w, bp, sp, 0, 1 << 20)
        exp = a.double() @ w.double().T
        assert ((out.double() - exp).abs() <= gemm_bound([a.cpu()], [w.cpu()], None, torch.bfloat16).to(dev)).all()
