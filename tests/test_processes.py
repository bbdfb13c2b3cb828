"""How our processes end (trainer/ranks/processes.py) and how waiting ranks wait (trainer/ranks/parallel.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

# A process with what a sweeper holds at its end: a pool of drawing children (stopped), a thread
# pool, an atexit handler, output in a buffer; exit_now must run the handler, flush, and end.
ENDING = textwrap.dedent(
    """
    import atexit, sys
    from concurrent.futures import ThreadPoolExecutor
    from sweeper.report import drawing
    from trainer.ranks.processes import run_then_exit

    def main():
        atexit.register(lambda: print("atexit ran"))
        drawing.warm_up(2)
        print("drawn", drawing.draw(sum, [1, 2]).result())
        drawing.stop()
        ThreadPoolExecutor(1).submit(int).result()
        sys.stdout.write("buffered, no newline")
        sys.exit(int(sys.argv[1]))

    if __name__ == "__main__":
        run_then_exit(main)
    """
)


def test_exit_now_ends_with_the_status_after_handlers_and_pools(tmp_path):
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    for status in (0, 3):
        done = subprocess.run(
            [sys.executable, str(script), str(status)], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == status, done.stderr
        assert done.stdout.splitlines() == ["drawn 3", "buffered, no newlineatexit ran"]


WAITING = textwrap.dedent(
    """
    import os, sys, time
    from trainer.ranks import parallel
    world = parallel.join_world(2)
    before = os.times()
    if world.rank == 0:
        time.sleep(1.5)  # rank 0 records; rank 1 waits
    if sys.argv[1] == "asleep":
        parallel.wait_for_all(world.comm)
    world.comm.bcast("point" if world.rank == 0 else None)
    after = os.times()
    if world.rank == 1:
        print(round(after.user + after.system - before.user - before.system, 2))
    """
)


def test_a_rank_waiting_for_rank_0_sleeps(tmp_path):
    """Real ranks: MPI's blocking wait burns a core for as long as it waits; wait_for_all does not."""
    from trainer.ranks import parallel

    script = tmp_path / "waiting.py"
    script.write_text(WAITING)
    mpiexec = parallel.find_mpiexec(None)
    cpu = {}
    for how in ("spinning", "asleep"):
        done = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, str(script), how],
            cwd=ROOT,
            env=parallel.mpiexec_env() | {"PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        cpu[how] = float(done.stdout.strip())
    assert cpu["asleep"] < 0.3 and cpu["spinning"] > 2 * cpu["asleep"], cpu


# Rank 0 never comes to the collective (a SIGTERM ends it before); rank 1 waits in it. Both get a
# SIGTERM, as every rank of a worker does at a Ctrl-C or a scancel.
ONE_NEVER_COMES = textwrap.dedent(
    """
    import os, sys, time
    from trainer.ranks import parallel, sigterm

    sigterm.install()
    world = parallel.join_world(2)
    with open(f"{sys.argv[2]}/{world.rank}.pid", "w") as f:
        f.write(str(os.getpid()))
    try:
        if world.rank == 0:
            time.sleep(120)
        elif sys.argv[1] == "share":
            parallel.share(world.comm, None)
        elif sys.argv[1] == "agree":
            parallel.agree(world.comm, 1, "min")
        elif sys.argv[1] == "gradient sum":
            import numpy as np
            from trainer.ranks.allreduce import HostAllreduce
            HostAllreduce(world, np, 1000, np.float64)(np.ones(1000))
        else:
            from trainer.lifecycle import requeue
            requeue.warned(world.comm)
    except sigterm.Terminated:
        print(f"rank {world.rank} terminated", flush=True)
    """
)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split()[3])
    except OSError:  # ended
        return None


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["share", "agree", "gradient sum", "epoch end"])
def test_a_rank_waiting_for_a_peer_that_sigterm_ended_ends_on_its_own_sigterm(tmp_path, how):
    """A warm worker's ranks between points: a blocking bcast or allreduce held rank 1 for good (a
    Python handler never runs inside MPI), so the worker outlived its sweep; asleep, both ranks end.
    So too in a step's gradient sum and at an epoch's end: a scancel's run was once recorded FAILED,
    not KILLED, because rank 0 waited there for a rank 1 that its SIGTERM had already ended."""
    from trainer.ranks import parallel

    script = tmp_path / "never.py"
    script.write_text(ONE_NEVER_COMES)
    cmd = [parallel.find_mpiexec(None), "-n", "2", sys.executable, str(script), how, str(tmp_path)]
    env = parallel.mpiexec_env() | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.pid"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a pid file whole, rank 1 in the collective
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("*.pid"))]
    try:
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proxies = [parent for pid in pids if (parent := _parent(pid)) is not None]
        for pid in [*pids, *proxies, proc.pid]:  # a rank still waiting too, and its launcher
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "rank 0 terminated" in out and "rank 1 terminated" in out, out


def test_a_rank_alone_starts_mpi_without_a_daemon_and_passes_no_setting_on():
    """A one-rank world started without mpiexec (a warm worker, `python -m trainer`): Open MPI's
    singleton settings (no daemon, its own transports) hold only while MPI starts, so that an
    mpiexec this process runs later does not pass them to its ranks; a setting the user gave stays."""
    probe = textwrap.dedent(
        """
        import os
        from trainer.ranks import parallel
        world = parallel.join_world(1)
        print(world.size, sorted(k for k in os.environ if k.startswith("OMPI_MCA_")))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))}
    alone = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 0 and alone.stdout.split() == ["1", "[]"], alone.stdout + alone.stderr
    given = {**env, "OMPI_MCA_pml": "ob1"}
    kept = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=given, capture_output=True, text=True, timeout=60
    )
    assert kept.returncode == 0 and kept.stdout.split() == ["1", "['OMPI_MCA_pml']"], kept.stdout + kept.stderr
