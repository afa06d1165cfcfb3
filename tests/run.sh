#!/bin/sh
# Runs every test: C unit tests (cmocka, under valgrind for leaks) and the
# end-to-end tests (pytest with Debian's python3 and the real jupyter_client).
# Ends with one summary line counting passed and failed tests.
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
# The kernels' default is the strict sandbox, so that is what the suite runs;
# KM_TEST_SANDBOX=none runs the functional tests without it (the attack tests
# always use strict).
export KM_TEST_SANDBOX=${KM_TEST_SANDBOX:-strict}
unit_pass=0; unit_fail=0
mkdir -p "$BUILD/test-logs"

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    log="$BUILD/test-logs/$name.log"
    if valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
        "$t" >"$log" 2>&1; then
        n=$(grep -c '^\[       OK \]' "$log")
        unit_pass=$((unit_pass + n))
        echo "unit  $name: $n passed"
    else
        n_ok=$(grep -c '^\[       OK \]' "$log")
        n_bad=$(grep -c '^\[  FAILED  \]' "$log")
        [ "$n_bad" -eq 0 ] && n_bad=1   # crash, leak or valgrind error
        unit_pass=$((unit_pass + n_ok)); unit_fail=$((unit_fail + n_bad))
        echo "unit  $name: FAILED (log: $log)"; tail -n 40 "$log"
    fi
done

# The tree must also build warning-free with clang, not only gcc.
if command -v clang >/dev/null; then
    if make --no-print-directory -j2 CC=clang BUILD="$BUILD/clang" all \
        >"$BUILD/test-logs/clang-build.log" 2>&1; then
        unit_pass=$((unit_pass + 1)); echo "build clang -Wall -Wextra -Werror: ok"
    else
        unit_fail=$((unit_fail + 1)); echo "build clang: FAILED (log: $BUILD/test-logs/clang-build.log)"
        tail -n 20 "$BUILD/test-logs/clang-build.log"
    fi
fi

# Style and static checks: clang-format and cppcheck (make lint).
if command -v cppcheck >/dev/null && command -v clang-format >/dev/null; then
    if make --no-print-directory lint >"$BUILD/test-logs/lint.log" 2>&1; then
        unit_pass=$((unit_pass + 1)); echo "lint clang-format + cppcheck: ok"
    else
        unit_fail=$((unit_fail + 1)); echo "lint: FAILED (log: $BUILD/test-logs/lint.log)"
        grep -E 'error|warning|portability' "$BUILD/test-logs/lint.log" | tail -n 20
    fi
fi

# Memory errors and undefined behaviour: the unit tests again, built with
# clang's AddressSanitizer (LeakSanitizer included) and UBSan; any report fails.
if command -v clang >/dev/null; then
    san="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    if make --no-print-directory -j2 CC=clang BUILD="$BUILD/asan" CFLAGS="$san" unit-bins \
        >"$BUILD/test-logs/asan-build.log" 2>&1; then
        for t in "$BUILD"/asan/tests/test_*; do
            [ -x "$t" ] || continue
            name=asan-$(basename "$t")
            log="$BUILD/test-logs/$name.log"
            if ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$t" >"$log" 2>&1 &&
                ! grep -q 'runtime error:' "$log"; then
                n=$(grep -c '^\[       OK \]' "$log")
                unit_pass=$((unit_pass + n)); echo "unit  $name: $n passed"
            else
                unit_fail=$((unit_fail + 1)); echo "unit  $name: FAILED (log: $log)"
                tail -n 40 "$log"
            fi
        done
    else
        unit_fail=$((unit_fail + 1)); echo "build asan/ubsan: FAILED (log: $BUILD/test-logs/asan-build.log)"
        tail -n 20 "$BUILD/test-logs/asan-build.log"
    fi
fi

xml="$BUILD/test-logs/pytest.xml"
rm -f "$xml"
# Processes the suite starts (kernels, sandbox inits, workers, daemons) all
# name the build directory (or the copy made for nobody, km-nobody-bin-*) in
# their command line; those running before the suite are not its own.
BUILD_ABS=$(cd "$BUILD" && pwd -P)
suite_procs() {
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [ "$pid" = "$$" ] && continue
        cmd=$( (tr '\0' ' ' <"$d/cmdline") 2>/dev/null) || continue
        case "$cmd" in
        *"$BUILD_ABS/"* | *"/km-nobody-bin-"*) echo "$pid" ;;
        esac
    done
}
before=$(suite_procs | tr '\n' ' ')
"$PYTHON" -m pytest -q -p no:cacheprovider --junitxml="$xml" ${PYTEST_ARGS:-} tests/e2e
py_rc=$?
# The suite must leave nothing running: wait a little for shutdowns in
# progress, then report what is left (one failure), and kill it.
left=""
for _ in $(seq 50); do
    left=""
    for pid in $(suite_procs); do
        case " $before " in *" $pid "*) continue ;; esac
        left="$left $pid"
    done
    [ -z "$left" ] && break
    sleep 0.1
done
leftover_fail=0
if [ -n "$left" ]; then
    leftover_fail=1
    echo "LEFTOVER PROCESSES after the e2e suite (a test did not clean up; killing them):"
    for pid in $left; do
        echo "  $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
    done
    kill -KILL $left 2>/dev/null
fi
set -- $("$PYTHON" - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    t, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    print(t - f - e - sk, f + e, sk)
except Exception:
    print(0, 1, 0)
PY
)
e2e_pass=$1; e2e_fail=$2; e2e_skip=$3
[ "$py_rc" -ne 0 ] && [ "$e2e_fail" -eq 0 ] && e2e_fail=1
e2e_fail=$((e2e_fail + leftover_fail))

total_pass=$((unit_pass + e2e_pass)); total_fail=$((unit_fail + e2e_fail))
echo "SUMMARY: $total_pass passed, $total_fail failed, $e2e_skip skipped" \
     "(unit: $unit_pass passed, $unit_fail failed; e2e: $e2e_pass passed, $e2e_fail failed)"
[ "$total_fail" -eq 0 ]
