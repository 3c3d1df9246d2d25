#!/usr/bin/env bash
# A local PostgreSQL for development and the tests: Debian's postgresql package, a cluster of
# its own (not Debian's main cluster) listening on 127.0.0.1 only.
#
#   scripts/postgres.sh start    # install (once, apt), initdb (once), start, wait until ready
#   scripts/postgres.sh stop
#   scripts/postgres.sh status   # exit 0 running, 1 not answering, 3 stopped
#   scripts/postgres.sh url      # e.g. RAG_STATE__URL=$(scripts/postgres.sh url)
#
# Environment: RAGQA_PG_PORT (5432), RAGQA_PG_BASE (where clusters live), RAGQA_PG_DATA (the
# cluster, its log and its socket; <base>/pg-data-<port>), RAGQA_PG_WAIT_S (60),
# RAGQA_PG_OPTIONS (more server options, e.g. "-c fsync=off" for a throwaway cluster).
#
# The cluster has one superuser, ragqa, and a database ragqa. Connections from 127.0.0.1 are
# trusted (no password): the server is for this machine's tests and development only. PostgreSQL
# refuses to run as root, so as root it runs as the system user ragqa-pg from a folder that user
# owns (RAGQA_PG_BASE, default /var/lib/ragqa-pg); as another user it runs as that user, from
# ~/.cache/ragqa.
set -euo pipefail

source "$(dirname "$0")/env.sh"

PORT="${RAGQA_PG_PORT:-5432}"
PG_USER="ragqa-pg"
if (( EUID == 0 )); then BASE="${RAGQA_PG_BASE:-/var/lib/ragqa-pg}"; else BASE="${RAGQA_PG_BASE:-$HOME/.cache/ragqa}"; fi
DATA="${RAGQA_PG_DATA:-$BASE/pg-data-$PORT}"
CLUSTER="$DATA/cluster"
LOG="$DATA/postgres.log"
WAIT_S="${RAGQA_PG_WAIT_S:-60}"
DB="ragqa"
URL="postgresql+psycopg://ragqa@127.0.0.1:$PORT/$DB"

die() { echo "postgres.sh: $*" >&2; exit 1; }
note() { echo "postgres.sh: $*" >&2; }

bindir() {  # the newest installed server's programs
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  [[ -n "$dir" && -x "$dir/pg_ctl" ]] || return 1
  echo "$dir"
}

as_owner() {  # run a command as the cluster's owner
  if (( EUID == 0 )); then runuser -u "$PG_USER" -- "$@"; else "$@"; fi
}

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 2; }

ours() { [[ -f "$CLUSTER/PG_VERSION" ]] && as_owner "$BIN/pg_ctl" -D "$CLUSTER" status >/dev/null 2>&1; }

prepare_user() {
  (( EUID == 0 )) || return 0
  if ! id "$PG_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_USER" \
      || die "cannot create the system user $PG_USER"
  fi
  chown "$PG_USER" "$DATA"
  runuser -u "$PG_USER" -- test -w "$DATA" \
    || die "the user $PG_USER cannot write $DATA (a parent folder is closed to it); set RAGQA_PG_BASE or RAGQA_PG_DATA"
}

start() {
  ensure_postgres || die "Debian's postgresql could not be installed (apt-get install postgresql)"
  BIN="$(bindir)" || die "no PostgreSQL server in /usr/lib/postgresql/*/bin"
  if ours && ready; then
    note "already running at $URL (data $DATA)"; return
  fi
  if ! ours && ready; then
    die "port $PORT already has a PostgreSQL not started from $DATA; set RAGQA_PG_PORT"
  fi
  mkdir -p "$DATA"
  chmod 700 "$DATA"
  prepare_user
  if [[ ! -f "$CLUSTER/PG_VERSION" ]]; then
    note "creating a cluster in $CLUSTER ($("$BIN/postgres" --version))"
    as_owner "$BIN/initdb" -D "$CLUSTER" -U ragqa -A trust -E UTF8 --no-locale >"$DATA/initdb.log" 2>&1 \
      || die "initdb failed (see $DATA/initdb.log)"
  fi
  local began=$SECONDS
  # Listen on loopback only; the socket goes in the data folder (Debian's /var/run/postgresql
  # belongs to its own clusters).
  as_owner "$BIN/pg_ctl" -D "$CLUSTER" -l "$LOG" -w -t "$WAIT_S" \
    -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DATA ${RAGQA_PG_OPTIONS:-}" \
    start >/dev/null || die "PostgreSQL did not start within ${WAIT_S} s: $(tail -3 "$LOG" 2>/dev/null | tr '\n' ' ') (see $LOG)"
  ready || die "PostgreSQL started but does not answer on 127.0.0.1:$PORT (see $LOG)"
  if [[ "$("$BIN/psql" -h 127.0.0.1 -p "$PORT" -U ragqa -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]]; then
    "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U ragqa "$DB" || die "cannot create the database $DB"
  fi
  echo "PostgreSQL ready at $URL after $((SECONDS - began)) s (data $DATA)"
}

stop() {
  BIN="$(bindir)" || { note "no PostgreSQL installed"; return; }
  if ! ours; then
    note "not running (data $DATA)"; return
  fi
  as_owner "$BIN/pg_ctl" -D "$CLUSTER" -m fast -w -t 60 stop >/dev/null || die "pg_ctl stop failed (see $LOG)"
  note "stopped (data $DATA)"
}

status() {
  BIN="$(bindir)" || { echo "not installed"; exit 3; }
  if ours && ready; then
    echo "running at $URL (data $DATA)"
  elif ours; then
    echo "started but not answering on 127.0.0.1:$PORT (see $LOG)"; exit 1
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
