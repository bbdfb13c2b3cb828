"""NCCL through ctypes: the communicator, the in-place all-reduce, and symmetric memory windows.

CuPy's binding (cupy.cuda.nccl) has no calls for NCCL's memory windows (NCCL 2.27 and later):
``ncclMemAlloc`` memory registered on every rank with ``ncclCommWindowRegister(...,
NCCL_WIN_COLL_SYMMETRIC)`` lets NCCL run its symmetric kernels, which read and write the peers'
buffers directly over NVLink. So the trainer talks to the library CuPy loaded (the same
libnccl) itself, with these few calls.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

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
