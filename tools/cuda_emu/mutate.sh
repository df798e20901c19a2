#!/bin/bash
# Applies one mutation (python replace old->new) to a copy of the headers, builds, runs a subset.
# usage: [MUTFILE=attention/prefill.cuh] [MUTTEST=test_attn] mutate.sh NAME 'old' 'new' [args for the test]
# (MUTFILE: the header under include/decodekit to mutate, default attention/paged.cuh; MUTTEST: the
# emulator test to run, default test_attn)
name=$1; old=$2; new=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
d=${TMPDIR:-/tmp}/dk_emu_mut/$name; rm -rf $d; mkdir -p $d; cp -r "$here/../../include/decodekit" $d/src
python3 - "$d/src/${MUTFILE:-attention/paged.cuh}" "$old" "$new" <<'PY'
import sys; p,o,n=sys.argv[1:4]; s=open(p).read(); assert o in s, "mutation not found: "+o; open(p,'w').write(s.replace(o,n,1))
PY
test=${MUTTEST:-test_attn}
cp "$here"/{prepare.py,shim.h,emu_types.h,wgmma_desc.h,cub_emu.h,$test.cpp} $d/ && cd $d && python3 prepare.py $d/src >/dev/null && \
g++ -std=c++20 -O1 -fno-strict-aliasing $MUTFLAGS -I inc -I "${CUDA_HOME:-/usr/local/cuda-13.0}/include" $test.cpp -o t -pthread 2>&1 | grep error | head -3
timeout 300 ./t "$@" > out.txt 2>&1; rc=$?
echo "$name: rc=$rc $(grep -c FAIL out.txt) FAIL lines; $(grep -m1 -E 'FAIL|emulator' out.txt)"
