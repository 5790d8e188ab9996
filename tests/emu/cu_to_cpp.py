#!/usr/bin/env python3
"""lossfuse's CUDA emulator (tests/emu/): one src/cuda source as C++ for the host compiler.

Usage: cu_to_cpp.py IN OUT (a .cu source or a .cuh header). Every launch `kernel<<<grid, block, smem, stream>>>(args)`
becomes `::lfemu::Launch(grid, block, smem, stream)([](auto... p) { kernel(p...); }, args)`, every
`extern __shared__ T name[];` a pointer to the launch's dynamic shared memory, and every `__shared__ T name[N];` a
static that `::lfemu::static_shared` refills at each block's first pass over it (what no thread of the block wrote
holds the race check's fill, as dynamic shared memory does). The emulator's cuda_runtime.h comes first and does not
define `__shared__`, so a declaration left unconverted does not compile. Line numbers stay those of IN.
"""
import os
import re
import sys


def kernel_start(s, end):
    """Index where the kernel expression ending before `end` starts: a name, maybe qualified, maybe with <...>."""
    i = end
    while True:
        while i > 0 and s[i - 1].isspace():
            i -= 1
        if s[i - 1] == ">":
            depth = 0
            while True:
                i -= 1
                depth += {">": 1, "<": -1}.get(s[i], 0)
                if depth == 0:
                    break
            while i > 0 and s[i - 1].isspace():
                i -= 1
        j = i
        while i > 0 and (s[i - 1].isalnum() or s[i - 1] == "_"):
            i -= 1
        if i == j:
            raise SystemExit(f"cu_to_cpp: no kernel name before the launch at offset {end}")
        if s[i - 2:i] == "::":
            i -= 2
            continue
        return i


def matching(s, i, open_, close):
    """Index just past the bracket closing the one at s[i]."""
    depth = 0
    while True:
        depth += {open_: 1, close: -1}.get(s[i], 0)
        i += 1
        if depth == 0:
            return i


def convert(s):
    out, pos = [], 0
    while (cfg := s.find("<<<", pos)) >= 0:
        start = kernel_start(s, cfg)
        cfg_end = s.index(">>>", cfg)
        args = cfg_end + 3
        while s[args].isspace():
            args += 1
        if s[args] != "(":
            raise SystemExit(f"cu_to_cpp: no argument list after the launch at offset {cfg}")
        args_end = matching(s, args, "(", ")")
        kernel = s[start:cfg].strip()
        inner = s[args + 1:args_end - 1]
        sep = ", " if inner.strip() else ""
        out.append(s[pos:start])
        dropped = s[start:cfg].count("\n") + s[cfg_end + 3:args].count("\n")  # kept, so line numbers stay
        out.append(f"::lfemu::Launch({s[cfg + 3:cfg_end]})([](auto... lfemu_p) {{ {kernel}(lfemu_p...); }}{sep}{inner})")
        out.append("\n" * dropped)
        pos = args_end
    out.append(s[pos:])
    s = "".join(out)
    s = re.sub(r"extern\s+__shared__\s+(?:alignas\(\d+\)\s+)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;",
               r"\1* const \2 = ::lfemu::dynamic_shared_as<\1>();", s)
    return re.sub(r"__shared__[ \t]+([^;=(){}\n]+?)[ \t]+(\w+)[ \t]*((?:\[[^\]\n]*\][ \t]*)*);",
                  r"static \1 \2\3; ::lfemu::static_shared(&\2, sizeof(\2));", s)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with open(dst, "w") as f:
        f.write(f'#include <cuda_runtime.h>\n#line 1 "{src}"\n' + convert(text))


if __name__ == "__main__":
    main()
