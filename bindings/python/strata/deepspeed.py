"""strata.deepspeed: DeepSpeed's names with DeepSpeed's semantics, for a
DeepSpeed user who changes one import and nothing else.

    # from deepspeed.ops.op_builder import AsyncIOBuilder
    from strata.deepspeed import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle(1 << 20, 128, False, False, 1)
    assert h.async_pwrite(tensor, "/mnt/nvme/x.bin") == 0
    assert h.wait() == 1

aio_handle is strata.aio.Handle under DeepSpeed's signatures, defaults and
return values: pread / pwrite take (buffer, filename, validate, async,
file_offset) and return 1 when synchronous, 0 when asynchronous (wait()
then counts the requests it finished); sync_* return 1, async_* 0;
read / write move a whole file; async_pwrite also takes an open file
descriptor; the handle reports its settings through DeepSpeed's getters.
validate=True reads the bytes back through the page cache after the
request finishes and raises ValueError naming the file and offset of the
first byte that differs (DeepSpeed compares and prints). Every strata.aio
guarantee holds: any thread may share a handle, the GIL is released
while it works, errors are exceptions naming the file.
"""
import os
import sys

from . import aio as _aio

__all__ = ["aio_handle", "AsyncIOBuilder"]


def _bytes(buffer):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buffer, torch.Tensor):
        return buffer.detach().contiguous().view(torch.uint8).numpy().tobytes()
    return memoryview(buffer).cast("B").tobytes()


def _async(async_op, kw):
    # DeepSpeed's keyword is `async`, which Python code can only pass as
    # **{"async": ...}: take it, or async_op, and nothing else.
    extra = set(kw) - {"async"}
    if extra:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(extra))}")
    if "async" in kw:
        if async_op is not None:
            raise TypeError("async and async_op given both")
        async_op = kw["async"]
    if async_op is None:
        raise TypeError("missing the async argument (DeepSpeed's 4th: True or False)")
    return bool(async_op)


def _fd_path(fd):
    if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
        raise TypeError(f"fd: expected an open file descriptor, got {fd!r}")
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        raise OSError(e.errno, f"fd {fd} is not an open file descriptor") from e


class aio_handle:  # noqa: N801: DeepSpeed's name
    """DeepSpeed's aio_handle(block_size, queue_depth, single_submit,
    overlap_events, intra_op_parallelism) over strata's I/O layer.

    single_submit and overlap_events are kept for their getters: strata
    always submits in batches and overlaps (docs/PYTHON.md says why).
    """

    def __init__(self, block_size=1 << 20, queue_depth=128, single_submit=False, overlap_events=False,
                 intra_op_parallelism=1):
        self._h = _aio.Handle(block_size, queue_depth, intra_op_parallelism=intra_op_parallelism)
        self._block_size = int(block_size)
        self._queue_depth = int(queue_depth)
        self._single_submit = bool(single_submit)
        self._overlap_events = bool(overlap_events)
        self._intra_op_parallelism = int(intra_op_parallelism)
        self._to_validate = []  # (buffer, filename, file_offset) of async requests asked to validate

    def get_block_size(self):
        return self._block_size

    def get_queue_depth(self):
        return self._queue_depth

    def get_single_submit(self):
        return self._single_submit

    def get_overlap_events(self):
        return self._overlap_events

    def get_intra_op_parallelism(self):
        return self._intra_op_parallelism

    get_thread_count = get_intra_op_parallelism  # DeepSpeed's earlier name

    def _validate(self, buffer, filename, file_offset):
        want = _bytes(buffer)
        with open(filename, "rb") as f:
            got = os.pread(f.fileno(), len(want), file_offset)
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise ValueError(f"validate: {filename} at offset {file_offset + first} differs from the buffer "
                             f"({len(got)} of {len(want)} bytes read back)")

    def _io(self, sync_call, async_call, buffer, filename, validate, async_op, file_offset, kw):
        # pread and pwrite: 0 when asynchronous (wait() finishes and
        # validates it), else the synchronous call's 1, validated now.
        if _async(async_op, kw):
            async_call(buffer, filename, file_offset)
            if validate:
                self._to_validate.append((buffer, filename, file_offset))
            return 0
        done = sync_call(buffer, filename, file_offset)
        if validate:
            self._validate(buffer, filename, file_offset)
        return done

    def pread(self, buffer, filename, validate, async_op=None, file_offset=0, **kw):
        """Reads `buffer`'s size from `filename` at `file_offset`; 0 when async_op (wait() finishes it), else 1."""
        return self._io(self._h.sync_pread, self._h.async_pread, buffer, filename, validate, async_op, file_offset,
                        kw)

    def pwrite(self, buffer, filename, validate, async_op=None, file_offset=0, **kw):
        """Writes `buffer` to `filename` at `file_offset`; 0 when async_op (wait() finishes it), else 1."""
        return self._io(self._h.sync_pwrite, self._h.async_pwrite, buffer, filename, validate, async_op, file_offset,
                        kw)

    def read(self, buffer, filename, validate):
        """Reads the whole of `filename` into `buffer` (their sizes must match); returns 1."""
        size = os.path.getsize(filename)
        nbytes = _aio._bytes_of(buffer, "buffer")[1]
        if size != nbytes:
            raise ValueError(f"read: {filename} holds {size} bytes, the buffer {nbytes}")
        return self.pread(buffer, filename, validate, False, 0)

    def write(self, buffer, filename, validate):
        """Writes `buffer` as the file `filename` from its start; returns 1."""
        return self.pwrite(buffer, filename, validate, False, 0)

    def sync_pread(self, buffer, filename, file_offset=0):
        return self._h.sync_pread(buffer, filename, file_offset)

    def sync_pwrite(self, buffer, filename, file_offset=0):
        return self._h.sync_pwrite(buffer, filename, file_offset)

    def async_pread(self, buffer, filename, file_offset=0):
        self._h.async_pread(buffer, filename, file_offset)
        return 0

    def async_pwrite(self, buffer, filename, file_offset=0):
        """`filename`: a path, or an open file descriptor (DeepSpeed's fd overload)."""
        path = _fd_path(filename) if isinstance(filename, int) and not isinstance(filename, bool) else filename
        self._h.async_pwrite(buffer, path, file_offset)
        return 0

    def wait(self):
        """Finishes every asynchronous request; returns how many finished. Raises the first failure."""
        pending, self._to_validate = self._to_validate, []
        done = self._h.wait()
        for buffer, filename, file_offset in pending:
            self._validate(buffer, filename, file_offset)
        return done

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A page-aligned tensor of `num_elem` elements of `example_tensor`'s dtype, locked in RAM."""
        return _aio.new_cpu_locked_tensor(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor):
        """Frees a tensor from new_cpu_locked_tensor: its memory goes with its last reference."""
        del tensor
        return True


class AsyncIOBuilder:
    """DeepSpeed's op builder for the aio op: load() returns the module
    whose aio_handle is this one; strata's needs no compiling."""

    NAME = "async_io"

    def is_compatible(self, verbose=False):
        del verbose
        return True

    def load(self, verbose=False):
        del verbose
        return sys.modules[__name__]
