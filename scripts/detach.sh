# Sourced by the scripts that start a daemon (docker.sh). Not run on its own.

# start_detached LOG COMMAND [ARGS...]: COMMAND in the background, in a session of its own and
# detached from this shell (it outlives the script), output appended to LOG, stdin from /dev/null,
# and none of this shell's other open files: a daemon that inherited a caller's pipe or lock file
# would hold it for its whole life (a CI step waiting for the pipe's end, a flock never released).
start_detached() {
    local log=$1
    shift
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
        done 2>/dev/null
        exec setsid nohup "$@" >>"$log" 2>&1 </dev/null
    ) &
}
