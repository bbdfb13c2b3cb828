"""Run by tests/test_trainer_runs.py on MPI ranks: print the addresses this rank listens on (TCP),
leaving out the sockets it inherited from its launcher."""

import os
from pathlib import Path

from mpi4py import MPI


def socket_inodes(pid: str) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


MPI.COMM_WORLD.Barrier()
mine = socket_inodes("self") - socket_inodes(str(os.getppid()))
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in Path(table).read_text().splitlines()[1:]:
        fields = row.split()
        if fields[3] == "0A" and fields[9] in mine:  # state LISTEN, one of this rank's sockets
            listening.append(fields[1].split(":")[0])
# Rank 0 prints every rank's line: lines of two ranks interleave on mpiexec's shared stdout.
rows = MPI.COMM_WORLD.gather(f"listening {MPI.COMM_WORLD.rank} {' '.join(sorted(listening))}")
if MPI.COMM_WORLD.rank == 0:
    print("\n".join(rows), flush=True)
MPI.COMM_WORLD.Barrier()
