"""A sweep's folder (hydra.sweep.dir): claimed by one sweep alone, released when refused, and the
line a sweep that could not close its runs leaves there for the next one.

The claim is a file created exclusively in the folder; Hydra's sweeper claims it before Hydra
writes its multirun.yaml there, the launcher finds it claimed (hydra_plugins/sweepscale_launcher/).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from pathlib import Path

NOTE_BYTES = 512
# Held by the claim while the sweep runs, given back when the disk fills: room for the store on the
# same disk to close the sweep's runs (SQLite's rollback journal holds the few pages each change
# touches); the sweep's end gives it back too, so a finished sweep keeps NOTE_BYTES.
RESERVE_BYTES = 256 * 1024
DISK_FULL = (
    "the disk is full where the sweep writes ({error}; its folder {folder}): {closed}. Free space, then "
    "python -m sweeper.sync {folder} records what trained, and the sweep run again runs only the rest"
)
CLOSED = "its runs are closed, each saying what it lacks"
LEFT_RUNNING = "what it could not record stays RUNNING until the next sweep closes it"
OWNER_FILE = ".sweepscale"  # created exclusively: the sweep that creates it owns the folder
JOB_FILES = ".submitit"  # the runners' files: submitit's jobs, the warm queues (launcher.folder unset)
_CLAIMED: set[Path] = set()  # this process's: the sweeper claims the folder, the launcher finds it claimed


class DiskFullError(Exception):
    """The disk filled while the sweep ran: ``full`` says what said so, ``closed`` whether its runs
    could still be closed (with the claim's reserve given back)."""

    def __init__(self, full: str, closed: bool) -> None:
        super().__init__(full)
        self.full, self.closed = full, closed


def claim_folder(base: Path) -> Path:
    """A sweep folder no other sweep writes: ``base``, or ``base-1``, ``base-2``... when another sweep
    (started in the same second, or given the same hydra.sweep.dir) holds it; its points' configs
    and Hydra's multirun.yaml would otherwise overwrite each other's."""
    if base in _CLAIMED:
        return base
    for n in itertools.count():
        folder = base if n == 0 else base.with_name(f"{base.name}-{n}")
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(folder / OWNER_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:  # room for note_end, and the reserve: both taken before the disk fills
            f.write(b" " * NOTE_BYTES + bytes(RESERVE_BYTES))
        _CLAIMED.add(folder)
        return folder
    raise AssertionError("unreachable")


def release_folder(folder: Path) -> None:
    """Remove a claimed sweep folder that holds nothing but its claim, Hydra's multirun.yaml and the
    runner's job files (a refused sbatch's; no point's folder), and its date folder and the one
    above (multirun/) where emptied."""
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {OWNER_FILE, "multirun.yaml", JOB_FILES}:
        for name in (OWNER_FILE, "multirun.yaml"):
            (folder / name).unlink(missing_ok=True)
        shutil.rmtree(folder / JOB_FILES, ignore_errors=True)
        folder.rmdir()
        with contextlib.suppress(OSError):  # another sweep's folder is in it
            folder.parent.rmdir()
            folder.parent.parent.rmdir()


def free_reserve(folder: Path) -> None:
    """Give the claim's reserve back to the disk (at the sweep's end, or to close its runs on a full
    disk); its note stays."""
    with contextlib.suppress(OSError):
        os.truncate(folder / OWNER_FILE, NOTE_BYTES)


def note_end(folder: Path, why: str) -> None:
    """Say in the claim why this sweep leaves its runs unclosed (its store cannot be written): written
    over the claim's own bytes, which a full disk still takes. The next sweep closes the runs with it."""
    with contextlib.suppress(OSError), open(folder / OWNER_FILE, "r+b") as f:
        f.write(why.encode()[:NOTE_BYTES].ljust(NOTE_BYTES))


def ending_note(folder: str | Path) -> str:
    """What :func:`note_end` left in a sweep's folder ("" where nothing, or no such folder)."""
    try:
        return (Path(folder) / OWNER_FILE).read_bytes()[:NOTE_BYTES].decode(errors="replace").strip()
    except OSError:
        return ""
