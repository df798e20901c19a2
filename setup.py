"""Build decodekit._C (CPU kernels always; CUDA kernels for sm_90a when enabled).

DECODEKIT_CUDA=1 builds the CUDA sources, =0 forces CPU-only; unset: CUDA iff a GPU is visible.
TORCH_CUDA_ARCH_LIST overrides the default -gencode=arch=compute_90a,code=sm_90a.
DECODEKIT_NATIVE=0 drops -march=native from the CPU flags (for binaries that travel);
DECODEKIT_MARCH=x86-64-v3 (say) uses that -march instead.
DECODEKIT_ABI3=1 builds against CPython's stable ABI (_C.abi3.so: one binary for Python 3.9+; the
library uses only PyModule_Create), e.g. to build here for another machine's Python
(tools/gpu_prebuild.sh).
DECODEKIT_PTXAS_VERBOSE=1 adds -Xptxas -v (used by tools/cuda_check.py).
MAX_JOBS sets the ninja parallelism (default: all cores).
"""
import glob
import os
import subprocess
import sys
import sysconfig
import time

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import build_env  # noqa: E402


def _want_cuda() -> bool:
    flag = os.environ.get("DECODEKIT_CUDA", "").strip()
    if flag in ("0", "1"):
        return flag == "1"
    if flag:
        raise SystemExit(f"DECODEKIT_CUDA must be 0 or 1, got {flag!r}")
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


WITH_CUDA = _want_cuda()
if WITH_CUDA:
    # Must be set before torch.utils.cpp_extension is imported: it reads CUDA_HOME then.
    os.environ["CUDA_HOME"] = build_env.require_cuda_home()

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


cpu_sources = rel(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")) + glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
# CUDA build only: torch-free kernels (*.cu, nvcc) and their torch launchers (*.cpp, host compiler,
# with the cxx flags below, -DDECODEKIT_CUDA=1 included).
cuda_sources = rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")) +
                   glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
include_dirs = [os.path.join(ROOT, "include"), os.path.join(ROOT, "csrc")]

cxx_flags = ["-O3", "-fopenmp", "-Wno-unknown-pragmas"]


def _gcc_major():
    """The C++ compiler's major version when it is GCC (None for clang or when it cannot be asked)."""
    cxx = os.environ.get("CXX", "c++")
    try:
        banner = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = subprocess.run([cxx, "-dumpversion"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if "clang" in banner.lower() or not version.strip():
        return None
    try:
        return int(version.strip().split(".")[0])
    except ValueError:
        return None


# GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves (`__m512 __Y = __Y;`), and
# -Wall (Python's own CFLAGS) then reports ~1800 false "may be used uninitialized" warnings per build, inlined
# into our kernels, burying any real one. GCC 13 and clang do not: they keep the warning.
_gcc = _gcc_major()
if _gcc is not None and _gcc < 13:
    cxx_flags += ["-Wno-maybe-uninitialized", "-Wno-uninitialized"]
if os.environ.get("DECODEKIT_MARCH"):
    cxx_flags.append("-march=" + os.environ["DECODEKIT_MARCH"])
elif os.environ.get("DECODEKIT_NATIVE", "1") != "0":
    cxx_flags.append("-march=native")
ABI3 = os.environ.get("DECODEKIT_ABI3", "0") == "1"
# libstdc++ from the system's shared library, named before the compiler driver's own: the H200
# image's /opt/gcc g++ 13.3 linked a private static copy into _C.so, whose iostreams crashed on the
# first error message holding a number (c10::str -> ostream << long, seen 2026-11-30). Harmless
# where the driver links it dynamically anyway (same library).
link_flags = ["-fopenmp", "-l:libstdc++.so.6"]

if WITH_CUDA:
    include_dirs += build_env.pip_cuda_include_dirs()
    include_dirs.append(build_env.cutlass_include_dir(required=True))
    nvcc_flags = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", "-DDECODEKIT_CUDA=1",
                  "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        nvcc_flags.append("-gencode=arch=compute_90a,code=sm_90a")
    if os.environ.get("DECODEKIT_PTXAS_VERBOSE") == "1":
        nvcc_flags += ["-Xptxas", "-v"]
    ext = CUDAExtension(
        "decodekit._C", cpu_sources + cuda_sources, include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags + ["-DDECODEKIT_CUDA=1"], "nvcc": nvcc_flags},
        extra_link_args=link_flags, py_limited_api=ABI3)
else:
    ext = CppExtension("decodekit._C", cpu_sources, include_dirs=include_dirs,
                       extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags,
                       py_limited_api=ABI3)


class TimedBuild(BuildExtension):
    def finalize_options(self):
        super().finalize_options()
        # pip's editable install builds in place from a throwaway temp dir outside the checkout; use
        # the checkout's own build/temp.* instead, the one `setup.py build_ext --inplace` (make install)
        # uses, so the first `make test` after `make demo` finds every object built (was: a full
        # rebuild, ~50 s). A --build-temp inside the checkout is kept.
        here = os.path.dirname(os.path.abspath(__file__))
        if self.inplace and not os.path.abspath(self.build_temp).startswith(here + os.sep):
            tag = f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
            self.build_temp = os.path.join(here, "build", tag)

    def run(self):
        t0 = time.time()
        print(f"decodekit: building {'CPU + CUDA' if WITH_CUDA else 'CPU-only'} "
              f"({len(ext.sources)} sources, MAX_JOBS={os.environ['MAX_JOBS']})", flush=True)
        super().run()
        print(f"decodekit: build took {time.time() - t0:.1f} s", flush=True)


# Metadata lives in pyproject.toml; setup.py only adds the extension.
setup(
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[ext],
    cmdclass={"build_ext": TimedBuild.with_options(use_ninja=True)},
)
