#!/bin/sh
# make demo: run examples/quickstart.md in a one-shot session and show the
# result, readable and as JSON. Works as root on a fresh machine: state goes
# to a temporary KERNELMGR_HOME.
set -e
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
KM="$BUILD/kernelmgr"
export KERNELMGR_HOME="${KERNELMGR_HOME:-$(mktemp -d /tmp/kernelmgr-demo.XXXXXX)}"
# Debian's python3 carries matplotlib (make deps); a pyenv shim on PATH may not
PY_OPT=""
[ -x /usr/bin/python3 ] && PY_OPT="--python /usr/bin/python3"
# the strict sandbox where the host allows it, else say so and run without
SBX=strict
if ! "$KM" doctor --json 2>/dev/null | grep -q '"strict": *{"available": *true'; then
    echo "demo: strict sandbox unavailable on this host (see: $KM doctor); using --sandbox none"
    SBX=none
fi
echo "== $KM run examples/quickstart.md   (KERNELMGR_HOME=$KERNELMGR_HOME)"
"$KM" run --sandbox "$SBX" $PY_OPT examples/quickstart.md
echo
echo "== the same, --json (one result per block; images elided)"
"$KM" run --sandbox "$SBX" $PY_OPT --json examples/quickstart.md |
    sed -E 's/"image\/png":"[^"]{40}[^"]*"/"image\/png":"<base64…>"/g' | cut -c1-400
