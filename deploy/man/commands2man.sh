#!/bin/sh
# commands2man.sh TEMPLATE — `kernelmgr --help` (stdin), verbatim, in place
# of the line @USAGE@ of TEMPLATE; the page on stdout.
set -eu
tmpl=$1
awk '
NR == FNR {
    s = $0
    gsub(/\\/, "\\e", s)
    if (s ~ /^[.\047]/) s = "\\&" s
    usage = usage s "\n"
    next
}
/^@USAGE@$/ {
    if (usage == "") { print "commands2man: no usage text on stdin" > "/dev/stderr"; exit 1 }
    printf ".nf\n%s.fi\n", usage
    next
}
{ print }
' - "$tmpl"
