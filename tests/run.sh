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
# KM_TEST_TIERS picks tiers (default: all of them): unit (valgrind), clang
# (the -Werror build), lint, asan (unit tests under ASan/UBSan), e2e
# (parallel pass, then serial), sanitized (e2e workload on the sanitizer
# build). E.g. KM_TEST_TIERS=e2e tests/run.sh
#
# Order: the tiers other than e2e (builds, unit tests, lint, the sanitized
# e2e workload) run in the background while the parallel e2e pass runs in
# the foreground: they mostly wait on one compiler or one core, the e2e pass
# on kernels. Their output goes to files and is printed, tier by tier in the
# order above, once the parallel pass is over and they have all ended; then
# the tests marked serial run with the machine to themselves.
# KM_TEST_OVERLAP=0 runs them one after another before the e2e pass instead.
TIERS=" ${KM_TEST_TIERS:-unit clang lint asan e2e sanitized} "
tier() { case "$TIERS" in *" $1 "*) return 0 ;; esac; return 1; }
LOGS=$BUILD/test-logs
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log.rc "$LOGS"/tier-*

# Unit test binaries run one per core at a time (each alone in its process,
# its log and exit status in files), then are counted in name order.
ujobs=${KM_TEST_UNIT_JOBS:-$(nproc 2>/dev/null || echo 1)}
run_units() { # dir log-prefix [command...]: each dir/test_* (under command) into
    # test-logs/PREFIXname.log, its exit status into test-logs/PREFIXname.log.rc
    d=$1; pre=$2; shift 2
    for t in "$d"/test_*; do [ -f "$t" ] && [ -x "$t" ] && echo "$t"; done |
        xargs -r -P "$ujobs" -n 1 sh -c \
            'for t; do :; done; log="$0$(basename "$t").log"
             "$@" >"$log" 2>&1; echo $? >"$log.rc"' "$LOGS/$pre" "$@"
}

# Each background tier prints to test-logs/tier-NAME.out and ends by writing
# "PASSED FAILED" to test-logs/tier-NAME.counts; a tier selected whose
# counts file is missing at the end (it was killed, or the shell failed)
# counts as one failure.
counts() { echo "$2 $3" >"$LOGS/tier-$1.counts"; }

tier_unit() {
    p=0; f=0
    run_units "$BUILD/tests" "" valgrind --quiet --leak-check=full \
        --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
        --error-exitcode=99
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        log="$LOGS/$name.log"
        if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ]; then
            n=$(grep -c '^\[       OK \]' "$log")
            p=$((p + n))
            echo "unit  $name: $n passed"
        else
            n_ok=$(grep -c '^\[       OK \]' "$log")
            n_bad=$(grep -c '^\[  FAILED  \]' "$log")
            [ "$n_bad" -eq 0 ] && n_bad=1   # crash, leak or valgrind error
            p=$((p + n_ok)); f=$((f + n_bad))
            echo "unit  $name: FAILED (log: $log)"; tail -n 40 "$log"
        fi
    done
    counts unit $p $f
}

# The tree must also build warning-free with clang, not only gcc.
tier_clang() {
    if ! command -v clang >/dev/null; then
        echo "build clang: clang is not installed (not run)"; counts clang 0 0; return
    fi
    if nice make --no-print-directory -j2 CC=clang BUILD="$BUILD/clang" all \
        >"$LOGS/clang-build.log" 2>&1; then
        echo "build clang -Wall -Wextra -Werror: ok"; counts clang 1 0
    else
        echo "build clang: FAILED (log: $LOGS/clang-build.log)"
        tail -n 20 "$LOGS/clang-build.log"; counts clang 0 1
    fi
}

# Style and static checks: clang-format and cppcheck (make lint).
tier_lint() {
    if ! command -v cppcheck >/dev/null || ! command -v clang-format >/dev/null; then
        echo "lint: cppcheck or clang-format is not installed (not run)"; counts lint 0 0; return
    fi
    if nice make --no-print-directory lint >"$LOGS/lint.log" 2>&1; then
        echo "lint clang-format + cppcheck: ok"; counts lint 1 0
    else
        echo "lint: FAILED (log: $LOGS/lint.log)"
        grep -E 'error|warning|portability' "$LOGS/lint.log" | tail -n 20; counts lint 0 1
    fi
}

# Memory errors and undefined behaviour: the unit tests again, built with
# clang's AddressSanitizer (LeakSanitizer included) and UBSan; any report fails.
# (The same build's daemon and kernels run the sanitized e2e tier below.)
# 0 when the build is made.
asan_build() {
    san="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    if nice make --no-print-directory -j2 CC=clang BUILD="$BUILD/asan" CFLAGS="$san" all unit-bins \
        >"$LOGS/asan-build.log" 2>&1; then
        return 0
    fi
    echo "build asan/ubsan: FAILED (log: $LOGS/asan-build.log)"
    tail -n 20 "$LOGS/asan-build.log"
    return 1
}
tier_asan() { # built: 0 when asan_build made the build
    if [ "$1" != 0 ]; then counts asan 0 1; return; fi
    p=0; f=0
    run_units "$BUILD/asan/tests" asan- env ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    for t in "$BUILD"/asan/tests/test_*; do
        [ -x "$t" ] || continue
        name=asan-$(basename "$t")
        log="$LOGS/$name.log"
        if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ] && ! grep -q 'runtime error:' "$log"; then
            n=$(grep -c '^\[       OK \]' "$log")
            p=$((p + n)); echo "unit  $name: $n passed"
        else
            f=$((f + 1)); echo "unit  $name: FAILED (log: $LOGS/$name.log)"
            tail -n 40 "$log"
        fi
    done
    counts asan $p $f
}

xml="$LOGS/pytest.xml"
xml_serial="$LOGS/pytest-serial.xml"
xml_san="$LOGS/pytest-asan.xml"
rm -f "$xml" "$xml_serial" "$xml_san"
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
# pytest-xdist: one worker per core plus two, at most 4 by default (the
# tests mostly wait on kernels; KM_TEST_JOBS=1 runs them serially). Tests
# that share a module- or class-scoped fixture stay on one worker
# (conftest.py).
jobs=${KM_TEST_JOBS:-$(( $(nproc 2>/dev/null || echo 1) + 2 ))}
[ "$jobs" -gt 4 ] && [ -z "${KM_TEST_JOBS:-}" ] && jobs=4
xdist=0
"$PYTHON" -c 'import xdist' 2>/dev/null && xdist=1
par=""
if [ "$jobs" -gt 1 ] && [ "$xdist" = 1 ]; then
    par="-n $jobs --dist loadgroup"
elif [ "$jobs" -gt 1 ]; then
    echo "e2e: pytest-xdist is missing (make deps installs python3-pytest-xdist): one process"
fi
# The sanitized workload runs beside the parallel pass: two workers
# (KM_TEST_SAN_JOBS) keep it off the pass's back; alone, it gets the pass's.
san_jobs=${KM_TEST_SAN_JOBS:-2}
tier e2e && [ "${KM_TEST_OVERLAP:-1}" != 0 ] || san_jobs=$jobs
san_par=""
[ "$san_jobs" -gt 1 ] && [ "$xdist" = 1 ] && san_par="-n $san_jobs --dist loadgroup"

# The daemon, the gateway and the kernel servers built with ASan, LSan and
# UBSan ($BUILD/asan, made above) under a representative workload: the CLI,
# MCP, the gateway's REST and WebSocket APIs, streaming, serve --stop, the
# debug protocol's relay, routing by session behind nginx. Every
# process writes its reports to a file in san_dir (mode 1777: kernels of the
# tests as nobody too); any report fails. The workers are Python and Bash.
SAN_TESTS="tests/e2e/test_mgr_cli.py tests/e2e/test_mcp.py tests/e2e/test_gateway.py
  tests/e2e/test_entry_stream.py tests/e2e/test_debugger.py tests/e2e/test_many_machines.py"
san_dir=""
if tier sanitized && command -v clang >/dev/null; then
    san_dir=$(mktemp -d /tmp/km-san-XXXXXX) && chmod 1777 "$san_dir"
fi
tier_sanitized() { # built: 0 when asan_build made the build
    if [ "$1" != 0 ] || [ ! -x "$BUILD/asan/kernelmgr" ]; then
        # a failed build is one failure, counted by the asan tier when it runs
        echo "e2e: no sanitizer build: the sanitized tier did not run"
        if tier asan; then counts sanitized 0 0; else counts sanitized 0 1; fi
        return
    fi
    echo "e2e: the sanitizer build ($BUILD/asan) under $SAN_TESTS (${san_par:-serially})" |
        tr '\n' ' '; echo
    # shellcheck disable=SC2086
    BUILD="$BUILD/asan" ASAN_OPTIONS="log_path=$san_dir/asan:detect_leaks=1" \
        UBSAN_OPTIONS="log_path=$san_dir/ubsan:print_stacktrace=1:halt_on_error=1" \
        "$PYTHON" -m pytest -q -p no:cacheprovider $san_par --junitxml="$xml_san" \
        ${PYTEST_ARGS:-} $SAN_TESTS
    rc=$?
    [ "$rc" -eq 5 ] && rc=0   # nothing selected (PYTEST_ARGS chose none)
    echo "$rc" >"$LOGS/tier-sanitized.rc"
    counts sanitized 0 0   # its tests are counted from its report with the e2e ones
}

# Every tier but e2e, one after another (the sanitized workload beside the
# others as soon as its build is made), each into its tier-NAME.out.
background_tiers() {
    built=1
    if tier asan || [ -n "$san_dir" ]; then
        if tier asan && ! command -v clang >/dev/null; then
            echo "unit  asan: clang is not installed (not run)" >"$LOGS/tier-asan.out"
            counts asan 0 0
        else
            asan_build >"$LOGS/tier-asan-build.out" 2>&1; built=$?
        fi
    fi
    san_pid=""
    if [ -n "$san_dir" ] && [ "${KM_TEST_OVERLAP:-1}" != 0 ]; then
        tier_sanitized $built >"$LOGS/tier-sanitized.out" 2>&1 &
        san_pid=$!
    fi
    tier asan && command -v clang >/dev/null && tier_asan $built >"$LOGS/tier-asan.out" 2>&1
    tier unit && tier_unit >"$LOGS/tier-unit.out" 2>&1
    tier clang && tier_clang >"$LOGS/tier-clang.out" 2>&1
    tier lint && tier_lint >"$LOGS/tier-lint.out" 2>&1
    [ -n "$san_pid" ] && wait "$san_pid"
    # KM_TEST_OVERLAP=0: one tier at a time, nothing beside another
    if [ -n "$san_dir" ] && [ "${KM_TEST_OVERLAP:-1}" = 0 ]; then
        tier_sanitized $built >"$LOGS/tier-sanitized.out" 2>&1
    fi
}
# Their output, in tier order, and their counts into unit_pass/unit_fail.
unit_pass=0; unit_fail=0
report_tiers() {
    for t in unit clang lint asan-build asan; do
        [ -f "$LOGS/tier-$t.out" ] && cat "$LOGS/tier-$t.out"
    done
    for t in unit clang lint asan; do
        tier $t || continue
        if [ -f "$LOGS/tier-$t.counts" ]; then
            read -r p f <"$LOGS/tier-$t.counts"
            unit_pass=$((unit_pass + p)); unit_fail=$((unit_fail + f))
        else
            unit_fail=$((unit_fail + 1)); echo "tier $t: FAILED (it reported no result)"
        fi
    done
}

py_rc=0; py_rc2=0; py_rc3=0
if [ "${KM_TEST_OVERLAP:-1}" != 0 ] && tier e2e; then
    background_tiers </dev/null &
    bg_pid=$!
    echo "tests: the unit, clang, lint, asan and sanitized tiers run in the background" \
         "(their output follows the parallel e2e pass)"
else
    background_tiers </dev/null
    bg_pid=""
fi
if tier e2e; then
    echo "e2e: parallel pass (${par:-serially}), then the tests marked serial"
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest -q -p no:cacheprovider $par -m "not serial" --junitxml="$xml" \
        ${PYTEST_ARGS:-} tests/e2e
    py_rc=$?
fi
[ -n "$bg_pid" ] && wait "$bg_pid"
report_tiers
if tier e2e; then
    # the tests marked serial (they measure CPU shares or timing, or load
    # every core): alone, after everything above has ended
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest -q -p no:cacheprovider -m serial --junitxml="$xml_serial" \
        ${PYTEST_ARGS:-} tests/e2e
    py_rc2=$?
fi
if [ -n "$san_dir" ]; then
    [ -f "$LOGS/tier-sanitized.out" ] && cat "$LOGS/tier-sanitized.out"
    if [ -f "$LOGS/tier-sanitized.rc" ]; then
        py_rc3=$(cat "$LOGS/tier-sanitized.rc")
    elif [ -f "$LOGS/tier-sanitized.counts" ]; then
        read -r _ f <"$LOGS/tier-sanitized.counts"; unit_fail=$((unit_fail + f))
    else
        unit_fail=$((unit_fail + 1)); echo "tier sanitized: FAILED (it reported no result)"
    fi
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
        mkdir -p "$LOGS/sanitizer"
        cp "$san_dir"/* "$LOGS/sanitizer/"
        echo "SANITIZER REPORTS from the daemon, gateway or kernels (in $LOGS/sanitizer/):"
        for f in "$san_dir"/*; do echo "== $f"; head -n 40 "$f"; done
    fi
    rm -rf "$san_dir"
fi
set -- $("$PYTHON" - "$(tier e2e && echo 1)" "$([ -f "$LOGS/tier-sanitized.rc" ] && echo 1)" "$xml" "$xml_serial" "$xml_san" <<'PY'
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
