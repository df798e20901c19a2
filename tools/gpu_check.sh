#!/usr/bin/env bash
# The one prepared script for the lent H200 machine: build, check, measure, write results.
#
#   bash tools/gpu_check.sh RESULTS_DIR [--only PART_OR_FAMILY,...] [--budget SECONDS] [--dry-run]
#
# On the device machine (tools/gpu_prepare.sh first, here; tools/gpu_prebuild.sh too, to carry the
# builds and save their minutes there):
#   run(command="bash tools/gpu_check.sh $OUT", carry=[".whl", "prebuilt"], timeout_s=600)
#
# Parts, in order, each in its own process under `timeout` (a failing part is reported and
# the script goes on): env, build, ceilings, tests, engine, cpp_bench, py_bench (see PARTS below).
# Families (norm, rope, activation, ...: see FAMILIES) narrow tests and benches to their names.
#   --only build,tests          just those parts (all families)
#   --only attention,gemm       every part, tests and benches narrowed to those families;
#                               names that are neither a part nor a family are skipped with a message
# Global budget (default 480 s): each part's timeout is its cap, cut so later parts keep time.
#
# RESULTS_DIR gets at most 8 flat files (what the device tool returns):
#   results.md                          summary table, ceilings, benchmark tables, test summaries
#   summary.json                        parts (status, seconds, key numbers), mode, families
#   log.txt                             every part's output (each capped)
#   DATE_DEVICE_ceilings.json           copy GB/s and matmul TFLOP/s
#   DATE_DEVICE_py_bench.json           bench/run_all.py rows (decodekit.bench.Result dicts)
#   DATE_DEVICE_cpp_bench.json          each bench/cpp binary's --json output, rc and output tail
#   DATE_DEVICE_engine.json             `decodekit bench latency/throughput` results (engine part)
#
# Without a GPU (no nvidia-smi, or torch.cuda.is_available() false, or --dry-run) it runs in
# CPU-only dry-run mode: it says which GPU parts it skips, runs the CPU-meaningful ones quickly
# (CPU ceilings, CMake CPU build + ctest, CPU C++ benches and py_bench --device cpu, both --quick)
# and exits 0 unless one of those fails.
set -u

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
cd "$REPO" || exit 2

# ---------------------------------------------------------------------------------------
# Registry. Adding a bench family is ONE line here: "name: keys". The keys (space separated)
# select pytest tests (-k "k1 or k2"), ctest tests (-R "k1|k2") and bench/cpp binaries
# (bench_*<key>*); the Python bench is bench/bench_<name>.py (found by bench/run_all.py).
FAMILIES=(
  "norm: norm"
  "rope: rope rotary"
  "activation: activation silu"
  "attention: attention paged reshape_and_cache fp8 copy_blocks swap_blocks"
  "quant: quant int4 int8 fp8_gemm"
  "spec: rejection_sample philox"
  "sampler: gumbel sampler sort_desc"
  "allreduce: allreduce all_reduce gemm_allreduce"
)
# part: cap in seconds (the most it may take; the global budget can cut it).
PARTS=(
  "env: 60"
  "build: 240"
  "ceilings: 60"
  "tests: 210"
  "engine: 200"
  "cpp_bench: 90"
  "py_bench: 150"
)
# ---------------------------------------------------------------------------------------

PY=${PYTHON:-python3}
export PY REPO SELF

part_names() { for p in "${PARTS[@]}"; do echo "${p%%:*}"; done; }
family_names() { for f in "${FAMILIES[@]}"; do echo "${f%%:*}"; done; }
family_keys() {  # family -> its keys
  local f
  for f in "${FAMILIES[@]}"; do [[ "${f%%:*}" == "$1" ]] && { echo ${f#*:}; return; }; done
}
part_cap() {  # DK_CAP_<part>=SECONDS overrides a part's cap for one run
  local v="DK_CAP_$1"; [[ -n "${!v:-}" ]] && { echo "${!v}"; return; }
  local p; for p in "${PARTS[@]}"; do [[ "${p%%:*}" == "$1" ]] && { echo ${p#*:}; return; }; done
}

now() { date +%s.%N; }
# floating-point arithmetic without bc (the H200 image has none): calc "1.5 + $x"
calc() {
  if command -v awk > /dev/null; then awk "BEGIN { printf \"%.6f\", $* }"
  else "${PY:-python3}" -c "print('%.6f' % ($*))"; fi
}
fsecs() { printf "%.1f" "$1"; }

# ===== the parts (run as: bash gpu_check.sh --part NAME, with the exported environment) ====

key() { echo "$*" >> "$WORK/key.$PART"; }        # key numbers for the summary table
skipmsg() { echo "SKIP ($*)"; echo "$PART: $*" >> "$WORK/skips"; }

sel_keys() {  # keys of the selected families, or nothing when all are selected
  [[ "$FAM_FILTER" == 1 ]] || return 0
  local f; for f in $FAMS; do family_keys "$f"; done | tr ' ' '\n' | sort -u | tr '\n' ' '
}
pytest_k() { local k=$(sel_keys); [[ -n "$k" ]] && echo "$k" | sed 's/ *$//; s/ / or /g'; }
ctest_r() { local k=$(sel_keys); [[ -n "$k" ]] && echo "$k" | sed 's/ *$//; s/ /|/g'; }

part_env() {
  echo "date: $(date -Is)  host: $(hostname)  kernel: $(uname -r)  cpus: $(nproc)"
  echo "mode: $MODE${DRY_REASON:+ ($DRY_REASON)}"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw \
      --format=csv 2>&1 | head -5
    nvidia-smi 2>&1 | head -20
  else
    echo "nvidia-smi: not found"
  fi
  command -v nvcc > /dev/null && nvcc --version | tail -2 || echo "nvcc: not on PATH"
  cmake --version 2>/dev/null | head -1 || echo "cmake: not found"
  "$PY" - <<'EOF'
import platform, torch
print(f"python {platform.python_version()}  torch {torch.__version__}  cuda {torch.version.cuda}  "
      f"cuda available {torch.cuda.is_available()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name}  cc {p.major}.{p.minor}  SMs {p.multi_processor_count}  "
          f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB  memory {p.total_memory / 2**30:.1f} GiB")
EOF
  local rc=0
  if ls .whl/*.whl > /dev/null 2>&1; then
    echo "installing carried wheels into $SITE: $(ls .whl | tr '\n' ' ')"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || rc=1
    key "wheels $(ls .whl/*.whl | wc -l)$([[ $rc != 0 ]] && echo ' INSTALL FAILED')"
    [[ -f "$SITE/cutlass_library/source/include/cutlass/cutlass.h" ]] &&
      export CUTLASS_INCLUDE_DIR="$SITE/cutlass_library/source/include"
  else
    echo "no .whl/*.whl carried (run tools/gpu_prepare.sh here and carry .whl)"
    key "no wheels"
  fi
  "$PY" tools/build_env.py || true
  if [[ "$MODE" == gpu ]]; then
    local g=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
    key "$g"
  else
    key "no GPU: dry run"
  fi
  key "$("$PY" -c 'import torch; print(f"torch {torch.__version__} cuda {torch.version.cuda}")' 2>/dev/null)"
  return $rc
}

cmake_build() {  # dir, extra configure args...
  local dir=$1; shift
  local t0=$(now) rc=0
  echo "cmake -S . -B $dir -G Ninja $*"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" && cmake --build "$dir" -j "$JOBS" || rc=$?
  echo "cmake build in $dir: rc=$rc, $(fsecs $(calc "$(now) - $t0")) s"
  return $rc
}

part_build() {
  if [[ ! -f CMakeLists.txt ]]; then HAVE_CMAKE=0; else HAVE_CMAKE=1; fi
  if [[ "$MODE" != gpu ]]; then
    skipmsg "no GPU: CUDA extension build (DECODEKIT_CUDA=1 setup.py build_ext) and CMake CUDA build (build/gpu)"
    if "$PY" -c "import decodekit" 2>/dev/null; then
      echo "CPU extension already importable: $("$PY" -c 'import decodekit, os; print(os.path.dirname(decodekit.__file__))')"
    else
      echo "note: 'import decodekit' fails here; py_bench needs the CPU build (make install)"
    fi
    if [[ $HAVE_CMAKE == 1 ]]; then
      cmake_build "$CMAKE_DIR" -DDECODEKIT_CUDA=OFF || { key "cmake cpu FAILED"; return 1; }
      key "cmake cpu ok ($CMAKE_DIR)"
    else
      skipmsg "no CMakeLists.txt: C++ tests and benches"
    fi
    return 0
  fi

  local cuda_home cutlass torch_prefix rc_ext=0 rc_cmake=0 t0=$(now)
  cuda_home=$("$PY" -c "import sys; sys.path.insert(0, 'tools'); import build_env; print(build_env.find_cuda_home() or '')")
  echo "CUDA_HOME=$cuda_home  CUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR:-}"
  [[ -n "$cuda_home" ]] && export CUDA_HOME="$cuda_home" PATH="$cuda_home/bin:$PATH"

  # A carried prebuilt/ (tools/gpu_prebuild.sh; the driver checked its torch version and source
  # hash) saves the build when it loads here; else build as usual.
  local need_ext=1 need_cmake=$HAVE_CMAKE
  if [[ -n "$PREBUILT" ]]; then
    echo "prebuilt/: $(tr '\n' ' ' < "$PREBUILT/MANIFEST")"
    cp "$PREBUILT/_C.abi3.so" python/decodekit/_C.abi3.so
    if "$PY" -c "import decodekit, sys; ok = decodekit.has_cuda_kernels(); print('prebuilt has_cuda_kernels:', ok); sys.exit(0 if ok else 1)"; then
      need_ext=0; key "ext prebuilt ($(sed -n 's/^git_rev=//p' "$PREBUILT/MANIFEST"))"
    else
      echo "prebuilt extension does not load here: building it"; rm -f python/decodekit/_C.abi3.so
    fi
    if [[ "$CMAKE_DIR" == "$PREBUILT/build_gpu" ]]; then
      local missing=$(ldd "$CMAKE_DIR"/* 2>&1 | grep -c "not found\|version .* not found")
      if (( missing == 0 )); then need_cmake=0; key "cmake prebuilt ($(ls "$CMAKE_DIR" | wc -l) binaries)"
      else echo "prebuilt CMake binaries miss libraries here: building them"; ldd "$CMAKE_DIR"/* 2>&1 | grep "not found"; rm -rf "$CMAKE_DIR"; fi
    fi
  fi
  (( need_ext == 0 && need_cmake == 0 )) && return 0

  # The extension and the CMake tree build at the same time (16 cores; nvcc is mostly serial per file).
  local pid_ext="" pid_cmake=""
  if (( need_ext == 1 )); then
    ( DECODEKIT_CUDA=1 MAX_JOBS=$JOBS "$PY" setup.py build_ext --inplace > "$WORK/build_ext.log" 2>&1 ) &
    pid_ext=$!
  fi
  if (( need_cmake == 1 )); then
    ( cmake_build "$CMAKE_DIR" -DDECODEKIT_CUDA=ON ${cuda_home:+-DCMAKE_CUDA_COMPILER=$cuda_home/bin/nvcc} \
        > "$WORK/build_cmake.log" 2>&1 ) &
    pid_cmake=$!
  fi
  [[ -n "$pid_ext" ]] && { wait $pid_ext || rc_ext=$?; }
  local t_ext=$(fsecs $(calc "$(now) - $t0"))
  [[ -n "$pid_ext" ]] && { echo "----- extension build (rc=$rc_ext, $t_ext s), last lines:"; tail -40 "$WORK/build_ext.log"; }
  if [[ $rc_ext == 0 && -n "$pid_ext" ]]; then
    "$PY" -c "import decodekit, sys; ok = decodekit.has_cuda_kernels(); print('has_cuda_kernels:', ok); sys.exit(0 if ok else 1)" \
      || rc_ext=1
    # a private static libstdc++ inside _C.so crashed on number formatting once (setup.py's link flags)
    local so=$(ls python/decodekit/_C*.so 2>/dev/null | head -1)
    if [[ -n "$so" ]] && command -v nm > /dev/null && nm -C "$so" | grep -qE " [TtWw] std::ostream& std::ostream::_M_insert<long>"; then
      echo "WARNING: $so holds its own copy of libstdc++ (statically linked)"; key "libstdc++ STATIC in _C.so"; rc_ext=1
    fi
  fi
  [[ -n "$pid_ext" ]] && key "ext $([[ $rc_ext == 0 ]] && echo ok || echo FAILED) ${t_ext}s"
  if [[ -n "$pid_cmake" ]]; then
    wait $pid_cmake || rc_cmake=$?
    echo "----- CMake CUDA build (rc=$rc_cmake), last lines:"; tail -40 "$WORK/build_cmake.log"
    key "cmake $([[ $rc_cmake == 0 ]] && echo ok || echo FAILED) $(fsecs $(calc "$(now) - $t0"))s"
  elif [[ $HAVE_CMAKE == 0 ]]; then
    skipmsg "no CMakeLists.txt: C++ tests and benches"
  fi
  [[ $rc_ext == 0 && $rc_cmake == 0 ]]
}

part_ceilings() {
  local dev=cpu; [[ "$MODE" == gpu ]] && dev=cuda
  # timing.py is loaded by path: it needs torch only, so this part runs even if the build failed.
  "$PY" - "$dev" "$RES/${STAMP}_${SLUG}_ceilings.json" "$WORK/key.$PART" <<'EOF'
import importlib.util, json, sys, time
dev, path, keyfile = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("dk_timing", "python/decodekit/bench/timing.py")
t = importlib.util.module_from_spec(spec); sys.modules["dk_timing"] = t; spec.loader.exec_module(t)
t0 = time.time()
copy = t.measure_copy_bandwidth(dev)
mm = t.measure_matmul_tflops(dev)  # bf16 on CUDA, fp32 on the CPU
rows = [c.to_dict() for c in t.ceiling_details()]
for r in rows:
    r.update(device_name=t.device_name(dev), date=time.strftime("%Y-%m-%dT%H:%M:%S"), torch_version=t.torch.__version__)
    print(f"{r['kind']}: {r['value']:.4g}  ({r['detail']})")
json.dump(rows, open(path, "w"), indent=1)
print(f"wrote {path} in {time.time() - t0:.1f} s")
mmk = "bf16" if dev == "cuda" else "fp32"
open(keyfile, "a").write(f"copy {copy:.4g} GB/s; {mmk} matmul {mm:.4g} TFLOP/s\n")
EOF
}

part_tests() {
  local k r rc=0 ran=0
  k=$(pytest_k); r=$(ctest_r)
  if [[ "$MODE" == gpu ]]; then
    # pytest-xdist (when there): a worker that crashes (a segfault) fails its test and is
    # restarted, so one crash does not hide every later test; a file's tests stay on one worker.
    # 8 workers x 2 OpenMP threads (the float64 references run on the host's 16 cores), tests
    # handed out one by one in collection order: the files that have never run on a GPU first.
    local par=()
    "$PY" -c "import xdist" 2>/dev/null && par=(-n 8 --dist load)
    "$PY" -c "import pytest_timeout" 2>/dev/null && par+=(--timeout 120)
    # Test files, those never run on a GPU first and the quantized GEMMs last (a kernel
    # fault poisons its worker's CUDA context for the rest of its tests). Files, not folders: pytest 8
    # collects an argument inside another one in the folder's order. Folders whose conftest skips
    # at import (tests/server without fastapi) are left out: named on the command line, their
    # conftest's skip would end the whole run.
    local first=(tests/e2e/test_gpu_engine.py tests/ops/test_allreduce_cuda.py tests/distributed/test_tp_cuda.py
                 tests/sampling tests/ops/test_block_ops.py tests/ops/test_attention.py tests/ops/test_attention_fp8.py
                 tests/ops/test_attention_window.py tests/ops/test_decoder_layer.py) last=(tests/ops/test_fp8_gemm.py tests/ops/test_int4.py)
    local files=() f all=()
    for f in $(find tests -name 'test_*.py' | sort); do
      grep -qE '^(\w+ = )?pytest\.importorskip' "$(dirname "$f")/conftest.py" 2>/dev/null || all+=("$f")
    done
    for f in $(for x in "${first[@]}"; do printf '%s\n' "${all[@]}" | grep -E "^$x(/|$)"; done) \
             $(printf '%s\n' "${all[@]}" | grep -vxF -f <(printf '%s\n' "${first[@]}" "${last[@]}") | grep -vE "^($(IFS='|'; echo "${first[*]}"))/") \
             $(for x in "${last[@]}"; do printf '%s\n' "${all[@]}" | grep -xF "$x"; done); do
      [[ " ${files[*]} " == *" $f "* ]] || files+=("$f")
    done
    echo "OMP_NUM_THREADS=2 python3 -m pytest -m cuda -v -rfE --tb=short ${par[*]} ${files[*]} ${k:+-k \"$k\"}"
    OMP_NUM_THREADS=2 "$PY" -m pytest -m cuda -v -rfE --tb=short -p no:cacheprovider "${par[@]}" "${files[@]}" ${k:+-k "$k"} 2>&1 |
      tee "$WORK/pytest.log"
    local prc=${PIPESTATUS[0]}
    local line=$(grep -E "(passed|failed|error|skipped|deselected|no tests ran)" "$WORK/pytest.log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
    if [[ $prc == 5 ]]; then key "pytest: no cuda tests selected"; elif [[ $prc != 0 ]]; then rc=1; key "pytest FAILED: $line"; else key "pytest: $line"; fi
    ran=1
  else
    skipmsg "no GPU: python3 -m pytest -m cuda tests/ (GPU tests)"
  fi
  if [[ -d "$CMAKE_DIR" && -f "$CMAKE_DIR/CTestTestfile.cmake" ]]; then
    echo "ctest --test-dir $CMAKE_DIR ${r:+-R \"$r\"}"
    ctest --test-dir "$CMAKE_DIR" --output-on-failure --timeout 120 ${r:+-R "$r"} 2>&1 | tee "$WORK/ctest.log"
    local crc=${PIPESTATUS[0]}
    local line=$(grep -E "tests passed|No tests were found" "$WORK/ctest.log" | tail -1)
    local nskip=$(grep -c '\*\*\*Skipped' "$WORK/ctest.log")
    [[ $crc != 0 ]] && rc=1
    key "ctest$([[ $crc != 0 ]] && echo ' FAILED'): ${line:-rc=$crc}$( (( nskip > 0 )) && echo ", $nskip skipped (exit 77)")"
    ran=1
  elif [[ -n "$PREBUILT" && "$CMAKE_DIR" == "$PREBUILT/build_gpu" ]] && ls "$CMAKE_DIR"/test_* > /dev/null 2>&1; then
    # prebuilt CUDA test binaries (no CTest tree): run each as ctest would (exit 77 = skipped)
    local t n_ok=0 n_fail=0 n_skip=0
    for t in "$CMAKE_DIR"/test_*; do
      [[ -n "$r" ]] && ! echo "$(basename "$t")" | grep -qE "$r" && continue
      echo "== $(basename "$t")"
      timeout -k 5 120 "$t" > "$WORK/ctest_one.log" 2>&1; local trc=$?
      tail -15 "$WORK/ctest_one.log"
      case $trc in 0) n_ok=$((n_ok + 1)) ;; 77) n_skip=$((n_skip + 1)) ;; *) n_fail=$((n_fail + 1)); echo "FAILED: $(basename "$t") rc=$trc" ;; esac
      echo "$(basename "$t"): rc=$trc" >> "$WORK/ctest.log"
    done
    (( n_fail > 0 )) && rc=1
    key "prebuilt C++ tests$( (( n_fail > 0 )) && echo ' FAILED'): $n_ok passed, $n_fail failed, $n_skip skipped"
    ran=1
  else
    skipmsg "no CMake build in $CMAKE_DIR: ctest"
  fi
  [[ $ran == 0 ]] && return 3
  return $rc
}

part_engine() {
  # End-to-end engine numbers: `decodekit bench` on random presets, HF transformers as the peer.
  # Dry run: one tiny CPU latency run (checks the plumbing only).
  local runs=() r i=0 rc=0 out=()
  if [[ "$MODE" == gpu ]]; then
    runs=(  # most wanted first: the part's time cap may stop the list
      "latency --model random:llama3-8b --dtype bfloat16 --input-len 512 --output-len 64 --iters 2 --peer hf --gpu-memory-utilization 0.45 --max-num-seqs 8"
      "throughput --model random:llama3-8b --dtype bfloat16 --input-len 256 --output-len 128 --num-prompts 64 --peer hf --gpu-memory-utilization 0.45 --max-num-seqs 64"
      "latency --model random:llama3-8b --dtype bfloat16 --quantization int4-rtn --weight-format packed --input-len 512 --output-len 32 --iters 1 --peer none --gpu-memory-utilization 0.45 --max-num-seqs 8"
      "latency --model random:llama3-8b --dtype bfloat16 --quantization fp8 --input-len 512 --output-len 32 --iters 1 --peer none --gpu-memory-utilization 0.45 --max-num-seqs 8"
      "latency --model random:llama3-8b --dtype bfloat16 --spec ngram --output-len 32 --gpu-memory-utilization 0.45 --max-num-seqs 8"
      "latency --model random:smollm2-135m --dtype bfloat16 --input-len 128 --output-len 64 --iters 3 --peer hf --gpu-memory-utilization 0.3 --max-num-seqs 8"
    )
  else
    skipmsg "no GPU: engine benchmarks on CUDA; running one tiny CPU latency run"
    runs=("latency --model random:tiny --input-len 16 --output-len 8 --iters 1 --peer none"
          "latency --model random:tiny --spec ngram --output-len 8")
  fi
  # DK_ENGINE_ONLY=3,6: just those runs of the list (1-based); DK_ENGINE_ENV="A=b C=d": their environment
  if [[ -n "${DK_ENGINE_ONLY:-}" ]]; then
    local sel=() j; for j in ${DK_ENGINE_ONLY//,/ }; do sel+=("${runs[$((j - 1))]}"); done; runs=("${sel[@]}")
  fi
  local deadline=$(calc "$(now) + $PART_TIMEOUT - 5")
  for r in "${runs[@]}"; do
    i=$((i + 1))
    local left=$(printf "%.0f" "$(calc "$deadline - $(now)")")
    (( left < 10 )) && { echo "no time left for: decodekit bench $r"; rc=1; continue; }
    echo "== decodekit bench $r (timeout $left s)"
    local t0=$(now)
    [[ -n "${DK_ENGINE_ENV:-}" ]] && echo "   with $DK_ENGINE_ENV"
    timeout -k 5 "$left" env ${DK_ENGINE_ENV:-} "$PY" -m decodekit.cli bench $r --output-json "$WORK/engine_$i.json" \
      > "$WORK/engine_$i.log" 2>&1
    local brc=$?
    tail -45 "$WORK/engine_$i.log"
    echo "== rc=$brc in $(fsecs $(calc "$(now) - $t0")) s"
    [[ $brc != 0 ]] && rc=1
    out+=("$WORK/engine_$i.json")
  done
  # the engine's host work per step (tiny model: the forward is ~free) at batch 1 / 64 / 256, by phase
  local left=$(printf "%.0f" "$(calc "$deadline - $(now)")")
  if (( left >= 20 )); then
    local dev=cpu; [[ "$MODE" == gpu ]] && dev=cuda
    echo "== bench/bench_engine_host.py --device $dev (timeout $left s)"
    timeout -k 5 "$left" "$PY" bench/bench_engine_host.py --device $dev --json "$WORK/engine_host.json" \
      > "$WORK/engine_host.log" 2>&1 || rc=1
    grep -E "^B=" "$WORK/engine_host.log"
    out+=("$WORK/engine_host.json")
  fi
  "$PY" - "$RES/${STAMP}_${SLUG}_engine.json" "$WORK/key.$PART" "${out[@]}" <<'EOF'
import json, os, sys
path, keyfile, files = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [json.load(open(f)) for f in files if os.path.exists(f)]
json.dump(rows, open(path, "w"), indent=1)
with open(keyfile, "a") as k:
    for r in rows:
        m = r["model"].replace("random:", "")
        if r["bench"] == "engine_host":  # host work per decode step, tiny model
            k.write("engine host per step: " + ", ".join(
                f"B={x['batch']} {x['ms_per_step']:.2f} ms (host-only {x['host_only_ms_per_step']:.2f})"
                for x in r["rows"]) + "\n")
            continue
        if r["bench"] == "latency_spec":  # speculative vs plain: the verification op's share of a step
            c = r["classes"]
            dev_us = 1e6 * (r.get("verify_op_device_s") or 0)
            k.write(f"{m} spec {r['method']}: rejection_sample {1e6 * r['verify_op_s']:.0f} us per call "
                    f"({dev_us:.0f} us on the device) = {100 * (r['verify_op_frac_of_decode_step'] or 0):.2f}% "
                    f"({100 * (r.get('verify_op_device_frac_of_decode_step') or 0):.2f}%) of a decode step; "
                    f"peaked {1e6 * (r.get('verify_op_peaked_device_s') or 0):.0f} us on the device; speed-up grounded "
                    f"{c['grounded']['median_speedup'] or 0:.2f}x open {c['open']['median_speedup'] or 0:.2f}x\n")
            continue
        d = r["decodekit"]
        if r["bench"] == "latency":
            hf = (r.get("hf_transformers") or {}).get("decode_tok_s")
            k.write(f"{m} decode {d['decode_tok_s']:.0f} tok/s ({100 * r['decode_frac_of_copy_bw']:.0f}% of copy BW"
                    f"{f', HF {hf:.0f}' if hf else ''}) prefill {d['prefill_tok_s']:.0f} tok/s\n")
        else:
            hf = (r.get("hf_transformers") or {}).get("output_tok_s")
            k.write(f"{m} x{r['num_prompts']} {d['output_tok_s']:.0f} out tok/s{f' (HF {hf:.0f})' if hf else ''}\n")
print(f"wrote {path} ({len(rows)} runs)")
EOF
  return $rc
}

part_cpp_bench() {
  # GPU: every bench_* binary in build/gpu (the CPU ones as a --quick smoke run).
  # Dry run: the CPU binaries of the CPU build, --quick.
  [[ "$MODE" != gpu ]] && skipmsg "no GPU: CUDA C++ benchmarks (bench_*_cuda in build/gpu); running the CPU ones --quick"
  [[ -d "$CMAKE_DIR" ]] || { skipmsg "no $CMAKE_DIR (build part failed or no CMakeLists.txt)"; return 3; }
  local keys=$(sel_keys) bins=() b name ok=0 fail=0
  mapfile -t bins < <(find "$CMAKE_DIR" -maxdepth 3 -type f -perm -u+x -name 'bench_*' ! -path '*CMakeFiles*' | sort)
  [[ "$MODE" != gpu ]] && mapfile -t bins < <(printf '%s\n' "${bins[@]}" | grep -v cuda)
  # DK_CPP_BENCH_ONLY=REGEX: one run's choice of binaries
  [[ -n "${DK_CPP_BENCH_ONLY:-}" ]] && mapfile -t bins < <(printf '%s\n' "${bins[@]}" | grep -E "${DK_CPP_BENCH_ONLY}")
  # never measured on a GPU first (the part's time cap may stop the list)
  mapfile -t bins < <(printf '%s\n' "${bins[@]}" | grep -E 'attention|quant'; printf '%s\n' "${bins[@]}" | grep -vE 'attention|quant')
  mkdir -p "$WORK/cpp"
  local deadline=$(calc "$(now) + $PART_TIMEOUT - 5")
  for b in "${bins[@]}"; do
    name=$(basename "$b")
    if [[ -n "$keys" ]]; then
      local hit=0 kk; for kk in $keys; do [[ "$name" == *"$kk"* ]] && hit=1; done
      [[ $hit == 0 ]] && continue
    fi
    local left=$(printf "%.0f" "$(calc "$deadline - $(now)")")
    if (( left < 5 )); then echo "no time left for $name"; echo "$name|skipped|0" >> "$WORK/cpp/index"; continue; fi
    local args=(--json "$WORK/cpp/$name.json")
    [[ "$name" != *cuda* ]] && args+=(--quick)  # CPU benches: smoke run only on the GPU machine
    local t0=$(now)
    echo "== $name ${args[*]} (timeout $(( left < 60 ? left : 60 )) s)"
    timeout -k 5 $(( left < 60 ? left : 60 )) "$b" "${args[@]}" > "$WORK/cpp/$name.log" 2>&1
    local brc=$?
    cat "$WORK/cpp/$name.log" | tail -30
    echo "$name|$brc|$(fsecs $(calc "$(now) - $t0"))" >> "$WORK/cpp/index"
    if [[ $brc == 0 ]]; then ok=$((ok + 1)); else fail=$((fail + 1)); echo "$name: rc=$brc"; fi
  done
  "$PY" - "$WORK/cpp" "$RES/${STAMP}_${SLUG}_cpp_bench.json" <<'EOF'
import json, os, sys
d, path = sys.argv[1:3]
out = {}
idx = os.path.join(d, "index")
for line in (open(idx).read().splitlines() if os.path.exists(idx) else []):
    name, rc, secs = line.split("|")
    rec = {"rc": rc, "seconds": float(secs), "json": None}
    j = os.path.join(d, name + ".json")
    if os.path.exists(j):
        try:
            rec["json"] = json.load(open(j))
        except Exception as e:  # keep the raw text when it is not valid JSON
            rec["json_error"] = str(e); rec["json_raw"] = open(j).read()[:20000]
    lg = os.path.join(d, name + ".log")
    if os.path.exists(lg):
        rec["output_tail"] = open(lg, errors="replace").read()[-4000:]
    out[name] = rec
json.dump(out, open(path, "w"), indent=1)
print(f"wrote {path} ({len(out)} binaries)")
EOF
  # the prefill kernel by mma.sync and by wgmma, side by side (the DECODEKIT_PREFILL_ATTN default is chosen from these)
  "$PY" - "$RES/${STAMP}_${SLUG}_cpp_bench.json" "$WORK/key.$PART" <<'EOF'
import json, sys
path, keyfile = sys.argv[1:3]
try:
    rows = json.load(open(path)).get("bench_attention_cuda", {}).get("json") or []
except Exception:
    rows = []
pre = {}
for r in rows if isinstance(rows, list) else []:
    case = str(r.get("case", ""))
    if case.startswith("prefill") and r.get("tflops"):
        wg = case.endswith(" wgmma")
        pre.setdefault((case[:-6] if wg else case, r.get("dtype")), {})["wgmma" if wg else "mma"] = r["tflops"]
with open(keyfile, "a") as k:
    for (case, dt), v in sorted(pre.items()):
        if "n=4096" in case:
            k.write(f"{case} {dt}: mma {v.get('mma', 0):.0f}, wgmma {v.get('wgmma', 0):.0f} TFLOP/s\n")
EOF
  local nsel=$(( ok + fail ))
  key "$nsel of ${#bins[@]} binaries run: $ok ok, $fail failed"
  (( nsel == 0 )) && { echo "no bench_* binaries selected in $CMAKE_DIR"; return 3; }
  [[ $fail == 0 ]]
}

part_py_bench() {
  local args=(--out "$WORK/py")
  if [[ "$MODE" == gpu ]]; then args+=(--device cuda); else args+=(--device cpu --quick); fi
  if [[ -n "${DK_PY_BENCH_ONLY:-}" ]]; then args+=(--only "$DK_PY_BENCH_ONLY")  # one run's choice, in its order
  elif [[ "$FAM_FILTER" == 1 ]]; then args+=(--only "$(echo $FAMS | tr ' ' ',')")
  else  # every family, those never measured on a GPU first (the part's time cap may end the run)
    local order=(attention quant sampler allreduce dense fused_layers) f all
    all=$("$PY" bench/run_all.py --list 2>/dev/null)
    for f in $all; do [[ " ${order[*]} " == *" $f "* ]] || order+=("$f"); done
    args+=(--only "$(printf '%s\n' "${order[@]}" | grep -xF -f <(echo "$all") | paste -sd,)")
  fi
  echo "$PY bench/run_all.py ${args[*]}"
  PYTHONUNBUFFERED=1 "$PY" bench/run_all.py "${args[@]}" 2>&1 | tee "$WORK/py_bench.log"
  local rc=${PIPESTATUS[0]}
  local f
  for f in "$WORK"/py/*_py_bench.json; do [[ -f "$f" ]] && cp "$f" "$RES/"; done
  local line=$(grep -E "^run_all: (OK|FAILED)" "$WORK/py_bench.log" | tail -1 | sed 's/^run_all: //')
  key "${line:-no summary (rc=$rc)}"
  return $rc
}

if [[ "${1:-}" == "--part" ]]; then
  PART=$2
  "part_$PART"
  exit $?
fi

# ===== the driver ==========================================================================

usage() { sed -n '2,30p' "$SELF" | sed 's/^# \{0,1\}//'; }
RES="" ONLY="" BUDGET=${DK_GPU_CHECK_BUDGET_S:-480} FORCE_DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --only=*) ONLY=${1#--only=}; shift ;;
    --budget) BUDGET=$2; shift 2 ;;
    --dry-run) FORCE_DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [[ -z "$RES" ]] && RES=$1 || { echo "gpu_check: extra argument $1" >&2; exit 2; }; shift ;;
  esac
done
[[ -n "$RES" ]] || { usage >&2; exit 2; }
mkdir -p "$RES" || exit 2
RES=$(cd "$RES" && pwd)
T_START=$(now)
DEADLINE=$(( $(date +%s) + BUDGET ))

# which parts and families
SEL_PARTS="" FAMS="" UNKNOWN=""
IFS=',' read -r -a TOKENS <<< "$ONLY"
for t in "${TOKENS[@]}"; do
  t=$(echo "$t" | tr -d ' ')
  [[ -z "$t" ]] && continue
  if part_names | grep -qx "$t"; then SEL_PARTS="$SEL_PARTS $t"
  elif family_names | grep -qx "$t"; then FAMS="$FAMS $t"
  else UNKNOWN="$UNKNOWN $t"; fi
done
FAM_FILTER=0
[[ -n "$FAMS" ]] && FAM_FILTER=1 || FAMS=$(family_names | tr '\n' ' ')
if [[ -z "$SEL_PARTS" ]]; then
  if [[ -z "$ONLY" || "$FAM_FILTER" == 1 ]]; then SEL_PARTS=$(part_names | tr '\n' ' ')
  else SEL_PARTS="env"; fi  # --only named nothing known: just describe the machine
fi

# GPU or dry run
MODE=gpu DRY_REASON=""
if [[ $FORCE_DRY == 1 ]]; then DRY_REASON="--dry-run"
elif ! command -v nvidia-smi > /dev/null 2>&1; then DRY_REASON="nvidia-smi not found"
elif ! nvidia-smi -L > /dev/null 2>&1; then DRY_REASON="nvidia-smi -L failed"
elif ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  DRY_REASON="torch.cuda.is_available() is False"
fi
[[ -n "$DRY_REASON" ]] && MODE=dry

WORK=$(mktemp -d /tmp/dk_gpu_check.XXXXXX)
if [[ "$MODE" == gpu ]]; then
  SITE=/tmp/site CMAKE_DIR=build/gpu JOBS=${MAX_JOBS:-16}
  SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/NVIDIA//; s/^ *//; s/[^A-Za-z0-9.]\{1,\}/-/g; s/-$//')
else
  SITE=$WORK/site CMAKE_DIR=build/gpu-check-cpu JOBS=${MAX_JOBS:-$(nproc)}
  SLUG=cpu
fi
STAMP=$(date +%Y%m%d-%H%M)
SLUG=${SLUG:-cuda}
# prebuilt/ (tools/gpu_prebuild.sh, carried): used when built for this torch from this very source
PREBUILT=""
if [[ "$MODE" == gpu && -f prebuilt/MANIFEST && -f prebuilt/_C.abi3.so ]]; then
  p_tv=$(sed -n 's/^torch_version=//p' prebuilt/MANIFEST); p_hash=$(sed -n 's/^source_hash=//p' prebuilt/MANIFEST)
  h_tv=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null); h_hash=$(bash tools/source_hash.sh)
  if [[ "$p_tv" == "$h_tv" && "$p_hash" == "$h_hash" ]]; then
    PREBUILT=$REPO/prebuilt
    [[ -d prebuilt/build_gpu ]] && CMAKE_DIR=$PREBUILT/build_gpu
  else
    echo "gpu_check: prebuilt/ not used: built for torch $p_tv / sources $p_hash, here torch $h_tv / sources $h_hash"
  fi
fi
# carried wheels (installed by env) and this checkout's python/ come first on the path
export PYTHONPATH="$SITE:$REPO/python${PYTHONPATH:+:$PYTHONPATH}"
[[ -f "$SITE/cutlass_library/source/include/cutlass/cutlass.h" || "$MODE" == gpu ]] &&
  export CUTLASS_INCLUDE_DIR="$SITE/cutlass_library/source/include"
export MODE DRY_REASON WORK RES SITE CMAKE_DIR JOBS SLUG STAMP FAMS FAM_FILTER PREBUILT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

echo "gpu_check: mode $MODE${DRY_REASON:+ ($DRY_REASON)}; budget ${BUDGET}s; results in $RES"
echo "gpu_check: parts:$( echo " $SEL_PARTS" | tr -s ' ')  families: $FAMS$([[ $FAM_FILTER == 0 ]] && echo '(all)')"
for u in $UNKNOWN; do
  echo "gpu_check: skipping '$u': not a part ($(part_names | tr '\n' ' ')) nor a known family ($(family_names | tr '\n' ' ')); add a line to FAMILIES in tools/gpu_check.sh" |
    tee -a "$WORK/skips"
done
if [[ "$MODE" == dry ]]; then
  echo "gpu_check: DRY RUN (no GPU): skipping the GPU parts: CUDA extension build, CMake CUDA build (build/gpu),"
  echo "           pytest -m cuda, ctest on build/gpu, bench/cpp CUDA benchmarks, py_bench --device cuda, GPU ceilings;"
  echo "           running instead: env, CMake CPU build + ctest ($CMAKE_DIR), CPU ceilings, CPU C++ benches --quick,"
  echo "           py_bench --device cpu --quick"
fi

declare -A STATUS=() SECS=()
ORDER=()
n_sel=$(echo $SEL_PARTS | wc -w)
i=0
for p in $(part_names); do
  [[ " $SEL_PARTS " == *" $p "* ]] || continue
  i=$((i + 1))
  ORDER+=("$p")
  left=$(( DEADLINE - $(date +%s) ))
  reserve=$(( (n_sel - i) * 10 ))  # keep 10 s for each later part
  cap=$(part_cap "$p")
  t=$(( left - reserve < cap ? left - reserve : cap ))
  if (( t < 10 )); then
    STATUS[$p]="SKIP(budget)"; SECS[$p]=0
    echo "=== $p: skipped, budget spent" | tee -a "$WORK/skips"
    continue
  fi
  echo
  echo "=================== part $p (timeout ${t}s) ==================="
  t0=$(now)
  PART_TIMEOUT=$t timeout -k 10 "$t" bash "$SELF" --part "$p" 2>&1 | tee "$WORK/log.$p"
  rc=${PIPESTATUS[0]}
  SECS[$p]=$(fsecs $(calc "$(now) - $t0"))
  case $rc in
    0) STATUS[$p]=ok ;;
    3) STATUS[$p]=skipped ;;
    124|137) STATUS[$p]="TIMEOUT(${t}s)" ;;
    *) STATUS[$p]="FAIL(rc=$rc)" ;;
  esac
  [[ "$MODE" == dry && "${STATUS[$p]}" == ok ]] && STATUS[$p]="ok(cpu)"
  # a py_bench part stopped by its cap keeps what run_all wrote after each family
  [[ "$p" == py_bench ]] && for f in "$WORK"/py/*_py_bench.json; do [[ -f "$f" ]] && cp -n "$f" "$RES/"; done
  echo "=== part $p: ${STATUS[$p]} in ${SECS[$p]} s"
done

# ===== results: summary.json, results.md, log.txt =========================================
keyof() { [[ -f "$WORK/key.$1" ]] && paste -sd '\t' "$WORK/key.$1" | sed 's/\t/; /g' || true; }
{
  for p in "${ORDER[@]}"; do
    echo "$p|${STATUS[$p]}|${SECS[$p]}|$(keyof "$p")"
  done
} > "$WORK/table"
TOTAL=$(fsecs $(calc "$(now) - $T_START"))

"$PY" - "$WORK" "$RES" "$MODE" "$DRY_REASON" "$TOTAL" "$STAMP" "$SLUG" "$FAMS" "$FAM_FILTER" <<'EOF'
import glob, json, os, sys
work, res, mode, reason, total, stamp, slug, fams, famf = sys.argv[1:10]
parts = []
for line in open(os.path.join(work, "table")).read().splitlines():
    p, st, secs, key = line.split("|", 3)
    parts.append({"part": p, "status": st, "seconds": float(secs), "key": key})
skips = open(os.path.join(work, "skips")).read().splitlines() if os.path.exists(os.path.join(work, "skips")) else []
summary = {"mode": mode, "dry_reason": reason, "stamp": stamp, "device": slug, "total_seconds": float(total),
           "families": fams.split(), "family_filter": famf == "1", "parts": parts, "skipped": skips}
json.dump(summary, open(os.path.join(res, "summary.json"), "w"), indent=1)

md = [f"# gpu_check {stamp} ({'GPU' if mode == 'gpu' else 'CPU-only dry run: ' + reason})", ""]
md += ["| part | status | seconds | key numbers |", "|---|---|---|---|"]
md += [f"| {p['part']} | {p['status']} | {p['seconds']:.1f} | {p['key']} |" for p in parts]
md += ["", f"total {float(total):.1f} s; families: {fams}"]
if skips:
    md += ["", "## Skipped", ""] + [f"- {s}" for s in skips]
for f in sorted(glob.glob(os.path.join(res, "*_ceilings.json"))):
    md += ["", "## Ceilings", ""]
    for c in json.load(open(f)):
        md.append(f"- {c['kind']}: **{c['value']:.4g}** on {c.get('device_name', c['device'])} ({c['detail']})")
for f in sorted(glob.glob(os.path.join(work, "py", "*_py_bench.md"))):
    body = open(f).read().splitlines()
    md += ["", "## Python microbenchmarks (bench/run_all.py)", ""] + body[1:]
for name, title in (("pytest.log", "pytest -m cuda"), ("ctest.log", "ctest")):
    f = os.path.join(work, name)
    if os.path.exists(f):
        lines = open(f, errors="replace").read().splitlines()
        md += ["", f"## {title} (last lines)", "", "```"] + lines[-25:] + ["```"]
idx = os.path.join(work, "cpp", "index")
if os.path.exists(idx):
    md += ["", "## C++ benchmarks (bench/cpp)", ""]
    for line in open(idx).read().splitlines():
        name, rc, secs = line.split("|")
        md += [f"### {name} (rc {rc}, {secs} s)", ""]
        rows = None
        try:
            rows = json.load(open(os.path.join(work, "cpp", name + ".json")))
        except Exception:
            pass
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            cols = list(rows[0])
            md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for r in rows:
                md.append("| " + " | ".join(f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c, ""))
                                            for c in cols) + " |")
            md.append("")
        else:
            lg = os.path.join(work, "cpp", name + ".log")
            md += ["```"] + (open(lg, errors="replace").read().splitlines()[-40:] if os.path.exists(lg) else []) + ["```", ""]
open(os.path.join(res, "results.md"), "w").write("\n".join(md) + "\n")
EOF

# log.txt: every part's output, each capped at 2 MB (head + tail) so the file comes back
{
  for p in "${ORDER[@]}"; do
    f="$WORK/log.$p"
    [[ -f "$f" ]] || continue
    echo "=================== $p: ${STATUS[$p]} (${SECS[$p]} s)"
    if (( $(stat -c %s "$f") > 2000000 )); then
      head -c 400000 "$f"; echo; echo "[... cut ...]"; tail -c 1500000 "$f"
    else
      cat "$f"
    fi
    for extra in build_ext build_cmake; do
      [[ "$p" == build && -f "$WORK/$extra.log" ]] && { echo "----- $extra.log"; tail -c 1000000 "$WORK/$extra.log"; }
    done
  done
} > "$RES/log.txt"

nfiles=$(find "$RES" -maxdepth 1 -type f | wc -l)
ndirs=$(find "$RES" -mindepth 1 -type d | wc -l)
(( nfiles > 8 || ndirs > 0 )) && echo "gpu_check: WARNING: $RES has $nfiles files and $ndirs folders (the device tool returns at most 8 files)"

# the short table, last (the device tool returns the tail of the output)
FAILED=0
echo
echo "gpu_check $STAMP: mode $MODE${DRY_REASON:+ ($DRY_REASON)}, total ${TOTAL}s, results in $RES ($nfiles files)"
[[ -s "$WORK/skips" ]] && sed 's/^/  skipped: /' "$WORK/skips"
printf "%-10s %-14s %7s  %s\n" part status seconds "key numbers"
printf "%-10s %-14s %7s  %s\n" ---------- -------------- ------- -----------
while IFS='|' read -r p st s k; do
  printf "%-10s %-14s %7s  %s\n" "$p" "$st" "$s" "$k"
  [[ "$st" == FAIL* || "$st" == TIMEOUT* ]] && FAILED=$((FAILED + 1))
done < "$WORK/table"
rm -rf "$WORK"
if (( FAILED > 0 )); then echo "gpu_check: $FAILED part(s) failed"; exit 1; fi
echo "gpu_check: all selected parts passed or were skipped"
exit 0
