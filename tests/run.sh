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
# KM_TEST_TIERS picks tiers (default: all of them, in this order): unit
# (valgrind), clang (the -Werror build), lint, asan (unit tests under
# ASan/UBSan), e2e (parallel pass, then serial), sanitized (e2e workload on
# the sanitizer build). E.g. KM_TEST_TIERS=e2e tests/run.sh
TIERS=" ${KM_TEST_TIERS:-unit clang lint asan e2e sanitized} "
tier() { case "$TIERS" in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$BUILD/test-logs"
rm -f "$BUILD"/test-logs/*.log.rc

# Unit test binaries run one per core at a time (each alone in its process,
# its log and exit status in files), then are counted in name order.
ujobs=${KM_TEST_UNIT_JOBS:-$(nproc 2>/dev/null || echo 1)}
run_units() { # dir log-prefix [command...]: each dir/test_* (under command) into
    # test-logs/PREFIXname.log, its exit status into test-logs/PREFIXname.log.rc
    d=$1; pre=$2; shift 2
    for t in "$d"/test_*; do [ -f "$t" ] && [ -x "$t" ] && echo "$t"; done |
        xargs -r -P "$ujobs" -n 1 sh -c \
            'for t; do :; done; log="$0$(basename "$t").log"
             "$@" >"$log" 2>&1; echo $? >"$log.rc"' "$BUILD/test-logs/$pre" "$@"
}
tier unit && run_units "$BUILD/tests" "" valgrind --quiet --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --error-exitcode=99
for t in "$BUILD"/tests/test_*; do
    tier unit && [ -x "$t" ] || continue
    name=$(basename "$t")
    log="$BUILD/test-logs/$name.log"
    if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ]; then
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
if tier clang && command -v clang >/dev/null; then
    if make --no-print-directory -j2 CC=clang BUILD="$BUILD/clang" all \
        >"$BUILD/test-logs/clang-build.log" 2>&1; then
        unit_pass=$((unit_pass + 1)); echo "build clang -Wall -Wextra -Werror: ok"
    else
        unit_fail=$((unit_fail + 1)); echo "build clang: FAILED (log: $BUILD/test-logs/clang-build.log)"
        tail -n 20 "$BUILD/test-logs/clang-build.log"
    fi
fi

# Style and static checks: clang-format and cppcheck (make lint).
if tier lint && command -v cppcheck >/dev/null && command -v clang-format >/dev/null; then
    if make --no-print-directory lint >"$BUILD/test-logs/lint.log" 2>&1; then
        unit_pass=$((unit_pass + 1)); echo "lint clang-format + cppcheck: ok"
    else
        unit_fail=$((unit_fail + 1)); echo "lint: FAILED (log: $BUILD/test-logs/lint.log)"
        grep -E 'error|warning|portability' "$BUILD/test-logs/lint.log" | tail -n 20
    fi
fi

# Memory errors and undefined behaviour: the unit tests again, built with
# clang's AddressSanitizer (LeakSanitizer included) and UBSan; any report fails.
# (The same build's daemon and kernels run the sanitized e2e tier below.)
if { tier asan || tier sanitized; } && command -v clang >/dev/null; then
    san="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    if make --no-print-directory -j2 CC=clang BUILD="$BUILD/asan" CFLAGS="$san" all unit-bins \
        >"$BUILD/test-logs/asan-build.log" 2>&1; then
        tier asan && run_units "$BUILD/asan/tests" asan- env ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        for t in "$BUILD"/asan/tests/test_*; do
            tier asan && [ -x "$t" ] || continue
            name=asan-$(basename "$t")
            log="$BUILD/test-logs/$name.log"
            if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ] && ! grep -q 'runtime error:' "$log"; then
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
xml_serial="$BUILD/test-logs/pytest-serial.xml"
rm -f "$xml" "$xml_serial"
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
# Two passes: everything not marked serial in parallel (pytest-xdist, one
# worker per core plus two, at most 4 by default: the tests mostly wait on
# kernels; KM_TEST_JOBS=1 runs it serially), then the tests marked serial
# (they measure CPU shares or timing, or load every core) alone. Tests that
# share a module- or class-scoped fixture stay on one worker (conftest.py).
jobs=${KM_TEST_JOBS:-$(( $(nproc 2>/dev/null || echo 1) + 2 ))}
[ "$jobs" -gt 4 ] && [ -z "${KM_TEST_JOBS:-}" ] && jobs=4
par=""
if [ "$jobs" -gt 1 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
    par="-n $jobs --dist loadgroup"
elif [ "$jobs" -gt 1 ]; then
    echo "e2e: pytest-xdist is missing (make deps installs python3-pytest-xdist): one process"
fi
py_rc=0; py_rc2=0; py_rc3=0
if tier e2e; then
    echo "e2e: parallel pass (${par:-serially}), then the tests marked serial"
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest -q -p no:cacheprovider $par -m "not serial" --junitxml="$xml" \
        ${PYTEST_ARGS:-} tests/e2e
    py_rc=$?
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest -q -p no:cacheprovider -m serial --junitxml="$xml_serial" \
        ${PYTEST_ARGS:-} tests/e2e
    py_rc2=$?
fi
# The daemon, the gateway and the kernel servers built with ASan, LSan and
# UBSan ($BUILD/asan, made above) under a representative workload: the CLI,
# MCP, the gateway's REST and WebSocket APIs, streaming, serve --stop, the
# debug protocol's relay, routing by session behind nginx. Every
# process writes its reports to a file in san_dir (mode 1777: kernels of the
# tests as nobody too); any report fails. The workers are Python and Bash.
SAN_TESTS="tests/e2e/test_mgr_cli.py tests/e2e/test_mcp.py tests/e2e/test_gateway.py
  tests/e2e/test_entry_stream.py tests/e2e/test_debugger.py tests/e2e/test_many_machines.py"
xml_san="$BUILD/test-logs/pytest-asan.xml"
rm -f "$xml_san"
san_dir=""
if tier sanitized && [ -x "$BUILD/asan/kernelmgr" ]; then
    san_dir=$(mktemp -d /tmp/km-san-XXXXXX) && chmod 1777 "$san_dir"
    echo "e2e: the sanitizer build ($BUILD/asan) under $SAN_TESTS" | tr '\n' ' '; echo
    # shellcheck disable=SC2086
    BUILD="$BUILD/asan" ASAN_OPTIONS="log_path=$san_dir/asan:detect_leaks=1" \
        UBSAN_OPTIONS="log_path=$san_dir/ubsan:print_stacktrace=1:halt_on_error=1" \
        "$PYTHON" -m pytest -q -p no:cacheprovider $par --junitxml="$xml_san" \
        ${PYTEST_ARGS:-} $SAN_TESTS
    py_rc3=$?
fi
# 5: nothing selected (PYTEST_ARGS chose none of a pass's tests)
for v in py_rc py_rc2 py_rc3; do eval "[ \"\$$v\" -eq 5 ] && $v=0"; done
[ "$py_rc2" -ne 0 ] && py_rc=$py_rc2
[ "$py_rc3" -ne 0 ] && py_rc=$py_rc3
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
# Sanitizer reports of the daemons and kernels of that pass (they are
# written at exit: after the wait above)
san_fail=0
if [ -n "$san_dir" ]; then
    if [ -n "$(ls -A "$san_dir")" ]; then
        san_fail=1
        mkdir -p "$BUILD/test-logs/sanitizer"
        cp "$san_dir"/* "$BUILD/test-logs/sanitizer/"
        echo "SANITIZER REPORTS from the daemon, gateway or kernels (in $BUILD/test-logs/sanitizer/):"
        for f in "$san_dir"/*; do echo "== $f"; head -n 40 "$f"; done
    fi
    rm -rf "$san_dir"
fi
set -- $("$PYTHON" - "$(tier e2e && echo 1)" "${san_dir:+1}" "$xml" "$xml_serial" "$xml_san" <<'PY'
import sys, xml.etree.ElementTree as ET
p = f = sk = 0
e2e, san, xml, xml_serial, xml_san = sys.argv[1:]
for path in ([xml, xml_serial] if e2e else []) + ([xml_san] if san else []):
    try:
        r = ET.parse(path).getroot()
        for s in ([r] if r.tag == "testsuite" else r.findall("testsuite")):
            t, fa, e, k = (int(s.get(x, 0)) for x in ("tests", "failures", "errors", "skipped"))
            p += t - fa - e - k
            f += fa + e
            sk += k
    except Exception:
        f += 1  # a pass that wrote no report failed
print(p, f, sk)
PY
)
e2e_pass=$1; e2e_fail=$2; e2e_skip=$3
[ "$py_rc" -ne 0 ] && [ "$e2e_fail" -eq 0 ] && e2e_fail=1
e2e_fail=$((e2e_fail + leftover_fail + san_fail))

total_pass=$((unit_pass + e2e_pass)); total_fail=$((unit_fail + e2e_fail))
echo "SUMMARY: $total_pass passed, $total_fail failed, $e2e_skip skipped" \
     "(unit: $unit_pass passed, $unit_fail failed; e2e: $e2e_pass passed, $e2e_fail failed)"
[ "$total_fail" -eq 0 ]
