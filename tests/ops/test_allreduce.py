"""custom_all_reduce and gemm_allreduce (include/decodekit/comm/allreduce.h) on the CPU.

Two harnesses:
* threads as ranks in this process (the op releases the GIL): buffers and Signal blocks are plain
  tensors, so the protocol (flags, epochs, the two-shot partition, rank-order sums) is exercised
  quickly on many sizes, including hundreds of calls across the 2^64 epoch wrap;
* processes (torch.multiprocessing spawn, gloo): CustomAllReduce over /dev/shm segments, world
  sizes 2 and 3, as tensor-parallel workers use it.

Tolerance (all_reduce): inputs are already in T; the kernel sums in fp32 in rank order (each of the
ws - 1 additions errs by <= u32 = 2^-24 times the partial sum, <= sum|x|) and rounds once to T
(<= u_T |result|, u_T = 2^-24 / 2^-11 / 2^-8 for fp32 / fp16 / bf16). So
    |out - S| <= u_T |S| + (1 + u_T)(ws - 1) u32 sum_r |x_r|   (+ the smallest subnormal of T),
with S the exact (float64) sum; the test allows 1.01x that. gemm_allreduce adds each rank's partial
product in fp32 (<= (K + 2) u32 sum_k |a||w|, bias included) rounded to T (<= u_T |P_r|):
    |out - S| <= u_T (|S| + sum_r |P_r|) + ws u32 sum_r |P_r| + (K + 2) u32 sum_r |a_r| @ |w_r|^T,
allowed 2x (the M > 32 tiles come from torch's GEMM).
"""
from __future__ import annotations

import os
import socket
import tempfile
import threading

import pytest
import torch
from torch.library import opcheck

from dk_testing import TOL
from decodekit import ops
from decodekit.ops import reference as ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
U = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
TINY = {torch.float32: 2.0 ** -149, torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}
U32 = 2.0 ** -24
# element counts: 1, odd, not a multiple of 16 bytes nor of world_size, a few units per chunk, large
SIZES = [1, 7, 8, 31, 1001, 4099, 65537]


def allreduce_bound(xs: list[torch.Tensor], dtype) -> torch.Tensor:
    s = torch.stack([x.double() for x in xs]).sum(0)
    abs_sum = torch.stack([x.double().abs() for x in xs]).sum(0)
    u = U[dtype]
    return 1.01 * (u * s.abs() + (1 + u) * (len(xs) - 1) * U32 * abs_sum) + TINY[dtype]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (so -0 != +0 and NaN payloads count)."""
    return t.contiguous().view(-1).view({4: torch.int32, 2: torch.int16}[t.element_size()])


def check_allreduce(outs: list[torch.Tensor], xs: list[torch.Tensor], dtype, what: str) -> None:
    exp = ref.custom_all_reduce([x.double() for x in xs])
    for r, o in enumerate(outs):
        assert not torch.isnan(o).any(), f"{what}: rank {r} left poisoned (NaN) elements"
        assert torch.equal(bits(o), bits(outs[0])), f"{what}: rank {r} differs from rank 0 (must be bitwise identical)"
    err = (outs[0].double() - exp).abs()
    bound = allreduce_bound(xs, dtype)
    bad = err > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements beyond the bound, worst err {err[bad].max():.3g} "
                           f"at bound {bound[bad][0]:.3g}")


# ---------------------------------------------------------------------------- threads as ranks

class ThreadRanks:
    """world_size ranks as threads of this process, sharing plain CPU tensors as buffers."""

    def __init__(self, ws: int, buffer_bytes: int = 2 << 20, epoch: int = 0, timeout_s: float = 10.0):
        self.ws, self.buffer_bytes = ws, buffer_bytes
        sb = ops.allreduce_signal_bytes()
        self._keep = []
        self.buffer_ptrs, self.signal_ptrs, self.signals = [], [], []
        for _ in range(ws):
            buf = torch.full((buffer_bytes,), 0xFF, dtype=torch.uint8)  # garbage, never zeros
            raw = torch.empty(sb + 128, dtype=torch.uint8)
            sig = raw[(128 - raw.data_ptr() % 128) % 128:][:sb]
            ops.allreduce_init_signal(sig, ws, timeout_s, epoch)
            self._keep += [buf, raw]
            self.signals.append(sig)
            self.buffer_ptrs.append(buf.data_ptr())
            self.signal_ptrs.append(sig.data_ptr())

    def run(self, fn, ranks=None) -> list:
        """fn(rank) on each rank's thread; returns the results (re-raises the first exception)."""
        ranks = range(self.ws) if ranks is None else ranks
        results, errors = {}, {}

        def body(r):
            try:
                results[r] = fn(r)
            except BaseException as e:  # noqa: BLE001
                errors[r] = e

        th = [threading.Thread(target=body, args=(r,)) for r in ranks]
        for t in th:
            t.start()
        for t in th:
            t.join(60)
        assert not any(t.is_alive() for t in th), "a rank hangs"
        if errors:
            raise next(iter(errors.values()))
        return [results[r] for r in ranks]

    def all_reduce(self, xs, two_shot, outs=None):
        outs = outs or [torch.full_like(x, float("nan")) for x in xs]
        self.run(lambda r: ops.custom_all_reduce(xs[r], self.buffer_ptrs, self.signal_ptrs, r, self.buffer_bytes,
                                                 two_shot, out=outs[r]))
        return outs


def rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("ws", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_threads(ws, dtype, gen):
    g = ThreadRanks(ws)
    for n in SIZES:
        xs = [rand((n,), dtype, gen, scale=10.0 ** (r - 1)) for r in range(ws)]  # mixed magnitudes
        one = g.all_reduce(xs, two_shot=False)
        check_allreduce(one, xs, dtype, f"one-shot ws={ws} n={n}")
        two = g.all_reduce(xs, two_shot=True)
        check_allreduce(two, xs, dtype, f"two-shot ws={ws} n={n}")
        assert torch.equal(one[0], two[0]), f"ws={ws} n={n}: one-shot and two-shot differ (same rank order)"
    # exact for values whose sum is representable: the rank order is the only order
    xs = [torch.full((129,), float(2 ** r), dtype=dtype) for r in range(ws)]
    assert torch.equal(g.all_reduce(xs, False)[0], torch.full((129,), float(2 ** ws - 1), dtype=dtype))


def test_all_reduce_rank_order_and_in_place(gen):
    # fp32 sums depend on the order: 1 + 2^-24 + 2^-24 = 1 in rank order, 1 + 2^-23 the other way
    g = ThreadRanks(3)
    xs = [torch.tensor([1.0] * 5), torch.full((5,), 2.0 ** -24), torch.full((5,), 2.0 ** -24)]
    assert torch.equal(g.all_reduce(xs, False)[0], torch.ones(5))
    assert torch.equal(g.all_reduce(xs, True)[1], torch.ones(5))
    xs = [rand((1001, 3), torch.bfloat16, gen) for _ in range(3)]
    exp = g.all_reduce([x.clone() for x in xs], False)[0]
    g.all_reduce(xs, True, outs=xs)  # out is inp
    for x in xs:
        assert torch.equal(x, exp)


def test_epoch_wraps_and_hundreds_of_calls(gen):
    """300 calls of changing sizes and algorithms across the 2^64 epoch wrap, one-shot / two-shot mixed."""
    g = ThreadRanks(3, buffer_bytes=1 << 16, epoch=-150)  # 2^64 - 150
    n_calls, sizes = 300, [1, 17, 1000, 3]
    xs = [[rand((sizes[i % 4],), torch.float32, gen) for _ in range(3)] for i in range(n_calls)]
    outs = [[torch.full_like(x, float("nan")) for x in c] for c in xs]

    def rank_loop(r):
        for i in range(n_calls):
            ops.custom_all_reduce(xs[i][r], g.buffer_ptrs, g.signal_ptrs, r, g.buffer_bytes, i % 3 == 1,
                                  out=outs[i][r])

    g.run(rank_loop)
    for i in range(n_calls):
        check_allreduce(outs[i], xs[i], torch.float32, f"call {i}")
    epoch = g.signals[0][8:16].view(torch.int64).item()
    assert epoch == -150 + n_calls, "each call advances the epoch by one (mod 2^64)"


def test_world_size_1_and_opcheck(gen):
    g = ThreadRanks(1)
    x = rand((1001,), torch.bfloat16, gen)
    assert torch.equal(g.all_reduce([x], False)[0], x)
    args = (torch.empty_like(x), x, g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes, False)
    opcheck(torch.ops.decodekit.custom_all_reduce.default, args)
    a, w = rand((3, 40), torch.float32, gen), rand((24, 40), torch.float32, gen)
    args = (torch.empty(3, 24), a, w, None, g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes, None, None, 1e-6)
    opcheck(torch.ops.decodekit.gemm_allreduce.default, args)


def test_peer_that_never_arrives_times_out(gen):
    g = ThreadRanks(2, timeout_s=0.2)
    x = rand((100,), torch.float32, gen)
    with pytest.raises(RuntimeError, match=r"rank 0 of 2 timed out after 0\.[0-9]+ s waiting for rank 1"):
        ops.custom_all_reduce(x, g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes, False)
    a, w = rand((2, 16), torch.float32, gen), rand((8, 16), torch.float32, gen)
    with pytest.raises(RuntimeError, match="timed out.*gemm_allreduce"):
        ops.gemm_allreduce(a, w, g.buffer_ptrs, g.signal_ptrs, 1, g.buffer_bytes)


def test_argument_errors(gen):
    g = ThreadRanks(2, buffer_bytes=4096)
    x = torch.randn(10)
    with pytest.raises(RuntimeError, match="'signal_ptrs' must hold 2"):
        ops.custom_all_reduce(x, g.buffer_ptrs, g.signal_ptrs[:1], 0, g.buffer_bytes)
    with pytest.raises(RuntimeError, match="'rank' must be in"):
        ops.custom_all_reduce(x, g.buffer_ptrs, g.signal_ptrs, 2, g.buffer_bytes)
    with pytest.raises(RuntimeError, match="more than the buffers hold"):
        ops.custom_all_reduce(torch.randn(1000), g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes)
    with pytest.raises(RuntimeError, match="'residual' and 'norm_weight' go together"):
        ops.gemm_allreduce(torch.randn(2, 4), torch.randn(3, 4), g.buffer_ptrs, g.signal_ptrs, 0, g.buffer_bytes,
                           residual=torch.randn(2, 3))
    raw = torch.zeros(ops.allreduce_signal_bytes() + 128, dtype=torch.uint8)
    sig = raw[(128 - raw.data_ptr() % 128) % 128:][:ops.allreduce_signal_bytes()]
    with pytest.raises(RuntimeError, match="not initialised"):
        ops.custom_all_reduce(x, g.buffer_ptrs, [sig.data_ptr(), g.signal_ptrs[1]], 0, g.buffer_bytes)
    with pytest.raises(RuntimeError, match="CUDA"):
        ops.ipc_mem_handle(torch.zeros(4))


def gemm_bound(a_list, w_list, bias, dtype) -> torch.Tensor:
    P = [a.double() @ w.double().T for a, w in zip(a_list, w_list)]
    A = [a.double().abs() @ w.double().abs().T for a, w in zip(a_list, w_list)]
    if bias is not None:
        P[0] = P[0] + bias.double()
        A[0] = A[0] + bias.double().abs()
    S = sum(P)
    sum_p = sum(p.abs() for p in P)
    K = a_list[0].shape[1]
    u = U[dtype]
    return 2 * (u * (S.abs() + sum_p) + len(P) * U32 * sum_p + (K + 2) * U32 * sum(A)) + TINY[dtype]


def run_gemm(g, a_list, w_list, bias, residual=None, norm_weight=None, eps=1e-6):
    M, N = a_list[0].shape[0], w_list[0].shape[0]
    outs = [torch.full((M, N), float("nan"), dtype=a_list[0].dtype) for _ in a_list]
    res = [None if residual is None else residual.clone() for _ in a_list]
    g.run(lambda r: ops.gemm_allreduce(a_list[r], w_list[r], g.buffer_ptrs, g.signal_ptrs, r, g.buffer_bytes,
                                       bias=bias, residual=res[r], norm_weight=norm_weight, eps=eps, out=outs[r]))
    return outs, res


@pytest.mark.parametrize("ws", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 600, 64), (5, 8, 100), (16, 513, 37), (40, 300, 48)])
def test_gemm_allreduce_threads(ws, dtype, M, N, K, gen):
    """Tiles of 256 columns (N = 600: 256, 256, 88), odd N and K, M > 32 (torch GEMM tiles)."""
    g = ThreadRanks(ws)
    a_list = [rand((M, K), dtype, gen) for _ in range(ws)]
    w_list = [rand((N, K), dtype, gen, scale=0.2) for _ in range(ws)]
    bias = rand((N,), dtype, gen)
    outs, _ = run_gemm(g, a_list, w_list, bias)
    for r, o in enumerate(outs):
        assert not torch.isnan(o).any(), f"rank {r}: poisoned output left"
        assert torch.equal(o, outs[0]), f"rank {r} differs from rank 0"
    exp, _ = ref.gemm_allreduce([a.double() for a in a_list], [w.double() for w in w_list], bias.double())
    err = (outs[0].double() - exp).abs()
    bound = gemm_bound(a_list, w_list, bias, dtype)
    assert (err <= bound).all(), f"worst err {err.max():.3g}, bound there {bound.view(-1)[err.argmax()]:.3g}"
    # the fused path equals ops.linear (rank-local, T; the same GEMM routing) + custom_all_reduce, bit for bit
    if ws > 1:
        parts = [ops.linear(a, w, bias if r == 0 else None) for r, (a, w) in enumerate(zip(a_list, w_list))]
        assert torch.equal(outs[0], g.all_reduce(parts, False)[0])

    # epilogue: fused_add_rms_norm of the reduced output, bit for bit, and near the float64 reference
    residual = rand((M, N), dtype, gen)
    nw = rand((N,), dtype, gen, scale=0.5) + 1
    outs2, res2 = run_gemm(g, a_list, w_list, bias, residual, nw)
    x_exp, r_exp = outs[0].clone(), residual.clone()
    ops.fused_add_rms_norm(x_exp, r_exp, nw, 1e-6)
    for r in range(ws):
        assert torch.equal(outs2[r], x_exp) and torch.equal(res2[r], r_exp), f"rank {r}: epilogue differs"
    e_out, e_res = ref.gemm_allreduce([a.double() for a in a_list], [w.double() for w in w_list], bias.double(),
                                      residual.double(), nw.double(), 1e-6)
    torch.testing.assert_close(res2[0].double(), e_res, atol=4 * TOL[dtype]["atol"] * (ws + 1) * 8,
                               rtol=4 * TOL[dtype]["rtol"])
    torch.testing.assert_close(outs2[0].double(), e_out, atol=4 * TOL[dtype]["atol"] * (ws + 1),
                               rtol=4 * TOL[dtype]["rtol"])


def test_gemm_allreduce_fallback_when_slots_do_not_fit(gen):
    """ws slots of the partial product exceed half a buffer: GEMM, then all_reduce in place."""
    M, N, K, ws = 8, 100, 32, 3
    g = ThreadRanks(ws, buffer_bytes=4096)  # fp16 message 1600 bytes > buffer_bytes / 4
    a_list = [rand((M, K), torch.float16, gen) for _ in range(ws)]
    w_list = [rand((N, K), torch.float16, gen) for _ in range(ws)]
    with pytest.raises(RuntimeError, match="more than the buffers hold"):
        run_gemm(g, a_list, w_list, None)
    g = ThreadRanks(ws, buffer_bytes=8192)  # message 1600 <= 2048, slots 3 * 1792 > 4096: fallback
    outs, _ = run_gemm(g, a_list, w_list, None)
    parts = [ops.linear(a, w) for a, w in zip(a_list, w_list)]
    assert torch.equal(outs[1], g.all_reduce(parts, False)[0])


# ---------------------------------------------------------------------------- processes (/dev/shm)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mp_worker(rank: int, ws: int, port: int, out_dir: str) -> None:
    """One tensor-parallel rank: every case of the multi-process tests, results saved for the parent."""
    import torch.distributed as dist

    from decodekit.distributed.custom_allreduce import CustomAllReduce
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    res = {}
    gen = torch.Generator().manual_seed(1234 + rank)
    car = CustomAllReduce(device="cpu", max_bytes=64 << 10, timeout_s=20)
    for dtype in DTYPES:
        for n in (1, 5, 1001, 8193):
            for algo in ("one_shot", "two_shot", "auto"):
                x = rand((n,), dtype, gen)
                out = torch.full_like(x, float("nan"))
                car.all_reduce(x, out=out, algo=algo)
                res[f"ar {dtype} {n} {algo}"] = (x, out)
    for i in range(200):  # repeated calls, one buffer half after the other
        x = torch.full((3,), float(i + rank))
        res[f"rep {i}"] = (x, car.all_reduce(x))
    big = rand((40000,), torch.float32, gen)  # over max_bytes: torch.distributed
    res["big"] = (big, car.all_reduce(big))
    for M in (1, 7):
        a, w = rand((M, 48), torch.bfloat16, gen), rand((300, 48), torch.bfloat16, gen)
        b = torch.linspace(-1, 1, 300).to(torch.bfloat16)
        resid = torch.linspace(-2, 2, M * 300).reshape(M, 300).to(torch.bfloat16)
        nw = torch.linspace(0.5, 1.5, 300).to(torch.bfloat16)
        out = car.gemm_allreduce(a, w, bias=b)
        r2 = resid.clone()
        out2 = car.gemm_allreduce(a, w, bias=b, residual=r2, norm_weight=nw)
        res[f"gemm {M}"] = (a, w, b, resid, nw, out, out2, r2)
    for q in range(ws):  # every group must be created on every rank
        grp = dist.new_group([q])
        if q == rank:
            with CustomAllReduce(grp, device="cpu", max_bytes=4096) as solo:
                x = rand((77,), torch.float16, gen)
                res["solo"] = (x, solo.all_reduce(x))
    car.close()
    short = CustomAllReduce(device="cpu", max_bytes=4096, timeout_s=0.3)
    if rank == 0:  # the peers never make this call
        try:
            short.all_reduce(torch.ones(10))
            res["timeout"] = "no error"
        except RuntimeError as e:
            res["timeout"] = str(e)
    dist.barrier()
    short.close()
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _shm_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("decodekit_ar_")}


@pytest.fixture(scope="module", params=[2, 3])
def mp_results(request):
    import torch.multiprocessing as mp
    ws = request.param
    before = _shm_files()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_mp_worker, args=(ws, _free_port(), d), nprocs=ws, join=True, start_method="spawn")
        results = [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(ws)]
    leftover = _shm_files() - before
    return ws, results, leftover


def test_processes_all_reduce(mp_results):
    ws, R, leftover = mp_results
    assert not leftover, f"/dev/shm files left behind: {leftover}"
    for key in R[0]:
        if key.startswith("ar "):
            xs, outs = [R[r][key][0] for r in range(ws)], [R[r][key][1] for r in range(ws)]
            check_allreduce(outs, xs, xs[0].dtype, f"ws={ws} {key}")
    for i in range(200):
        for r in range(ws):
            assert torch.equal(R[r][f"rep {i}"][1], torch.full((3,), float(ws * i + ws * (ws - 1) // 2)))
    big = sum(R[r]["big"][0].double() for r in range(ws))
    for r in range(ws):
        torch.testing.assert_close(R[r]["big"][1].double(), big, atol=1e-5, rtol=1e-5)
        x, y = R[r]["solo"]
        assert torch.equal(x, y), "world size 1 is a copy"


def test_processes_gemm_allreduce(mp_results):
    ws, R, _ = mp_results
    for M in (1, 7):
        a = [R[r][f"gemm {M}"][0] for r in range(ws)]
        w = [R[r][f"gemm {M}"][1] for r in range(ws)]
        b, resid, nw = R[0][f"gemm {M}"][2:5]
        exp, _ = ref.gemm_allreduce([x.double() for x in a], [x.double() for x in w], b.double())
        out0 = R[0][f"gemm {M}"][5]
        assert (out0.double() - exp).abs().le(gemm_bound(a, w, b, torch.bfloat16)).all()
        x_exp, r_exp = out0.clone(), resid.clone()
        ops.fused_add_rms_norm(x_exp, r_exp, nw, 1e-6)
        for r in range(ws):
            out, out2, r2 = R[r][f"gemm {M}"][5:8]
            assert torch.equal(out, out0), f"rank {r} differs"
            assert torch.equal(out2, x_exp) and torch.equal(r2, r_exp), f"rank {r}: epilogue differs"


def test_processes_timeout(mp_results):
    ws, R, _ = mp_results
    msg = R[0]["timeout"]
    assert "timed out after" in msg and "waiting for rank 1" in msg and "close it" in msg, msg


def test_stale_segments_of_dead_processes_are_swept():
    import subprocess

    from decodekit.distributed import custom_allreduce as ca
    p = subprocess.Popen(["true"])
    p.wait()  # a pid that no longer exists
    dead = os.path.join("/dev/shm", f"decodekit_ar_{p.pid}_0123abcd")
    alive = os.path.join("/dev/shm", f"decodekit_ar_{os.getpid()}_0123abcd")
    for f in (dead, alive):
        open(f, "w").close()
    try:
        ca._sweep_stale_segments()
        assert not os.path.exists(dead) and os.path.exists(alive)
    finally:
        for f in (dead, alive):
            if os.path.exists(f):
                os.unlink(f)
