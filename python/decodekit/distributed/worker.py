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
import signal
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
    if args.quantization in ("int4-rtn", "fp8"):
        quantize_projections(loaded.weights, args.quantization)
    plan = shard(loaded.config) if shard else None
    model = LlamaModel(loaded.config, loaded.weights, dtype=dtype, device=device, tp=tp, plan=plan,
                       max_model_len=args.max_model_len)
    return loaded, model


class TPDriverModel:
    """Rank 0's model: LlamaModel's interface, each state-changing call mirrored on the workers."""

    def __init__(self, model: LlamaModel, tp: TPGroup):
        self._model, self.tp = model, tp
        self._ids = itertools.count()
        self._freed: list[int] = []

    def __getattr__(self, name):  # config, dtype, device, layers, kv_dtype, ...: the local model's
        return getattr(self._model, name)

    def _send(self, *cmds) -> None:
        batch = [("free", p) for p in self._freed] + list(cmds)
        self._freed = []
        try:
            self.tp.send(batch)
        except RuntimeError as e:
            raise self.worker_error(e) from e

    def worker_error(self, e: BaseException) -> TPWorkerError:
        dead = self.tp.dead_workers()
        who = f"worker {', '.join(dead)} died" if dead else "a worker stopped answering"
        return TPWorkerError(f"tensor parallelism failed: {who} ({type(e).__name__}: {str(e)[:200]}); the "
                             f"engine cannot continue -- restart it")

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> KVPool:
        pid = next(self._ids)
        self._send(("alloc", pid, num_blocks, block_size))
        pool = KVPool(self._model.allocate_kv_cache(num_blocks, block_size))
        pool.tp_pool_id, pool.tp_driver = pid, self
        weakref.finalize(pool, self._freed.append, pid)
        return pool

    def copy_kv_blocks(self, pool: KVPool, pairs) -> None:
        self._send(("copy", pool.tp_pool_id, list(pairs)))

    def _local(self, fn):
        """This rank's part of a collective step: a RuntimeError there is a collective that failed."""
        try:
            return fn()
        except TPWorkerError:
            raise
        except RuntimeError as e:  # say which worker
            raise self.worker_error(e) from e

    @property
    def local_model(self) -> LlamaModel:
        return self._model

    def forward(self, input_ids: torch.Tensor, md: AttentionMetadata, kv_caches: KVPool,
                num_layers: int | None = None) -> torch.Tensor:
        self._send(("forward", kv_caches.tp_pool_id, *_host_inputs(input_ids, md), num_layers))
        return self._local(lambda: self._model.forward(input_ids, md, kv_caches, num_layers))

    def build_decode_bucket(self, pool: KVPool, host, size: int, capture: bool):
        """The driver's DecodeBucket over its local shard (host: model_runner.BucketHost), built (warmed up
        and captured) together with each worker's."""
        from decodekit.engine.model_runner import DecodeBucket
        self._send(("bucket", pool.tp_pool_id, size, host.max_blocks_per_seq, capture))
        return self._local(lambda: DecodeBucket(host, size, capture))

    def run_decode_bucket(self, pool: KVPool, bucket, inputs, to_dev) -> torch.Tensor:
        """A padded decode step: the workers get the host inputs (ids, positions, slots, tables, seq_lens),
        then the driver runs its bucket on their device copies (to_dev)."""
        self._send(("bucket_run", pool.tp_pool_id, bucket.size, *inputs))
        return self._local(lambda: bucket.run(*(to_dev(t) for t in inputs)))

    def set_kv_cache_dtype(self, kv_dtype: torch.dtype, kv_scales=None) -> None:
        self._send(("kv_dtype", kv_dtype, kv_scales is not None))
        self._model.set_kv_cache_dtype(kv_dtype, kv_scales)

    def calibrate_kv_scales(self, run_forward, margin: float = 2.0):
        self._send(("calib_begin",))
        self._model.begin_kv_calibration()
        try:
            run_forward()
        finally:
            self._send(("calib_end", margin))
        return self._model.end_kv_calibration(margin)

    def shutdown(self) -> None:
        try:
            self._send(("stop",))
        except TPWorkerError:
            pass
        self.tp.shutdown()


def _die_with_parent() -> None:
    try:  # Linux: SIGKILL this worker when the driver process dies
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def worker_main(args, rank: int, world_size: int, init_method: str, threads: int | None) -> int:
    """A worker process: join the group, load the shard, execute the driver's commands."""
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


if __name__ == "__main__":  # spawned by parallel_state._spawn_worker: argv[1] holds the pickled arguments
    import os
    import pickle
    import sys
    with open(sys.argv[1], "rb") as f:
        a = pickle.load(f)
    os.unlink(sys.argv[1])
    sys.exit(worker_main(*a))
