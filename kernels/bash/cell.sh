# cell.sh — sourced by bootstrap.sh to run one cell of the kernelmgr Bash
# kernel. A sourced file, not a function: `declare` stays global, `return`
# ends the cell, and an interrupt can unwind it (DEBUG trap returning 2).
# With the user's `set -x`, tracing starts inside the eval, so that only the
# cell's own commands are traced.
if [[ -z ${__km_opt_x-} ]]; then
    eval "$__km_code"
else
    eval "builtin set -x; $__km_code"
fi
