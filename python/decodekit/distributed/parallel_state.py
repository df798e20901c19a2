"""The tensor-parallel process group of one engine and its collectives.

Rank 0 is the driver (scheduler, sampler, detokenizer, API); ranks 1..N-1 are workers that only
run the model on their shard. Two groups over the same ranks:

    group      the model's collectives (AllReduce after row-parallel layers, the vocabulary-parallel
               embedding and the logits gather): NCCL on CUDA, gloo on CPU; timeout `tp_timeout`
               seconds, so a hung peer becomes an error instead of a hang. Ranks sharing one GPU
               (more ranks than this machine has GPUs: NCCL refuses them) get gloo, with a warning;
               that is for testing, decodekit's own AllReduce then carries the model's collectives.
    cmd_group  gloo, driver -> workers step commands (`broadcast_object_list`); a long timeout, since
               an idle server sends nothing for hours. A dead peer still fails at once (closed socket).

Launch: `launch_tensor_parallel` spawns the N - 1 workers on this machine (each SIGKILLs itself when its
stdin, a pipe only the driver process holds, closes: they never outlive the driver); under `torchrun`
(RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment) every process is started by torchrun
and only rank 0 returns to the caller -- the others serve as workers and exit when the driver shuts down.
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

log = logging.getLogger("decodekit.distributed")


class TPWorkerError(RuntimeError):
    """A tensor-parallel peer died or stopped answering; the engine cannot continue."""


@dataclass
class TPGroup:
    rank: int
    world_size: int
    device: torch.device
    group: object                    # torch.distributed ProcessGroup for the model's collectives
    cmd_group: object                # gloo ProcessGroup for driver -> worker commands
    allreduce: str = "gloo"          # "gloo"/"nccl" (torch.distributed) or "custom" (decodekit's)
    backend: str = "gloo"            # group's backend: "nccl" or "gloo"
    fused: bool = False              # row-parallel GEMM + AllReduce in column chunks that overlap
    custom: object | None = None     # decodekit.distributed.custom_allreduce.CustomAllReduce
    procs: list = field(default_factory=list)   # spawned worker processes (driver only)
    fused_chunks: int = 4            # column chunks of the fused path (each a multiple of 32 columns)
    closed: bool = False             # shutdown() ran (a later call must not touch a newer engine's group)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """In place: x <- the sum of every rank's x (all ranks get identical values)."""
        if self.custom is not None:  # it falls back to torch.distributed past its buffers
            return self.custom.all_reduce(x, out=x)
        dist.all_reduce(x, group=self.group)
        return x

    def linear_all_reduce(self, x: torch.Tensor,          # [M, K_shard]
                          weight,                         # [N, K_shard] (tensor or packed)
                          residual: torch.Tensor | None = None,     # [M, N] in/out
                          norm_weight: torch.Tensor | None = None,  # [N]
                          eps: float = 1e-6) -> torch.Tensor:       # [M, N]
        """A row-parallel layer: y = the sum over ranks of x @ weight^T; with residual and norm_weight
        also residual <- y + residual, y <- rms_norm(residual) * norm_weight (fused_add_rms_norm).

        Fused (--tp-fused-allreduce) with decodekit's AllReduce: CustomAllReduce.gemm_allreduce (dense, INT4
        and fp8 weights: each output tile pushed to the peers as soon as it is computed, the norm as its
        epilogue; it falls back itself for other weights); with torch's, the output columns in chunks, each
        chunk's AllReduce started as soon as it is computed and overlapping the next chunk's GEMM. On the
        CPU every output element's arithmetic is the same as unfused, so are the results."""
        from decodekit import ops
        if self.fused and self.custom is not None:
            return self.custom.gemm_allreduce(x, weight, residual=residual, norm_weight=norm_weight, eps=eps)
        N = weight.shape[0]
        chunk = -(-N // self.fused_chunks // 32) * 32
        if not self.fused or N <= chunk or not _column_chunks_exact(x, weight):
            y = self.all_reduce(ops.linear(x, weight))
        else:
            parts, works = [], []
            for n0 in range(0, N, chunk):
                n1 = min(N, n0 + chunk)
                w = weight[n0:n1] if isinstance(weight, torch.Tensor) else weight.rows(n0, n1)
                part = ops.linear(x, w)
                parts.append(part)
                works.append(dist.all_reduce(part, group=self.group, async_op=True))
            for w in works:
                w.wait()
            y = torch.cat(parts, dim=1)
        if residual is not None:
            ops.fused_add_rms_norm(y, residual, norm_weight, eps)
        return y

    def gather_logits(self, local: torch.Tensor,  # [R, V_shard_r] fp32, this rank's vocabulary slice
                      vocab_shard: int, vocab_size: int) -> torch.Tensor | None:  # [R, V] on rank 0
        """Rank 0 gets every rank's slice side by side (the workers None). Through decodekit's AllReduce
        when [R, world_size * vocab_shard] fp32 fits its buffers: each rank's slice in its own columns,
        zeros elsewhere, summed (x + 0 is exact: the same values as a gather; capturable in CUDA graphs
        without NCCL); else torch.distributed's gather (gloo: staged through the host)."""
        R = local.shape[0]
        if self.custom is not None and local.dtype == torch.float32 and \
                R * self.world_size * vocab_shard * 4 <= self.custom.max_bytes:
            full = torch.zeros(R, self.world_size * vocab_shard, dtype=torch.float32, device=local.device)
            full[:, self.rank * vocab_shard:self.rank * vocab_shard + local.shape[1]] = local
            self.custom.all_reduce(full, out=full)
            return full[:, :vocab_size] if self.rank == 0 else None
        if local.shape[1] < vocab_shard:  # the last slice may be short: pad to equal sizes
            local = torch.nn.functional.pad(local, (0, vocab_shard - local.shape[1]))
        local = local.contiguous()
        dev = local.device
        if self.backend == "gloo" and dev.type != "cpu":  # gloo gathers host tensors
            local = local.cpu()
        if self.rank == 0:
            bufs = [torch.empty(R, vocab_shard, dtype=local.dtype, device=local.device)
                    for _ in range(self.world_size)]
            dist.gather(local, bufs, dst=0, group=self.group)
            return torch.cat(bufs, dim=1)[:, :vocab_size].to(dev)
        dist.gather(local, None, dst=0, group=self.group)
        return None

    def graph_max_rows(self, hidden_row_bytes: int, logits_row_bytes: int) -> int:
        """The most tokens a forward pass captured in a CUDA graph may have: every collective in it must
        be capturable. NCCL's are (no limit); with gloo only decodekit's AllReduce is, so the rows whose
        hidden states (hidden_row_bytes each) and logits (logits_row_bytes each, all ranks' columns) fit
        its buffers; 0 when nothing can be captured."""
        if self.device.type != "cuda":
            return 0
        if self.backend == "nccl":
            return 1 << 30
        if self.custom is None:
            return 0
        return self.custom.max_bytes // max(hidden_row_bytes, logits_row_bytes)

    # ------------------------------------------------------------------ commands
    def send(self, cmds: list) -> None:
        dist.broadcast_object_list([cmds], src=0, group=self.cmd_group)

    def recv(self) -> list:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.cmd_group)
        return box[0]

    def dead_workers(self) -> list[str]:
        return [f"rank {i + 1} (exit code {p.poll()})" for i, p in enumerate(self.procs) if p.poll() is not None]

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.custom is not None:
            try:
                self.custom.close()
            except Exception:  # noqa: BLE001 -- best effort at exit
                pass
            self.custom = None
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001 -- subprocess.TimeoutExpired: it did not stop
                p.kill()
                p.wait(timeout=5)
            if p.stdin is not None:  # (the worker's lifeline: closed once it has exited)
                try:
                    p.stdin.close()
                except OSError:
                    pass
        self.procs = []
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def _column_chunks_exact(x: torch.Tensor, weight) -> bool:
    """Whether ops.linear on 32-aligned column chunks gives each element exactly as unchunked: our own
    kernels (packed INT4 / INT8 / fp8, and on the CPU dense_gemm, where ops.dense_route sends the rows)
    compute every output independently of the others; torch's GEMMs may block by N, so those run whole."""
    if not isinstance(weight, torch.Tensor):
        return True
    from decodekit import ops
    return ops.dense_gemm_takes(x)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun (or any launcher setting RANK / WORLD_SIZE)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def _local_world_size(world_size: int) -> int:
    """Ranks on this machine: torchrun's LOCAL_WORLD_SIZE, else all of them (spawned here)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def ranks_share_gpu(world_size: int) -> bool:
    """Whether this machine's ranks outnumber its GPUs (rank r runs on GPU r % count)."""
    return _local_world_size(world_size) > max(1, torch.cuda.device_count())


def init_group(rank: int, world_size: int, device: torch.device, init_method: str, timeout_s: float,
               allreduce: str = "auto", fused: bool = False) -> TPGroup:
    backend = "nccl" if device.type == "cuda" and not ranks_share_gpu(world_size) else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda":
        if device.index is None:  # "cuda": rank r on GPU r % count (set_device needs an index)
            device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        if backend == "gloo" and rank == 0:
            log.warning("tensor parallelism: %d ranks on this machine's %d GPU(s): NCCL refuses ranks that share "
                        "a GPU, using gloo and decodekit's AllReduce (for testing: no speed-up)",
                        _local_world_size(world_size), torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    group = dist.group.WORLD
    cmd_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=365))
    tp = TPGroup(rank, world_size, device, group, cmd_group, allreduce=backend, backend=backend, fused=fused)
    if allreduce in ("auto", "custom"):
        tp.custom = _custom_allreduce(tp, required=allreduce == "custom", timeout_s=timeout_s)
        if tp.custom is not None:
            tp.allreduce = "custom"
    return tp


def _custom_allreduce(tp: TPGroup, required: bool, timeout_s: float):
    """decodekit's own AllReduce (shared-memory / CUDA-IPC buffers) when every rank's build has it
    (decided together, so no rank enters the setup collectives alone)."""
    err = None
    try:
        from decodekit.distributed.custom_allreduce import CustomAllReduce
    except Exception as e:  # noqa: BLE001 -- auto: fall back to torch.distributed
        err = e
    ok = torch.tensor([0 if err else 1], dtype=torch.int32, device=tp.device if tp.backend == "nccl" else "cpu")
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=tp.group)
    if not int(ok.item()):
        if required:
            raise ValueError(f"tp_allreduce 'custom' is not available on every rank ({err or 'another rank'})")
        return None
    return CustomAllReduce(tp.group, tp.device, timeout_s=timeout_s)


def launch_tensor_parallel(args, device: torch.device) -> TPGroup:
    """Rank 0's TPGroup after starting the workers (spawned here, or by torchrun). Under torchrun a
    rank > 0 runs its worker loop inside this call and exits the process when the driver is done."""
    from .worker import worker_main
    n = args.tensor_parallel_size
    if dist.is_initialized():  # (init_process_group would fail with "initialize the default process group twice")
        raise ValueError("tensor_parallel_size > 1: this process already has a torch.distributed process group -- "
                         "another tensor-parallel LLM / LLMEngine still running (call its shutdown() first; one "
                         "tensor-parallel engine per process at a time) or the script's own init_process_group")
    env = torchrun_env()
    if env is not None:
        rank, world = env
        if world != n:
            raise ValueError(f"tensor_parallel_size {n} differs from torchrun's WORLD_SIZE {world}")
        if rank != 0:
            os._exit(worker_main(args, rank, n, "env://", None))
        return init_group(0, n, device, "env://", args.tp_timeout, args.tp_allreduce, args.tp_fused_allreduce)
    init = f"tcp://127.0.0.1:{_free_port()}"
    threads = max(1, torch.get_num_threads() // n)
    procs = []
    try:
        for r in range(1, n):
            procs.append(_spawn_worker(args, r, n, init, threads))
        torch.set_num_threads(threads)
        tp = init_group(0, n, device, init, args.tp_timeout, args.tp_allreduce, args.tp_fused_allreduce)
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
            p.stdin.close()
        raise
    tp.procs = procs
    return tp


def _spawn_worker(args, rank: int, world_size: int, init: str, threads: int):
    """A fresh interpreter running decodekit.distributed.worker (not multiprocessing: a user's script
    without an `if __name__ == "__main__"` guard must not be re-imported). Its arguments go pickled through
    its stdin, which stays open: the worker's lifeline (worker._die_with_driver). The parent-death signal
    only where this is the main thread (it fires when the spawning *thread* ends)."""
    import pickle
    import subprocess
    import sys
    import threading
    main = threading.current_thread() is threading.main_thread()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.Popen([sys.executable, "-m", "decodekit.distributed.worker"], stdin=subprocess.PIPE, env=env)
    try:
        pickle.dump((args, rank, world_size, init, threads, main), p.stdin)
        p.stdin.flush()
    except BaseException:
        p.kill()
        p.wait()
        p.stdin.close()
        raise
    return p
