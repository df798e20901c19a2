"""Custom AllReduce for small messages over peer-mapped buffers, and the fused gemm_allreduce.

Each rank allocates one segment = [Signal block | data buffer] and maps every peer's:

* CUDA: a device tensor whose IPC handle (``decodekit.ops.ipc_mem_handle``) is exchanged with
  ``torch.distributed.all_gather_object`` over the given group and opened by every peer
  (``ipc_open``); two processes on the same GPU can do this too.
* CPU: a POSIX shared-memory file in /dev/shm (name exchanged the same way), mmapped by every
  rank and unlinked as soon as all ranks have mapped it, so a crash leaves no file behind.

The kernels (``include/decodekit/comm/allreduce.h`` / ``.cuh``) take the addresses as int64 lists.
They synchronise through flags with acquire/release ordering and a per-rank epoch that the kernel
itself advances (no host barrier; CUDA-graph capturable). Every rank gets bitwise identical
results (fp32 sums in rank order), so tensor-parallel workers never diverge.

    car = CustomAllReduce(group, device)          # collective: every rank of `group`
    y = car.all_reduce(x)                         # out of place (out=..., in place with out=x)
    y = car.gemm_allreduce(a, w_shard)            # allreduce(a @ w_shard^T), row-parallel layer
    y = car.gemm_allreduce(a, w_shard, residual=r, norm_weight=g)  # + fused residual add and RMSNorm
    car.close()

Every call is a collective: all ranks must make the same calls (same shapes, dtype, algo) in the
same order, and on CUDA issue them on one stream each. A call that waits for a peer longer than
``timeout_s`` fails (CPU: RuntimeError naming the peer; CUDA: the kernel traps), after which the
communicator is unusable. Messages larger than ``max_bytes`` go to ``torch.distributed.all_reduce``.
"""
from __future__ import annotations

import mmap
import os
import secrets
import weakref

import torch
import torch.distributed as dist

from decodekit import ops
from decodekit.quant import Int4Weight
from decodekit.quant.fp8 import Fp8Weight

MAX_RANKS = 8  # = dk::comm::kMaxRanks
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)

# all_reduce(algo="auto"): two-shot (reduce-scatter + all-gather) from this many bytes, one-shot
# (every rank reads every peer) below: the crossover of the bench "all_reduce" rows (algo one_shot vs
# two_shot, per device and world size) of bench/bench_allreduce.py. The only place these numbers live.
#   cpu, 2 ranks (2-core VM, bench/results/20261201-0233 and -0559_cpu_allreduce.md): two-shot is as fast
#     or faster at 4 KiB (8.3 vs 8.5-10.9 us), 16 KiB, 64 KiB, 256 KiB (65 vs 88-92 us) and 4 MiB, slower
#     only at 1 MiB (383-609 vs 328-383 us) -> from 4 KiB.
#   cuda, and cpu with 3+ ranks: PLACEHOLDERS until measured (gpu_check family `allreduce` records them).
TWO_SHOT_MIN_BYTES = {
    "cuda": {2: 1 << 20, 3: 512 << 10, 4: 512 << 10, 8: 256 << 10},
    "cpu": {2: 4 << 10, 3: 256 << 10, 4: 256 << 10},
}
_DEFAULT_TWO_SHOT_MIN_BYTES = 512 << 10


def two_shot_min_bytes(device_type: str, world_size: int) -> int:
    """Message size (bytes) from which algo="auto" picks two-shot (see TWO_SHOT_MIN_BYTES)."""
    table = TWO_SHOT_MIN_BYTES.get(device_type, {})
    if world_size in table:
        return table[world_size]
    smaller = [w for w in table if w <= world_size]
    return table[max(smaller)] if smaller else _DEFAULT_TWO_SHOT_MIN_BYTES


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


_SHM_DIR, _SHM_PREFIX = "/dev/shm", "decodekit_ar_"


def _sweep_stale_segments() -> None:
    """Removes /dev/shm segments of processes that no longer exist: a rank killed between creating
    its segment and the unlink after every rank mapped it (a short window) leaves one behind."""
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return
    for name in names:
        parts = name[len(_SHM_PREFIX):].split("_") if name.startswith(_SHM_PREFIX) else []
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        try:
            os.kill(int(parts[0]), 0)
        except ProcessLookupError:  # owner gone
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
            except OSError:
                pass
        except OSError:  # alive (or not ours to signal)
            pass


class _Resources:
    """What a CustomAllReduce holds, released once (close(), garbage collection or exit)."""

    def __init__(self):
        self.path: str | None = None       # own /dev/shm file until unlinked
        self.maps: list[mmap.mmap] = []    # CPU: every rank's mapping
        self.views: list[torch.Tensor] = []  # tensors over the mappings (keep the addresses alive)
        self.segment: torch.Tensor | None = None  # CUDA: own segment
        self.opened: list[int] = []        # CUDA: peers' IPC-opened addresses

    def release(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None
        self.views.clear()
        for m in self.maps:
            try:
                m.close()
            except BufferError:  # a view still exported somewhere: the OS unmaps at exit
                pass
        self.maps.clear()
        for p in self.opened:
            try:
                ops.ipc_close(p)
            except Exception:  # noqa: BLE001  (interpreter shutdown, a dead context)
                pass
        self.opened.clear()
        self.segment = None


def _map_segment(res: "_Resources", path: str, seg_bytes: int, create: bool) -> torch.Tensor:
    """Maps a /dev/shm segment (created here, exclusively, when `create`) as uint8 [seg_bytes]; the map and
    the view are kept in `res` (and the path, when created, for unlinking)."""
    fd = os.open(path, (os.O_CREAT | os.O_EXCL | os.O_RDWR) if create else os.O_RDWR, 0o600)
    if create:
        res.path = path
    try:
        if create:
            os.ftruncate(fd, seg_bytes)
        m = mmap.mmap(fd, seg_bytes)
    finally:
        os.close(fd)
    res.maps.append(m)
    view = torch.frombuffer(m, dtype=torch.uint8)
    res.views.append(view)
    return view


class CustomAllReduce:
    """AllReduce and gemm_allreduce among the ranks of ``group`` through peer-mapped buffers.

    group: a torch.distributed process group (default: the world), used at construction to
    exchange the buffers' names or handles, and for messages over ``max_bytes``.
    device: "cpu" or a CUDA device (default: the current CUDA device if available, else CPU).
    max_bytes: the largest message (and gemm_allreduce output) reduced through the buffers; each
    rank allocates 4 * max_bytes (two halves of [input copy | reduced chunk]) plus its Signal block.
    timeout_s: how long a call waits for a peer before failing.
    epoch: the epoch the first call follows (all ranks the same; tests start near 2^64 to wrap).
    """

    def __init__(self, group=None, device=None, max_bytes: int = 8 << 20, timeout_s: float = 30.0,
                 epoch: int = 0):
        if not dist.is_initialized():
            raise RuntimeError("CustomAllReduce: torch.distributed is not initialized (init_process_group first)")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        if not 1 <= self.world_size <= MAX_RANKS:
            raise ValueError(f"CustomAllReduce: world size {self.world_size} is outside [1, {MAX_RANKS}]")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"CustomAllReduce: unsupported device {self.device}")
        if max_bytes <= 0:
            raise ValueError(f"CustomAllReduce: max_bytes must be positive, got {max_bytes}")
        self.max_bytes = _round_up(int(max_bytes), 256)
        self.buffer_bytes = 4 * self.max_bytes
        self.timeout_s = float(timeout_s)
        self.two_shot_min_bytes = two_shot_min_bytes(self.device.type, self.world_size)
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _Resources.release, self._res)  # also runs at exit
        sig_bytes = ops.allreduce_signal_bytes()
        self._sig_region = _round_up(sig_bytes, 4096)
        seg_bytes = self._sig_region + self.buffer_bytes
        try:
            if self.device.type == "cpu":
                bases = self._map_shm(seg_bytes, sig_bytes, int(epoch))
            else:
                bases = self._map_ipc(seg_bytes, sig_bytes, int(epoch))
        except BaseException:
            self.close()
            raise
        self.signal_ptrs = list(bases)
        self.buffer_ptrs = [b + self._sig_region for b in bases]

    # ---- setup ---------------------------------------------------------------------------

    def _exchange(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _map_shm(self, seg_bytes: int, sig_bytes: int, epoch: int) -> list[int]:
        res = self._res
        _sweep_stale_segments()
        path = os.path.join(_SHM_DIR, f"{_SHM_PREFIX}{os.getpid()}_{secrets.token_hex(8)}")
        own_view = _map_segment(res, path, seg_bytes, create=True)
        ops.allreduce_init_signal(own_view[:sig_bytes], self.world_size, self.timeout_s, epoch)
        paths = self._exchange(path)
        bases = []
        for q, p in enumerate(paths):
            if q == self.rank:
                bases.append(own_view.data_ptr())
                continue
            bases.append(_map_segment(res, p, seg_bytes, create=False).data_ptr())
        dist.barrier(group=self.group)  # every rank has mapped every segment: the names can go
        os.unlink(path)
        res.path = None
        return bases

    def _map_ipc(self, seg_bytes: int, sig_bytes: int, epoch: int) -> list[int]:
        if not torch.cuda.is_available():
            raise RuntimeError("CustomAllReduce: a CUDA device was asked for but torch.cuda is unavailable")
        res = self._res
        with torch.cuda.device(self.device):
            seg = torch.empty(seg_bytes, dtype=torch.uint8, device=self.device)
            res.segment = seg
            # a kernel that times out writes {1, peer, flag slot, epoch} here before it traps
            self._diag = torch.zeros(4, dtype=torch.int64, pin_memory=True)
            ops.allreduce_init_signal(seg[:sig_bytes], self.world_size, self.timeout_s, epoch,
                                      diag_ptr=self._diag.data_ptr())
            torch.cuda.synchronize(self.device)
            handle = bytes(ops.ipc_mem_handle(seg).numpy().tobytes())
            handles = self._exchange(handle)
            bases = []
            for q, h in enumerate(handles):
                if q == self.rank:
                    bases.append(seg.data_ptr())
                    continue
                p = ops.ipc_open(torch.frombuffer(bytearray(h), dtype=torch.uint8))
                res.opened.append(p)
                bases.append(p)
        dist.barrier(group=self.group)
        return bases

    # ---- the collectives -----------------------------------------------------------------

    def _check_open(self):
        if not self._finalizer.alive:
            raise RuntimeError("CustomAllReduce: used after close()")

    def _fits(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def all_reduce(self, x: torch.Tensor,              # [...] on this communicator's device
                   out: torch.Tensor | None = None,    # [...] like x (may be x: in place)
                   algo: str = "auto") -> torch.Tensor:
        """Sum of x over the ranks, bitwise identical on every rank. algo: "auto" (one-shot below
        two_shot_min_bytes, two-shot from there), "one_shot" or "two_shot"."""
        self._check_open()
        if algo not in ("auto", "one_shot", "two_shot"):
            raise ValueError(f"CustomAllReduce.all_reduce: algo must be auto, one_shot or two_shot, got {algo!r}")
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nbytes = x.numel() * x.element_size()
        if not self._fits(nbytes) or x.dtype not in _FLOAT_TYPES or not out.is_contiguous():
            if out.data_ptr() != x.data_ptr():
                out.copy_(x)
            dist.all_reduce(out, group=self.group)
            return out
        two_shot = algo == "two_shot" or (algo == "auto" and nbytes >= self.two_shot_min_bytes)
        ops.custom_all_reduce(x.contiguous(), self.buffer_ptrs, self.signal_ptrs, self.rank, self.buffer_bytes,
                              two_shot, out=out)
        return out

    def gemm_allreduce(self, a: torch.Tensor,           # [M, K_shard] (row stride free)
                       weight,                          # [N, K_shard] this rank's shard: tensor, Int4Weight, Fp8Weight
                       bias: torch.Tensor | None = None,  # [N], added once
                       residual: torch.Tensor | None = None,  # [M, N] in/out: out + residual
                       norm_weight: torch.Tensor | None = None,  # [N]
                       eps: float = 1e-6,
                       out: torch.Tensor | None = None) -> torch.Tensor:  # [M, N]
        """allreduce(a @ weight^T) (+ bias) for a row-parallel layer; with residual and norm_weight,
        residual <- out + residual and out <- rms_norm(residual) * norm_weight. Weights the fused ops do
        not take (INT8) and messages over the buffer: ops.linear, then the all-reduce."""
        self._check_open()
        M, N = a.shape[0], weight.shape[0]
        if out is None:
            out = torch.empty((M, N), dtype=a.dtype, device=a.device)
        fused_weight = isinstance(weight, (torch.Tensor, Int4Weight, Fp8Weight))
        if not self._fits(M * N * a.element_size()) or a.dtype not in _FLOAT_TYPES or not fused_weight:
            y = self.all_reduce(ops.linear(a, weight, bias if self.rank == 0 else None))
            out.copy_(y)
            if residual is not None:
                ops.fused_add_rms_norm(out, residual, norm_weight, eps)
            return out
        return ops.gemm_allreduce(a, weight, self.buffer_ptrs, self.signal_ptrs, self.rank, self.buffer_bytes,
                                  bias=bias, residual=residual, norm_weight=norm_weight, eps=eps, out=out)

    def timeout_report(self) -> str | None:
        """CUDA: a kernel that waits for a peer longer than timeout_s traps (the CUDA error shows at the
        next synchronisation and the context is lost); this says which peer it waited for, read from
        pinned host memory (no CUDA call). None when no timeout was recorded (and always on the CPU,
        where the call itself raises)."""
        d = getattr(self, "_diag", None)
        if d is None or int(d[0]) != 1:
            return None
        return (f"decodekit CustomAllReduce: rank {self.rank} of {self.world_size} timed out after {self.timeout_s} s "
                f"waiting for rank {int(d[1])} (flag slot {int(d[2])}, call {int(d[3]) & (2**64 - 1)}): that rank "
                "died, hangs, or made a different call")

    # ---- lifetime ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Unmaps the peers' buffers and frees this rank's (idempotent). Not a collective, but a
        peer may still be reading this rank's buffer: close after the last call on every rank."""
        self._finalizer()

    def __enter__(self) -> "CustomAllReduce":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CustomAllReduce(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"max_bytes={self.max_bytes}{', closed' if self.closed else ''})")
