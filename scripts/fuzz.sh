#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, ASan and UBSan into ./build-fuzz and
# runs each for a bounded time (docs/fuzzing.md). Any crash, sanitizer report, leak, timeout
# (> 10 s for one input) or out-of-memory (> 2 GiB) fails the run; the input that did it is
# saved as build-fuzz/fuzz/crashes/<target>/crash-* (copy it to tests/fuzz/regressions/<target>/
# once fixed: the normal build replays it as a unit test).
#
#   scripts/fuzz.sh                       # CI: every target 45 s, two at a time
#   scripts/fuzz.sh --seconds 3600 --target fuzz_jinja   # a developer's long run
#   scripts/fuzz.sh --build-only | --list
# The corpus of each target grows in build-fuzz/fuzz/corpus/<target>/ and is kept between
# runs (seeded from the fixtures listed in build-fuzz/fuzz/<target>.seeds). A target with a
# tests/fuzz/dicts/<target>.dict (field names, keywords) gets it as libFuzzer's -dict.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=45
JOBS=${JOBS:-2}
TARGETS=()
BUILD_ONLY=0
LIST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --target) TARGETS+=("$2"); shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --list) LIST=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
command -v clang++ >/dev/null || { echo "error: clang++ not found (scripts/install-deps.sh installs clang)" >&2; exit 2; }
t0=$(date +%s)
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DMOESERVE_FUZZ=ON -DMOESERVE_CUDA=OFF -DMOESERVE_TESTS=OFF \
  -DMOESERVE_BENCH=OFF -DMOESERVE_TEST_BACKENDS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1" >/dev/null
cmake --build "$BUILD_DIR" --target fuzz_all -j "$JOBS"
t1=$(date +%s)
echo "fuzz build: $((t1 - t0)) s"
FZ="$BUILD_DIR/fuzz"
if [ ${#TARGETS[@]} -eq 0 ]; then
  for s in "$FZ"/*.seeds; do TARGETS+=("$(basename "$s" .seeds)"); done
fi
if [ "$LIST" = 1 ]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
[ "$BUILD_ONLY" = 1 ] && exit 0

run_one() {
  local t="$1" fz="$2" secs="$3"
  local corpus="$fz/corpus/$t" crashes="$fz/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  # Seeds: files and folders listed by CMake; a folder's files are copied one by one.
  while IFS= read -r seed; do
    [ -z "$seed" ] && continue
    if [ -d "$seed" ]; then
      find "$seed" -type f ! -name '.keep' -exec cp -n {} "$corpus/" \; 2>/dev/null || true
    elif [ -f "$seed" ]; then
      cp -n "$seed" "$corpus/" 2>/dev/null || true
    fi
  done < "$fz/$t.seeds"
  local rc=0 dict=()
  [ -f "tests/fuzz/dicts/$t.dict" ] && dict=(-dict="tests/fuzz/dicts/$t.dict")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$fz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix="$crashes/" "${dict[@]}" "$corpus" > "$fz/$t.log" 2>&1 || rc=$?
  local execs cov
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$fz/$t.log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$fz/$t.log" | tail -1 | grep -o '[0-9]*')
  local files
  files=$(find "$corpus" -type f | wc -l)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$rc" "${execs:-?}" "${cov:-?}" "$files" "$secs" > "$fz/$t.result"
  if [ "$rc" != 0 ]; then
    echo "FAILED: $t (exit $rc); last lines of $fz/$t.log:" >&2
    tail -40 "$fz/$t.log" >&2
  fi
}
export -f run_one
rm -f "$FZ"/*.result
printf '%s\n' "${TARGETS[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one "$@"' _ {} "$FZ" "$SECONDS_PER_TARGET"
t2=$(date +%s)
status=0
summary="| target | result | executions | coverage (edges) | corpus files | seconds |
|---|---|---|---|---|---|"
for t in "${TARGETS[@]}"; do
  if [ ! -f "$FZ/$t.result" ]; then summary+=$'\n'"| $t | did not run | | | | |"; status=1; continue; fi
  IFS=$'\t' read -r name rc execs cov files secs < "$FZ/$t.result"
  if [ "$rc" = 0 ]; then res=ok; else res="CRASH (exit $rc)"; status=1; fi
  summary+=$'\n'"| $name | $res | $execs | $cov | $files | $secs |"
done
echo "$summary" | tee "$FZ/summary.md"
echo "fuzz lane: build $((t1 - t0)) s, runs $((t2 - t1)) s, total $((t2 - t0)) s (jobs $JOBS)"
exit $status
