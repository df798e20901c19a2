#!/usr/bin/env bash
# In-process A/B of the CPU INT4 / INT8 GEMM: the headers of git revision REV (side a) against the
# working tree's (side b), built into one binary and timed alternately (bench/cpp/ab/quant_gemm_main.cpp
# says what is timed). On a shared VM, whose speed drifts +-30% between runs, this is the way to see a
# 5-20% kernel change. Usage: tools/ab_quant_gemm.sh [REV (default HEAD)] [M ...]; OMP_NUM_THREADS as usual.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rev=${1:-HEAD}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$rev" include | tar -x -C "$work"
cxx=${CXX:-g++}
flags=(-std=c++20 -O3 -march=native -fopenmp -w)
side=$root/bench/cpp/ab/quant_gemm_side.cpp
"$cxx" "${flags[@]}" -I "$work/include" -Ddk=dk_ab_ns_a -DDK_AB_FN=dk_ab_a -c "$side" -o "$work/a.o" &
"$cxx" "${flags[@]}" -I "$root/include" -Ddk=dk_ab_ns_b -DDK_AB_FN=dk_ab_b -c "$side" -o "$work/b.o" &
wait
"$cxx" "${flags[@]}" "$root/bench/cpp/ab/quant_gemm_main.cpp" "$work/a.o" "$work/b.o" -o "$work/ab"
echo "a = $rev ($(git -C "$root" rev-parse --short "$rev")), b = working tree; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}"
"$work/ab" "$@"
