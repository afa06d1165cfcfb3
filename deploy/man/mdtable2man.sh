#!/bin/sh
# mdtable2man.sh TEMPLATE — the markdown table of `kernelmgr config --doc`
# (stdin) as man(7) entries, put in place of the line @OPTIONS@ of
# TEMPLATE; the page on stdout. Backticks become bold.
set -eu
tmpl=$1
awk '
function roff(s) {
    gsub(/\\/, "\\e", s)
    while (match(s, /`[^`]*`/)) {
        s = substr(s, 1, RSTART - 1) "\\fB" substr(s, RSTART + 1, RLENGTH - 2) "\\fR" \
            substr(s, RSTART + RLENGTH)
    }
    gsub(/\\\|/, "|", s)
    return s
}
NR == FNR {
    if ($0 !~ /^\|/ || $0 ~ /^\| *key *\|/ || $0 ~ /^\| *---/) next
    line = $0
    gsub(/\\\|/, "\001", line)
    n = split(line, f, "|")
    for (i = 1; i <= n; i++) { gsub(/\001/, "|", f[i]); sub(/^ +/, "", f[i]); sub(/ +$/, "", f[i]) }
    key = f[2]; gsub(/`/, "", key)
    rows = rows ".TP\n.B " roff(key) "\n" roff(f[4]) "\n.br\nDefault: " roff(f[3]) ".\n"
    count++
    next
}
/^@OPTIONS@$/ {
    if (!count) { print "mdtable2man: no table rows on stdin" > "/dev/stderr"; exit 1 }
    printf "%s", rows
    next
}
{ print }
' - "$tmpl"
