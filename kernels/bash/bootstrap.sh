# bootstrap.sh — the kernelmgr Bash worker (see kernels/WORKER_PROTOCOL.md).
#
# Started by kernel-bash as
#   bash --noprofile --norc -i bootstrap.sh
# i.e. an *interactive* shell reading this file, with fd 2 on /dev/null for its
# startup chatter (job control) and the real stderr on fd 5 (the server's
# quiet_start, backend.h). Interactive, because only then does
# an expansion error (`${x:?}`, `set -u`) abort the cell instead of the shell.
#
# fds: 0 an empty pipe (end-of-file), 1/2 stdout/stderr pipes, 3 requests
# (NUL-separated fields), 4 events (one JSON object per line).
#
# Everything the driver defines starts with __km_, except the user-facing
# functions `read` (routes the kernel's stdin to the client) and `display`.

exec 2>&5 5>&-
builtin set +o history +m +H
unset HISTFILE MAILCHECK PROMPT_COMMAND TMOUT
PS1='' PS2='' PS4='+ '
builtin shopt -s extdebug
BASH_ARGV0=bash
# The pipes move to high fds so that user scripts can use fds 3 and 4.
exec {__km_req}<&3 {__km_evt}>&4 {__km_stdin}<&0 3<&- 4>&- {__km_null}>/dev/null
unset KERNELMGR_REQ_FD KERNELMGR_EVT_FD
__km_pid=$BASHPID
__km_bash=$BASH
__km_cell=${BASH_SOURCE[0]%/*}/cell.sh
__km_ws=$PWD # the workspace: a snapshot's cwd is saved relative to it
declare -r __km_req __km_evt __km_stdin __km_null __km_pid __km_bash __km_cell __km_ws
__km_code='' __km_silent=0 __km_store=1 __km_stdin_ok=0 __km_count=0 __km_t='' __km_rc=0
__km_intr='' __km_sigint='' __km_waiting='' __km_owed=0 __km_errexit='' __km_flags='' __km_phase=idle __km_opt_e='' __km_opt_u='' __km_opt_x='' __km_opt_v='' __km_opt_ncm=''

# ------------------------------------------------------------------ events

# Control characters other than \t \n \r, and their JSON escapes.
__km_ctl_chars=() __km_ctl_esc=()
for __km_i in {1..31} 127; do
    case $__km_i in 9 | 10 | 13) continue ;; esac
    builtin printf -v __km_h '%02x' "$__km_i"
    builtin printf -v "__km_ctl_chars[__km_i]" "\\x$__km_h"
    __km_ctl_esc[__km_i]="\\u00$__km_h"
done
unset __km_i __km_h

# __km_json STRING: REPLY becomes STRING as a JSON string literal. Quoted
# patterns and replacements, so no shopt (patsub_replacement, extglob) of the
# user changes the result.
__km_json() {
    local __km_s=$1 __km_k __km_b='\' __km_q='"'
    __km_s=${__km_s//"$__km_b"/"$__km_b$__km_b"}
    __km_s=${__km_s//"$__km_q"/"$__km_b$__km_q"}
    __km_s=${__km_s//$'\n'/"${__km_b}n"}
    __km_s=${__km_s//$'\t'/"${__km_b}t"}
    __km_s=${__km_s//$'\r'/"${__km_b}r"}
    if [[ $__km_s == *[[:cntrl:]]* ]]; then
        for __km_k in "${!__km_ctl_chars[@]}"; do
            __km_s=${__km_s//"${__km_ctl_chars[__km_k]}"/"${__km_ctl_esc[__km_k]}"}
        done
    fi
    REPLY="\"$__km_s\""
}

# After an event with "sync":true the kernel answers "sync" once it has
# published everything written before the event: output that follows cannot
# overtake the event.
__km_wait_sync() {
    local __km_w __km_waiting=1
    while IFS= builtin read -r -d '' -u "$__km_req" __km_w; do
        case $__km_w in
        sync) return 0 ;;
        input_reply) IFS= builtin read -r -d '' -u "$__km_req" __km_w ;;
        interrupt) # announced interrupt: the cell ends after this display
            IFS= builtin read -r -d '' -u "$__km_req" __km_w
            ((__km_owed += 1))
            if [[ $__km_phase == cell ]]; then
                __km_intr=1
                __km_unwind
            fi
            ;;
        esac
    done
    return 1
}

__km_emit() {
    builtin printf '%s\n' "$1" >&"$__km_evt"
}

__km_log() {
    local REPLY
    __km_json "$1"
    __km_emit "{\"type\":\"log\",\"message\":$REPLY}"
}

__km_error() { # ename evalue traceback-line
    local REPLY __km_n __km_v
    __km_json "$1"
    __km_n=$REPLY
    __km_json "$2"
    __km_v=$REPLY
    __km_json "$3"
    __km_emit "{\"type\":\"error\",\"ename\":$__km_n,\"evalue\":$__km_v,\"traceback\":[$REPLY]}"
}

# ------------------------------------------------------------------ interrupts

# An interrupt (SIGINT) or an errexit failure unwinds the rest of the cell:
# with extdebug, a DEBUG trap returning 2 skips the next command and returns
# from the current function or sourced file, level by level, until the cell's
# file (cell.sh) is left. The DEBUG trap is only installed while unwinding,
# so normal code runs at full speed.
__km_skipcell() {
    local __km_s
    for __km_s in "${BASH_SOURCE[@]}"; do
        [[ $__km_s != "$__km_cell" ]] || return 2
    done
    return 0
}
__km_unwind() {
    builtin trap '__km_skipcell' DEBUG
}
# A SIGINT counts only while a cell runs. Before each SIGINT the kernel writes
# an `interrupt` request (with a generation number) to the request pipe. A
# signal whose announcement was already taken - by an input or sync wait, or
# between cells (__km_owed counts those) - is a late one (the sandbox's init
# forwards signals asynchronously; the kernel re-sends once at half the grace
# period) and must not end the next cell. One never announced (`kill -INT $$`
# in a cell) is a real interrupt. Between cells every SIGINT is ignored, and
# it never disturbs the reading of a request.
#
# The trap itself must not read: it can run *inside* a `read` builtin (an
# interactive bash runs traps while read waits and then goes on reading), and
# a nested `read` - even `read -t 0` - resets the outer one's delimiter, so the
# outer read would swallow the NUL-separated requests that follow. The INT
# trap only arms a DEBUG trap; that runs before the next command, outside any
# builtin, and looks for the announcement.
__km_onint() {
    if [[ $__km_phase != cell ]]; then
        ((__km_owed == 0)) || ((__km_owed -= 1))
        return 0
    fi
    __km_sigint=1
    [[ -n $__km_intr ]] || builtin trap '__km_check_int' DEBUG
}
# Reads the requests waiting in the pipe (only ever called outside a read
# builtin): an `interrupt` among them confirms the SIGINT. A stray
# input_reply / input_cancel / sync of an input or sync wait that an
# interrupt cut short is dropped, as in the main loop.
__km_take_interrupts() {
    local __km_w __km_n=0
    while builtin read -t 0 -u "$__km_req" && IFS= builtin read -r -d '' -u "$__km_req" __km_w; do
        case $__km_w in
        interrupt) IFS= builtin read -r -d '' -u "$__km_req" __km_w && ((__km_n += 1)) ;;
        input_reply) IFS= builtin read -r -d '' -u "$__km_req" __km_w ;;
        esac
    done
    __km_sigint=''
    if ((__km_n > 0)); then
        __km_intr=1
        ((__km_owed += __km_n - 1)) # more announcements than signals so far
    elif ((__km_owed > 0)); then
        ((__km_owed -= 1)) # the late signal of an interrupt already taken
    else
        __km_intr=1 # not announced: someone sent it directly
    fi
}
__km_check_int() {
    # Inside an input or sync wait the wait itself reads the announcement.
    [[ $__km_phase == cell && -z $__km_waiting ]] || return 0
    __km_take_interrupts
    if [[ -n $__km_intr ]]; then
        __km_unwind
        __km_skipcell
        return
    fi
    builtin trap - DEBUG
    return 0
}
# errexit (set -e) in the main shell ends the cell, not the kernel: the ERR
# trap runs before bash would exit, and turning -e off there cancels the exit.
# Subshells keep the real errexit behaviour.
__km_onerr() {
    local __km_st=$?
    # shopt -o, not a match on $-: the user may have set nocasematch, and $-
    # also holds E (errtrace).
    builtin shopt -qo errexit && [[ $BASHPID == "$__km_pid" ]] || return 0
    builtin set +e
    [[ -n $__km_errexit ]] || __km_errexit=$__km_st
    __km_unwind
}

# The user's -e -u -x -v and nocasematch live on between cells, but the
# driver runs without them. -x is switched on again inside cell.sh so the
# driver is not traced.
__km_before_cell() {
    __km_errexit='' __km_intr='' __km_sigint='' __km_waiting=''
    builtin shopt -s extdebug
    builtin trap - DEBUG
    builtin trap '__km_onerr' ERR
    [[ -z $__km_opt_ncm ]] || builtin shopt -s nocasematch
    [[ -z $__km_opt_v ]] || builtin set -v
    [[ -z $__km_opt_u ]] || builtin set -u
    [[ -z $__km_opt_e ]] || builtin set -e
}
__km_after_cell() {
    builtin set +euxv
    # A SIGINT during the cell's last command has not been checked yet.
    [[ -z $__km_sigint || -n $__km_intr ]] || __km_take_interrupts
    __km_opt_ncm=''
    if builtin shopt -q nocasematch; then
        __km_opt_ncm=1
        builtin shopt -u nocasematch
    fi
    builtin trap - DEBUG
    builtin trap '__km_onint' INT
    __km_opt_e='' __km_opt_u='' __km_opt_x='' __km_opt_v=''
    if [[ $__km_flags == *e* || -n $__km_errexit ]]; then __km_opt_e=1; fi
    if [[ $__km_flags == *u* ]]; then __km_opt_u=1; fi
    if [[ $__km_flags == *x* ]]; then __km_opt_x=1; fi
    if [[ $__km_flags == *v* ]]; then __km_opt_v=1; fi
    if [[ -n $__km_errexit ]]; then __km_rc=$__km_errexit; fi
    if [[ -n $__km_intr ]]; then
        __km_error KeyboardInterrupt "interrupted" "Interrupted (SIGINT): the rest of the cell was skipped; the shell and its state are kept."
        __km_emit "{\"type\":\"done\",\"status\":\"error\",\"exit_code\":130}"
    elif [[ $__km_rc != 0 ]]; then
        __km_error ExitStatus "$__km_rc" "exit status $__km_rc"
        __km_emit "{\"type\":\"done\",\"status\":\"error\",\"exit_code\":$__km_rc}"
    else
        __km_emit '{"type":"done","status":"ok","exit_code":0}'
    fi
}

# ------------------------------------------------------------------ stdin

# `read` from the kernel's own stdin asks the client (input_request) when the
# request allows stdin, else sees end-of-file. Redirected or piped input and
# `read -u FD` are the real builtin, untouched.
read() {
    local __km_o __km_prompt='' __km_pw=false __km_u='' __km_args=() __km_uopt=() __km_t __km_v OPTIND=1 OPTARG
    while getopts ':ersa:d:i:n:N:p:t:u:' __km_o; do
        case $__km_o in
        p) __km_prompt=$OPTARG ;;
        s) __km_pw=true ;;
        u) __km_u=$OPTARG __km_uopt=(-u "$OPTARG") ;;
        e | i) ;; # readline options need a terminal
        t) __km_args+=(-t "$OPTARG") ;;
        r) __km_args+=(-r) ;;
        a | d | n | N) __km_args+=("-$__km_o" "$OPTARG") ;;
        *) builtin read "$@"; return ;;
        esac
    done
    shift $((OPTIND - 1))
    if [[ ( -n $__km_u && $__km_u != 0 ) || ! /dev/stdin -ef /dev/fd/$__km_stdin ]]; then
        builtin read "${__km_args[@]}" "${__km_uopt[@]}" "$@"
        return
    fi
    if [[ $__km_stdin_ok != 1 ]]; then
        builtin read "${__km_args[@]}" "$@"
        return
    fi
    local REPLY
    __km_json "$__km_prompt"
    __km_emit "{\"type\":\"input_request\",\"prompt\":$REPLY,\"password\":$__km_pw}"
    unset REPLY
    # The answer, or an interrupt: the kernel announces every interrupt on
    # this pipe (and cancels the input), so the wait ends on what it reads,
    # whenever the SIGINT itself arrives.
    local __km_waiting=1
    while :; do
        IFS= builtin read -r -d '' -u "$__km_req" __km_t || return 1
        case $__km_t in
        input_reply)
            IFS= builtin read -r -d '' -u "$__km_req" __km_v || return 1
            __km_waiting=''
            builtin read "${__km_args[@]}" "$@" <<<"$__km_v"
            return
            ;;
        sync) ;;
        *) # interrupt (its generation follows) or input_cancel
            if [[ $__km_t == interrupt ]]; then
                IFS= builtin read -r -d '' -u "$__km_req" __km_v
                ((__km_owed += 1))
            fi
            __km_waiting=''
            builtin read "${__km_args[@]}" "$@" </dev/null
            __km_intr=1
            __km_unwind
            return 130
            ;;
        esac
    done
}

# ------------------------------------------------------------------ display

# display FILE [MIME-TYPE]: shows a PNG, JPEG, GIF, SVG, HTML, Markdown or text
# file as rich output (display_data).
display() {
    local __km_f=${1-} __km_m=${2-} __km_lc REPLY __km_dec='[]'
    if [[ -z $__km_f ]]; then
        builtin printf 'usage: display FILE [MIME-TYPE]\n' >&2
        return 2
    fi
    if [[ ! -f $__km_f || ! -r $__km_f ]]; then
        builtin printf 'display: %s: not a readable file\n' "$__km_f" >&2
        return 1
    fi
    if [[ -z $__km_m ]]; then
        __km_lc=${__km_f,,}
        case $__km_lc in
        *.png) __km_m=image/png ;;
        *.jpg | *.jpeg) __km_m=image/jpeg ;;
        *.gif) __km_m=image/gif ;;
        *.svg) __km_m=image/svg+xml ;;
        *.html | *.htm) __km_m=text/html ;;
        *.md) __km_m=text/markdown ;;
        *.txt | *.log) __km_m=text/plain ;;
        *)
            builtin printf 'display: %s: unknown type, give a MIME type (e.g. image/png)\n' "$__km_f" >&2
            return 2
            ;;
        esac
    fi
    if ! builtin type -P base64 >/dev/null; then
        builtin printf 'display: the base64 program is missing\n' >&2
        return 1
    fi
    __km_json "$__km_m"
    local __km_mj=$REPLY
    case $__km_m in
    image/png | image/jpeg | image/gif) ;;
    *) __km_dec="[$__km_mj]" ;; # text types: the kernel decodes them
    esac
    __km_json "${__km_f##*/}"
    local __km_name=$REPLY
    [[ $__km_m != text/plain ]] || __km_name='""'
    # Only the shell itself waits for the kernel's "sync": a subshell or a
    # background job reading the request pipe could steal the next request.
    local __km_sync=false
    [[ $BASHPID != "$__km_pid" ]] || __km_sync=true
    {
        builtin printf '{"type":"display_data","sync":%s,"decode_base64":%s,"metadata":{},"data":{%s:"' "$__km_sync" "$__km_dec" "$__km_mj"
        command base64 -w0 -- "$__km_f"
        if [[ $__km_m == text/plain ]]; then
            builtin printf '"}}\n'
        else
            builtin printf '","text/plain":%s}}\n' "$__km_name"
        fi
    } >&"$__km_evt"
    [[ $__km_sync == false ]] || __km_wait_sync
}

# ------------------------------------------------------------------ introspection

__km_list_json() { # newline-separated items in $1 -> REPLY = JSON array
    local __km_items=() __km_x __km_out='' __km_n=0
    [[ -z $1 ]] || builtin mapfile -t __km_items <<<"$1"
    for __km_x in "${__km_items[@]}"; do
        [[ -n $__km_x && $__km_x != __km_* && $__km_x != '$__km_'* && $__km_x != '${__km_'* ]] || continue
        ((++__km_n <= 1000)) || break
        __km_json "$__km_x"
        __km_out+=${__km_out:+,}$REPLY
    done
    REPLY="[$__km_out]"
}

__km_complete() { # code cursor
    local __km_c=$1 __km_before __km_i __km_ch __km_tok __km_pre __km_out='' __km_start REPLY
    __km_before=${__km_c:0:$2}
    __km_before=${__km_before##*$'\n'}
    local __km_line_start=$(($2 - ${#__km_before}))
    __km_i=${#__km_before}
    while ((__km_i > 0)); do
        __km_ch=${__km_before:__km_i-1:1}
        case $__km_ch in
        [[:space:]] | ';' | '|' | '&' | '(' | ')' | '<' | '>' | '"' | "'" | '=' | '`') break ;;
        esac
        ((__km_i--))
    done
    __km_tok=${__km_before:__km_i}
    __km_start=$((__km_line_start + __km_i))
    __km_pre=${__km_before:0:__km_i}
    __km_pre=${__km_pre%"${__km_pre##*[![:space:]]}"}
    if [[ $__km_tok == '${'* ]]; then
        __km_out=$(builtin compgen -v -- "${__km_tok:2}" 2>/dev/null | LC_ALL=C command sort -u)
        __km_out=$(builtin printf '%s\n' "$__km_out" | command sed -e '/^$/d' -e 's/^/${/' -e 's/$/}/')
    elif [[ $__km_tok == '$'* ]]; then
        __km_out=$(builtin compgen -v -- "${__km_tok:1}" 2>/dev/null | LC_ALL=C command sort -u)
        __km_out=$(builtin printf '%s\n' "$__km_out" | command sed -e '/^$/d' -e 's/^/$/')
    elif [[ $__km_tok != */* && ( -z $__km_pre || $__km_pre == *[\;\|\&\(\`] || $__km_pre =~ (^|[[:space:]])(then|do|else|elif|if|while|until|time|!|sudo|xargs|exec|command|builtin)$ ) ]]; then
        __km_out=$( { builtin compgen -c -- "$__km_tok"; builtin compgen -d -S / -- "$__km_tok"; } 2>/dev/null | LC_ALL=C command sort -u)
    else
        __km_out=$( { builtin compgen -f -- "$__km_tok" | while IFS= builtin read -r __km_x; do
            if [[ -d $__km_x ]]; then builtin printf '%s/\n' "$__km_x"; else builtin printf '%s\n' "$__km_x"; fi
        done; } 2>/dev/null | LC_ALL=C command sort -u)
    fi
    __km_list_json "$__km_out"
    __km_emit "{\"type\":\"complete_reply\",\"matches\":$REPLY,\"cursor_start\":$__km_start,\"cursor_end\":$2,\"metadata\":{}}"
}

__km_is_complete() { # code
    local __km_c=$1 __km_out __km_st REPLY
    if [[ $__km_c == *\\ ]]; then
        __km_emit '{"type":"is_complete_reply","status":"incomplete","indent":""}'
        return
    fi
    __km_out=$("$__km_bash" --norc --noprofile -n -c "$__km_c" 2>&1 >/dev/null)
    __km_st=$?
    if ((__km_st == 0)); then
        if [[ $__km_out == *here-document*delimited\ by\ end-of-file* ]]; then
            __km_st=incomplete
        else
            __km_st=complete
        fi
    elif [[ $__km_out == *'unexpected end of file'* || $__km_out == *'unexpected EOF'* ]]; then
        __km_st=incomplete
    else
        __km_st=invalid
    fi
    __km_emit "{\"type\":\"is_complete_reply\",\"status\":\"$__km_st\",\"indent\":\"\"}"
}

__km_inspect() { # code cursor detail
    local __km_c=$1 __km_p=$2 __km_l __km_r __km_w __km_text='' __km_found=false REPLY
    __km_l=${__km_c:0:__km_p}
    __km_r=${__km_c:__km_p}
    local __km_lc='[^A-Za-z0-9_.:+/@%$-]' __km_rx='[^A-Za-z0-9_.:+/@%-]'
    __km_l=${__km_l##*$__km_lc}
    __km_r=${__km_r%%$__km_rx*}
    __km_w=$__km_l$__km_r
    __km_w=${__km_w#'${'}
    if [[ $__km_w == '$'* ]]; then
        __km_w=${__km_w#'$'}
        [[ -z $__km_w ]] || __km_text=$(builtin declare -p -- "$__km_w" 2>/dev/null)
    elif [[ -n $__km_w ]]; then
        __km_text=$(builtin type -a -- "$__km_w" 2>/dev/null)
        if [[ $(builtin type -t -- "$__km_w" 2>/dev/null) == builtin || $(builtin type -t -- "$__km_w" 2>/dev/null) == keyword ]]; then
            __km_text+=$'\n\n'$(builtin help -- "$__km_w" 2>/dev/null)
        fi
    fi
    [[ -z $__km_text ]] || __km_found=true
    __km_json "$__km_text"
    if [[ $__km_found == true ]]; then
        __km_emit "{\"type\":\"inspect_reply\",\"found\":true,\"data\":{\"text/plain\":$REPLY},\"metadata\":{}}"
    else
        __km_emit '{"type":"inspect_reply","found":false,"data":{},"metadata":{}}'
    fi
}

__km_field() {
    IFS= builtin read -r -d '' -u "$__km_req" "$1"
}

# ------------------------------------------------------------------ snapshots

# The worker protocol's `snapshot` request (WORKER_PROTOCOL.md, "Snapshots"):
# save writes DIR/state.sh, a script that, sourced at top level, recreates
# the user's variables and arrays (declare -p: attributes, exports and
# readonly included), functions, aliases, shopt and set -o, and the cwd.
# Everything the driver owns (__km_*, read, display) and bash's own special
# variables are left out. Background jobs cannot be saved: they are listed.
__km_snap_special=' BASH BASHOPTS BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND BASH_EXECUTION_STRING BASH_LINENO BASH_LOADABLES_PATH BASH_REMATCH BASH_SOURCE BASH_SUBSHELL BASH_VERSINFO BASH_VERSION BASH_COMPAT COLUMNS COMP_CWORD COMP_KEY COMP_LINE COMP_POINT COMP_TYPE COMP_WORDBREAKS COMP_WORDS COPROC DIRSTACK EPOCHREALTIME EPOCHSECONDS EUID FUNCNAME GROUPS HISTCMD HOSTNAME HOSTTYPE LINENO LINES MACHTYPE OLDPWD OPTARG OPTERR OPTIND OSTYPE PIPESTATUS PPID PS1 PS2 PS4 PWD RANDOM READLINE_LINE READLINE_POINT REPLY SECONDS SHELLOPTS SHLVL SRANDOM UID _ IFS '
# What this start was given (PATH and NODE_PATH naming the session's package
# directories, HOME, ...), recorded before the first cell (__km_snap_base):
# a snapshot keeps of it only what a cell changed or unset, so that a restore
# elsewhere (a move, another layout) keeps what that start was given.
declare -A __km_base_v=() __km_base_a=()
__km_snap_base() {
    local __km_n
    # every variable's name without a subshell (compgen -v would fork one)
    for __km_n in ${!A*} ${!B*} ${!C*} ${!D*} ${!E*} ${!F*} ${!G*} ${!H*} ${!I*} ${!J*} ${!K*} ${!L*} ${!M*} ${!N*} ${!O*} ${!P*} ${!Q*} ${!R*} ${!S*} ${!T*} ${!U*} ${!V*} ${!W*} ${!X*} ${!Y*} ${!Z*} ${!a*} ${!b*} ${!c*} ${!d*} ${!e*} ${!f*} ${!g*} ${!h*} ${!i*} ${!j*} ${!k*} ${!l*} ${!m*} ${!n*} ${!o*} ${!p*} ${!q*} ${!r*} ${!s*} ${!t*} ${!u*} ${!v*} ${!w*} ${!x*} ${!y*} ${!z*} ${!_*}; do
        [[ $__km_n == __km_* || $__km_snap_special == *" $__km_n "* ]] && continue
        __km_base_a[$__km_n]=${!__km_n@a}
        [[ ${!__km_n@a} == *[aA]* ]] || __km_base_v[$__km_n]=${!__km_n}
    done
}
__km_snap_save() { # dir max_bytes
    local __km_d=$1 __km_max=$2 __km_n __km_s __km_names=() __km_fns=() __km_lost='' __km_j LC_ALL=C REPLY
    for __km_n in $(builtin compgen -v); do
        [[ $__km_n == __km_* || $__km_snap_special == *" $__km_n "* ]] && continue
        if [[ -v __km_base_a[$__km_n] && ${!__km_n@a} == "${__km_base_a[$__km_n]}" &&
            ${!__km_n@a} != *[aA]* && ${!__km_n} == "${__km_base_v[$__km_n]}" ]]; then
            continue # as the start gave it
        fi
        __km_names+=("$__km_n")
    done
    for __km_n in $(builtin compgen -A function); do
        [[ $__km_n == __km_* || $__km_n == read || $__km_n == display ]] || __km_fns+=("$__km_n")
    done
    __km_s="# kernelmgr bash snapshot 1"$'\n'
    for __km_n in "${!__km_base_a[@]}"; do # given by the start, unset by a cell
        builtin declare -p "$__km_n" >&"$__km_null" 2>&1 || __km_s+="builtin unset -v $__km_n"$'\n'
    done
    ((${#__km_names[@]} == 0)) || __km_s+="$(builtin declare -p "${__km_names[@]}" 2>/dev/null)"$'\n'
    ((${#__km_fns[@]} == 0)) || __km_s+="$(builtin declare -f "${__km_fns[@]}")"$'\n'
    __km_s+="$(builtin alias -p)"$'\n'
    local __km_line
    while IFS= builtin read -r __km_line; do
        case ${__km_line##* } in
        extdebug | nocasematch | expand_aliases | history | monitor | histexpand | errexit | nounset | xtrace | verbose | emacs | vi) ;;
        *) __km_s+="$__km_line"$'\n' ;;
        esac
    done < <(builtin shopt -p; builtin set +o)
    builtin printf -v __km_j '__km_opt_e=%q __km_opt_u=%q __km_opt_x=%q __km_opt_v=%q __km_opt_ncm=%q __km_count=%q' \
        "$__km_opt_e" "$__km_opt_u" "$__km_opt_x" "$__km_opt_v" "$__km_opt_ncm" "$__km_count"
    __km_s+="$__km_j"$'\n'
    # below the workspace: relative to it, so that a fork or an imported
    # session (another workspace path) comes back to the same directory
    if [[ $PWD == "$__km_ws" ]]; then
        __km_j='builtin cd -- "$__km_ws"'
    elif [[ $PWD == "$__km_ws"/* ]]; then
        builtin printf -v __km_j 'builtin cd -- "$__km_ws"/%q' "${PWD#"$__km_ws"/}"
    else
        builtin printf -v __km_j 'builtin cd -- %q' "$PWD"
    fi
    __km_s+="$__km_j"$'\n'
    local __km_jobs
    __km_jobs=$(builtin jobs -l 2>/dev/null)
    if [[ -n $__km_jobs ]]; then
        while IFS= builtin read -r __km_line; do
            [[ -n $__km_line ]] || continue
            __km_json "$__km_line"
            __km_lost+="${__km_lost:+,}{\"name\":$REPLY,\"type\":\"background job\",\"reason\":\"a running process cannot be saved\"}"
        done <<<"$__km_jobs"
    fi
    if [[ $__km_max != 0 ]] && ((${#__km_s} > __km_max)); then
        __km_emit "{\"type\":\"snapshot_reply\",\"status\":\"error\",\"ename\":\"SnapshotTooLarge\",\"evalue\":\"the bash state is larger than snapshot_max=$__km_max bytes (${#__km_s} bytes)\",\"lost\":[$__km_lost]}"
        return
    fi
    if ! { builtin printf '%s' "$__km_s" >"$__km_d/state.sh"; } 2>"$__km_null"; then
        __km_emit '{"type":"snapshot_reply","status":"error","ename":"SnapshotFailed","evalue":"the bash state could not be written","lost":[]}'
        return
    fi
    __km_emit "{\"type\":\"snapshot_reply\",\"status\":\"ok\",\"bytes\":${#__km_s},\"names\":$((${#__km_names[@]} + ${#__km_fns[@]})),\"lost\":[$__km_lost],\"execution_count\":${__km_count:-0}}"
}
# After `source DIR/state.sh` (at top level, so that declares are global):
# the lines bash refused (a readonly clash, say) are the names lost.
__km_snap_loaded() { # dir status
    local __km_line __km_lost='' REPLY __km_n=0
    if [[ $2 == missing ]]; then
        __km_emit '{"type":"snapshot_reply","status":"error","ename":"SnapshotCorrupt","evalue":"the bash snapshot has no state.sh (or it is not a kernelmgr bash snapshot)","lost":[]}'
        return
    fi
    while IFS= builtin read -r __km_line && ((__km_n++ < 100)); do
        __km_json "${__km_line#"$1/state.sh: "}"
        __km_lost+="${__km_lost:+,}{\"name\":$REPLY,\"type\":\"\",\"reason\":\"not loaded\"}"
    done <"$1/load.err"
    __km_emit "{\"type\":\"snapshot_reply\",\"status\":\"ok\",\"lost\":[$__km_lost],\"execution_count\":${__km_count:-0}}"
}

# ------------------------------------------------------------------ main loop

builtin trap '__km_onint' INT
__km_snap_base
__km_emit '{"type":"ready","features":["interrupt","snapshot"]}'

# The loop is at top level (not in a function), so that the cell's
# `declare`s are global.
while :; do
    __km_phase=idle
    # A SIGINT here is ignored by the trap and does not end the read (an
    # interactive bash runs the trap and reads on). End of file: the kernel
    # is gone.
    IFS= builtin read -r -d '' -u "$__km_req" __km_t || builtin exit 0
    __km_phase=request
    case $__km_t in
    execute)
        # One builtin for the five fields: every `read` call costs its own
        # fcntl/lseek/ioctl/sigprocmask round (the bytes themselves come one
        # read(2) each from a pipe, either way).
        builtin mapfile -t -d '' -n 5 -u "$__km_req" __km_f
        ((${#__km_f[@]} == 5)) || builtin exit 0
        __km_code=${__km_f[0]} __km_silent=${__km_f[1]} __km_store=${__km_f[2]}
        __km_stdin_ok=${__km_f[3]} __km_count=${__km_f[4]}
        __km_f=()
        __km_before_cell
        __km_phase=cell
        builtin source "$__km_cell"
        { __km_rc=$? __km_flags=$- __km_phase=after; builtin set +xv; } 2>&"$__km_null"
        __km_after_cell
        ;;
    complete)
        __km_field __km_code && __km_field __km_t && __km_complete "$__km_code" "$__km_t"
        ;;
    inspect)
        __km_field __km_code && __km_field __km_t && __km_field __km_rc &&
            __km_inspect "$__km_code" "$__km_t" "$__km_rc"
        ;;
    is_complete)
        __km_field __km_code && __km_is_complete "$__km_code"
        ;;
    snapshot)
        builtin mapfile -t -d '' -n 3 -u "$__km_req" __km_f
        ((${#__km_f[@]} == 3)) || builtin exit 0
        if [[ ${__km_f[0]} == save ]]; then
            __km_snap_save "${__km_f[1]}" "${__km_f[2]}"
        elif IFS= builtin read -r __km_t <"${__km_f[1]}/state.sh" 2>"$__km_null" &&
            [[ $__km_t == "# kernelmgr bash snapshot 1" ]]; then
            builtin source "${__km_f[1]}/state.sh" 2>"${__km_f[1]}/load.err" >"$__km_null"
            __km_snap_loaded "${__km_f[1]}" ok
        else
            __km_snap_loaded "${__km_f[1]}" missing
        fi
        __km_f=()
        ;;
    input_reply) # a reply that arrived after its wait was cut short
        __km_field __km_t
        ;;
    interrupt) # announced when the cell had already ended: its SIGINT is late
        __km_field __km_t
        ((__km_owed += 1))
        ;;
    input_cancel | sync) ;;
    *)
        __km_log "unknown request '$__km_t'"
        ;;
    esac
done
