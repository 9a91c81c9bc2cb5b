"""strata: out-of-core training — CPU optimizers on tensors, a drop-in torch
optimizer and the strata engine, from Python.

    import strata.optim      # one optimizer step in place on NumPy arrays / torch tensors
    import strata.torch      # CPUAdam, CPUAdamW: torch.optim.Optimizer drop-ins
    import strata.aio        # asynchronous tensor reads and writes to NVMe files
    import strata.safetensors  # a checkpoint's weights for Hugging Face / torch
    strata.Trainer, strata.plan   # the built-in GPT trainer and the planner
    strata.Session                # a model of your own, trained by strata (its chunks, your compute)

The native module (_strata) is built by strata's CMake build; docs/PYTHON.md
says where it lands and how to import it.
"""
from . import _strata
from ._trainer import Trainer, plan
from .session import ChunkView, Session

__version__ = _strata.__version__

__all__ = ["__version__", "Trainer", "plan", "Session", "ChunkView", "optim", "aio", "safetensors", "set_num_threads", "get_num_threads",
           "library_version"]


def library_version():
    """The version of the libstrata.so loaded (strata_get_version)."""
    return _strata.library_version()


def set_num_threads(threads):
    """Threads the CPU optimizers run on (0: every core). Returns None."""
    _strata.set_num_threads(int(threads))


def get_num_threads():
    """Threads the CPU optimizers run on."""
    return _strata.get_num_threads()


def __getattr__(name):
    # strata.optim and strata.torch load on first use, so that importing
    # strata never needs torch.
    if name in ("optim", "torch", "aio", "safetensors"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")
