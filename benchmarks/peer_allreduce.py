"""An all-reduce between the GPUs of one node by their copy engines: no SMs taken but a small sum.

An experiment, not used by the trainer: measured against NCCL (benchmarks/gpu_allreduce.py), it
took 80 to 105 us where NCCL takes 33 to 49 (docs/benchmarks.md, "The all-reduce alone").

NCCL's all-reduce runs as kernels, and beside the step's GEMMs its blocks and theirs slow each
other (docs/benchmarks.md, "Scaling with NCCL"). Here the data moves by DMA: every rank's buffer
is mapped into the others' address space (CUDA IPC), cudaMemcpyAsync between them runs on the
copy engines over NVLink, and the ranks signal each other through flags in GPU memory that the
GPUs' front ends write and wait on (cuStreamWriteValue32 / cuStreamWaitValue32), so no host
synchronises with anything.

One call sums a range of the buffer in P equal chunks (P ranks), as a reduce-scatter then an
all-gather. Rank r, on its stream:
1. tells every peer that its values are complete (raises its READY flag in the peer's memory);
2. once a peer's READY flag is up (and lowered again), copies chunk r of that peer's range into
   its staging rows, then adds them to its own chunk r (one kernel, the only one);
3. copies the summed chunk r into every peer's buffer and raises its PUSHED flag there;
4. waits until every peer's PUSHED flag is up (and lowers it): its whole range is summed.
No rank writes a peer's chunk before that peer has read it: peer q reads chunk q of r's buffer in
its step 2, before it pushes the sum into the same place in its step 3. A peer raises a flag
again only in a later call, after it has seen this call's end from this rank; so every rank must
make the same calls in the same order, as with NCCL.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

READY, PUSHED = 0, 1  # the two flags per peer
ALIGN = 256  # bytes: chunks start on 256-byte boundaries, as the copy engines like them

_ADD = r"""
extern "C" __global__ void add_rows(T* own, const T* rows, long long n, long long stride, int count) {
    // own[i] += rows[0][i] + ... + rows[count - 1][i]
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        T s = own[i];
        for (int p = 0; p < count; ++p) s += rows[p * stride + i];
        own[i] = s;
    }
}
"""


class _StreamMemOps:
    """cuStreamWriteValue32 / cuStreamWaitValue32 from the driver (CuPy does not wrap them)."""

    GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self._write, self._wait = lib.cuStreamWriteValue32_v2, lib.cuStreamWaitValue32_v2
        for fn in (self._write, self._wait):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int

    def write(self, stream: int, addr: int, value: int) -> None:
        """Once the stream's earlier work is done (and visible: a fence comes first), *addr = value."""
        self._check(self._write(stream, addr, value, 0), "cuStreamWriteValue32")

    def wait(self, stream: int, addr: int, value: int) -> None:
        """The stream's later work waits until *addr >= value."""
        self._check(self._wait(stream, addr, value, self.GEQ), "cuStreamWaitValue32")

    @staticmethod
    def _check(result: int, name: str) -> None:
        if result:
            raise RuntimeError(f"{name} failed: CUresult {result}")


class PeerAllreduce:
    """Sum ranges of a flat device buffer over the ranks of one node, in place, by copy engines.

    The buffer is this object's (``buffer``, n elements): CUDA IPC maps whole allocations, so it
    has one of its own, with the flags after it. ``__call__``/``start``/``sum_on`` as
    NcclAllreduce's, on any contiguous view of ``buffer``. ``graphs``: each call replays a CUDA
    graph captured at the first call on that view (one launch instead of some forty
    API calls, and the graph's branches start without the CPU in between)."""

    def __init__(self, world: Any, n: int, dtype: Any, graphs: bool = True) -> None:
        import cupy as cp

        if world.local_size != world.size:
            raise ValueError(f"PeerAllreduce needs all ranks on one node ({world.size} ranks, {world.local_size} here)")
        rt = cp.cuda.runtime
        self.cp, self.rt, self.ops, self.graphs = cp, rt, _StreamMemOps(), graphs
        self.size, self.rank = world.size, world.rank
        self.dtype = np.dtype(dtype)
        self.item = self.dtype.itemsize
        self.n = n
        self.flags_at = ALIGN * -(-n * self.item // ALIGN)
        self.memory = cp.cuda.Memory(self.flags_at + 4 * 2 * self.size)  # cudaMalloc'd, not pooled
        self.base = self.memory.ptr
        self.buffer = cp.ndarray((n,), self.dtype, cp.cuda.MemoryPointer(self.memory, 0))
        rt.memset(self.base + self.flags_at, 0, 4 * 2 * self.size)
        rt.deviceSynchronize()
        handles = world.comm.allgather(rt.ipcGetMemHandle(self.base))
        self.peers = [q for q in range(self.size) if q != self.rank]
        self.remote = {q: rt.ipcOpenMemHandle(handles[q], rt.cudaIpcMemLazyEnablePeerAccess) for q in self.peers}
        world.comm.Barrier()  # every rank's flags are down before anyone raises one
        self.per_chunk = self._chunk(n)
        self.staging = cp.empty((max(self.size - 1, 1), self.per_chunk), dtype=self.dtype)
        self.rows = [row.data.ptr for row in self.staging]  # a view per call would cost CPU time
        ctype = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}[self.dtype]
        self._add = cp.RawKernel(f"typedef {ctype} T;\n" + _ADD, "add_rows")
        # Compiled and loaded now, not while a graph is being captured: an empty launch.
        self._add((1,), (32,), (np.uint64(self.base), self.staging, np.int64(0), np.int64(0), np.int32(0)))
        self.blocks = 2 * cp.cuda.Device().attributes["MultiProcessorCount"]
        # One stream per peer, so that the copies to and from different peers can run at once
        # (measured no faster than one stream, docs/benchmarks.md); events fork and join them.
        high = -100  # clamped to the highest priority, as NcclAllreduce's side stream
        self.branch = [rt.streamCreateWithPriority(rt.streamNonBlocking, high) for _ in self.peers]
        self.fork = cp.cuda.Event(disable_timing=True)
        self.joined = [cp.cuda.Event(disable_timing=True) for _ in self.peers]
        self._graphs: dict[tuple[int, int], Any] = {}
        self.capture = cp.cuda.Stream(non_blocking=True)
        self._streams: dict[int, Any] = {}
        self.side = rt.streamCreateWithPriority(rt.streamNonBlocking, high)
        self.ready = cp.cuda.Event(disable_timing=True)

    def _chunk(self, length: int) -> int:
        """Elements per rank's chunk of a range of ``length``: a 1/P share, whole 256-byte blocks."""
        per, share = ALIGN // self.item, -(-length // self.size)
        return per * -(-share // per)

    def _flag(self, base: int, kind: int, q: int) -> int:
        return base + self.flags_at + 4 * (kind * self.size + q)

    def _stream(self, ptr: int) -> Any:
        if ptr not in self._streams:
            self._streams[ptr] = self.cp.cuda.ExternalStream(ptr)
        return self._streams[ptr]

    def __call__(self, buf: Any) -> None:
        self.sum_on(buf, self.cp.cuda.get_current_stream().ptr)

    def start(self, buf: Any, done: Any) -> None:
        """As NcclAllreduce.start: the sum on a side stream once the current stream's work is done."""
        self.ready.record()
        self.rt.streamWaitEvent(self.side, self.ready.ptr)
        self.sum_on(buf, self.side)
        self.rt.eventRecord(done.ptr, self.side)

    def sum_on(self, buf: Any, stream: int) -> None:
        """Queue the in-place sum of ``buf`` (a contiguous view of ``buffer``) on the stream ``stream``."""
        if self.size == 1:
            return
        first = (buf.data.ptr - self.base) // self.item
        if buf.data.ptr < self.base or first + buf.size > self.n or not buf.flags.c_contiguous:
            raise ValueError("PeerAllreduce sums contiguous views of its own buffer only")
        if not self.graphs:
            self._queue(first, buf.size, stream)
            return
        key = (first, buf.size)  # the graph is the same whichever stream it is launched on
        if key not in self._graphs:
            self.capture.begin_capture()
            self._queue(first, buf.size, self.capture.ptr)
            self._graphs[key] = self.capture.end_capture()
        self._graphs[key].launch(self._stream(stream))

    def _queue(self, first: int, length: int, stream: int) -> None:
        """The four steps of the module's docstring for elements [first, first + length), on
        ``stream`` and the branch streams. A flag is raised (1) by the peer and lowered (0) by its
        owner once seen: the peer raises it again only in a later call, after this one's end."""
        chunk = self._chunk(length)
        lo = first + min(self.rank * chunk, length)
        count = first + min((self.rank + 1) * chunk, length) - lo  # this rank's chunk, maybe short or empty
        nbytes, at = count * self.item, lo * self.item
        ops, rt, copy = self.ops, self.rt, self.rt.memcpyDefault
        for q in self.peers:
            ops.write(stream, self._flag(self.remote[q], READY, self.rank), 1)
        self._fork(stream)
        for i, q in enumerate(self.peers):  # 2. chunk r of each peer's range into the staging rows
            mine = self._flag(self.base, READY, q)
            ops.wait(self.branch[i], mine, 1)
            ops.write(self.branch[i], mine, 0)
            if count:
                rt.memcpyAsync(self.rows[i], self.remote[q] + at, nbytes, copy, self.branch[i])
        self._join(stream)
        if count:
            with self._stream(stream):  # the kernel runs on CuPy's current stream
                self._add(
                    (min(self.blocks, -(-count // 256)),), (256,),
                    (np.uint64(self.base + at), self.staging, np.int64(count), np.int64(self.per_chunk),
                     np.int32(len(self.peers))),
                )  # fmt: skip
        self._fork(stream)
        for i, q in enumerate(self.peers):  # 3. and 4. the sum into each peer's buffer; theirs into ours
            if count:
                rt.memcpyAsync(self.remote[q] + at, self.base + at, nbytes, copy, self.branch[i])
            ops.write(self.branch[i], self._flag(self.remote[q], PUSHED, self.rank), 1)
            mine = self._flag(self.base, PUSHED, q)
            ops.wait(self.branch[i], mine, 1)
            ops.write(self.branch[i], mine, 0)
        self._join(stream)

    def _fork(self, stream: int) -> None:
        self.rt.eventRecord(self.fork.ptr, stream)
        for b in self.branch:
            self.rt.streamWaitEvent(b, self.fork.ptr)

    def _join(self, stream: int) -> None:
        for b, e in zip(self.branch, self.joined):
            self.rt.eventRecord(e.ptr, b)
            self.rt.streamWaitEvent(stream, e.ptr)
