"""strata.Session: a model of your own, trained by strata, from Python.

The C API's session (docs/C_API_SESSION.md) with the same contract: you
register your parameters as chunks, run your own forward and backward,
and strata keeps every byte of model state (working weights, gradients,
fp32 master weights, optimizer states) where the config puts it — device
slots, host RAM, NVMe — and updates each chunk on the CPU as its gradient
arrives.

    s = strata.Session({"optimizer": {"type": "adamw", "lr": 1e-3}, "precision": "fp32"})
    w = s.add_chunk("fc1", initial_values)        # float32 values (any shape)
    with s.step():                                # begin_step ... end_step
        x = s.acquire(w).numpy()                  # the weights, read-only, zero-copy
        ...forward...
        s.release(w)
        g = s.gradient_buffer(w).numpy()          # write the gradient here
        ...backward...
        s.submit_gradient(w)
    s.verdict                                     # the step's global norm, clipped, skipped, ...

A view (ChunkView) is valid from the call that gives it until the release
(weights) or submit (gradient) that ends it: converting it after that
(np.asarray, .numpy(), .torch()) raises. An array made from it before
shares its memory and is not checked: do not keep it past the release.
On the host backend the memory is ordinary memory, seen through
__array_interface__; on a GPU ("cuda") through __cuda_array_interface__
(torch.as_tensor). bf16 chunks show their bits as uint16 in NumPy and as
torch.bfloat16 in torch.

Every failure raises the exception of its status (ValueError for a bad
argument, RuntimeError for a call out of turn, MemoryError for a budget,
OSError for I/O...) with the status's name as its `status` attribute;
nothing changes then.
"""
import json

from . import _strata
from ._trainer import _config_text, _device

__all__ = ["Session", "ChunkView"]

_TYPESTR = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2"}


class ChunkView:
    """One chunk's memory on the session's device, without a copy: its
    working weights (read-only) or its gradient buffer (writable)."""

    def __init__(self, session, chunk, address, writable, what):
        self._session = session
        self.chunk = chunk
        self.name = session.chunk_name(chunk)
        self.count = session.chunk_count(chunk)
        self.dtype = session.chunk_dtype(chunk)
        self.writable = writable
        self._address = address
        self._what = what
        self._valid = True

    @property
    def valid(self):
        """False once the release or submit that ended it has come."""
        return self._valid

    def _end(self):
        self._valid = False

    def _interface(self):
        if not self._valid:
            raise RuntimeError(f"the {self._what} view of chunk {self.chunk} ({self.name!r}) was used after its "
                               f"{'submit' if self.writable else 'release'}")
        return {"shape": (self.count,), "typestr": _TYPESTR[self.dtype], "data": (self._address, not self.writable),
                "version": 3}

    @property
    def __array_interface__(self):
        if self._session.device != "host":
            raise AttributeError("a GPU's memory has no __array_interface__: use __cuda_array_interface__ (torch)")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if self._session.device != "cuda":
            raise AttributeError("the host backend's memory has no __cuda_array_interface__: use __array_interface__")
        d = self._interface()
        d["strides"] = None
        return d

    def numpy(self):
        """The chunk as a 1-D NumPy array sharing its memory (host backend)."""
        import numpy as np
        return np.asarray(self)

    def torch(self):
        """The chunk as a 1-D torch tensor sharing its memory (bf16 as torch.bfloat16)."""
        import torch
        if self._session.device == "cuda":
            if self.dtype == "bf16":
                d = dict(self._interface(), typestr="<i2")
                return torch.as_tensor(_Interface(cuda=d), device="cuda").view(torch.bfloat16)
            return torch.as_tensor(self, device="cuda")
        a = self.numpy()
        if self.dtype == "bf16":
            import numpy as np
            a = a.view(np.int16)
        import warnings
        with warnings.catch_warnings():
            # Read-only weights: torch warns that its tensors cannot be; the
            # view says so (writable False) and the session holds it to that.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if self.dtype == "bf16" else t

    def __repr__(self):
        state = "valid" if self._valid else "ended"
        return f"<strata.ChunkView {self._what} of chunk {self.chunk} {self.name!r}: {self.count} {self.dtype}, {state}>"


class _Interface:
    def __init__(self, cuda):
        self.__cuda_array_interface__ = cuda


class Session:
    """A model of the caller's own, trained by strata (strata_session).

    config: a dict, JSON text or a JSON file's path (docs/CONFIG.md; the
    session reads the optimizer, precision, states, budgets, placement, io
    and gradient_accumulation_steps keys), None for the defaults; device:
    "host" (the CPU backend: chunk views are NumPy arrays) or "cuda".
    """

    def __init__(self, config=None, device="host"):
        self.device = _device(device)
        self._s = _strata.Session(_config_text(config), self.device)
        self._chunks = []  # [name, count, dtype] per chunk
        self._held = {}  # chunk -> its weights' ChunkView, acquired
        self._grads = {}  # chunk -> its gradient buffer's ChunkView, until submitted
        self.verdict = None  # the last end_step's verdict

    # Registration, before start().
    def add_chunk(self, name, initial=None, *, count=None):
        """Registers a chunk: `initial`, its fp32 values (any shape; its size
        is the count), or `count` zeros. Returns its index."""
        import numpy as np
        values = None
        if initial is not None:
            values = np.ascontiguousarray(np.asarray(initial, dtype=np.float32)).reshape(-1)
            if count is not None and count != values.size:
                raise ValueError(f"add_chunk {name!r}: count {count} but {values.size} initial values")
            count = values.size
        if count is None:
            raise ValueError(f"add_chunk {name!r}: give its initial values or its count")
        chunk = self._s.add_chunk(str(name), int(count), values)
        self._chunks.append([str(name), int(count), self._s.chunk_dtype(chunk)])
        return chunk

    def set_chunk_dtype(self, chunk, dtype):
        """Chunk `chunk`'s working type before start: "bf16", "fp16" or "fp32"."""
        self._s.set_chunk_dtype(int(chunk), str(dtype))
        self._chunks[chunk][2] = self._s.chunk_dtype(int(chunk))

    def add_tensor(self, chunk, name, offset, shape):
        """Names a tensor inside a chunk (what checkpoints save it as)."""
        self._s.add_tensor(int(chunk), str(name), int(offset), [int(d) for d in shape])

    def start(self):
        """Places every chunk and writes its initial state (the first step does it otherwise)."""
        self._s.start()

    # What it is.
    @property
    def chunks(self):
        return len(self._chunks)

    def chunk_name(self, chunk):
        return self._chunks[self._index(chunk)][0]

    def chunk_count(self, chunk):
        return self._chunks[self._index(chunk)][1]

    def chunk_dtype(self, chunk):
        return self._chunks[self._index(chunk)][2]

    @property
    def steps_done(self):
        return self._s.steps_done()

    @property
    def loss_scale(self):
        """fp16: multiply the loss by this before backward (1 otherwise)."""
        return self._s.loss_scale()

    @loss_scale.setter
    def loss_scale(self, scale):
        self._s.set_loss_scale(float(scale))

    def set_lr(self, lr):
        self._s.set_lr(float(lr))

    def set_gradient_order(self, order):
        self._s.set_gradient_order([int(c) for c in order])

    def describe(self):
        """The session as a dict: chunks, placement, budgets, steps_done, counters, warnings."""
        return json.loads(self._s.describe())

    # A step.
    def begin_step(self, grad_scale=1.0):
        self._s.begin_step(float(grad_scale))

    def acquire(self, chunk):
        """Chunk `chunk`'s working weights on the device (a read-only
        ChunkView), until release(chunk)."""
        chunk = self._index(chunk)
        address = self._s.acquire(chunk)
        view = ChunkView(self, chunk, address, writable=False, what="weights")
        self._held.setdefault(chunk, []).append(view)
        return view

    def release(self, chunk):
        chunk = self._index(chunk)
        self._s.release(chunk)
        views = self._held.get(chunk)
        if views:
            views.pop()._end()

    def gradient_buffer(self, chunk):
        """Where to write chunk `chunk`'s gradient (a writable ChunkView of
        the working type, contents undefined), until submit_gradient(chunk)."""
        chunk = self._index(chunk)
        address = self._s.gradient_buffer(chunk)
        view = self._grads.get(chunk)
        if view is None or not view.valid or view._address != address:
            view = ChunkView(self, chunk, address, writable=True, what="gradient")
            self._grads[chunk] = view
        return view

    def submit_gradient(self, chunk):
        chunk = self._index(chunk)
        self._s.submit_gradient(chunk)
        view = self._grads.pop(chunk, None)
        if view is not None:
            view._end()

    def end_step(self):
        """Ends the step (every chunk's gradient submitted): waits for the
        update and returns its verdict (also kept as .verdict)."""
        self.verdict = self._s.end_step()
        self._end_views()
        return self.verdict

    def cancel_step(self):
        """Abandons the open step; nothing of it is applied."""
        self._s.cancel_step()
        self._end_views()

    def step(self, grad_scale=1.0):
        """A step as a context manager: begin_step on entry, end_step on a
        clean exit, cancel_step when the body raises (the exception goes on)."""
        return _Step(self, grad_scale)

    # Outside a step.
    def read_master(self, chunk):
        """Chunk `chunk`'s fp32 master weights, a copy."""
        chunk = self._index(chunk)
        return self._s.read_master(chunk, self.chunk_count(chunk))

    def save(self, path):
        import os
        self._s.save(os.fspath(path))

    def load(self, path):
        import os
        self._s.load(os.fspath(path))

    def finalize(self):
        """Lands the work in flight and raises its first failure."""
        self._s.finalize()

    def abort(self):
        self._s.abort()

    def close(self):
        """Ends the session (an open step is abandoned); later calls raise."""
        self._end_views()
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _index(self, chunk):
        c = int(chunk)
        if not 0 <= c < len(self._chunks):
            e = ValueError(f"INVALID_ARGUMENT: chunk {chunk} is not registered (the session has "
                           f"{len(self._chunks)} chunks)")
            e.status = "INVALID_ARGUMENT"
            raise e
        return c

    def _end_views(self):
        for views in self._held.values():
            for v in views:
                v._end()
        for v in self._grads.values():
            v._end()
        self._held.clear()
        self._grads.clear()


class _Step:
    def __init__(self, session, grad_scale):
        self._session = session
        self._grad_scale = grad_scale

    def __enter__(self):
        self._session.begin_step(self._grad_scale)
        return self._session

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._session.end_step()
            return False
        try:
            self._session.cancel_step()
        except RuntimeError:
            # Every gradient was in: the update is under way, and only
            # end_step closes the step. The body's exception goes on.
            self._session.end_step()
        return False
