#!/usr/bin/env bash
# One hash of every source that goes into the native binaries (the extension and the CMake
# tests/benchmarks): tools/gpu_prebuild.sh records it, tools/gpu_check.sh compares it with the
# tree it runs in before using a carried prebuilt/ (needs no git: the device gets a plain copy).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
find csrc include tests/cpp bench/cpp setup.py CMakeLists.txt -type f \
     \( -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' -o -name '*.hpp' -o -name '*.inc' \
        -o -name '*.py' -o -name '*.txt' \) ! -path '*/__pycache__/*' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
