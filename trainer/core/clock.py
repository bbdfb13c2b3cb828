"""Per-phase timing of each batch that does not stall the device.

On the GPU a CUDA event is recorded into the stream at every phase boundary and the events are
read once per epoch, so timing adds no synchronisation to the step. On the CPU work is
synchronous and ``time.perf_counter`` is exact. Every batch's durations are kept, so the spread
(quartiles, trainer/core/timing.py) is known as well as the median.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

_IMPORTED = time.time()  # process_start's fallback: as early as this module is imported


@cache
def process_start() -> float:
    """When this process started, as a ``time.time()`` value. Linux: its start in the kernel's boot
    clock (/proc/self/stat field 22, clock ticks), put on the wall clock through CLOCK_BOOTTIME
    (/proc/stat's btime is whole seconds only); elsewhere, when trainer.core.clock was first imported."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": comm may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: the 20th after comm
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return _IMPORTED


class PhaseClock:
    def __init__(self, phases: tuple[str, ...], gpu: bool, nvtx: bool = False) -> None:
        self.phases = phases
        self.gpu = gpu
        self.nvtx = None
        if nvtx and gpu:  # ranges per phase for Nsight Systems, as the course's code had
            from cupy.cuda import nvtx as cupy_nvtx

            self.nvtx = cupy_nvtx
        self.samples: dict[str, list[float]] = {p: [] for p in (*phases, "batch")}
        self._batch: list[Any] = []
        self._host0 = 0.0  # perf_counter at the batch's start: on the GPU, "queue" is the CPU's time to queue it
        self.first_start: float | None = None  # time.time() at the first batch's start: the time to first batch
        self._pending: list[list[Any]] = []
        if gpu:
            import cupy

            self._cupy = cupy

    def _now(self) -> Any:
        if not self.gpu:
            return time.perf_counter()
        event = self._cupy.cuda.Event()
        event.record()
        return event

    def start(self) -> None:
        if self.first_start is None:
            self.first_start = time.time()
        self._host0 = time.perf_counter()
        self._batch = [self._now()]
        if self.nvtx:
            self.nvtx.RangePush(self.phases[0])

    def mark(self) -> None:
        """End the next phase (in the order of ``phases``)."""
        self._batch.append(self._now())
        done = len(self._batch) - 1
        if self.nvtx:
            self.nvtx.RangePop()
            if done < len(self.phases):
                self.nvtx.RangePush(self.phases[done])
        if done == len(self.phases):
            self._pending.append(self._batch)
            if self.gpu:  # the host's time to queue the batch: near the GPU's, the GPU waits for its launches
                self.samples.setdefault("queue", []).append((time.perf_counter() - self._host0) * 1e3)

    def _ms(self, a: Any, b: Any) -> float:
        if not self.gpu:
            return (b - a) * 1e3
        return self._cupy.cuda.get_elapsed_time(a, b)

    def flush(self) -> None:
        """Turn the marks recorded so far into durations (waits for the last event on the GPU)."""
        if self._pending and self.gpu:
            self._pending[-1][-1].synchronize()
        for marks in self._pending:
            for phase, a, b in zip(self.phases, marks, marks[1:]):
                self.samples[phase].append(self._ms(a, b))
            self.samples["batch"].append(self._ms(marks[0], marks[-1]))
        self._pending = []

    def since(self, first: int) -> dict[str, list[float]]:
        """Every phase's milliseconds from batch ``first`` (0-based) on: the timed sample."""
        self.flush()
        return {p: v[first:] for p, v in self.samples.items() if v}
