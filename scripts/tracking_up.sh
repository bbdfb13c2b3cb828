#!/usr/bin/env bash
# A real tracking server for the tests and for a cluster without containers: Debian's PostgreSQL
# (the runs) and `mlflow server` on it, serving the artifacts itself, both on 127.0.0.1 unless told.
# These are the commands docker/compose.yaml runs. .ci/run calls it after `make install`.
# Idempotent: installs PostgreSQL only when missing, starts only what is not running.
#   MLFLOW_PORT (5000), PG_PORT (5432), BASE (/var/lib/sweepscale-tracking): artifacts, logs, pid.
#   MLFLOW_HOST (127.0.0.1): the address the server listens on; the one your compute nodes reach
#   (a second server on the same database may listen elsewhere: another MLFLOW_PORT and BASE).
set -euo pipefail
cd "$(dirname "$0")/.."
MLFLOW_HOST=${MLFLOW_HOST:-127.0.0.1}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
PG_PORT=${PG_PORT:-5432}
BASE=${BASE:-/var/lib/sweepscale-tracking}
MLFLOW=${MLFLOW:-.venv/bin/mlflow}
DB_URI="postgresql+psycopg2://mlflow:mlflow@127.0.0.1:${PG_PORT}/mlflow"
log() { echo "[tracking_up] $*"; }
waitfor() { local n=$1; shift; for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }

# ---- 1. PostgreSQL from Debian's packages, its default cluster, on localhost only
if ! command -v pg_lsclusters >/dev/null; then
  log "installing postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
read -r version cluster _ < <(pg_lsclusters -h | head -1)
if ! pg_lsclusters -h | head -1 | grep -q online; then
  log "starting PostgreSQL $version/$cluster"
  pg_ctlcluster "$version" "$cluster" start -- -o "-c listen_addresses=127.0.0.1 -c port=${PG_PORT}"
fi
waitfor 30 runuser -u postgres -- psql -p "$PG_PORT" -Atc "select 1"
runuser -u postgres -- psql -p "$PG_PORT" -v ON_ERROR_STOP=1 -q <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'mlflow') THEN CREATE ROLE mlflow LOGIN PASSWORD 'mlflow'; END IF;
END $$;
SQL
runuser -u postgres -- psql -p "$PG_PORT" -Atc "select 1 from pg_database where datname='mlflow'" | grep -q 1 \
  || runuser -u postgres -- createdb -p "$PG_PORT" -O mlflow mlflow

# ---- 2. the MLflow tracking server on it
mkdir -p "$BASE/artifacts" "$BASE/log"
URL="http://${MLFLOW_HOST}:${MLFLOW_PORT}"
if ! curl -sf "$URL/health" >/dev/null; then
  log "starting mlflow server on $URL (runs in PostgreSQL, artifacts in $BASE/artifacts)"
  # Each worker answers up to 40 requests at once, each holding a database connection: a pool of 5
  # (+10) made 32 points writing at once fail with "QueuePool limit ... reached" (2 x 40 < PostgreSQL's 100).
  # MLflow's job runner (GenAI scorers; none of ours) is off: it started 8 more processes of 3-4 s of CPU each.
  MLFLOW_SQLALCHEMYSTORE_POOL_SIZE=20 MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=20 MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
  setsid "$MLFLOW" server --host "$MLFLOW_HOST" --port "$MLFLOW_PORT" --workers 2 \
    --backend-store-uri "$DB_URI" --artifacts-destination "$BASE/artifacts" \
    </dev/null >>"$BASE/log/mlflow-server.log" 2>&1 &
  echo $! >"$BASE/mlflow-server.pid"
  waitfor 120 curl -sf "$URL/health" || { tail -30 "$BASE/log/mlflow-server.log" >&2; exit 1; }
  # up once its API answers from the database: /health answers before the first query is made
  waitfor 60 curl -sf "$URL/api/2.0/mlflow/experiments/search?max_results=1" \
    || { tail -30 "$BASE/log/mlflow-server.log" >&2; exit 1; }
fi
log "mlflow server up: $URL (PostgreSQL ${version} on 127.0.0.1:${PG_PORT})"
