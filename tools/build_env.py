"""Locate the build's external pieces: the CUDA toolkit, the pip CUDA headers and CUTLASS.

Used by setup.py and by tools/cuda_check.py. Plain Python (no torch import), so it can
run before torch.utils.cpp_extension reads CUDA_HOME at import time.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import site
import sys
import sysconfig


class MissingPiece(RuntimeError):
    pass


def _is_toolkit(root: str | None) -> bool:
    return bool(root) and os.path.isfile(os.path.join(root, "bin", "nvcc")) and os.path.isfile(
        os.path.join(root, "include", "cuda_runtime.h"))


def find_cuda_home() -> str | None:
    """The real CUDA toolkit root, or None.

    Torch's own guess takes dirname(dirname(which nvcc)); when `nvcc` on PATH is a wrapper
    script (e.g. /usr/local/bin/nvcc exec'ing the real one) that points at /usr/local and
    torch then looks for libcudart beside the wrapper. We check each candidate for
    bin/nvcc + include/cuda_runtime.h, and read the wrapper for the path it execs.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if _is_toolkit(os.environ.get(var)):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    candidates = []
    if nvcc:
        real = os.path.realpath(nvcc)
        candidates.append(os.path.dirname(os.path.dirname(real)))
        try:
            with open(real, "rb") as f:
                head = f.read(4096)
            if head.startswith(b"#!"):  # a wrapper script: find the nvcc it runs
                for m in re.finditer(rb"(/[^\s'\"]+)/bin/nvcc\b", head):
                    candidates.append(m.group(1).decode())
        except OSError:
            pass
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True) + ["/opt/cuda"]
    for c in candidates:
        if _is_toolkit(c):
            return os.path.realpath(c)
    return None


def _site_dirs() -> list[str]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    out = []
    for d in dirs:
        if d and d not in out and os.path.isdir(d):
            out.append(d)
    return out


def pip_cuda_include_dirs() -> list[str]:
    """Headers that torch's CUDA headers need (cublas, cusparse, ...) from the nvidia-* wheels."""
    found = []
    for d in _site_dirs():
        for inc in sorted(glob.glob(os.path.join(d, "nvidia", "cu[0-9]*", "include"))):
            if inc not in found:
                found.append(inc)
    return found


def cutlass_include_dir(required: bool) -> str | None:
    """CUTLASS/CuTe headers from the `nvidia-cutlass` package (cutlass_library/source/include)."""
    env = os.environ.get("CUTLASS_INCLUDE_DIR")
    if env and os.path.isfile(os.path.join(env, "cutlass", "cutlass.h")):
        return env
    for d in _site_dirs():
        inc = os.path.join(d, "cutlass_library", "source", "include")
        if os.path.isfile(os.path.join(inc, "cutlass", "cutlass.h")):
            return inc
    if required:
        raise MissingPiece(
            "CUTLASS headers not found. Install them with:  pip install --no-deps nvidia-cutlass\n"
            "(or set CUTLASS_INCLUDE_DIR to a directory containing cutlass/cutlass.h)")
    return None


def require_cuda_home() -> str:
    home = find_cuda_home()
    if home is None:
        raise MissingPiece(
            "DECODEKIT_CUDA=1 but no CUDA toolkit was found (looked at $CUDA_HOME, the nvcc on PATH and "
            "what it execs, /usr/local/cuda*). Install the CUDA 13 toolkit or set CUDA_HOME to its root "
            "(the directory with bin/nvcc and include/cuda_runtime.h); or build CPU-only with DECODEKIT_CUDA=0.")
    return home


def cuda_runtime_include() -> str | None:
    """A directory holding cuda_runtime.h / cuda_fp16.h (the toolkit's, else pip's)."""
    home = find_cuda_home()
    dirs = ([os.path.join(home, "include")] if home else []) + pip_cuda_include_dirs()
    return next((d for d in dirs if os.path.isfile(os.path.join(d, "cuda_fp16.h"))), None)


if __name__ == "__main__":
    if sys.argv[1:] == ["--cuda-include"]:  # for the Makefile's emu-test
        d = cuda_runtime_include()
        print(d or "")
        sys.exit(0 if d else 1)
    if sys.argv[1:] == ["--cutlass-include"]:  # for CMakeLists.txt (the CUDA benchmarks)
        d = cutlass_include_dir(False)
        print(d or "")
        sys.exit(0 if d else 1)
    print("CUDA_HOME:", find_cuda_home())
    print("pip CUDA includes:", pip_cuda_include_dirs())
    print("CUTLASS:", cutlass_include_dir(False))
