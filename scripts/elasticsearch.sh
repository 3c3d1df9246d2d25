#!/usr/bin/env bash
# A local single-node Elasticsearch for development and the integration tests: the minimal
# "integ-test" distribution from Maven Central, on 127.0.0.1 only, security off.
#
#   scripts/elasticsearch.sh start    # fetch (once), unpack (once), start, wait until ready
#   scripts/elasticsearch.sh stop
#   scripts/elasticsearch.sh status   # exit 0 running, 1 not answering, 3 stopped
#   scripts/elasticsearch.sh url      # e.g. RAG_TEST_ES_URL=$(scripts/elasticsearch.sh url)
#
# Environment: RAGQA_ES_VERSION (9.3.2), RAGQA_ES_PORT (9200), RAGQA_ES_DATA (data, logs and
# pid file; <base>/es-data-<port>), RAGQA_ES_WAIT_S (180), ES_JAVA_HOME (default: the newest
# JDK 21+ in /usr/lib/jvm), RAGQA_ES_BASE (where the distribution and data go).
#
# Elasticsearch refuses to run as root, so as root it runs as the system user ragqa-es, and
# everything it reads or writes lives in a folder that user owns (RAGQA_ES_BASE, default
# /var/lib/ragqa-es), so no folder of root's home is opened to it. As another user it runs as
# that user, from ~/.cache/ragqa.
set -euo pipefail

VERSION="${RAGQA_ES_VERSION:-9.3.2}"
PORT="${RAGQA_ES_PORT:-9200}"
CACHE="$HOME/.cache/ragqa"
ES_USER="ragqa-es"
if (( EUID == 0 )); then BASE="${RAGQA_ES_BASE:-/var/lib/ragqa-es}"; else BASE="${RAGQA_ES_BASE:-$CACHE}"; fi
DATA="${RAGQA_ES_DATA:-$BASE/es-data-$PORT}"
# An Elasticsearch started by an earlier version of this script, as root, from ~/.cache/ragqa,
# keeps its pid file there: keep using that folder while it runs, so stop still finds it.
if [[ -z "${RAGQA_ES_DATA:-}" && "$BASE" != "$CACHE" && -s "$CACHE/es-data-$PORT/es.pid" ]] \
    && kill -0 "$(cat "$CACHE/es-data-$PORT/es.pid" 2>/dev/null)" 2>/dev/null; then
  DATA="$CACHE/es-data-$PORT"
fi
WAIT_S="${RAGQA_ES_WAIT_S:-180}"
M2_REPO="${RAGQA_M2_REPO:-$HOME/.m2/repository}"
ZIP="$M2_REPO/org/elasticsearch/distribution/integ-test-zip/elasticsearch/$VERSION/elasticsearch-$VERSION.zip"
ES_HOME="$BASE/es-$VERSION/elasticsearch-$VERSION"
OLD_HOME="$CACHE/es-$VERSION/elasticsearch-$VERSION"  # where root's distribution used to be unpacked
URL="http://127.0.0.1:$PORT"
PIDFILE="$DATA/es.pid"
LOG="$DATA/logs/console.log"

die() { echo "elasticsearch.sh: $*" >&2; exit 1; }
say() { echo "elasticsearch.sh: $*" >&2; }

pid_alive() {
  local pid
  [[ -s "$PIDFILE" ]] || return 1
  pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && grep -qa elasticsearch "/proc/$pid/cmdline" 2>/dev/null  # not a reused pid
}

healthy() {
  curl -fsS --max-time 10 "$URL/_cluster/health?wait_for_status=yellow&timeout=${1:-1}s" >/dev/null 2>&1
}

es_version() {
  curl -fsS --max-time 10 "$URL/_nodes/_local?filter_path=nodes.*.version" 2>/dev/null \
    | sed -n 's/.*"version":"\([^"]*\)".*/\1/p'
}

java_home() {
  if [[ -n "${ES_JAVA_HOME:-}" ]]; then
    [[ -x "$ES_JAVA_HOME/bin/java" ]] || die "ES_JAVA_HOME=$ES_JAVA_HOME has no bin/java"
    echo "$ES_JAVA_HOME"; return
  fi
  local best="" best_major=0 dir version major
  for dir in /usr/lib/jvm/*/; do
    dir="${dir%/}"
    [[ -x "$dir/bin/java" ]] || continue
    version="$(sed -n 's/^JAVA_VERSION="\(.*\)"/\1/p' "$dir/release" 2>/dev/null || true)"
    [[ -n "$version" ]] || version="$("$dir/bin/java" -version 2>&1 | sed -n '1s/.*version "\([^"]*\)".*/\1/p' || true)"
    major="${version%%[.+-]*}"
    [[ "$major" == 1 ]] && major="$(cut -d. -f2 <<<"$version")"
    if [[ "$major" =~ ^[0-9]+$ ]] && (( major >= 21 && major > best_major )); then
      best="$dir"; best_major="$major"
    fi
  done
  [[ -n "$best" ]] || die "no JDK 21 or newer in /usr/lib/jvm; install one or set ES_JAVA_HOME"
  echo "$best"
}

fetch() {
  [[ -s "$ZIP" ]] && return
  command -v mvn >/dev/null || die "Elasticsearch $VERSION is not in $M2_REPO and mvn is not installed to fetch it"
  mkdir -p "$CACHE"
  say "fetching Elasticsearch $VERSION (integ-test zip) from Maven Central"
  if ! mvn -q -B dependency:get -Dartifact="org.elasticsearch.distribution.integ-test-zip:elasticsearch:$VERSION:zip" \
      -Dtransitive=false -Dmaven.repo.local="$M2_REPO" >"$CACHE/es-fetch.log" 2>&1 || [[ ! -s "$ZIP" ]]; then
    die "cannot fetch org.elasticsearch.distribution.integ-test-zip:elasticsearch:$VERSION:zip (see $CACHE/es-fetch.log)"
  fi
}

unpack() {
  [[ -x "$ES_HOME/bin/elasticsearch" ]] && return
  local tmp
  mkdir -p "$BASE"
  tmp="$(mktemp -d "$BASE/es-$VERSION.unpack.XXXXXX")"
  if [[ "$OLD_HOME" != "$ES_HOME" && -x "$OLD_HOME/bin/elasticsearch" && ! -s "$ZIP" ]]; then
    say "copying $OLD_HOME into $BASE/es-$VERSION"
    cp -a "$OLD_HOME" "$tmp/" || { rm -rf "$tmp"; die "cannot copy $OLD_HOME"; }
  else
    fetch
    say "unpacking into $BASE/es-$VERSION"
    unzip_into "$tmp"
  fi
  [[ -x "$tmp/elasticsearch-$VERSION/bin/elasticsearch" ]] || { rm -rf "$tmp"; die "$ZIP holds no elasticsearch-$VERSION/bin/elasticsearch"; }
  mkdir -p "$BASE/es-$VERSION"
  mv "$tmp/elasticsearch-$VERSION" "$ES_HOME"
  rmdir "$tmp"
}

unzip_into() {
  local tmp="$1"
  if command -v unzip >/dev/null; then
    unzip -q "$ZIP" -d "$tmp" || { rm -rf "$tmp"; die "cannot unpack $ZIP"; }
  else
    python3 -m zipfile -e "$ZIP" "$tmp" || { rm -rf "$tmp"; die "cannot unpack $ZIP"; }
    chmod +x "$tmp/elasticsearch-$VERSION/bin/"*
  fi
}

# As root: Elasticsearch refuses to run as root, so it runs as a system user that owns its
# files. No permission outside them changes: a folder the user cannot reach is an error.
prepare_user() {
  (( EUID == 0 )) || return 0
  if ! id "$ES_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$ES_USER" \
      || die "cannot create the system user $ES_USER"
  fi
  [[ "$(stat -c %U "$ES_HOME/config")" == "$ES_USER" ]] || chown -R "$ES_USER" "$ES_HOME"
  chown -R "$ES_USER" "$DATA"
  local dir
  for dir in "$ES_HOME/bin" "$DATA/data"; do
    runuser -u "$ES_USER" -- test -x "$dir" \
      || die "the user $ES_USER cannot reach $dir (a parent folder is closed to it); set RAGQA_ES_BASE or RAGQA_ES_DATA to a folder it can reach"
  done
}

start() {
  command -v curl >/dev/null || die "curl is needed"
  if pid_alive && healthy; then
    say "already running at $URL (pid $(cat "$PIDFILE"), version $(es_version))"; return
  fi
  if ! pid_alive && healthy; then
    say "an Elasticsearch not started from $DATA already answers at $URL; using it"; return
  fi
  if ! pid_alive && curl -s --max-time 5 -o /dev/null "$URL/"; then
    die "port $PORT is taken by something that is not Elasticsearch; set RAGQA_ES_PORT"
  fi
  local jdk launcher=""
  jdk="$(java_home)"
  if ! pid_alive; then
    unpack
    mkdir -p "$DATA/data" "$DATA/logs"
    rm -f "$PIDFILE"
    prepare_user
    local cmd=(env "ES_JAVA_HOME=$jdk" "ES_JAVA_OPTS=-Xms512m -Xmx512m" "$ES_HOME/bin/elasticsearch"
      -p "$PIDFILE" -Ediscovery.type=single-node -Expack.security.enabled=false
      -Enetwork.host=127.0.0.1 -Ehttp.port="$PORT" -Epath.data="$DATA/data" -Epath.logs="$DATA/logs"
      -Ecluster.routing.allocation.disk.threshold_enabled=false -Ecluster.name="ragqa-$PORT")
    (( EUID == 0 )) && cmd=(runuser -u "$ES_USER" -- "${cmd[@]}")
    say "starting Elasticsearch $VERSION on $URL (java $(basename "$jdk"), data $DATA)"
    (cd "$ES_HOME" && exec setsid nohup "${cmd[@]}" >"$LOG" 2>&1 </dev/null) &
    launcher=$!
  fi
  local began=$SECONDS
  until healthy 5; do
    if [[ -n "$launcher" ]] && ! kill -0 "$launcher" 2>/dev/null; then
      local why
      why="$(grep -m1 -E 'ERROR|Exception|error:' "$LOG" || grep -v '^WARNING' "$LOG" | grep . | tail -1 || true)"
      why="${why:0:300}"
      die "Elasticsearch $VERSION exited during start-up: ${why:-no message} (see $LOG)"
    fi
    (( SECONDS - began < WAIT_S )) || die "Elasticsearch did not become ready within ${WAIT_S} s (see $LOG)"
    sleep 1
  done
  echo "Elasticsearch $(es_version) ready at $URL after $((SECONDS - began)) s (pid $(cat "$PIDFILE"))"
}

stop() {
  if ! pid_alive; then
    rm -f "$PIDFILE"; say "not running (no live pid in $PIDFILE)"; return
  fi
  local pid i
  pid="$(cat "$PIDFILE")"
  kill "$pid"
  for ((i = 0; i < 60; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; say "stopped (pid $pid)"; return; }
    sleep 1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
  say "killed (pid $pid did not stop within 60 s)"
}

status() {
  if pid_alive && healthy; then
    echo "running at $URL (pid $(cat "$PIDFILE"), version $(es_version))"
  elif healthy; then
    echo "an Elasticsearch not started from $DATA answers at $URL (version $(es_version))"
  elif pid_alive; then
    echo "started (pid $(cat "$PIDFILE")) but not answering at $URL"; exit 1
  else
    echo "not running (data $DATA)"; exit 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
