"""Where a command's CPU goes, by kind of process: the whole machine sampled while it runs.

    python benchmarks/cpu_by_process.py -- make test
    python benchmarks/cpu_by_process.py --every 1 -- python -m sweeper -m hidden=8,16 epochs=2

Every ``--every`` seconds each process's CPU time so far (utime + stime in /proc/PID/stat) is read;
a process counts with the last value seen, so one that lived less than a sample is missed (the
total below says how much that was). Processes are grouped by what they run: ``python -m X`` by
X, xdist's workers, multiprocessing's children, anything else by its name (the kernel's threads,
daemons such as slurmd or postgres). The machine's busy time comes from /proc/stat.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

TICK = os.sysconf("SC_CLK_TCK")


def kind(name: str, argv: list[str]) -> str:
    """What a process is, for the table: the module a Python runs, else its name."""
    if not name.startswith("python") or len(argv) < 2:
        return name
    args = [a for a in argv[1:] if a not in ("-u", "-B", "-E", "-s", "-I")]  # flags that change no module
    if args[:1] == ["-m"] and len(args) > 1:
        return f"python -m {args[1]}"
    if "import sys;exec(eval(sys.stdin.readline()))" in " ".join(argv):
        return "pytest-xdist worker (in-process tests)"
    if any("multiprocessing.spawn" in a for a in argv):
        return "multiprocessing child (references, drawings)"
    return f"python {Path(argv[1]).name if not argv[1].startswith('-') else ' '.join(argv[1:3])[:40]}"


def sample(seen: dict[tuple[str, str], tuple[str, float]]) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            rest = stat[stat.rindex(")") + 2 :].split()
            key = (pid, rest[19])  # a pid with its start time: pids are reused
            cpu = (int(rest[11]) + int(rest[12])) / TICK
            if key not in seen:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                seen[key] = (kind(stat[stat.index("(") + 1 : stat.rindex(")")], argv), cpu)
            else:
                seen[key] = (seen[key][0], cpu)
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue


def busy() -> tuple[float, float]:
    """The machine's total and idle CPU seconds so far."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) / TICK, (fields[3] + fields[4]) / TICK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--top", type=int, default=20, help="rows shown")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    seen: dict[tuple[str, str], tuple[str, float]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(args.every):
            sample(seen)

    sample(seen)
    before = {key: cpu for key, (_, cpu) in seen.items()}  # what processes alive already had spent
    total0, idle0 = busy()
    start = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rc = subprocess.call(command)
    done.set()
    watcher.join()
    sample(seen)
    wall = time.monotonic() - start
    total1, idle1 = busy()
    used = (total1 - total0) - (idle1 - idle0)
    by_kind: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for key, (name, cpu) in seen.items():
        if cpu > before.get(key, 0.0):
            by_kind[name] += cpu - before.get(key, 0.0)
            count[name] += 1
    table = Table(title=f"{' '.join(command)}: exit {rc}, {wall:.0f} s on {os.cpu_count()} cores")
    for column in ("process", "count", "CPU s", "share"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for name, cpu in by_kind.most_common(args.top):
        table.add_row(name, str(count[name]), f"{cpu:.0f}", f"{cpu / used:.0%}")
    Console().print(table)
    sampled = sum(by_kind.values())
    print(
        f"machine busy {used:.0f} CPU s of {total1 - total0:.0f}; {sampled:.0f} seen in processes (short ones missed)"
    )
    sys.exit(rc)


if __name__ == "__main__":
    main()
