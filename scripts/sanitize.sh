#!/usr/bin/env bash
# ASan+UBSan build of the HTTP, server, parser, engine, tokenizer and Jinja test targets
# (CPU only: no CUDA, no benchmarks, no model/backend code) into ./build-asan, then runs
# every test binary; any sanitizer report (leak, overflow, use-after-free, undefined
# behaviour) or failed test fails the run.
#   scripts/sanitize.sh                   # the default set: build + run
#   scripts/sanitize.sh --gtest_filter='HttpRobustness.*'   # extra args go to every test binary
#   SANITIZE_TARGETS="test_engine_units test_engine_sched" scripts/sanitize.sh   # a subset
#   SANITIZE_SET=quick scripts/sanitize.sh   # the host-only engine, tokenizer and Jinja tests
#   SANITIZE_CXX=g++ scripts/sanitize.sh     # GCC's sanitizers instead of clang's (slower build)
#   SANITIZE_BUILD_ONLY=1 scripts/sanitize.sh  # build, run nothing
# Configuration: clang (GCC with SANITIZE_CXX=g++), -O1 with line tables, asserts on (no
# NDEBUG), -fno-sanitize-recover=undefined (undefined behaviour aborts), leak checking on;
# ccache is used when present. Suppressions: tests/sanitize/lsan.supp and ubsan.supp (empty
# unless a report comes from code that is not ours; each entry says why).
# Timing and the results of each run: docs/reliability.md ("Sanitizers").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-asan}
JOBS=${JOBS:-$(nproc)}
ALL="test_core test_io test_structured test_tokenizer test_jinja test_engine_units test_engine_sched test_server_units test_agent_apis test_http test_http_robustness test_hub"
QUICK="test_engine_units test_engine_sched test_tokenizer test_jinja"
if [ -n "${SANITIZE_TARGETS:-}" ]; then read -r -a TARGETS <<<"$SANITIZE_TARGETS"
elif [ "${SANITIZE_SET:-all}" = quick ]; then read -r -a TARGETS <<<"$QUICK"
else read -r -a TARGETS <<<"$ALL"; fi
CXX_BIN=${SANITIZE_CXX:-}
if [ -z "$CXX_BIN" ]; then
  if command -v clang++ >/dev/null; then CXX_BIN=clang++; else CXX_BIN=g++; fi
fi
case "$CXX_BIN" in *clang++*) CC_BIN=${CXX_BIN/clang++/clang} ;; *) CC_BIN=${CXX_BIN/g++/gcc} ;; esac
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
OPT="-O1 -g1"
start=$(date +%s)
CC=$CC_BIN CXX=$CXX_BIN cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOESERVE_CUDA=OFF -DMOESERVE_BENCH=OFF -DMOESERVE_TEST_BACKENDS=ON \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$OPT" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$OPT" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
built=$(date +%s)
if [ "${SANITIZE_BUILD_ONLY:-0}" = 1 ]; then echo "sanitize: build $((built - start)) s"; exit 0; fi
SUPP="$ROOT/tests/sanitize"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SUPP/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp}
# What ctest would set (moeserve_test in cmake/moeserve.cmake).
export MOESERVE_SOURCE_DIR="$ROOT" MOESERVE_BINARY_DIR="$ROOT/$BUILD_DIR"
export MOESERVE_SHARED_DATA="$ROOT/tests/fixtures/shared-data"
status=0
summary=()
for t in "${TARGETS[@]}"; do
  bin=$(find "$BUILD_DIR/tests" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "sanitize: $t not built" >&2; status=1; summary+=("$t: not built"); continue; }
  echo "== $t"
  log="$BUILD_DIR/sanitize-$t.log"
  t0=$(date +%s)
  rc=0
  (cd "$(dirname "$bin")" && "./$t" "$@") 2>&1 | tee "$log" || rc=$?
  [ "$rc" = 0 ] || status=1
  passed=$(grep -o '\[  PASSED  \] [0-9]*' "$log" | grep -o '[0-9]*$' || true)
  failed=$(grep -o '\[  FAILED  \] [0-9]* test' "$log" | grep -o '[0-9]*' || true)
  skipped=$(grep -o '\[  SKIPPED \] [0-9]* test' "$log" | grep -o '[0-9]*' || true)
  reports=$(grep -c 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' "$log" || true)
  summary+=("$t: exit $rc, passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}, sanitizer reports ${reports:-0}, $(( $(date +%s) - t0 )) s")
done
end=$(date +%s)
printf 'sanitize: %s\n' "${summary[@]}"
echo "sanitize: compiler $CXX_BIN, build $((built - start)) s, tests $((end - built)) s, status $status"
exit $status
