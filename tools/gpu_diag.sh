#!/usr/bin/env bash
# Crash diagnosis on the device machine, after tools/gpu_check.sh built the extension in place:
#   bash tools/gpu_diag.sh OUTFILE [PYTEST_NODE_OR_ARGS...]
# 1. Does an error raised by a CUDA launcher reach Python (rms_norm with a CPU weight), in a
#    subprocess each, so a crash is reported instead of ending the script?
# 2. The given pytest selection under cuda-gdb (it debugs host code too; the image has no gdb):
#    on a crash, the C++ backtrace.
set -u
OUTF=${1:?usage: gpu_diag.sh OUTFILE [pytest args]}; shift
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
export PYTHONPATH="/tmp/site:$REPO/python${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "== 1. launcher errors from Python"
  for snippet in \
    "x = torch.randn(4, 64, device='cuda'); ops.rms_norm(x, torch.randn(64), 1e-5)" \
    "x = torch.randn(4, 64, device='cuda'); ops.rms_norm(x, torch.randn(65, device='cuda'), 1e-5)" \
    "x = torch.randn(4, 64); ops.rms_norm(x, torch.randn(65), 1e-5)"; do
    timeout 60 python3 -c "
import torch, decodekit.ops as ops
try:
    $snippet
    print('no error raised')
except Exception as e:
    print('caught', type(e).__name__, str(e).splitlines()[0][:160])
"
    echo "   rc=$? for: $snippet"
  done
  if [[ $# -gt 0 ]]; then
    echo "== 2. cuda-gdb: pytest $*"
    timeout 150 cuda-gdb -q -batch -ex "set pagination off" -ex "set print thread-events off" -ex run -ex bt \
      --args python3 -m pytest -q -x -p no:cacheprovider "$@" 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -120
  fi
} > "$OUTF" 2>&1
tail -40 "$OUTF"
