"""How our processes end (trainer/ranks/processes.py) and how waiting ranks wait (trainer/ranks/parallel.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
