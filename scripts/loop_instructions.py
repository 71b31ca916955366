#!/usr/bin/env python3
"""Counts the instructions of a kernel's loops in a disassembly, as a baseline for the
kernels' cost on hardware nobody here has (docs/PERFORMANCE.md).

usage: loop_instructions.py OBJDUMP OBJECT FUNCTION [INNER_TRIPS]

FUNCTION is a substring of the demangled name, e.g. "interleaved_tile<(strata::tensor::DType)2, 1>(".
A loop is the range from a backward branch's target to the branch. Prints each loop's
static count, smallest first (for the float formats, the 4-column loop); with INNER_TRIPS, also the instructions one pass of the
outermost loop executes when every loop nested in it runs INNER_TRIPS times (the
K-quants' sub-block loop: 8).
"""
import re
import subprocess
import sys


def function_lines(objdump, obj, name):
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", obj], check=True, capture_output=True,
                          text=True).stdout
    inside = False
    for line in text.splitlines():
        if line.endswith(">:"):
            if inside:
                return
            inside = name in line
            continue
        if inside:
            m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
            if m:
                yield int(m.group(1), 16), m.group(2), m.group(3)


def main():
    objdump, obj, name = sys.argv[1:4]
    inner_trips = int(sys.argv[4]) if len(sys.argv) > 4 else None
    instructions = list(function_lines(objdump, obj, name))
    if not instructions:
        sys.exit(f"no function matching {name!r} in {obj}")
    addresses = [a for a, _, _ in instructions]
    loops = []
    for address, mnemonic, operands in instructions:
        if not (mnemonic.startswith("b") or mnemonic.startswith("j") or mnemonic in ("cbz", "cbnz", "tbz", "tbnz")):
            continue
        target = re.search(r"\b([0-9a-f]+) <", operands)
        if target and int(target.group(1), 16) <= address:
            first = int(target.group(1), 16)
            loops.append((first, address, sum(1 for a in addresses if first <= a <= address)))
    loops.sort(key=lambda loop: (loop[2], loop[0]))
    for first, last, count in loops:
        print(f"loop {first:#x}-{last:#x}: {count} instructions")
    if inner_trips is not None and loops:
        outer = max(loops, key=lambda loop: loop[2])
        nested = [l for l in loops if l != outer and outer[0] <= l[0] and l[1] <= outer[1]]
        print(f"one pass of the outermost loop: {outer[2] + (inner_trips - 1) * sum(l[2] for l in nested)} instructions")


main()
