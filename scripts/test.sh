#!/usr/bin/env bash
# The README's test command (`make test`, what .ci/run runs): the services the suite's tests need,
# brought up where this machine can (root and Debian's apt: a Slurm of three nodes, a headless
# browser, PostgreSQL with an MLflow server), then ruff and the suite on two workers, then the
# services this script started are put back. Elsewhere their tests are skipped, each with its reason,
# and the closing lines count them. SWEEPSCALE_TEST_SERVICES=0 starts none.
set -uo pipefail
cd "$(dirname "$0")/.."
started=()
teardown() {
  for s in "${started[@]}"; do
    case $s in
      slurm) bash scripts/slurm_down.sh >/dev/null 2>&1 ;;
      tracking) bash scripts/tracking_down.sh >/dev/null 2>&1 ;;
    esac
  done
}
trap teardown EXIT
if [ "${SWEEPSCALE_TEST_SERVICES:-1}" != 1 ]; then
  echo "[test] SWEEPSCALE_TEST_SERVICES=0: no service started"
elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "[test] not root with apt-get: Slurm, PostgreSQL and the browser are not started; their tests skip"
else
  if ! sinfo -h >/dev/null 2>&1; then
    SLURM_CI_NODES=2 bash scripts/slurm_up.sh && started+=(slurm)
  fi
  bash scripts/browser_up.sh
  if ! curl -sf http://127.0.0.1:5000/health >/dev/null 2>&1; then
    bash scripts/tracking_up.sh && started+=(tracking)
  fi
fi
.venv/bin/ruff check . || exit 1
# Where PYTHONDONTWRITEBYTECODE is set (these machines set it), every sweeper, worker and rank the
# suite starts compiles our modules again: compiled once here, each reads them (0.4 CPU-s of a small sweep's 11).
.venv/bin/python -m compileall -q sweeper trainer hydra_plugins tests
.venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
