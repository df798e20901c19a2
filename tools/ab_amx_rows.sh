#!/usr/bin/env bash
# In-process A/B of the CPU's 1..16-row INT4 GEMM without / with the AMX rows copy (bench/cpp/ab/amx_rows_main.cpp
# says what is timed). Usage: tools/ab_amx_rows.sh [M ...]; OMP_NUM_THREADS as usual.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${CXX:-g++}" -std=c++20 -O3 -march=native -fopenmp -w -I "$root/include" "$root/bench/cpp/ab/amx_rows_main.cpp" -o "$work/ab"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}, $(date -u '+%Y-%m-%d %H:%M UTC')"
"$work/ab" "$@"
