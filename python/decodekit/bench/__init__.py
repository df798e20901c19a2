"""Benchmark helpers shared by the Python microbenchmarks in bench/ (see timing.py).

    from decodekit.bench import bench, rotating_copies, measure_copy_bandwidth, Result, write_results
"""
from .timing import (  # noqa: F401
    DTYPES,
    TOLERANCE,
    BenchContext,
    Ceiling,
    Result,
    Timing,
    add_common_args,
    bench,
    cache_bytes,
    ceiling_details,
    check_close,
    device_name,
    device_slug,
    format_table,
    gbps,
    measure_copy_bandwidth,
    measure_matmul_tflops,
    rel_err,
    result_name,
    rotating_copies,
    rotation_count,
    run_stamp,
    summarize,
    tensor_bytes,
    tflops,
    write_results,
)

__all__ = [n for n in dir() if not n.startswith("_")]
