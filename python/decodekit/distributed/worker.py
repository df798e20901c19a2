"""Driver and workers of a tensor-parallel engine.

The TP boundary is the model: the driver's engine (scheduler, sampler, drafters, runner) is the
same as with one rank, but its model is a `TPDriverModel`, which sends every call that touches a
rank's state -- forward passes, KV-cache allocation and block copies, fp8 KV calibration -- to the
workers before running its own shard. A worker (`worker_main`) loads its shard, then executes those
commands in the driver's order until told to stop, so the ranks never diverge. Forward passes meet
in the model's collectives (AllReduce per row-parallel layer, the embedding's, the logits gather).

Commands (lists, one broadcast per driver call; KV pools freed on the driver are freed on the
workers with the next one):
    ("alloc", pool, num_blocks, block_size)    ("free", pool)      ("copy", pool, [(src, dst), ...])
    ("forward", pool, input_ids, metadata, num_layers)
    ("bucket", pool, size, max_blocks_per_seq, capture)   a decode bucket (model_runner.DecodeBucket):
        static buffers, on CUDA a graph captured in lockstep with the driver's
    ("bucket_run", pool, size, ids, positions, slots, block_tables, seq_lens)   a padded decode step
    ("calib_begin",)  ("calib_end", margin)  ("kv_dtype", dtype, use_calibrated)   ("stop",)
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import os
import signal
import threading
import time
import weakref

import torch

from decodekit.models import AttentionMetadata, LlamaModel

from .parallel_state import TPGroup, TPWorkerError, init_group
from .sharding import ShardPlan

log = logging.getLogger("decodekit.distributed")


class KVPool(list):
    """The driver's KV caches ([(K, V)] per layer) with the id the workers know their own pool by
    and the driver model that mirrors block copies (model_runner.copy_kv_blocks asks it)."""
    tp_pool_id: int = -1
    tp_driver: "TPDriverModel | None" = None


def _to_host(x):
    if isinstance(x, torch.Tensor):
        return x.cpu() if x.device.type != "cpu" else x
    if isinstance(x, AttentionMetadata):
        return AttentionMetadata(**{k: _to_host(v) for k, v in vars(x).items() if k != "host"})
    return x


def _to_device(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, AttentionMetadata):
        return AttentionMetadata(**{k: _to_device(v, device) for k, v in vars(x).items() if k != "host"})
    return x


def _host_inputs(input_ids: torch.Tensor, md: AttentionMetadata):  # -> (ids [T], metadata) on the host
    """What the workers get: the host tensors md was copied from when md says so for these very input_ids
    (ModelRunner on CUDA: no device-to-host copy, which would wait for the stream), else copies."""
    if md.host is not None and md.host[0] is input_ids:
        return md.host[1], md.host[2]
    return _to_host(input_ids), _to_host(md)


def load_shard(args, device: torch.device, dtype: torch.dtype, tp: TPGroup | None):
    """(LoadedModel, LlamaModel) of this rank: the weights read as this rank's slices (the whole model
    when tp is None), projection weights quantized at load when asked."""
    from decodekit.quant.load import quantize_projections
    from decodekit.loader import load_model
    shard = (lambda cfg: ShardPlan(cfg, tp.rank, tp.world_size)) if tp is not None else None
    loaded = load_model(args.model, dtype=dtype, device=device, progress=args.progress and (tp is None or
                                                                                         tp.rank == 0),
                        keep_quantized=args.keep_quantized(), shard=shard)
    if args.quantization in ("int4-rtn", "fp8"):  # (the LM head as with one rank: LLMEngine's condition)
        quantize_projections(loaded.weights, args.quantization,
                             lm_head_int8=args.quantization == "int4-rtn" and device.type == "cpu"
                             and args.quantize_lm_head)
    plan = shard(loaded.config) if shard else None
    model = LlamaModel(loaded.config, loaded.weights, dtype=dtype, device=device, tp=tp, plan=plan,
                       max_model_len=args.max_model_len)
    return loaded, model


class TPDriverModel:
    """Rank 0's model: LlamaModel's interface, each state-changing call mirrored on the workers.

    Every call is one step of the group (_step): the commands to the workers, then the driver's own part. A
    step the driver leaves part-way leaves the workers inside its collectives, out of step with the driver for
    good; so Ctrl-C is held until the step ends (then raised: the engine stays usable, as with one rank), and
    any other failure breaks the group at once (_fail: the workers stopped, the process group freed for a new
    engine; later calls raise TPWorkerError) instead of the next step waiting tp_timeout for a lost peer."""

    def __init__(self, model: LlamaModel, tp: TPGroup):
        self._model, self.tp = model, tp
        self._ids = itertools.count()
        self._freed: list[int] = []       # pools the driver dropped, freed on the workers with the next step
        self._broken: str | None = None   # why the group cannot continue (_fail)

    def __getattr__(self, name):  # config, dtype, device, layers, kv_dtype, ...: the local model's
        return getattr(self._model, name)

    def _step(self, cmds: list, local=None):
        """Sends cmds (after the frees pending) to the workers, then runs local() -- this rank's part, which
        meets theirs in the collectives -- and returns its result."""
        if self._broken is not None:
            raise TPWorkerError(self._broken)
        with _SigintHeld() as held:
            try:
                # the same list object always: the pools' finalizers hold its append (rebinding the attribute
                # lost every pool freed later -- the workers kept them, the fp8 / memory-profiling probes)
                freed = self._freed[:]
                del self._freed[:len(freed)]
                try:
                    self.tp.send([("free", p) for p in freed] + list(cmds))
                except RuntimeError as e:
                    raise self.worker_error(e) from e
                out = local() if local is not None else None
            except TPWorkerError as e:
                self._fail(str(e))
                raise
            except RuntimeError as e:  # a collective that failed: say which worker
                err = self.worker_error(e)
                self._fail(str(err))
                raise err from e
            except BaseException as e:  # noqa: BLE001 -- re-raised; the workers are left mid-step
                self._fail(f"tensor parallelism failed: the driver left a step part-way ({type(e).__name__}"
                           f"{': ' + str(e)[:200] if str(e) else ''}), out of step with the workers; the engine "
                           "cannot continue -- restart it")
                raise
        if held.hit:  # Ctrl-C during the step: now that every rank finished it
            raise KeyboardInterrupt
        return out

    def _fail(self, reason: str) -> None:
        """The group cannot continue: workers killed (they may be waiting in a collective for tp_timeout),
        the process group destroyed (so a new tensor-parallel engine can start in this process)."""
        if self._broken is not None:
            return
        self._broken = reason
        for p in self.tp.procs:
            if p.poll() is None:
                p.kill()
        self.tp.shutdown()

    def worker_error(self, e: BaseException) -> TPWorkerError:
        dead = self.tp.dead_workers()
        deadline = time.monotonic() + 2.0
        while not dead and self.tp.procs and time.monotonic() < deadline:  # a failed peer may still be exiting
            time.sleep(0.05)
            dead = self.tp.dead_workers()
        who = f"worker {', '.join(dead)} died" if dead else "a worker stopped answering"
        return TPWorkerError(f"tensor parallelism failed: {who} ({type(e).__name__}: {str(e)[:200]}); the "
                             f"engine cannot continue -- restart it")

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> KVPool:
        pid = next(self._ids)
        pool = KVPool(self._step([("alloc", pid, num_blocks, block_size)],
                                 lambda: self._model.allocate_kv_cache(num_blocks, block_size)))
        pool.tp_pool_id, pool.tp_driver = pid, self
        weakref.finalize(pool, self._freed.append, pid)
        return pool

    def copy_kv_blocks(self, pool: KVPool, pairs) -> None:
        self._step([("copy", pool.tp_pool_id, list(pairs))])

    @property
    def local_model(self) -> LlamaModel:
        return self._model

    def forward(self, input_ids: torch.Tensor, md: AttentionMetadata, kv_caches: KVPool,
                num_layers: int | None = None) -> torch.Tensor:
        return self._step([("forward", kv_caches.tp_pool_id, *_host_inputs(input_ids, md), num_layers)],
                          lambda: self._model.forward(input_ids, md, kv_caches, num_layers))

    def build_decode_bucket(self, pool: KVPool, host, size: int, capture: bool):
        """The driver's DecodeBucket over its local shard (host: model_runner.BucketHost), built (warmed up
        and captured) together with each worker's."""
        from decodekit.engine.model_runner import DecodeBucket
        return self._step([("bucket", pool.tp_pool_id, size, host.max_blocks_per_seq, capture)],
                          lambda: DecodeBucket(host, size, capture))

    def run_decode_bucket(self, pool: KVPool, bucket, inputs, to_dev) -> torch.Tensor:
        """A padded decode step: the workers get the host inputs (ids, positions, slots, tables, seq_lens),
        then the driver runs its bucket on their device copies (to_dev)."""
        return self._step([("bucket_run", pool.tp_pool_id, bucket.size, *inputs)],
                          lambda: bucket.run(*(to_dev(t) for t in inputs)))

    def set_kv_cache_dtype(self, kv_dtype: torch.dtype, kv_scales=None) -> None:
        self._step([("kv_dtype", kv_dtype, kv_scales is not None)],
                   lambda: self._model.set_kv_cache_dtype(kv_dtype, kv_scales))

    def calibrate_kv_scales(self, run_forward, margin: float = 2.0):
        self._step([("calib_begin",)], self._model.begin_kv_calibration)
        try:
            run_forward()
        finally:
            if self._broken is None:
                self._step([("calib_end", margin)])
        return self._model.end_kv_calibration(margin)

    def shutdown(self) -> None:
        if self._broken is None:
            try:
                self._step([("stop",)])
            except TPWorkerError:
                pass
        self.tp.shutdown()


class _SigintHeld:
    """While a step runs in the main thread under Python's default SIGINT handler: a first Ctrl-C is only
    recorded (`hit`: the step raises KeyboardInterrupt once every rank finished it), a second one raises at
    once (the step is then abandoned and the group breaks). Elsewhere (other threads, the user's own handler):
    nothing changes."""

    def __enter__(self) -> "_SigintHeld":
        self.hit, self._old = False, None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _die_with_parent() -> None:
    try:  # Linux: SIGKILL this worker when the thread that started it ends
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _die_with_driver(fd: int) -> None:
    """SIGKILLs this worker when `fd` (its stdin, whose other end only the driver process holds) reads EOF:
    the driver process is gone, however it ended (or has shut the group down). A copy of the descriptor, read
    unbuffered (a daemon thread blocked in sys.stdin's reader would hold its lock at interpreter shutdown)."""
    fd = os.dup(fd)

    def watch():
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="decodekit-tp-driver-watch", daemon=True).start()


def worker_main(args, rank: int, world_size: int, init_method: str, threads: int | None,
                parent_death_signal: bool = True) -> int:
    """A worker process: join the group, load the shard, execute the driver's commands. parent_death_signal:
    SIGKILL it when the thread that started it ends (only where that thread is its process's main thread:
    else an LLM built in a short-lived thread would lose its workers with the thread)."""
    if parent_death_signal:
        _die_with_parent()
    logging.basicConfig(level=logging.WARNING)
    if threads:
        torch.set_num_threads(threads)
    dtype = args.resolved_dtype()
    tp = init_group(rank, world_size, args.resolved_device(), init_method, args.tp_timeout, args.tp_allreduce,
                    args.tp_fused_allreduce)
    device = tp.device
    try:
        if args.seed is not None:
            torch.manual_seed(args.seed)
        _, model = load_shard(args, device, dtype, tp)
        _serve_commands(model, tp)
        return 0
    except Exception:  # noqa: BLE001 -- the driver sees the broken collective; say why here
        log.exception("tensor-parallel worker %d failed", rank)
        return 1
    finally:
        tp.shutdown()


@torch.inference_mode()
def _serve_commands(model: LlamaModel, tp: TPGroup) -> None:
    from decodekit.engine.model_runner import BucketHost, DecodeBucket, copy_kv_blocks
    pools: dict[int, list] = {}
    hosts: dict[int, BucketHost] = {}                   # pool -> what its decode buckets run on
    buckets: dict[tuple[int, int], DecodeBucket] = {}   # (pool, size) -> bucket
    calibrated = None
    while True:
        for cmd in tp.recv():
            op = cmd[0]
            if op == "forward":
                _, pid, ids, md, num_layers = cmd
                model.forward(_to_device(ids, model.device), _to_device(md, model.device), pools[pid], num_layers)
            elif op == "bucket_run":
                _, pid, size, *inputs = cmd
                buckets[(pid, size)].run(*(_to_device(t, model.device) for t in inputs))
            elif op == "bucket":
                _, pid, size, max_blocks, capture = cmd
                if pid not in hosts:
                    hosts[pid] = BucketHost(model, pools[pid], model.device, max_blocks)
                buckets[(pid, size)] = DecodeBucket(hosts[pid], size, capture)
            elif op == "copy":
                copy_kv_blocks(pools[cmd[1]], cmd[2])
            elif op == "alloc":
                pools[cmd[1]] = model.allocate_kv_cache(cmd[2], cmd[3])
            elif op == "free":
                pools.pop(cmd[1], None)
                hosts.pop(cmd[1], None)
                for key in [k for k in buckets if k[0] == cmd[1]]:
                    del buckets[key]
            elif op == "calib_begin":
                model.begin_kv_calibration()
            elif op == "calib_end":
                calibrated = model.end_kv_calibration(cmd[1])
            elif op == "kv_dtype":
                model.set_kv_cache_dtype(cmd[1], calibrated if cmd[2] else None)
            elif op == "stop":
                return
            else:
                raise RuntimeError(f"unknown tensor-parallel command {op!r}")


if __name__ == "__main__":  # spawned by parallel_state._spawn_worker: the pickled arguments come on stdin
    import pickle
    import sys
    a = pickle.load(sys.stdin.buffer)  # (the driver writes nothing after it: the buffer holds no more)
    _die_with_driver(sys.stdin.fileno())
    sys.exit(worker_main(*a))
