#!/bin/sh
# gen-bash.sh — bash completion for kernelmgr from `kernelmgr --help` (stdin):
# the commands are the first words of the "Commands:" section, the options
# every --word of the text (not those quoted in backticks). The script on stdout.
set -eu
help=$(cat)
commands=$(printf '%s\n' "$help" | awk '
    /^Commands:/ { on = 1; next }
    /^[^ ]/ { on = 0 }
    on && /^  [a-z]/ { sub(/^  /, ""); sub(/   +.*/, ""); n = split($0, w, / +/); print w[1]
                       for (i = 2; i <= n; i++) if (w[i - 1] == "|") print w[i] }' |
    grep -E '^[a-z][a-z-]*$' | sort -u | tr '\n' ' ')
options=$(printf '%s\n' "$help" | sed 's/`[^`]*`//g' | grep -oE -- '--[a-z][a-z-]*' | sort -u | tr '\n' ' ')
[ -n "$commands" ] && [ -n "$options" ] || { echo "gen-bash: no commands or options in the help" >&2; exit 1; }
cat <<SCRIPT
# bash completion for kernelmgr — generated from \`kernelmgr --help\` at build time.
_kernelmgr() {
    local cur prev
    cur=\${COMP_WORDS[COMP_CWORD]}
    prev=\${COMP_WORDS[COMP_CWORD-1]}
    case \$prev in
    --lang) COMPREPLY=(\$(compgen -W "python bash auto" -- "\$cur")); return ;;
    --sandbox) COMPREPLY=(\$(compgen -W "strict none" -- "\$cur")); return ;;
    --network) COMPREPLY=(\$(compgen -W "on off" -- "\$cur")); return ;;
    --manager) COMPREPLY=(\$(compgen -W "pip npm" -- "\$cur")); return ;;
    --client) COMPREPLY=(\$(compgen -W "claude cursor vscode generic" -- "\$cur")); return ;;
    --config|--workspace|--python|--allowlist|--prefix|--tls-cert|--tls-key|-o|--output)
        COMPREPLY=(\$(compgen -f -- "\$cur")); return ;;
    esac
    if [ "\$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=(\$(compgen -W "$commands --help --version" -- "\$cur"))
        return
    fi
    case \${COMP_WORDS[1]}:\$COMP_CWORD in
    kernelspec:2|mcp:2) COMPREPLY=(\$(compgen -W "install" -- "\$cur")); return ;;
    esac
    if [[ \$cur == -* ]]; then
        COMPREPLY=(\$(compgen -W "$options" -- "\$cur"))
    else
        COMPREPLY=(\$(compgen -f -- "\$cur"))
    fi
}
complete -F _kernelmgr kernelmgr
SCRIPT
