"""strata.aio: asynchronous tensor reads and writes to files on NVMe.

    h = strata.aio.Handle(block_size=1 << 20, queue_depth=32)
    buf = strata.aio.pinned_empty(1 << 20, dtype="float32", like="torch")
    h.pwrite(buf, "/mnt/nvme/x.bin", 0)
    h.wait()                 # -> 1 (requests finished)
    h.pread(buf, "/mnt/nvme/x.bin", 0)
    h.wait()

A Handle queues each request in block_size pieces on strata's I/O layer
(io_uring; the POSIX thread pool where io_uring is refused) and wait()
finishes them all, returning how many requests finished and raising the
first failure (FileNotFoundError, PermissionError, OSError carrying the
file, offset and errno) once all are done. Tensors and arrays are
written and read in place, zero copy; keep them untouched until wait()
returns (the handle keeps them alive until then).

Threads may share a handle: every call releases the GIL while it works
or waits. sync_pread / sync_pwrite wait for their own request only;
wait() finishes every request queued with pread / pwrite / async_* by any
thread and counts them all.

O_DIRECT (no page cache) needs the buffer address, the file offset and
the length to be multiples of 4096 and a filesystem that supports it.
`direct` says what to do otherwise:

    "prefer" (default)  unaligned requests, and files on tmpfs, go through
                        the page cache; aligned ones are direct
    "require"           they are refused: ValueError (unaligned), or
                        ValueError naming the filesystem (tmpfs)
    "off"               everything goes through the page cache

pinned_empty() / new_cpu_locked_tensor() allocate page-aligned buffers
locked in RAM (mlock), the kind O_DIRECT and GPU copies want.
"""
import sys
import threading

from . import _strata

__all__ = ["Handle", "aio_handle", "pinned_empty", "new_cpu_locked_tensor"]

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1, "float64": 8, "int32": 4,
             "int64": 8, "int16": 2, "uint16": 2, "bool": 1}


def _bytes_of(x, name):
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{name}: a tensor on {x.device}; strata.aio reads and writes CPU memory")
        if not x.is_contiguous():
            raise ValueError(f"{name}: not contiguous")
        return x.data_ptr(), x.numel() * x.element_size()
    if np is not None and isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: not contiguous")
        return x.__array_interface__["data"][0], x.nbytes
    raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")


class Handle:
    """Asynchronous reads and writes of whole tensors at file offsets.

    block_size: bytes per I/O request (any; 1 MiB default; one that is not
    a multiple of 4096 sends requests larger than it through the page cache);
    queue_depth: requests in flight; intra_op_parallelism: threads of the
    POSIX fallback; direct: "prefer", "require" or "off" (module doc);
    backend: "auto" (io_uring, else POSIX), "uring" or "posix".
    single_submit and overlap_events are DeepSpeed's and accepted for
    compatibility: strata always submits in batches and overlaps.
    """

    def __init__(self, block_size=1 << 20, queue_depth=32, single_submit=False, overlap_events=True,
                 intra_op_parallelism=1, *, direct="prefer", backend="auto"):
        del single_submit, overlap_events
        self._h = _strata.AioHandle(int(block_size), int(queue_depth), int(intra_op_parallelism), str(direct),
                                    str(backend))
        self._keep = {}  # request id -> its buffer, until a wait() finishes it
        self._keep_lock = threading.Lock()

    @property
    def backend(self):
        """The I/O engine in use: "io_uring" or the POSIX pool's name."""
        return self._h.backend

    def pwrite(self, buffer, path, offset=0):
        """Queues a write of the whole of `buffer` to `path` at `offset` (the file is created if missing)."""
        address, nbytes = _bytes_of(buffer, "buffer")
        request = self._h.pwrite(address, nbytes, _path(path), _offset(offset), False)
        with self._keep_lock:
            self._keep[request] = buffer

    def pread(self, buffer, path, offset=0):
        """Queues a read filling the whole of `buffer` from `path` at `offset` (past the end: an error)."""
        address, nbytes = _bytes_of(buffer, "buffer")
        if getattr(getattr(buffer, "flags", None), "writeable", True) is False:
            raise ValueError("buffer: a read-only array cannot be read into")
        request = self._h.pread(address, nbytes, _path(path), _offset(offset), False)
        with self._keep_lock:
            self._keep[request] = buffer

    def wait(self):
        """Finishes every queued request; returns how many finished. Raises the first failure."""
        try:
            return self._h.wait()
        finally:
            self._release_finished()

    def _release_finished(self):
        # The buffers of requests a wait() finished (this thread's or
        # another's); those still queued stay referenced.
        live = set(self._h.pending_ids())
        with self._keep_lock:
            for request in [r for r in self._keep if r not in live]:
                del self._keep[request]

    def pending(self):
        """Requests queued with pread / pwrite / async_* and not yet waited for."""
        return len(self._h.pending_ids())

    def close(self):
        """Waits, then closes the files this handle opened."""
        try:
            self.wait()
        finally:
            self._h.close()

    # DeepSpeed's aio_handle names.
    def async_pwrite(self, buffer, path, offset=0):
        return self.pwrite(buffer, path, offset)

    def async_pread(self, buffer, path, offset=0):
        return self.pread(buffer, path, offset)

    def sync_pwrite(self, buffer, path, offset=0):
        """Writes the whole of `buffer` to `path` at `offset` and waits for that write alone; returns 1."""
        address, nbytes = _bytes_of(buffer, "buffer")
        return self._h.wait_for(self._h.pwrite(address, nbytes, _path(path), _offset(offset), True))

    def sync_pread(self, buffer, path, offset=0):
        """Fills the whole of `buffer` from `path` at `offset` and waits for that read alone; returns 1."""
        address, nbytes = _bytes_of(buffer, "buffer")
        if getattr(getattr(buffer, "flags", None), "writeable", True) is False:
            raise ValueError("buffer: a read-only array cannot be read into")
        return self._h.wait_for(self._h.pread(address, nbytes, _path(path), _offset(offset), True))

    def new_cpu_locked_tensor(self, numel, example):
        """A locked, page-aligned tensor of `numel` elements of `example`'s dtype."""
        return new_cpu_locked_tensor(numel, example)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


aio_handle = Handle


def _path(path):
    import os
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError(f"path: expected a file name, got {path!r}")
    return path


def _offset(offset):
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset: expected an int, got {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"offset: expected >= 0, got {offset}")
    return offset


def pinned_empty(numel, dtype="float32", like="numpy", lock=True):
    """A zero-filled, 4096-byte-aligned array or tensor of `numel` elements,
    locked in RAM unless lock=False (an OSError naming RLIMIT_MEMLOCK where
    the limit refuses). dtype: a name ("float32", "bfloat16", ...) or a
    numpy / torch dtype; like: "numpy" or "torch"."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel: expected an int >= 0, got {numel!r}")
    name = str(dtype).replace("torch.", "")
    if name not in _ITEMSIZE:
        raise TypeError(f"dtype: {dtype} is not supported (one of {', '.join(sorted(_ITEMSIZE))})")
    raw = _strata.aligned_buffer(numel * _ITEMSIZE[name], bool(lock))
    if like == "torch":
        import torch
        return torch.from_numpy(raw).view(getattr(torch, name)) if numel else torch.empty(0, dtype=getattr(torch, name))
    if like != "numpy":
        raise ValueError(f"like: expected 'numpy' or 'torch', got {like!r}")
    if name == "bfloat16":
        raise TypeError("dtype: numpy has no bfloat16 (like='torch' makes one)")
    return raw.view(name)


def new_cpu_locked_tensor(numel, example):
    """DeepSpeed's name: a locked tensor of `numel` elements of `example`'s dtype."""
    return pinned_empty(int(numel), dtype=example.dtype, like="torch")
