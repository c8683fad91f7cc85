#!/usr/bin/env python3
"""The include graph keeps device code in the backend (issue 21): no file of src/ outside the
places listed in ALLOWED includes a CUDA / NCCL header or a backend/cuda/ header, directly or
through other src/ headers, or names CudaBackend in code (comments are ignored).

    scripts/check_include_graph.py [--src DIR]     exit 0: clean; 1: each violation printed

Run by CTest as `include_graph` (label unit). Standard library only.
"""
import argparse
import os
import re
import sys

# Paths (relative to src/, prefixes end in "/") that may include device headers, and why.
ALLOWED = {
    "backend/": "the backends: backend/cuda/ is the CUDA backend itself",
    "dist/": "the NCCL / p2p communicators run on CUDA streams and device memory; code above "
             "them uses dist/nccl.h (no device header) and dist/communicator.h",
    "tools/bench_model.cpp": "bench-model times the CUDA backend's kernels (roofline, op timers)",
    "tools/bench_parallel.cpp": "bench-model -tp: NCCL communicators on each GPU's stream",
    "tools/bench_synth.h": "bench-model's synthetic MiniMax-M2.5 weights, made on the GPU",
    "tools/bench_synth.cpp": "bench-model's synthetic MiniMax-M2.5 weights, made on the GPU",
    "tools/roofline.cpp": "bench-model's roofline: times raw kernels",
    "tools/explain_dispatch.cpp": "bench-model --explain-dispatch evaluates the CUDA kernel selectors "
                                  "(backend/cuda/*/select_*.h, common/tuning.h: plain host code, no device header)",
}

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# System headers of the CUDA toolkit, cuBLAS(Lt), NCCL, NVTX, cuRAND, CUTLASS/CUB/Thrust.
DEVICE_SYSTEM = re.compile(r"^(cuda[\w.]*|cuda/.*|cublas\w*\.h|cublasLt\.h|nccl\w*\.h|nvtx\w*\.h|nvToolsExt\.h|"
                           r"curand\w*\.h|cub/.*|thrust/.*|cutlass/.*|cute/.*)$")
CUDA_BACKEND = re.compile(r"\bCudaBackend\b")


def allowed(rel):
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWED)


def strip_comments(text):
    # Removes // and /* */ comments, keeping string literals and line structure.
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        prev = text[i - 1] if i else " "
        if c == "R" and text.startswith('R"', i) and not (prev.isalnum() or prev == "_"):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if m:  # raw string R"delim( ... )delim"
                end = text.find(")" + m.group(1) + '"', i + m.end())
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append(text[i:j])
                i = j
                continue
        if c == "'" and not prev.isalnum():  # a character literal (not a digit separator)
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scan(src):
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(SOURCE_EXT):
                path = os.path.join(root, name)
                files[os.path.relpath(path, src).replace(os.sep, "/")] = path
    direct = {}  # rel -> [(line, reason)] device uses in the file itself
    edges = {}   # rel -> [(line, included rel)] quoted includes of files under src/
    for rel, path in files.items():
        with open(path, encoding="utf-8", errors="replace") as f:
            code = strip_comments(f.read())
        d, e = [], []
        for no, line in enumerate(code.split("\n"), 1):
            m = INCLUDE.match(line)
            if m:
                kind, inc = m.groups()
                if inc.startswith("backend/cuda/"):
                    d.append((no, f'#include "{inc}"'))
                elif kind == "<" and DEVICE_SYSTEM.match(inc):
                    d.append((no, f"#include <{inc}>"))
                elif kind == '"':
                    here = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
                    target = inc if inc in files else here if here in files else None
                    if target:
                        e.append((no, target))
                continue
            if CUDA_BACKEND.search(line):
                d.append((no, "names CudaBackend"))
        direct[rel], edges[rel] = d, e
    return files, direct, edges


def first_device_path(rel, direct, edges, memo, stack):
    # The chain of includes from `rel` to a file that uses a device header itself, or None.
    if rel in memo:
        return memo[rel]
    if rel in stack:
        return None
    stack.add(rel)
    res = None
    if direct[rel]:
        no, why = direct[rel][0]
        res = [f"{rel}:{no}: {why}"]
    else:
        for no, inc in edges[rel]:
            sub = first_device_path(inc, direct, edges, memo, stack)
            if sub:
                res = [f"{rel}:{no}: includes {inc}"] + sub
                break
    stack.discard(rel)
    memo[rel] = res
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    a = ap.parse_args()
    files, direct, edges = scan(a.src)
    if not files:
        print(f"include_graph: no sources under {a.src}", file=sys.stderr)
        return 1
    memo, bad = {}, 0
    for rel in sorted(files):
        if allowed(rel):
            continue
        chain = first_device_path(rel, direct, edges, memo, set())
        if chain:
            bad += 1
            print(f"{rel}: device code above the backend:\n    " + "\n    ".join(chain))
    checked = sum(1 for r in files if not allowed(r))
    if bad:
        print(f"include_graph: {bad} of {checked} files reach a CUDA header or CudaBackend; use backend "
              "capabilities (backend/capabilities.h) or dist/nccl.h, or add the file to ALLOWED with a reason",
              file=sys.stderr)
        return 1
    print(f"include_graph: {checked} files checked, none reaches a CUDA header or names CudaBackend")
    return 0


if __name__ == "__main__":
    sys.exit(main())
