"""NCCL through ctypes: the communicator, the in-place all-reduce, and symmetric memory windows.

CuPy's binding (cupy.cuda.nccl) has no calls for NCCL's memory windows (NCCL 2.27 and later):
``ncclMemAlloc`` memory registered on every rank with ``ncclCommWindowRegister(...,
NCCL_WIN_COLL_SYMMETRIC)`` lets NCCL run its symmetric kernels, which read and write the peers'
buffers directly over NVLink. So the trainer talks to the library CuPy loaded (the same
libnccl) itself, with these few calls. NcclAllreduce is the all-reduce that
trainer/ranks/allreduce.py's make_allreduce gives the step on GPUs with NCCL.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Protocol

import numpy as np

from trainer.gpu.policy import OVERLAP_MAX_CTAS, WINDOW_CTAS


class World(Protocol):
    """What a communicator needs of the ranks' world (trainer/ranks/parallel.py World has it)."""

    comm: Any  # the MPI communicator: the unique id is broadcast through it
    rank: int
    size: int


FLOAT32, FLOAT64, SUM = 7, 8, 0  # ncclFloat32, ncclFloat64, ncclSum
WIN_COLL_SYMMETRIC = 0x01
WINDOWS_SINCE = 22700  # NCCL 2.27: ncclMemAlloc + ncclCommWindowRegister and the symmetric kernels
DTYPES = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]  # NCCL_UNIQUE_ID_BYTES


def library() -> ctypes.CDLL:
    """The libnccl that CuPy's binding loaded (importing it loads the library into the process)."""
    import cupy.cuda.nccl  # noqa: F401

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libnccl.so" in line}
    lib = ctypes.CDLL(min(paths) if paths else "libnccl.so.2")
    p, i, size, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "ncclGetVersion": [ctypes.POINTER(i)],
        "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
        "ncclCommInitRank": [cp, i, UniqueId, i],
        "ncclAllReduce": [p, p, size, i, i, p, p],
        "ncclGetErrorString": [i],
        "ncclGetLastError": [p],
    }
    for name, args in signatures.items():
        getattr(lib, name).argtypes = args
    lib.ncclGetErrorString.restype = lib.ncclGetLastError.restype = ctypes.c_char_p
    if version(lib) >= WINDOWS_SINCE:
        lib.ncclMemAlloc.argtypes = [cp, size]
        lib.ncclCommWindowRegister.argtypes = [p, p, size, cp, i]
    return lib


def version(lib: ctypes.CDLL) -> int:
    """NCCL's version code: 22803 for 2.28.3."""
    v = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(v))
    return v.value


class Communicator:
    """One rank's NCCL communicator. ``uid`` (``unique_id()`` on one rank, sent to all) and the
    rank's place in the world make it; every call raises with NCCL's own message if it fails."""

    def __init__(self, lib: ctypes.CDLL, uid: bytes, size: int, rank: int) -> None:
        self.lib, self.comm = lib, ctypes.c_void_p()
        self._check(
            "ncclCommInitRank",
            lib.ncclCommInitRank(ctypes.byref(self.comm), size, UniqueId.from_buffer_copy(uid), rank),
        )

    @staticmethod
    def unique_id(lib: ctypes.CDLL) -> bytes:
        uid = UniqueId()
        if lib.ncclGetUniqueId(ctypes.byref(uid)):
            raise RuntimeError("ncclGetUniqueId failed")
        return bytes(uid)

    def _check(self, call: str, result: int) -> None:
        if result:
            detail = self.lib.ncclGetLastError(self.comm) or b""
            raise RuntimeError(f"{call}: {self.lib.ncclGetErrorString(result).decode()} {detail.decode()}".strip())

    def all_reduce(self, ptr: int, count: int, dtype: int, stream: int) -> None:
        """Queue the in-place sum of ``count`` elements at device address ``ptr`` on ``stream``."""
        self._check("ncclAllReduce", self.lib.ncclAllReduce(ptr, ptr, count, dtype, SUM, self.comm, stream))

    def window_buffer(self, n: int, dtype: Any) -> Any:
        """A CuPy array of n elements in memory from ncclMemAlloc, registered on every rank as a
        symmetric window (a collective call: all ranks, same n). Lives with the process."""
        import cupy

        nbytes = n * np.dtype(dtype).itemsize
        ptr, win = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("ncclMemAlloc", self.lib.ncclMemAlloc(ctypes.byref(ptr), nbytes))
        flags = WIN_COLL_SYMMETRIC
        self._check(
            "ncclCommWindowRegister", self.lib.ncclCommWindowRegister(self.comm, ptr, nbytes, ctypes.byref(win), flags)
        )
        memory = cupy.cuda.UnownedMemory(ptr.value, nbytes, owner=self)
        return cupy.ndarray((n,), dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


class NcclAllreduce:
    """Sum a flat device buffer over all ranks with NCCL, in place: on the current stream
    (``__call__``), or on a side stream beside the compute (``start``).

    The unique id travels over MPI; each rank must have a GPU of its own. ``beside_gemm`` caps the
    thread blocks NCCL takes per GPU (NCCL_MAX_CTAS, unless the environment sets it: policy.py
    OVERLAP_MAX_CTAS): fewer blocks take longer alone but slow a concurrent GEMM less.
    ``window``: ``empty`` gives buffers in an NCCL symmetric memory window where the library has
    them (NCCL 2.27+), so NCCL can sum them with its symmetric kernels; the
    buffer to sum must come from ``empty`` for that. ``window_state`` says what was done."""

    via = "nccl"  # how the sums go (trainer/core/flops.py COMMS)
    overlaps = True  # start / sum_on: a part summed on a stream of its own while the step computes
    capturable = True  # NCCL's sums are kernels on the stream: a CUDA graph replays them

    def __init__(self, world: World, dtype: Any, beside_gemm: bool = False, window: bool = False) -> None:
        import cupy

        max_ctas = OVERLAP_MAX_CTAS if beside_gemm else None
        if max_ctas:  # NCCL reads it when the process's first communicator is created
            os.environ.setdefault("NCCL_MAX_CTAS", str(max_ctas))
        if window:
            os.environ.setdefault("NCCL_SYM_CTAS", str(WINDOW_CTAS))
        lib = library()
        uid = world.comm.bcast(Communicator.unique_id(lib) if world.rank == 0 else None)
        self.comm = Communicator(lib, uid, world.size, world.rank)
        self.cupy, self.dtype, self.nccl_dtype = cupy, np.dtype(dtype), DTYPES[np.dtype(dtype)]
        if not window:
            self.window_state = "off"
        elif version(lib) < WINDOWS_SINCE:
            self.window_state = f"unavailable: NCCL {version(lib)} has no windows (2.27 or later)"
        else:
            self.window_state = "symmetric"
        # The side stream: non-blocking (no implicit synchronisation with the default stream) and
        # of the highest priority (-100 is clamped to it), so NCCL's blocks are scheduled ahead of
        # the compute's queued ones: the overlapped step at 4 GPUs took 0.62 ms so, 0.66 ms with a
        # default-priority stream (docs/benchmarks.md).
        self.runtime = runtime = cupy.cuda.runtime
        self.side = runtime.streamCreateWithPriority(runtime.streamNonBlocking, -100)  # lives with the process
        self.ready = cupy.cuda.Event(disable_timing=True)

    def empty(self, n: int) -> Any:
        """A device buffer of n elements for the sums: in the symmetric window when there is one
        (a collective call: every rank asks for the same n)."""
        if self.window_state == "symmetric":
            try:
                return self.comm.window_buffer(n, self.dtype)
            except RuntimeError as e:  # e.g. NCCL without cuMem (NCCL_CUMEM_ENABLE=0): sum a plain buffer
                self.window_state = f"unavailable: {e}"
        return self.cupy.empty(n, dtype=self.dtype)

    def __call__(self, buf: Any) -> None:
        self.sum_on(buf, self.cupy.cuda.get_current_stream().ptr)

    def start(self, buf: Any, done: Any) -> None:
        """Queue the sum of ``buf`` on the side stream once the work queued so far on the current
        stream is done, and record ``done`` (a cupy Event) after it. Nothing waits here: the
        caller makes its stream wait for ``done`` where it needs the sum."""
        self.ready.record()
        self.runtime.streamWaitEvent(self.side, self.ready.ptr)  # this record: ``ready`` may be recorded again
        self.sum_on(buf, self.side)
        self.runtime.eventRecord(done.ptr, self.side)

    def sum_on(self, buf: Any, stream: int) -> None:
        """Queue the in-place sum of ``buf`` on the stream with this handle."""
        self.comm.all_reduce(buf.data.ptr, buf.size, self.nccl_dtype, stream)
