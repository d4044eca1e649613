#!/bin/bash
# Where a Dafka gateway's CPU goes, thread by thread, under redis-benchmark RPUSHX (50
# clients): each thread of `rafka` and of its children (the embedded tower and store) with
# its user and system CPU per command and its context switches per command, from /proc.
# Python threads of one process share its name: the event loop's thread is the one whose
# id is the process's. Never fails a build; a measuring aid.
#
# Usage: bench/thread_cpu.sh PIPELINE COMMANDS [TREE] (e.g. `bench/thread_cpu.sh 1 200000`).
# With TOPICS=N in the environment, each RPUSHX goes to one of N topics at random
# (redis-benchmark -r N), one when unset.
set -u
P=$1; N=$2; TREE=$(cd "${3:-$(dirname "$0")/..}" && pwd)
KEY=topics:t; SPREAD=()
if [ "${TOPICS:-1}" -gt 1 ]; then KEY=topics:t__rand_int__; SPREAD=(-r "$TOPICS"); fi
. "$(dirname "$0")/gateway.sh"
start_gateway "$TREE" "$P" "${SPREAD[@]}" RPUSHX "$KEY" v
snapshot() {
  for p in $PID $(pgrep -P $PID); do
    for t in /proc/$p/task/*; do
      echo "$p $(basename "$t") $(tr ' ' _ <"$t/comm") $(awk '{print $14, $15}' "$t/stat")" \
        "$(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status")"
    done
  done
}
BEFORE=$(snapshot)
redis-benchmark -p "$PORT" -c 50 -n "$N" -P "$P" "${SPREAD[@]}" -q RPUSHX "$KEY" v 2>&1 | tr '\r' '\n' \
  | grep -v '^$' | tail -1
AFTER=$(snapshot)
stop_gateway
printf '%s\n--\n%s\n' "$BEFORE" "$AFTER" | awk -v n="$N" '
  /^--$/ { after = 1; next }
  !after { u[$2] = $4; s[$2] = $5; c[$2] = $6; next }
  ($2 in u) {
    du = ($4 - u[$2]) * 1e4 / n; ds = ($5 - s[$2]) * 1e4 / n
    total += du + ds
    if (du + ds >= 0.05)
      printf "%-8s %-8s %-16s user %6.2f  sys %6.2f us/cmd  %.2f switches/cmd\n",
        $1, $2, $3, du, ds, ($6 - c[$2]) / n }
  END { printf "all threads: %.2f us/cmd\n", total }'
