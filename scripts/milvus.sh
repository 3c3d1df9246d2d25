#!/usr/bin/env bash
# A local Milvus standalone server for development and the integration tests: the `milvus`
# package from PyPI (2.3.5, the server binary with an embedded etcd, local storage and
# rocksmq in one process) in a virtualenv of its own, with time ticks and coordinator checks
# shortened for tests (reads at Strong consistency wait for the next tick).
#
#   scripts/milvus.sh start    # install (once), start, wait until it answers
#   scripts/milvus.sh stop     # SIGTERM, then SIGKILL of its process group; nothing is left
#   scripts/milvus.sh status   # exit 0 running, 1 not answering, 3 stopped
#   scripts/milvus.sh uri      # e.g. RAG_TEST_MILVUS_URI=$(scripts/milvus.sh uri)
#
# Environment: RAGQA_MILVUS_PORT (the proxy, which clients use; 19530), RAGQA_MILVUS_PORT_BASE
# (the eleven ports of its other parts, BASE to BASE+10; default the proxy port + 100),
# RAGQA_MILVUS_DATA (data, logs, config and pid file; ~/.cache/ragqa/milvus-data-<port>),
# RAGQA_MILVUS_VENV (~/.cache/ragqa/milvus-venv), RAGQA_MILVUS_WAIT_S (120).
#
# The embedded etcd listens on 127.0.0.1 only. Milvus 2.3 binds its gRPC servers (the proxy
# and every coordinator and node) and its metrics/health HTTP port on all interfaces whatever
# `<component>.ip` says (that setting is only the address it registers), so those ports are
# reachable from the network wherever the firewall lets them through.
set -euo pipefail

VERSION="2.3.5"
PORT="${RAGQA_MILVUS_PORT:-19530}"
BASE="${RAGQA_MILVUS_PORT_BASE:-$((PORT + 100))}"
CACHE="$HOME/.cache/ragqa"
VENV="${RAGQA_MILVUS_VENV:-$CACHE/milvus-venv}"
DATA="$(realpath -m "${RAGQA_MILVUS_DATA:-$CACHE/milvus-data-$PORT}")"
WAIT_S="${RAGQA_MILVUS_WAIT_S:-120}"
PIDFILE="$DATA/milvus.pid"
LOG="$DATA/logs/console.log"
HEALTH="http://127.0.0.1:$((BASE + 10))/healthz"
URI="http://127.0.0.1:$PORT"

die() { echo "milvus.sh: $*" >&2; exit 1; }
say() { echo "milvus.sh: $*" >&2; }

pid_alive() {
  local pid
  [[ -s "$PIDFILE" ]] || return 1
  pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$DATA/bin/milvus" ]]  # not a reused pid
}

healthy() {
  [[ "$(curl -fsS --max-time 5 "$HEALTH" 2>/dev/null)" == *OK* ]]
}

install() {
  if [[ -x "$VENV/bin/python" ]] \
     && "$VENV/bin/python" -c "import milvus, sys; sys.exit(milvus.__version__ != '$VERSION')" 2>/dev/null; then
    return
  fi
  local py
  py="$(command -v python3.11 || command -v python3)" || die "python3 is needed to install milvus $VERSION"
  say "installing milvus $VERSION into $VENV"
  "$py" -m venv "$VENV" || die "cannot create the virtualenv $VENV"
  "$VENV/bin/pip" install -q "milvus==$VERSION" >"$CACHE/milvus-install.log" 2>&1 \
    || die "cannot install milvus==$VERSION (see $CACHE/milvus-install.log)"
}

# The package's own config template and unpacked binaries, with our ports, the component
# addresses set to 127.0.0.1, the embedded etcd's own config (loopback, our ports), and a
# short graceful stop (its default is 1,800 s).
configure() {
  "$VENV/bin/python" - "$DATA" "$PORT" "$BASE" <<'PY'
import os, socket, sys
from milvus import MilvusServerConfig, _initialize_data_files

data, port, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ports = dict(etcd_port=base, root_coord_port=base + 2, proxy_port=port,
             proxy_internal_port=base + 3, query_coord_port=base + 4, query_node_port=base + 5,
             index_coord_port=base + 6, index_node_port=base + 7, data_coord_port=base + 8,
             data_node_port=base + 9)
config = MilvusServerConfig(data_dir=data, **ports)
for component in ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode"):
    config.set(f"{component}.ip", "127.0.0.1")
config.set("common.gracefulStopTimeout", 3)
# A read at Strong consistency waits for the next time tick (200 ms by default), and loading a
# collection for the coordinator's next check (1 s): shorter intervals for a test server.
config.set("proxy.timeTickInterval", 50)
config.set("queryCoord.checkInterval", 200)
config.set("queryCoord.distPullInterval", 100)
# The package's resolve() checks ports without SO_REUSEADDR, so it refuses a port left in
# TIME_WAIT by a server stopped a moment ago; check them here as the server will bind them.
for name, number in [*ports.items(), ("etcd_peer_port", base + 1), ("metrics_port", base + 10)]:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", number))
        except OSError as exc:
            sys.exit(f"milvus.sh: port {number} ({name}) is taken: {exc}; set RAGQA_MILVUS_PORT/_PORT_BASE")
    if name in config.configurable_items:
        config.configurable_items[name][1] = number
config.resolve_storage()
config.write_config()
_initialize_data_files(data)
peer = f"http://127.0.0.1:{base + 1}"
with open(os.path.join(data, "configs", "embedEtcd.yaml"), "w", encoding="utf-8") as fh:
    fh.write(f"name: ragqa-milvus\n"
             f"listen-client-urls: http://127.0.0.1:{base}\n"
             f"advertise-client-urls: http://127.0.0.1:{base}\n"
             f"listen-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\n"
             f"initial-cluster: ragqa-milvus={peer}\n")
PY
}

start() {
  command -v curl >/dev/null || die "curl is needed"
  if pid_alive && healthy; then
    say "already running at $URI (pid $(cat "$PIDFILE"))"; return
  fi
  if ! pid_alive && healthy; then
    die "a Milvus not started from $DATA answers at $HEALTH; stop it or set RAGQA_MILVUS_PORT_BASE"
  fi
  local launcher=""
  if ! pid_alive; then
    install
    mkdir -p "$DATA/logs"
    rm -f "$PIDFILE"
    configure || die "cannot configure Milvus in $DATA"
    say "starting Milvus $VERSION on $URI (other parts on ports $BASE-$((BASE + 10)), data $DATA)"
    (cd "$DATA" && exec setsid nohup env DEPLOY_MODE=STANDALONE METRICS_PORT="$((BASE + 10))" \
       MILVUSCONF="$DATA/configs/" ETCD_CONFIG_PATH="$DATA/configs/embedEtcd.yaml" \
       ETCD_DATA_DIR="$DATA/data/etcd.data" MILVUS_RUN_DIR="$DATA/run" \
       LD_LIBRARY_PATH="$DATA/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
       "$DATA/bin/milvus" run standalone >"$LOG" 2>&1 </dev/null) &
    launcher=$!
    echo "$launcher" >"$PIDFILE"  # exec keeps the pid: it is the server's, and its group's
  fi
  local began=$SECONDS
  until healthy; do
    if [[ -n "$launcher" ]] && ! kill -0 "$launcher" 2>/dev/null; then
      local why
      why="$(grep -m1 -E '\[(ERROR|FATAL)\]|panic:' "$LOG" || tail -1 "$LOG" || true)"
      die "Milvus exited during start-up: ${why:0:300} (see $LOG)"
    fi
    (( SECONDS - began < WAIT_S )) || die "Milvus did not become ready within ${WAIT_S} s (see $LOG)"
    sleep 0.5
  done
  echo "Milvus $VERSION ready at $URI after $((SECONDS - began)) s (pid $(cat "$PIDFILE"))"
}

# Everything in the server's process group and session, and anything still running the
# server's binary (a child that changed its group).
leftovers() {
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  {
    [[ "$pid" =~ ^[0-9]+$ ]] && ps -o pid= -s "$pid" 2>/dev/null
    find /proc/[0-9]*/exe -maxdepth 0 -lname "$DATA/bin/*" 2>/dev/null | cut -d/ -f3
  } | tr -d ' ' | sort -u | grep -v '^$' || true
}

stop() {
  local pid i left
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  if ! pid_alive && [[ -z "$(leftovers)" ]]; then
    rm -f "$PIDFILE"; say "not running (no live pid in $PIDFILE)"; return
  fi
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -TERM -- "-$pid" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    [[ -z "$(leftovers)" ]] && { rm -f "$PIDFILE"; say "stopped (pid $pid)"; return; }
    sleep 0.5
  done
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -KILL -- "-$pid" 2>/dev/null || true
  left="$(leftovers)"
  [[ -n "$left" ]] && kill -KILL $left 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    [[ -z "$(leftovers)" ]] && { rm -f "$PIDFILE"; say "killed (pid $pid did not stop within 10 s)"; return; }
    sleep 0.25
  done
  die "processes of $DATA/bin/milvus still running: $(leftovers | tr '\n' ' ')"
}

status() {
  if pid_alive && healthy; then
    echo "running at $URI (pid $(cat "$PIDFILE"))"
  elif pid_alive; then
    echo "started (pid $(cat "$PIDFILE")) but not answering at $HEALTH"; exit 1
  else
    echo "not running (data $DATA)"; exit 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  uri) echo "$URI" ;;
  *) echo "usage: $0 start|stop|status|uri" >&2; exit 2 ;;
esac
