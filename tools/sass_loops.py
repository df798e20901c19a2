#!/usr/bin/env python3
"""Static instruction counts of a kernel's loops in SASS (no GPU needed): for each backward branch, the
instructions between its target and the branch, with the most frequent opcodes. The innermost loop
that holds a kernel's loads and math is its per-iteration cost; divided by the bytes one iteration
reads it gives instructions per byte, which bounds a memory-bound kernel when the SM's issue rate
(4 warp-instructions per clock) cannot keep up with its share of the bandwidth.

    python tools/cuda_check.py --build-dir /tmp/cc            # builds the objects (or any nvcc -c)
    python tools/sass_loops.py /tmp/cc/csrc/cuda/attention.o 'paged_decode_tc_kernelI13__nv_bfloat16S3_Li128E' \\
        'paged_attention_kernelI13__nv_bfloat16S3_Li128ELi4ELb1E'

    --hot HMMA         the smallest loop holding an HMMA: a loop body whose branches the compiler laid out
                       around it (the fp8 decode kernel's tile loop) still shows as one range
    --span BAR.SYNC HMMA --after LDGSTS
                       from the first BAR.SYNC after the first LDGSTS to the last HMMA: a loop whose rare
                       tail sits inside it (the Marlin kernel's per-unit path without its split epilogue)

Patterns are regular expressions over the mangled names (the first match is taken). Overlapping
ranges are reported as they are (a loop whose body branches back to an earlier label shows up as a
larger range too); "innermost" marks ranges that contain no other, and the innermost one with the
kernel's HMMA / LDG / LDGSTS is the hot loop.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter

from cuda_check import find_cuobjdump  # noqa: E402  (tools/ is this script's directory)


def functions(sass: str) -> dict[str, list[str]]:
    out, name = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def instructions(lines: list[str]) -> list[tuple[int, str]]:
    ins = []
    for line in lines:
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def loops(lines: list[str]) -> list[tuple[int, int, list[str]]]:
    ins = instructions(lines)
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        if "BRA" not in text:
            continue
        m = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            t = int(m.group(1), 16)
            found.append((t, a, [x for _, x in ins[index[t]:i + 1]]))
    return found


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("object", help="an object or cubin with sm_90 SASS")
    ap.add_argument("patterns", nargs="+", help="regexes over mangled kernel names")
    ap.add_argument("--top", type=int, default=4, help="loops per kernel, largest first")
    ap.add_argument("--hot", metavar="OPCODE", help="also: the smallest loop holding OPCODE (regex)")
    ap.add_argument("--span", nargs=2, metavar=("FROM", "TO"),
                    help="also: from the first FROM (regex) to the last TO")
    ap.add_argument("--after", metavar="OPCODE", help="--span starts after the first OPCODE")
    args = ap.parse_args(argv)
    tool = find_cuobjdump()
    if not tool:
        print("cuobjdump not found ($CUDA_HOME/bin, the triton package, PATH)")
        return 1
    funcs = functions(subprocess.run([tool, "-sass", args.object], capture_output=True, text=True).stdout)
    for pat in args.patterns:
        name = next((n for n in funcs if re.search(pat, n)), None)
        if name is None:
            print(f"{pat}: no kernel matches")
            continue
        total = sum(1 for x in funcs[name] if re.match(r"\s*/\*[0-9a-f]{4,}\*/", x))
        print(f"{name[:110]}: {total} instructions")
        found = loops(funcs[name])
        inner = {(t, a) for t, a, _ in found
                 if not any((t2, a2) != (t, a) and t <= t2 and a2 <= a for t2, a2, _ in found)}
        for t, a, body in sorted(found, key=lambda r: -len(r[2]))[:args.top]:
            top = Counter(opcode(x) for x in body).most_common(12)
            print(f"  {'innermost ' if (t, a) in inner else ''}loop {t:#x}-{a:#x}: {len(body)} instructions; "
                  + " ".join(f"{k} {v}" for k, v in top))
        if args.hot:
            hot = [r for r in found if any(re.search(args.hot, x) for x in r[2])]
            if hot:
                t, a, body = min(hot, key=lambda r: len(r[2]))
                top = Counter(opcode(x) for x in body).most_common(10)
                print(f"  hot loop ({args.hot}) {t:#x}-{a:#x}: {len(body)} instructions; "
                      + " ".join(f"{k} {v}" for k, v in top))
        if args.span:
            ins = [x for _, x in instructions(funcs[name])]
            start = next((i for i, x in enumerate(ins) if re.search(args.after, x)), 0) if args.after else 0
            i0 = next((i for i in range(start, len(ins)) if re.search(args.span[0], ins[i])), None)
            i1 = max((i for i, x in enumerate(ins) if re.search(args.span[1], x)), default=None)
            if i0 is not None and i1 is not None and i1 >= i0:
                body = ins[i0:i1 + 1]
                top = Counter(opcode(x) for x in body).most_common(10)
                print(f"  span {args.span[0]} .. {args.span[1]}: {len(body)} instructions; "
                      + " ".join(f"{k} {v}" for k, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
