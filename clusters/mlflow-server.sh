#!/usr/bin/env bash
# Start (or restart) the MLflow tracking server on the Ray head node; the cluster YAMLs run it
# from head_start_ray_commands, inside the Ray container:
#
#   bash ~/isosweep/clusters/mlflow-server.sh ARTIFACTS_DESTINATION
#
# ARTIFACTS_DESTINATION: s3://BUCKET/PREFIX (AWS), gs://BUCKET/PREFIX (GCP), or a directory on a
# disk every node and the head share (on-prem). Artifacts are proxied by this server
# (--serve-artifacts), so only the head needs credentials for the bucket (its IAM role or
# service account); trainer workers just talk HTTP to the server.
#
# Where it listens: the head's private IP, port 5000. Not 127.0.0.1, because the trial workers on
# other nodes log to it (MLFLOW_TRACKING_URI=http://<head private ip>:5000, set by the cluster
# YAMLs); not 0.0.0.0, which would include any public interface. The security group / firewall
# admits port 5000 only from inside the cluster; from a laptop use an SSH tunnel (clusters/README.md).
#
# Backend store: the PostgreSQL that the head's initialization_commands run on the host, bound
# to 127.0.0.1:5432. Its password is generated on the head at first start and read here from
# MLFLOW_DB_PASSWORD_FILE (mounted into the container), or from MLFLOW_DB_PASSWORD if set; it is
# handed to libpq as PGPASSWORD, so it is neither in a file of this repository nor on a command line.
set -euo pipefail

ARTIFACTS="${1:?usage: mlflow-server.sh ARTIFACTS_DESTINATION (s3://..., gs://... or a shared directory)}"
PORT="${MLFLOW_PORT:-5000}"
HOST="${MLFLOW_HOST:-$(hostname -I | awk '{print $1}')}"
case "$HOST" in
  "" | 0.0.0.0 | "::" | "[::]") echo "mlflow-server.sh: refusing to listen on '${HOST}': give the head's private IP" >&2; exit 1 ;;
esac
DB_URI="${MLFLOW_BACKEND_STORE_URI:-postgresql://mlflow@127.0.0.1:5432/mlflow}"
PASSWORD_FILE="${MLFLOW_DB_PASSWORD_FILE:-/run/secrets/mlflow-db-password}"
if [ -z "${MLFLOW_DB_PASSWORD:-}" ]; then
  MLFLOW_DB_PASSWORD="$(cat "$PASSWORD_FILE")"
fi
export PGPASSWORD="$MLFLOW_DB_PASSWORD"
LOG_DIR="${MLFLOW_LOG_DIR:-/tmp/isosweep-mlflow}"
mkdir -p "$LOG_DIR"
case "$ARTIFACTS" in s3://* | gs://*) ;; *) mkdir -p "$ARTIFACTS" ;; esac

# PostgreSQL was started seconds ago on a fresh head: wait until it accepts the password.
for _ in $(seq 90); do
  if python -c "import sqlalchemy as s; s.create_engine('$DB_URI').connect().close()" 2>/dev/null; then break; fi
  sleep 2
done

# A previous server of ours (ray up re-runs the start commands): stop it by its pid file.
if [ -s "$LOG_DIR/server.pid" ]; then
  kill "$(cat "$LOG_DIR/server.pid")" 2>/dev/null || true
  sleep 2
fi

nohup mlflow server \
  --host "$HOST" --port "$PORT" \
  --backend-store-uri "$DB_URI" \
  --serve-artifacts --artifacts-destination "$ARTIFACTS" \
  --workers "${MLFLOW_WORKERS:-4}" \
  >"$LOG_DIR/server.log" 2>&1 &
echo $! >"$LOG_DIR/server.pid"
echo "MLflow tracking server on http://$HOST:$PORT (pid $(cat "$LOG_DIR/server.pid"), log $LOG_DIR/server.log)"
