#!/usr/bin/env bash
# Build HERE (no GPU needed), for the H200 image, what tools/gpu_check.sh would otherwise compile
# there: ~2-4 minutes of the 15 minutes of device time a session gets, and a compile error found
# here costs none.
#
#   bash tools/gpu_prebuild.sh [TORCH_VERSION]        (default 2.11.0: the image's torch, cu130)
#
# 1. torch==TORCH_VERSION for THIS machine's Python, --no-deps, into $DK_PREBUILD_TORCH
#    (default /tmp/dk_torch-VERSION): its headers and libraries are those of the image's build
#    (the C++ ABI of an extension is torch's, not Python's).
# 2. decodekit._C against it with CPython's stable ABI (DECODEKIT_ABI3=1: _C.abi3.so loads in the
#    image's Python 3.12), CPU code for -march=x86-64-v3 (any H200 host; not this CPU's
#    -march=native), CUDA for sm_90a; debug info stripped -> prebuilt/_C.abi3.so
# 3. the CMake CUDA tests and benchmarks (test_*_cuda, bench_*_cuda; -DDECODEKIT_NATIVE=OFF)
#    -> prebuilt/build_gpu/ (CUDA runtime linked statically: no library path to find there)
# 4. prebuilt/MANIFEST: torch version, source hash (tools/source_hash.sh), git revision, the
#    newest GLIBC / GLIBCXX symbol versions the binaries need.
#
# gpu_check.sh uses prebuilt/ when it is carried (run(..., carry=[".whl", "prebuilt"])), the
# image's torch is TORCH_VERSION and the source hash matches the tree it runs in; otherwise
# (or when the library fails to load there) it builds there as before.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
TV=${1:-2.11.0}
TDIR=${DK_PREBUILD_TORCH:-/tmp/dk_torch-$TV}
OUTD=prebuilt
WORKD=${DK_PREBUILD_WORK:-/tmp/dk_prebuild-$TV}
JOBS=${MAX_JOBS:-$(nproc)}
t_all=$SECONDS

EXCLUDE=$(git rev-parse --git-path info/exclude)
grep -qxF '/prebuilt/' "$EXCLUDE" 2>/dev/null || echo '/prebuilt/' >> "$EXCLUDE"

CUDA_HOME=${CUDA_HOME:-$("$PY" -c "import sys; sys.path.insert(0, 'tools'); import build_env; print(build_env.find_cuda_home() or '')")}
[[ -x "$CUDA_HOME/bin/nvcc" ]] || { echo "gpu_prebuild: no nvcc under CUDA_HOME='$CUDA_HOME'" >&2; exit 1; }
export CUDA_HOME

# 1. torch
if ! PYTHONPATH=$TDIR "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TV' else 1)" 2>/dev/null; then
  echo "gpu_prebuild: pip install --no-deps --target $TDIR torch==$TV"
  rm -rf "$TDIR"
  "$PY" -m pip install -q --no-deps --target "$TDIR" "torch==$TV"
fi
TFULL=$(PYTHONPATH=$TDIR "$PY" -c "import torch; print(torch.__version__, torch.version.cuda)")
echo "gpu_prebuild: building against torch $TFULL ($TDIR)"

# 2. the extension
t0=$SECONDS
mkdir -p "$WORKD"
PYTHONPATH=$TDIR DECODEKIT_CUDA=1 DECODEKIT_ABI3=1 DECODEKIT_MARCH=x86-64-v3 MAX_JOBS=$JOBS \
  "$PY" setup.py build_ext --build-temp "$WORKD/temp" --build-lib "$WORKD/lib" > "$WORKD/build.log" 2>&1 ||
  { tail -40 "$WORKD/build.log"; echo "gpu_prebuild: extension build FAILED (log $WORKD/build.log)" >&2; exit 1; }
so=$(ls "$WORKD"/lib/decodekit/_C*.so | head -1)
case "$so" in *.abi3.so) ;; *) echo "gpu_prebuild: expected an .abi3.so, got $so" >&2; exit 1 ;; esac
rm -rf "$OUTD"; mkdir -p "$OUTD/build_gpu"
strip --strip-debug -o "$OUTD/_C.abi3.so" "$so"
echo "gpu_prebuild: extension in $((SECONDS - t0)) s: $(du -h "$OUTD/_C.abi3.so" | cut -f1)"

# 3. CMake CUDA tests and benchmarks
t0=$SECONDS
TARGETS=$(awk '/^if\(DECODEKIT_CUDA\)$/{f=1} /^endif\(\)$/{f=0}
  f && /foreach\(t /{gsub(/.*foreach\(t |\)/,""); for(i=1;i<=NF;i++) printf "test_%s_cuda ", $i}
  f && /foreach\(b /{gsub(/.*foreach\(b |\)/,""); for(i=1;i<=NF;i++) printf "bench_%s_cuda ", $i}' CMakeLists.txt)
echo "gpu_prebuild: CMake targets: $TARGETS"
cmake -S . -B "$WORKD/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDECODEKIT_CUDA=ON -DDECODEKIT_NATIVE=OFF \
  -DDECODEKIT_CUDART_STATIC=ON -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" > "$WORKD/cmake.log" 2>&1 &&
  cmake --build "$WORKD/cmake" -j "$JOBS" --target $TARGETS >> "$WORKD/cmake.log" 2>&1 ||
  { tail -40 "$WORKD/cmake.log"; echo "gpu_prebuild: CMake build FAILED (log $WORKD/cmake.log)" >&2; exit 1; }
for t in $TARGETS; do strip --strip-debug -o "$OUTD/build_gpu/$t" "$WORKD/cmake/$t"; done
echo "gpu_prebuild: CMake CUDA binaries in $((SECONDS - t0)) s"

# 4. manifest
glibc=$(objdump -T "$OUTD/_C.abi3.so" "$OUTD"/build_gpu/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
glibcxx=$(objdump -T "$OUTD/_C.abi3.so" "$OUTD"/build_gpu/* 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
cat > "$OUTD/MANIFEST" <<EOF
torch_version=$TV
source_hash=$(bash tools/source_hash.sh)
git_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc include setup.py CMakeLists.txt tests/cpp bench/cpp || echo '+dirty')
built=$(date -Is)
glibc_needed=$glibc
glibcxx_needed=$glibcxx
EOF
cat "$OUTD/MANIFEST"
echo "gpu_prebuild: $(du -sh "$OUTD" | cut -f1) in $OUTD, $((SECONDS - t_all)) s. Carry it: run(command=\"bash tools/gpu_check.sh \$OUT\", carry=[\".whl\", \"prebuilt\"])"
