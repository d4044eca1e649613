#!/bin/bash
# Alternate runs of two (or more) checkouts of rafka on the Dafka engine under
# redis-benchmark RPUSHX (50 clients), printing each run's rate, the gateway's CPU per
# command (all its threads) and its children's (the embedded tower and store), and the
# gateway's context switches per command: on a shared machine the rates move with other
# people's load, the CPU a command costs much less. Never fails a build; a measuring aid.
#
# Usage: bench/compare_trees.sh PIPELINE RUNS TREE... (e.g. `git worktree add /tmp/old
# HEAD~1`, then `bench/compare_trees.sh 1 3 /tmp/old .`). Each tree runs its own code:
# `rafka` is started with PYTHONPATH=<tree>. With TOPICS=N in the environment, each
# RPUSHX goes to one of N topics at random (redis-benchmark -r N), one when unset.
set -u
P=$1; N=$2; shift 2
KEY=topics:t; SPREAD=()
if [ "${TOPICS:-1}" -gt 1 ]; then KEY=topics:t__rand_int__; SPREAD=(-r "$TOPICS"); fi
. "$(dirname "$0")/gateway.sh"
COMMANDS=$((P == 1 ? 200000 : 1000000))
for _ in $(seq "$N"); do
  for TREE in "$@"; do
    TREE=$(cd "$TREE" && pwd)
    start_gateway "$TREE" "$P" "${SPREAD[@]}" RPUSHX "$KEY" v
    cpu() { for p in $PID $(pgrep -P $PID); do awk '{print $14+$15}' "/proc/$p/stat"; done | paste -sd' '; }
    switches() { cat /proc/$PID/task/*/status | awk '/ctxt_switches/ {s+=$2} END {print s}'; }
    BEFORE=$(cpu); SWITCHES=$(switches)
    RATE=$(redis-benchmark -p "$PORT" -c 50 -n "$COMMANDS" -P "$P" "${SPREAD[@]}" -q RPUSHX "$KEY" v 2>&1 \
      | tr '\r' '\n' | grep -v '^$' | tail -1 | awk '{print $4}')
    AFTER=$(cpu); SWITCHED=$(($(switches) - SWITCHES))
    echo "$TREE $RATE $BEFORE $AFTER" | awk -v n="$COMMANDS" -v s="$SWITCHED" '{
      k = (NF - 2) / 2; gateway = ($(3 + k) - $3) * 1e6 / 100 / n; children = 0
      for (j = 2; j <= k; j++) children += $(3 + k + j - 1) - $(3 + j - 1)
      printf "%-30s %10s/s  gateway %5.2f  children %5.2f us/cmd  %.2f switches/cmd\n",
        $1, $2, gateway, children * 1e6 / 100 / n, s / n }'
    stop_gateway
  done
done
