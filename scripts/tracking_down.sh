#!/usr/bin/env bash
# Stops what scripts/tracking_up.sh started: the mlflow server, then PostgreSQL's cluster.
# --purge also deletes the database and the served artifacts.
set -euo pipefail
BASE=${BASE:-/var/lib/sweepscale-tracking}
PG_PORT=${PG_PORT:-5432}
if [ -s "$BASE/mlflow-server.pid" ]; then
  kill -- -"$(ps -o sid= -p "$(cat "$BASE/mlflow-server.pid")" | tr -d ' ')" 2>/dev/null || true
  rm -f "$BASE/mlflow-server.pid"
fi
if [ "${1:-}" = --purge ]; then
  runuser -u postgres -- dropdb -p "$PG_PORT" --if-exists mlflow
  rm -rf "$BASE"
fi
read -r version cluster _ < <(pg_lsclusters -h | head -1)
pg_ctlcluster "$version" "$cluster" stop || true
echo "[tracking_down] stopped"
