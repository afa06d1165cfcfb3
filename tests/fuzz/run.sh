#!/bin/sh
# Runs every libFuzzer target in $BUILD/fuzz for $FUZZ_SECONDS seconds each
# (default 60) with a persistent corpus under $BUILD/fuzz-corpus/<target>,
# seeded from tests/fuzz/seeds/<target>. Fails if any target finds a crash,
# leak, timeout or undefined behaviour; reproducers land in
# $BUILD/fuzz-artifacts/ (re-run one with: $BUILD/fuzz/<target> <file>).
BUILD=${BUILD:-build}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
here=$(cd "$(dirname "$0")" && pwd)
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
mkdir -p "$BUILD/fuzz-artifacts" "$BUILD/test-logs"
failed=""
found=0
for bin in "$BUILD"/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    found=1
    name=$(basename "$bin")
    corpus="$BUILD/fuzz-corpus/$name"
    mkdir -p "$corpus"
    seeds="$here/seeds/$name"
    dict="$here/$name.dict"
    set -- -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/$name-"
    [ -f "$dict" ] && set -- "$@" -dict="$dict"
    set -- "$@" "$corpus"
    [ -d "$seeds" ] && set -- "$@" "$seeds"
    log="$BUILD/test-logs/$name.log"
    echo "fuzz  $name: ${FUZZ_SECONDS}s (log: $log)"
    if "$bin" "$@" >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        echo "fuzz  $name: clean, ${runs:-?} runs, corpus $(ls "$corpus" | wc -l) inputs"
    else
        echo "fuzz  $name: FAILED"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -n 20
        failed="$failed $name"
    fi
done
if [ "$found" -eq 0 ]; then
    echo "fuzz: no targets in $BUILD/fuzz (run make fuzz)" >&2
    exit 1
fi
if [ -n "$failed" ]; then
    echo "fuzz: FAILED:$failed"
    exit 1
fi
echo "fuzz: all targets clean"
