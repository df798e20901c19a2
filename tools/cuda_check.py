#!/usr/bin/env python3
"""CI compile check for the CUDA kernels (needs nvcc, no GPU).

1. Builds the extension out of place (CPU + CUDA, sm_90a, `-Xptxas -v`):
     DECODEKIT_CUDA=1 DECODEKIT_PTXAS_VERBOSE=1 python setup.py build_ext \
         --build-temp BUILD_DIR --build-lib BUILD_DIR/lib
   (incremental: ninja recompiles only what changed), keeping the full log in
   BUILD_DIR/cuda_build.log and printing the elapsed time.
2. Collects, per kernel: registers and stack frame (cuobjdump -res-usage, always
   available) and spill stores/loads (the `ptxas info` blocks of the log; for objects
   that were not recompiled this run, from BUILD_DIR/ptxas_info.json, written by the
   run that compiled them) and prints a compact table.
3. Disassembles every object built from csrc/cuda/*.cu (cuobjdump -sass), requires that
   each one holds sm_90a machine code, splits the SASS by function and checks the rules
   of tools/sass_expectations.json; fails where ptxas serialised our wgmma instructions (C7520).
4. Builds and runs tools/wgmma_layout_check.cu (host only): the wgmma operand layouts and descriptors of the
   prefill kernel, and the CUDA emulator's decoding of them, against CUTLASS CuTe's.
5. Loads the built extension in a fresh process (no GPU needed where torch is a CUDA build): torch checks every
   kernel's C++ signature against its TORCH_LIBRARY schema when it is registered, so a CUDA launcher whose
   parameters drifted from csrc/registration.cpp fails here instead of at import on the GPU machine; and the ops
   the CPU build registers for CUDA must have a CUDA kernel.

Rule format (tools/sass_expectations.json is a JSON list of these objects):
  {
    "kernel":  "<regex, re.search on the demangled kernel name, e.g. 'rms_norm_kernel<[^,]+, true'>",
    "require": ["<opcode regex>", ...],  every matched kernel must contain >= 1 instruction
                                         whose opcode matches each regex
    "forbid":  ["<opcode regex>", ...],  no matched kernel may contain a matching instruction
    "hot":     true,                     matched kernels must have no spills and a zero stack frame
    "why":     "<one line: what the rule protects>",
    optional:
    "min_matches":   N,                  at least N kernels must match (default 1: a rule
                                         that matches no kernel is stale and fails)
    "max_registers": R                   matched kernels may use at most R registers
  }
An opcode regex is matched with re.match (anchored at the start) against the full opcode
with its modifiers and without the predicate: 'LDG\\.E\\.128' matches "LDG.E.128" and
"LDG.E.128.CONSTANT"; 'LDL' matches "LDL", "LDL.LU", "LDL.64"; 'HGMMA' matches
"HGMMA.64x128x16.F32.BF16"; 'UTMALDG' matches "UTMALDG.2D".

Exit status 0 only when the build succeeded and every check passed.
Options: --skip-build (check the existing objects), --build-dir DIR (default build/cuda),
--expect FILE, --sass-dump DIR (write each object's SASS there, for reading).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import build_env  # noqa: E402

ARCH = "sm_90a"


# ----------------------------------------------------------------------------- tools

def find_cuobjdump() -> str | None:
    home = build_env.find_cuda_home()
    cands = []
    if home:
        cands.append(os.path.join(home, "bin", "cuobjdump"))
    try:
        import triton  # noqa: F401  (ships cuobjdump/nvdisasm with its NVIDIA backend)
        cands.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except Exception:
        pass
    w = shutil.which("cuobjdump")
    if w:
        cands.append(w)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def demangle_all(names) -> dict[str, str]:
    names = sorted(set(names))
    out = {n: n for n in names}
    cxxfilt = shutil.which("c++filt")
    if cxxfilt and names:
        try:
            res = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
            lines = res.stdout.splitlines()
            if len(lines) == len(names):
                out = dict(zip(names, lines))
        except (OSError, subprocess.CalledProcessError):
            pass
    return out


def short_name(demangled: str) -> str:
    """'void dk::cuda::x::k<float, true>(float*, ...)' -> 'x::k<float, true>'."""
    s = demangled
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            s = s[:i]
            break
    for prefix in ("dk::cuda::", "dk::"):
        if s.startswith(prefix):
            s = s[len(prefix):]
            break
    s = s.replace("(anonymous namespace)::", "")
    return s if len(s) <= 100 else s[:97] + "..."  # CUTLASS kernels (c++filt leaves some of them mangled)


# ----------------------------------------------------------------------------- build

def run_build(build_dir: str, log_path: str) -> bool:
    env = dict(os.environ, DECODEKIT_CUDA="1", DECODEKIT_PTXAS_VERBOSE="1")
    cmd = [sys.executable, "setup.py", "build_ext", "--build-temp", build_dir, "--build-lib",
           os.path.join(build_dir, "lib")]
    print("build:", " ".join(["DECODEKIT_CUDA=1", "DECODEKIT_PTXAS_VERBOSE=1"] + cmd[1:]), flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    dt = time.time() - t0
    with open(log_path) as f:
        text = f.read()
    ncu = len(re.findall(r"^\[\d+/\d+\].*\bnvcc\b.*\.cu\b", text, re.M))
    print(f"build: {'ok' if rc == 0 else 'FAILED (rc=%d)' % rc} in {dt:.1f} s "
          f"({ncu} .cu file(s) recompiled; full log: {os.path.relpath(log_path, ROOT)})", flush=True)
    if rc != 0:
        tail = text.splitlines()[-80:]
        print("---- last lines of the build log ----")
        print("\n".join(tail))
    return rc == 0


def ninja_compile_times(build_dir: str) -> dict[str, float]:
    """{object path: seconds} of the latest compile of each object, from BUILD_DIR/.ninja_log."""
    out: dict[str, float] = {}
    try:
        with open(os.path.join(build_dir, ".ninja_log")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4 and parts[0].isdigit():
                    out[os.path.realpath(parts[3])] = (int(parts[1]) - int(parts[0])) / 1000.0
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------- ptxas log

_NINJA_CMD = re.compile(r"^\[\d+/\d+\]\s+(.*)$")
_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"ptxas info\s*: Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")


def wgmma_layout_check(build_dir: str) -> list[str]:
    """Builds and runs tools/wgmma_layout_check.cu (host only): the prefill kernel's swizzled K/V tiles, its
    wgmma descriptors and the emulator's decoding of them against CUTLASS CuTe's layouts and make_gmma_desc."""
    nvcc = os.path.join(build_env.require_cuda_home(), "bin", "nvcc")
    exe = os.path.join(build_dir, "wgmma_layout_check")
    cmd = [nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "include"), "-I",
           build_env.cutlass_include_dir(required=True), "-I", os.path.join(ROOT, "tools", "cuda_emu"),
           os.path.join(ROOT, "tools", "wgmma_layout_check.cu"), "-o", exe]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return [f"wgmma_layout_check.cu does not build: {r.stderr[-2000:]}"]
    r = subprocess.run([exe], capture_output=True, text=True)
    # (CuTe's make_gmma_desc prints an error line for the shared address it cannot take on the host; the
    # check reads the start offsets from the layouts instead)
    out = [line for line in r.stdout.splitlines() if "cast_smem_ptr_to_uint" not in line]
    print("\n".join(out[-12:]) + f" ({time.time() - t0:.1f} s)", flush=True)
    return [] if r.returncode == 0 else ["wgmma layout check failed (tools/wgmma_layout_check.cu)"]


def parse_ptxas_log(text: str) -> dict[str, dict[str, dict]]:
    """{object path: {mangled kernel: {regs, stack, spill_st, spill_ld, arch}}} from a build log.

    Ninja prints each command ("[k/n] .../nvcc ... -c SRC -o OBJ ...") followed by its
    whole output, so ptxas lines belong to the last command printed before them.
    """
    out: dict[str, dict[str, dict]] = {}
    obj = "?"
    cur = None   # entry being described
    props = None  # function named by the last "Function properties" line
    for line in text.splitlines():
        m = _NINJA_CMD.match(line)
        if m:
            mo = re.search(r"\s-o\s+(\S+)", m.group(1))
            obj = os.path.realpath(mo.group(1)) if mo else "?"
            cur = props = None
            continue
        m = _ENTRY.search(line)
        if m:
            cur = m.group(1)
            out.setdefault(obj, {})[cur] = {"arch": m.group(2), "regs": None, "stack": None, "spill_st": None,
                                             "spill_ld": None}
            continue
        m = _PROPS.search(line)
        if m:
            props = m.group(1)
            continue
        m = _FRAME.search(line)
        if m and props is not None and props == cur:
            d = out[obj][cur]
            d["stack"], d["spill_st"], d["spill_ld"] = (int(g) for g in m.groups())
            continue
        m = _USED.search(line)
        if m and cur is not None:
            out[obj][cur]["regs"] = int(m.group(1))
    return out


def update_ptxas_cache(cache_path: str, fresh: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """Merge this run's ptxas info into the cache (keyed by object, valid while its mtime holds)."""
    try:
        with open(cache_path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    for obj, funcs in fresh.items():
        if os.path.isfile(obj):
            cache[obj] = {"mtime": os.path.getmtime(obj), "functions": funcs}
    valid = {o: e for o, e in cache.items() if os.path.isfile(o) and abs(os.path.getmtime(o) - e["mtime"]) < 1e-6}
    with open(cache_path, "w") as f:
        json.dump(valid, f, indent=1, sort_keys=True)
    return {o: e["functions"] for o, e in valid.items()}


# ----------------------------------------------------------------------------- objects / SASS

def cu_objects(build_dir: str) -> tuple[dict[str, str | None], list[str]]:
    """{csrc/cuda/X.cu: its object under build_dir or None}, plus problems (stale objects)."""
    srcs = sorted(f for f in os.listdir(os.path.join(ROOT, "csrc", "cuda")) if f.endswith(".cu"))
    objs = []
    for dp, _, files in os.walk(build_dir):
        for f in files:
            if f.endswith(".o"):
                objs.append(os.path.realpath(os.path.join(dp, f)))
    found: dict[str, str | None] = {}
    problems = []
    for s in srcs:
        stem = s[:-3]
        cands = [o for o in objs if re.search(r"csrc/cuda/" + re.escape(stem) + r"(\.cuda)?\.o$", o)]
        cands.sort(key=os.path.getmtime, reverse=True)
        rel = f"csrc/cuda/{s}"
        found[rel] = cands[0] if cands else None
        if cands and os.path.getmtime(cands[0]) < os.path.getmtime(os.path.join(ROOT, rel)):
            problems.append(f"{rel}: object {os.path.relpath(cands[0], ROOT)} is older than the source (rebuild)")
    return found, problems


def res_usage(cuobjdump: str, obj: str) -> dict[str, dict]:
    """{mangled: {regs, stack, arch}} from cuobjdump -res-usage."""
    text = subprocess.run([cuobjdump, "-res-usage", obj], capture_output=True, text=True).stdout
    out, arch, cur = {}, None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function (\S+?):?\s*$", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+)", line)
        if m and cur:
            out[cur] = {"regs": int(m.group(1)), "stack": int(m.group(2)), "arch": arch}
            cur = None
    return out


# A memory descriptor (cache policy) is a 64-bit uniform register pair, so its first register is even.
# nvcc 13.0's ptxas gave the Marlin kernel's cp.async ... L2::cache_hint (createpolicy) LDGSTS
# desc[UR1]; on the H200 that instruction faulted with "illegal instruction" (2026-12-04).
_ODD_DESC = re.compile(r"desc\[UR([0-9]*[13579])\]")
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


def sass_functions(cuobjdump: str, obj: str, dump_dir: str | None) -> tuple[dict[str, dict], set[str], str]:
    """({mangled: {arch, ops: {opcode: count}}}, archs with machine code, error)."""
    res = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True)
    if res.returncode != 0:
        return {}, set(), res.stderr.strip() or f"cuobjdump exited {res.returncode}"
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, os.path.basename(obj) + ".sass"), "w") as f:
            f.write(res.stdout)
    funcs: dict[str, dict] = {}
    archs: set[str] = set()
    arch, cur = None, None
    for line in res.stdout.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch = m.group(1)
            archs.add(arch)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = {"arch": arch, "ops": {}}
            funcs[m.group(1)] = cur
            continue
        if cur is not None:
            m = _INSN.match(line)
            if m:
                op = m.group(1)
                cur["ops"][op] = cur["ops"].get(op, 0) + 1
                d = _ODD_DESC.search(line)
                if d:
                    cur.setdefault("odd_desc", []).append(line.split(";")[0].strip())
    return funcs, archs, ""


# ----------------------------------------------------------------------------- rules

def load_rules(path: str) -> list[dict]:
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = data.get("rules", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rules")
    allowed = {"kernel", "require", "forbid", "hot", "why", "min_matches", "max_registers"}
    for i, r in enumerate(data):
        if not isinstance(r, dict) or "kernel" not in r:
            raise ValueError(f"{path}: rule {i} must be an object with a 'kernel' regex")
        extra = set(r) - allowed
        if extra:
            raise ValueError(f"{path}: rule {i} ({r['kernel']!r}) has unknown keys {sorted(extra)}")
        re.compile(r["kernel"])
        for rx in r.get("require", []) + r.get("forbid", []):
            re.compile(rx)
    return data


def check_rules(rules: list[dict], kernels: dict[str, dict]) -> list[str]:
    """kernels: {demangled: {ops, regs, stack, spill_st, spill_ld, short}}. Returns failures."""
    fails = []
    print()
    for n, r in enumerate(rules):
        tag = f"rule kernel={r['kernel']!r}"
        rx = re.compile(r["kernel"])
        hits = sorted(k for k in kernels if rx.search(k))
        need = int(r.get("min_matches", 1))
        before = len(fails)
        if len(hits) < need:
            fails.append(f"{tag}: matches {len(hits)} kernel(s), needs >= {need} (stale rule or missing kernel)")
            print(f"rule {n}: {r['kernel']!r}: {len(hits)} kernel(s): FAIL")
            continue
        for k in hits:
            info = kernels[k]
            name = info["short"]
            ops = info["ops"]
            for req in r.get("require", []):
                q = re.compile(req)
                if not any(q.match(op) for op in ops):
                    fails.append(f"{tag}: {name}: no instruction matches required {req!r}")
            for fb in r.get("forbid", []):
                q = re.compile(fb)
                bad = {op: n for op, n in ops.items() if q.match(op)}
                if bad:
                    fails.append(f"{tag}: {name}: forbidden {fb!r} found: " +
                                 ", ".join(f"{op} x{n}" for op, n in sorted(bad.items())))
            if r.get("hot"):
                st, sst, sld = info.get("stack"), info.get("spill_st"), info.get("spill_ld")
                if st:
                    fails.append(f"{tag}: {name}: hot kernel has a {st}-byte stack frame")
                if sst or sld:
                    fails.append(f"{tag}: {name}: hot kernel spills ({sst} B stores, {sld} B loads)")
            mr = r.get("max_registers")
            if mr is not None and info.get("regs") is not None and info["regs"] > mr:
                fails.append(f"{tag}: {name}: uses {info['regs']} registers > max_registers {mr}")
        what = [f"require {' '.join(r['require'])}"] if r.get("require") else []
        what += [f"forbid {' '.join(r['forbid'])}"] if r.get("forbid") else []
        what += ["hot"] if r.get("hot") else []
        print(f"rule {n}: {r['kernel']!r}: {len(hits)} kernel(s), {'; '.join(what)}: "
              f"{'ok' if len(fails) == before else 'FAIL'}")
    return fails


# ----------------------------------------------------------------------------- main

def fmt(v) -> str:
    return "?" if v is None else str(v)


LOAD_CHECK = """
import sys, torch
if torch.version.cuda is None:
    print("SKIP: torch is a CPU-only build"); sys.exit(0)
torch.ops.load_library(sys.argv[1])
names = [s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("decodekit::")]
cuda = [n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA")]
print(len(names), len(cuda))
"""


def load_check(build_dir: str) -> list[str]:
    """Step 5: the extension loads (every kernel registration matches its schema) and registers CUDA kernels."""
    libs = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(build_dir, "lib")) for f in fs
            if f.startswith("_C") and f.endswith(".so")]
    if not libs:
        return [f"load check: no _C*.so under {os.path.relpath(os.path.join(build_dir, 'lib'), ROOT)}"]
    r = subprocess.run([sys.executable, "-c", LOAD_CHECK, libs[0]], capture_output=True, text=True, timeout=300,
                       cwd=build_dir)
    out = r.stdout.strip().splitlines()
    if r.returncode != 0:  # (a registration mismatch aborts the process: c10::Error's text, then a stack trace)
        msg = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip() and not ln.startswith("frame #")]
        return [f"load check: loading {os.path.basename(libs[0])} failed (exit {r.returncode}): " + " | ".join(msg[:12])]
    if out and out[-1].startswith("SKIP"):
        print("load check:", out[-1])
        return []
    total, cuda = map(int, out[-1].split())
    print(f"load check: the CUDA build loads; {total} decodekit ops, {cuda} with a CUDA kernel")
    return [] if cuda > 0 else ["load check: no decodekit op has a CUDA kernel"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-build", action="store_true", help="check the objects already in the build dir")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "cuda"))
    ap.add_argument("--expect", default=os.path.join(ROOT, "tools", "sass_expectations.json"))
    ap.add_argument("--sass-dump", default=None, help="write each object's SASS into this directory")
    args = ap.parse_args()
    build_dir = os.path.realpath(args.build_dir)
    os.makedirs(build_dir, exist_ok=True)
    log_path = os.path.join(build_dir, "cuda_build.log")
    failures: list[str] = []

    try:
        rules = load_rules(args.expect)
    except (OSError, ValueError, re.error) as e:
        print(f"FAIL: cannot load {args.expect}: {e}")
        return 1

    fresh = {}
    if not args.skip_build:
        if not run_build(build_dir, log_path):
            return 1
        with open(log_path) as f:
            log_text = f.read()
        fresh = parse_ptxas_log(log_text)
        warns = sorted(set(re.findall(r"^.*ptxas (?:warning|error).*$", log_text, re.M)))
        for w in warns:
            print("ptxas:", w.strip())
        # ptxas serialises warpgroup MMAs it cannot overlap safely (accumulators written on a divergent path, a
        # branch around them): each wgmma then waits for the previous one. Ours must not (CUTLASS's are its own).
        for fn in sorted(set(re.findall(r"\(C7520\) Potential Performance Loss: wgmma[^']*'(\w+)'", log_text))):
            if "cutlass" not in fn:
                failures.append(f"ptxas serialised the wgmma instructions of {demangle_all([fn]).get(fn, fn)} (C7520)")
    ptxas = update_ptxas_cache(os.path.join(build_dir, "ptxas_info.json"), fresh)

    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("FAIL: cuobjdump not found (looked in $CUDA_HOME/bin, the triton package, PATH)")
        return 1

    objects, problems = cu_objects(build_dir)
    failures += problems
    times = ninja_compile_times(build_dir)
    ct = [f"{os.path.basename(src)} {times[o]:.1f} s" for src, o in objects.items() if o and o in times]
    if ct:
        print("last compile of each .cu (ninja, parallel jobs):", ", ".join(ct))
    kernels: dict[str, dict] = {}  # mangled -> info
    for src, obj in objects.items():
        if obj is None:
            failures.append(f"{src}: no object under {os.path.relpath(build_dir, ROOT)} (not built?)")
            continue
        funcs, archs, err = sass_functions(cuobjdump, obj, args.sass_dump)
        if err:
            failures.append(f"{src}: cuobjdump -sass failed: {err}")
            continue
        if ARCH not in archs or not any(f["arch"] == ARCH for f in funcs.values()):
            failures.append(f"{src}: no {ARCH} SASS in {os.path.relpath(obj, ROOT)} (machine code for: "
                            f"{', '.join(sorted(archs)) or 'none'})")
        for mangled, f in funcs.items():
            for insn in f.get("odd_desc", [])[:3]:
                failures.append(f"{src}: {short_name(demangle_all([mangled]).get(mangled, mangled))}: memory "
                                f"descriptor in an odd uniform register (faults at run time): {insn}")
        usage = res_usage(cuobjdump, obj)
        logged = ptxas.get(obj, {})
        for mangled, f in funcs.items():
            if f["arch"] != ARCH:
                continue
            u = usage.get(mangled, {})
            p = logged.get(mangled, {})
            kernels[mangled] = {
                "src": src, "ops": f["ops"], "regs": u.get("regs", p.get("regs")),
                "stack": u.get("stack", p.get("stack")), "spill_st": p.get("spill_st"), "spill_ld": p.get("spill_ld"),
            }

    names = demangle_all(kernels)
    by_name: dict[str, dict] = {}
    for mangled, info in kernels.items():
        d = names[mangled]
        info["short"] = short_name(d)
        by_name[d] = info

    # ---- table
    hot_rx = [re.compile(r["kernel"]) for r in rules if r.get("hot")]
    rows = sorted(by_name.items(), key=lambda kv: (kv[1]["src"], kv[1]["short"]))
    if rows:
        w = max(len(i["short"]) for _, i in rows)
        print(f"\n{'kernel':<{w}}  {'regs':>4}  {'stack':>5}  {'spill st/ld':>11}  {'LDG128':>6}  hot  file")
        for d, i in rows:
            ld128 = sum(n for op, n in i["ops"].items() if op.startswith("LDG.E.128"))
            hot = "yes" if any(rx.search(d) for rx in hot_rx) else ""
            sp = f"{fmt(i['spill_st'])}/{fmt(i['spill_ld'])}"
            print(f"{i['short']:<{w}}  {fmt(i['regs']):>4}  {fmt(i['stack']):>5}  {sp:>11}  {ld128:>6}  {hot:<3}  "
                  f"{i['src']}")
        unknown = sum(1 for _, i in rows if i["spill_st"] is None)
        if unknown:
            print(f"({unknown} kernel(s) without ptxas spill info: their objects were built without -Xptxas -v "
                  f"or before {os.path.relpath(os.path.join(build_dir, 'ptxas_info.json'), ROOT)} existed; "
                  f"LDL/STL rules still apply)")
    print(f"\n{len(rows)} {ARCH} kernel(s) in {sum(1 for o in objects.values() if o)} object(s); "
          f"{len(rules)} rule(s) from {os.path.relpath(args.expect, ROOT)}")

    failures += check_rules(rules, by_name)
    failures += wgmma_layout_check(build_dir)
    failures += load_check(build_dir)
    if failures:
        print(f"\nFAIL ({len(failures)}):")
        for f in failures:
            print("  -", f)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
