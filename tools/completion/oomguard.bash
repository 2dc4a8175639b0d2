# bash completion for oomguard(1); installed by `make install` into
# $(PREFIX)/share/bash-completion/completions/oomguard.
_oomguard()
{
    local cur prev cmd i
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    cmd=
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        -*) ;;
        *) cmd=${COMP_WORDS[i]}; break ;;
        esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "run report merge stats help --help --version" -- "$cur"))
        return
    fi
    case $prev in
    -f | --format)
        case $cmd in
        report) COMPREPLY=($(compgen -W "text json html memory-viz" -- "$cur")) ;;
        stats) COMPREPLY=($(compgen -W "text json html prometheus" -- "$cur")) ;;
        *) COMPREPLY=($(compgen -W "text json html" -- "$cur")) ;;
        esac
        return ;;
    --color) COMPREPLY=($(compgen -W "auto always never" -- "$cur")); return ;;
    -o | --output) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --top | --limit | --warn-at | --stack-depth) return ;;
    esac
    case $cmd in
    help) COMPREPLY=($(compgen -W "run report merge stats" -- "$cur")) ;;
    run)
        # after the first operand, the command's own words: complete commands, then files
        for ((i = i + 1; i < COMP_CWORD; i++)); do
            case ${COMP_WORDS[i]} in
            --dir | --limit | --warn-at | --stack-depth) ((i++)) ;;
            --) ((i++)); break ;;
            -*) ;;
            *) break ;;
            esac
        done
        if ((i < COMP_CWORD)); then
            COMPREPLY=($(compgen -f -- "$cur"))
        elif [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "--dir --limit --warn-at --stack-depth --summary --verbose --quiet --help --" -- "$cur"))
        else
            COMPREPLY=($(compgen -c -- "$cur"))
        fi ;;
    report | merge | stats)
        if [[ $cur == -* ]]; then
            local opts="--format --output --color --no-color --help"
            [ "$cmd" != merge ] && opts="$opts --top"
            COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        elif [ "$cmd" = report ]; then
            # dumps and directories
            COMPREPLY=($(compgen -d -- "$cur") $(compgen -f -X '!*.json' -- "$cur"))
        else
            COMPREPLY=($(compgen -d -- "$cur"))
        fi ;;
    esac
}
complete -o filenames -F _oomguard oomguard
