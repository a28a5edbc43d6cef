#!/usr/bin/env bash
# A throwaway Postgres for the cluster's storage on one machine (tests, .ci/run, the local recipe in docs/cluster.md):
# Debian's postgresql server binaries, initdb + pg_ctl into a temporary directory, no system service.
#
#   eval "$(scripts/local-postgres.sh start)"   # prints PG_DIR=... and DATABASE_URL=postgres://...
#   scripts/local-postgres.sh stop "$PG_DIR"     # stops the server and deletes the directory
#   scripts/local-postgres.sh restart "$PG_DIR"  # stop and start the same cluster on the same port (data kept)
#
# The server listens on 127.0.0.1 on a free port (or $PG_PORT), trusts local connections (user postgres, database
# postgres) and keeps its unix socket inside PG_DIR. As root, the cluster is owned by `nobody` (initdb refuses root).
set -euo pipefail

bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && bindir=$d; done
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "local-postgres: no initdb found under /usr/lib/postgresql/*/bin: install Debian's postgresql (scripts/setup-system.sh) or set PG_BINDIR" >&2
  exit 1
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}

free_port() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

start_server() {
  local dir=$1 port=$2
  as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-p $port -k $dir/socket -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null ||
    { echo "local-postgres: the server did not start; its log:" >&2; cat "$dir/server.log" >&2; exit 1; }
}

case "${1:-}" in
  start)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/effect-rl-pg.XXXXXX")
    mkdir -p "$dir/socket"
    [ "$(id -u)" = 0 ] && chown -R nobody "$dir"
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 ||
      { echo "local-postgres: initdb failed; its log:" >&2; cat "$dir/initdb.log" >&2; exit 1; }
    port=${PG_PORT:-$(free_port)}
    echo "$port" >"$dir/port"
    start_server "$dir" "$port"
    echo "PG_DIR=$dir"
    echo "DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    dir=${2:?usage: local-postgres.sh stop PG_DIR}
    [ -f "$dir/data/PG_VERSION" ] || { echo "local-postgres: $dir is not a directory local-postgres.sh start made" >&2; exit 1; }
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
  restart)
    dir=${2:?usage: local-postgres.sh restart PG_DIR}
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    start_server "$dir" "$(cat "$dir/port")"
    ;;
  *)
    echo "usage: local-postgres.sh start | stop PG_DIR | restart PG_DIR" >&2
    exit 2
    ;;
esac
