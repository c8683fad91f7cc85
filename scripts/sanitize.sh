#!/usr/bin/env bash
# ASan+UBSan build of the HTTP, server, engine and parser test targets (no CUDA, no
# benchmarks) into ./build-asan, then runs them; any sanitizer report fails the run.
# Developers run it before resolving an issue that touches those layers:
#   JOBS=2 scripts/sanitize.sh            # build + run
#   scripts/sanitize.sh --gtest_filter='HttpRobustness.*'   # extra args go to every test binary
#   SANITIZE_TARGETS="test_engine_units test_engine_sched" scripts/sanitize.sh   # a subset
#   SANITIZE_SET=quick scripts/sanitize.sh   # the host-only engine, tokenizer and Jinja tests
# Timing on the 2-core dev machine: docs/reliability.md ("Sanitizers").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
JOBS=${JOBS:-$(nproc)}
ALL="test_http test_http_robustness test_server_units test_engine_units test_engine_sched test_tokenizer test_jinja"
QUICK="test_engine_units test_engine_sched test_tokenizer test_jinja"
if [ -n "${SANITIZE_TARGETS:-}" ]; then read -r -a TARGETS <<<"$SANITIZE_TARGETS"
elif [ "${SANITIZE_SET:-all}" = quick ]; then read -r -a TARGETS <<<"$QUICK"
else read -r -a TARGETS <<<"$ALL"; fi
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_CUDA=OFF -DMOESERVE_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
built=$(date +%s)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${TARGETS[@]}"; do
  bin=$(find "$BUILD_DIR/tests" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "sanitize: $t not built" >&2; status=1; continue; }
  echo "== $t"
  (cd "$(dirname "$bin")" && "./$t" "$@") || status=1
done
end=$(date +%s)
echo "sanitize: build $((built - start)) s, tests $((end - built)) s, status $status"
exit $status
