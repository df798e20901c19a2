#!/usr/bin/env bash
# Run HERE (a machine with pip access), in the repo, before a session on the H200 machine.
#
#   bash tools/gpu_prepare.sh [EXTRA_NAME==VERSION ...]
#
# Downloads into ./.whl the Python 3.12 wheels that tools/gpu_check.sh needs and the H200
# image lacks, adds /.whl/ to .git/info/exclude (so the wheels travel only when carried),
# and prints the sizes: the wheels must stay under ~40 MiB, and the whole working tree that
# travels (tracked + untracked-not-ignored files + the carried .whl) under 64 MiB.
#
# Which packages: NEEDED below, minus those the image already has according to the device
# notes' KINDS.md ("Python packages already there"; DK_KINDS_MD overrides the path). Only
# nvidia-cutlass (the CUTLASS/CuTe headers setup.py needs for DECODEKIT_CUDA=1) is missing
# today; it is fetched --no-deps: its Requires-Dist (cuda-python, networkx, pydot, scipy,
# treelib) are for CUTLASS's Python generator, not for its headers.
# Versions: NAME_VERSION in the environment (e.g. NVIDIA_CUTLASS_VERSION=4.2.0.0), else the
# version installed here, else the newest.
#
# Then, with the device tool:  run(command="bash tools/gpu_check.sh $OUT", carry=[".whl"], timeout_s=600)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
WHL=.whl
MAX_WHL_MIB=${DK_MAX_WHL_MIB:-40}
KINDS=${DK_KINDS_MD:-/work/.library/device/KINDS.md}

# What gpu_check.sh imports or runs on the H200 (build, tests, benches).
NEEDED=(nvidia-cutlass gguf tokenizers safetensors jinja2 transformers torch numpy pytest hypothesis ninja setuptools wheel cmake pyyaml requests tqdm)
# Fetched even when KINDS.md cannot be read (the one known to be missing there).
ALWAYS=(nvidia-cutlass gguf)

norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }

# 1. keep the wheels out of git; they travel only when a run carries .whl
EXCLUDE=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" "$WHL"
grep -qxF '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
echo "gpu_prepare: /.whl/ is in $EXCLUDE"

# 2. which of NEEDED the H200 image lacks
declare -A HAVE=()
if [[ -r "$KINDS" ]]; then
  # the line after '## Python packages already there' that starts 'nvidia-h200:' ... 'Packages: a, b, c.'
  pkgs=$(awk '/^## Python packages already there/{f=1} f && /Packages:/{print; exit}' "$KINDS" \
         | sed -e 's/.*Packages://' -e 's/\.$//' | tr ',' '\n' | sed 's/^ *//; s/ *$//')
  while read -r p; do [[ -n "$p" ]] && HAVE[$(norm "$p")]=1; done <<< "$pkgs"
  echo "gpu_prepare: $KINDS lists ${#HAVE[@]} packages already on the H200 image"
else
  echo "gpu_prepare: $KINDS not readable; fetching only: ${ALWAYS[*]}"
fi

WANT=()
for p in "${NEEDED[@]}"; do
  if [[ ${#HAVE[@]} -eq 0 ]]; then
    [[ " ${ALWAYS[*]} " == *" $p "* ]] && WANT+=("$p")
  elif [[ -n "${HAVE[$(norm "$p")]:-}" ]]; then
    echo "  $p: already on the H200 image, not carried"
  else
    WANT+=("$p")
  fi
done

# pin each to NAME_VERSION, else the version installed here
SPECS=()
for p in "${WANT[@]}"; do
  var=$(echo "$p" | tr 'a-z-.' 'A-Z__')_VERSION
  ver=${!var:-}
  if [[ -z "$ver" ]]; then
    ver=$("$PY" -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
  fi
  SPECS+=("$p${ver:+==$ver}")
done
SPECS+=("$@")

# 3. download (the device notes' exact command), one version per package
for spec in "${SPECS[@]}"; do
  name=${spec%%[=<>!~]*}
  ver=""; [[ "$spec" == *"=="* ]] && ver=${spec##*==}
  fname=$(echo "$name" | tr '.-' '__')  # wheel file names use underscores
  have=$(ls "$WHL"/ 2>/dev/null | grep -i "^${fname}-" || true)
  if [[ -n "$ver" && -n "$have" ]] && echo "$have" | grep -qi "^${fname}-${ver}-"; then
    echo "  $spec: already in $WHL ($have)"
    continue
  fi
  for old in $have; do echo "  removing $WHL/$old (keeping one version)"; rm -f "$WHL/$old"; done
  echo "  downloading $spec for cp312 manylinux x86_64 ..."
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHL" "$spec"
done

# 4. sanity: the CUTLASS wheel has the headers build_env.py looks for
cw=$(ls "$WHL"/nvidia_cutlass-*.whl 2>/dev/null | head -1 || true)
if [[ -n "$cw" ]]; then
  listing=$(unzip -l "$cw")
  if grep -q 'cutlass_library/source/include/cutlass/cutlass.h' <<< "$listing"; then
    echo "gpu_prepare: $cw has cutlass_library/source/include/cutlass/cutlass.h"
  else
    echo "gpu_prepare: ERROR: $cw lacks cutlass_library/source/include/cutlass/cutlass.h" >&2; exit 1
  fi
fi

# 5. sizes
echo
echo "gpu_prepare: wheels in $WHL:"
ls -l "$WHL" | awk 'NR>1{printf "  %-70s %8.2f MiB\n", $9, $5/1048576}'
whl_bytes=$(du -cb "$WHL"/*.whl 2>/dev/null | tail -1 | cut -f1 || echo 0)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0)
printf "gpu_prepare: wheels total %.2f MiB (limit %d MiB); tree that travels without them %.2f MiB; together %.2f MiB (limit 64 MiB)\n" \
  "$(echo "$whl_bytes/1048576" | bc -l)" "$MAX_WHL_MIB" "$(echo "$tree_bytes/1048576" | bc -l)" \
  "$(echo "($whl_bytes+$tree_bytes)/1048576" | bc -l)"
if (( whl_bytes > MAX_WHL_MIB * 1048576 )); then
  echo "gpu_prepare: ERROR: the wheels exceed $MAX_WHL_MIB MiB" >&2; exit 1
fi
if (( whl_bytes + tree_bytes > 64 * 1048576 )); then
  echo "gpu_prepare: ERROR: wheels + working tree exceed 64 MiB: the run would be refused" >&2; exit 1
fi
echo "gpu_prepare: ready. On the H200: bash tools/gpu_check.sh \$OUT   (carry: [\".whl\"])"
