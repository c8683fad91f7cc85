#!/usr/bin/env bash
# Checks that clang compiles the tree: `clang++ -fsyntax-only` on every host C++ source of
# src/ with the flags of the normal build (build/compile_commands.json; run scripts/build.sh
# first). The fuzz lane (scripts/fuzz.sh) compiles core, io, engine, tokenizer and server with
# clang for real; this covers the rest (model, backend, dist, tools, cli). Exits 1 on any error.
# CI (.ci/run) runs it right after scripts/test.sh, whose configure step writes the database
# (CMAKE_EXPORT_COMPILE_COMMANDS in CMakeLists.txt); about 8 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=${BUILD_DIR:-build}/compile_commands.json
[ -f "$DB" ] || { echo "error: $DB missing (run scripts/build.sh)" >&2; exit 2; }
python3 - "$DB" "$(cd "${BUILD_DIR:-build}" && pwd)" <<'PY' | xargs -0 -P "${JOBS:-2}" -I{} bash -c {} || { echo "clang_check: errors above" >&2; exit 1; }
import json, os, shlex, sys
seen = set()
build_dir = sys.argv[2] + "/"
for c in json.load(open(sys.argv[1])):
    f = c["file"]
    if not f.endswith(".cpp") or "/src/" not in f or f in seen:
        continue
    # Sources generated into the build tree (embedded data: web_ui_page.cpp, the tiny
    # tokenizer's JSON) exist only once their target is built; a partial build skips them.
    if f.startswith(build_dir) and not os.path.exists(f):
        sys.stderr.write("clang_check: skipping %s (generated, not built yet)\n" % f)
        continue
    seen.add(f)
    args = shlex.split(c["command"])
    while args and ("ccache" in args[0] or args[0].endswith(("c++", "g++"))):
        args.pop(0)
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT"):
            skip = True
        elif a not in ("-MD", "-c"):
            out.append(a)
    cmd = "cd %s && clang++ -fsyntax-only -Wno-unknown-warning-option %s" % (
        shlex.quote(c["directory"]), " ".join(shlex.quote(x) for x in out))
    sys.stdout.write(cmd + "\0")
PY
echo "clang_check: every source of src/ compiles with $(clang++ --version | head -1)"
