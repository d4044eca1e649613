# Sourced by the bench shell scripts: start_gateway TREE PIPELINE [redis-benchmark args...]
# starts a Dafka gateway of checkout TREE (`rafka` with PYTHONPATH=TREE, uvloop, a fresh
# data directory, a random port), waits until it answers PING (else it says why and exits:
# redis-benchmark would spin on a refused connection), and warms it up with 20,000
# RPUSHX at PIPELINE (the args say where: default `RPUSHX topics:t v`). Sets PID, PORT and
# DATA; stop_gateway stops it and removes the data.
BENCH_VENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv

start_gateway() {
  local tree=$1 pipeline=$2
  shift 2
  [ $# -gt 0 ] || set -- RPUSHX topics:t v
  DATA=$(mktemp -d)
  # Below Linux's ephemeral ports (32768-60999), where the tower and stores bind.
  PORT=$((20000 + RANDOM % 12000))
  PYTHONPATH=$tree "$BENCH_VENV/bin/rafka" --host 127.0.0.1 -p "$PORT" --data-dir "$DATA" \
    --event-loop uvloop >"$DATA.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do
    redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  if ! redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG; then
    # redis-benchmark would spin on a refused connection for ever: stop here, saying why.
    echo "the gateway of $tree did not answer PING on port $PORT within 10 s:" >&2
    tail -5 "$DATA.log" >&2
    kill "$PID" 2>/dev/null
    rm -rf "$DATA" "$DATA.log"
    exit 1
  fi
  redis-benchmark -p "$PORT" -c 50 -n 20000 -P "$pipeline" -q "$@" >/dev/null 2>&1
}

stop_gateway() {
  kill "$PID"
  wait "$PID" 2>/dev/null
  rm -rf "$DATA" "$DATA.log"
}
