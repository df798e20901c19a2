"""Copies the repo's include/decodekit to ./inc/decodekit (next to this file) for the host emulator:
  - `__shared__` -> `static thread_local` (one block at a time per OS thread),
  - `kernel<...><<<grid, block, smem, stream>>>(args);` -> `::dk_emu::launch(grid, block, smem, stream, kernel<...>, args);`
  - `#if defined(__CUDACC__)` -> `#if 1` in common/vec.cuh (device helpers on the host),
  - `extern __shared__ T name[];` (dynamic shared memory) -> `T* name = (T*)::dk_emu::dynamic_smem();`,
  - `#include <cub/device/device_radix_sort.cuh>` -> `#include "cub_emu.h"` (copied to ./inc: CUB's
    DeviceRadixSort::SortPairs contract on the host, std::stable_sort on the key bits).
The sources themselves are untouched."""
import os, re, shutil, sys
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "decodekit")
HERE = os.path.dirname(os.path.abspath(__file__))
DST = os.path.join(HERE, "inc", "decodekit")
shutil.rmtree(DST, ignore_errors=True)
os.makedirs(DST, exist_ok=True)
shutil.copy(os.path.join(HERE, "cub_emu.h"), os.path.join(HERE, "inc", "cub_emu.h"))
EXTERN_SMEM = re.compile(r"\bextern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;")
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^;<>]*(?:<[^;<>]*>[^;<>]*)*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*(;|$)", re.S)
def fix_launch(m):
    kern, cfg, args, end = m.group(1), m.group(2), m.group(3), m.group(4)
    parts = [p.strip() for p in re.split(r",(?![^()]*\))", cfg)]
    while len(parts) < 4:
        parts.append("0" if len(parts) == 2 else "nullptr")
    return f"::dk_emu::launch({', '.join(parts)}, {kern}, {args}){end}"
n = 0
for dp, _, files in os.walk(SRC):
    for f in files:
        src = os.path.join(dp, f)
        dst = os.path.join(DST, os.path.relpath(src, SRC))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        text = open(src).read()
        if f.endswith(".cuh"):
            text, k = LAUNCH.subn(fix_launch, text)
            n += k
            text = EXTERN_SMEM.sub(r"\1* \2 = reinterpret_cast<\1*>(::dk_emu::dynamic_smem());", text)
            text = text.replace("#include <cub/device/device_radix_sort.cuh>", '#include "cub_emu.h"')
            text = re.sub(r"\b__shared__\b", "static thread_local", text)
            text = text.replace("#if defined(__CUDACC__)", "#if 1")
        open(dst, "w").write(text)
print(f"prepared {DST}: {n} launches rewritten")
