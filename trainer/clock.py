"""Per-phase timing of each batch that does not stall the device.

On the GPU a CUDA event is recorded into the stream at every phase boundary and the events are
read once per epoch, so timing adds no synchronisation to the step. On the CPU work is
synchronous and ``time.perf_counter`` is exact. Every batch's durations are kept, so the spread
(quartiles) is known as well as the median.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


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

    def quantiles(self, q: float) -> dict[str, float]:
        """Quantile ``q`` (0.5: the median) of each phase's milliseconds over every batch timed so far."""
        self.flush()
        return {p: float(np.quantile(v, q)) for p, v in self.samples.items() if v}

    def medians(self) -> dict[str, float]:
        return self.quantiles(0.5)
