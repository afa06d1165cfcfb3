#!/bin/sh
# layers.sh — fails when a lower layer includes a higher one (make lint).
#
#   common/           includes nothing of ours (only common/ itself)
#   protocol/         common/
#   sandbox/          nothing of ours (tests build it standalone)
#   kernels/*/        protocol/, common/ and kernels/
#   kernelmgr/        anything below, and inside it, in this order:
#     engine/         sessions, kernels, code_exec (nothing above it)
#     packages/       installs into the engine's package directories
#     service/        the daemon: methods over engine and packages
#     frontends/      CLI, MCP, gateway: clients of the service
#     main.c          the binaries' entry point
#
# Every #include "..." of a .c/.h file is resolved as the compiler does
# (the file's own directory, then -I. and -Iprotocol); one that names none
# of our files is a system or library header and is not checked. Prints one
# line per violation ("FILE:LINE: LAYER must not include TARGET") and exits 1
# when there is any. Run from anywhere: it works in the checkout it is in.
cd "$(dirname "$0")/../.." || exit 2

layer() {
    case $1 in
    common/*) echo common ;;
    protocol/*) echo protocol ;;
    sandbox/*) echo sandbox ;;
    kernels/*) echo kernels ;;
    kernelmgr/engine/*) echo engine ;;
    kernelmgr/packages/*) echo packages ;;
    kernelmgr/service/*) echo service ;;
    kernelmgr/frontends/*) echo frontends ;;
    kernelmgr/*) echo kernelmgr ;;
    *) echo other ;;
    esac
}

# allowed FROM TO: 0 when layer FROM may include layer TO
allowed() {
    case "$1:$2" in
    common:common) return 0 ;;
    protocol:common | protocol:protocol) return 0 ;;
    sandbox:sandbox) return 0 ;;
    kernels:common | kernels:protocol | kernels:kernels | kernels:sandbox) return 0 ;;
    engine:common | engine:protocol | engine:kernels | engine:sandbox | engine:engine) return 0 ;;
    packages:common | packages:protocol | packages:kernels | packages:sandbox | packages:engine | \
        packages:packages) return 0 ;;
    service:frontends | service:kernelmgr) return 1 ;;
    service:*) return 0 ;;
    frontends:kernelmgr) return 1 ;;
    frontends:*) return 0 ;;
    kernelmgr:*) return 0 ;;
    other:*) return 0 ;;
    esac
    return 1
}

bad=0
files=$(ls common/*.[ch] protocol/*.[ch] sandbox/*.[ch] kernels/*/*.[ch] kernelmgr/*.[ch] kernelmgr/*/*.[ch] 2>/dev/null)
tab=$(printf '\t')
for f in $files; do
    from=$(layer "$f")
    dir=$(dirname "$f")
    # "LINE:NAME" for each #include "NAME"
    for hit in $(grep -n "^[ $tab]*#[ $tab]*include[ $tab]*\"" "$f" |
        sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1:\2/'); do
        line=${hit%%:*}
        name=${hit#*:}
        target=
        for cand in "$dir/$name" "$name" "protocol/$name"; do
            if [ -f "$cand" ]; then
                target=$cand
                break
            fi
        done
        [ -n "$target" ] || continue
        # normalise "a/./b" and "a/x/../b"
        target=$(echo "$target" | sed -e 's#/\./#/#g' -e ':a' -e 's#[^/][^/]*/\.\./##' -e 'ta')
        to=$(layer "$target")
        if ! allowed "$from" "$to"; then
            echo "$f:$line: $from must not include $target ($to)"
            bad=1
        fi
    done
done
if [ "$bad" -ne 0 ]; then
    echo "layers: a lower layer includes a higher one (see tests/tools/layers.sh)" >&2
    exit 1
fi
echo "layers: ok"
