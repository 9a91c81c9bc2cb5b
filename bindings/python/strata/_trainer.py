"""strata.Trainer and strata.plan: the built-in GPT through the C API."""
import json
import os
import sys

from . import _strata


def _config_text(config):
    """A config as JSON text: a dict, a JSON string, a path to a JSON file, or None (the defaults)."""
    if config is None:
        return "{}"
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, os.PathLike) or (isinstance(config, str) and not config.lstrip().startswith("{")):
        path = os.fspath(config)
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            raise FileNotFoundError(e.errno, f"config file {path} cannot be read: {e.strerror}", path) from None
    if isinstance(config, str):
        return config
    raise TypeError(f"config: expected a dict, JSON text or a file path, got {type(config).__name__}")


def _device(device):
    if device not in ("host", "cuda"):
        raise ValueError(f"device: expected 'host' or 'cuda', got {device!r}")
    return device


def _tokens(x, name):
    import numpy as np
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer token ids, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{name}: token ids must be in [0, vocab)")
    return np.ascontiguousarray(a, dtype=np.int32).reshape(-1)


class Trainer:
    """The built-in GPT, trained by strata (the C API's strata_trainer).

        t = strata.Trainer({"model": {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "max_seq": 64},
                            "batch": {"micro_batch": 8, "seq": 64}})
        loss = t.step(tokens, targets)      # int arrays of grad_accum * batch * seq
        t.save("ckpt"); t2 = strata.Trainer.resume(config, "ckpt")

    config: a dict, JSON text, or a JSON file's path (docs/CONFIG.md), None
    for the defaults; device: "host" (the CPU backend) or "cuda".
    """

    def __init__(self, config=None, device="host", *, _resume_dir=""):
        self._t = _strata.Trainer(_config_text(config), _device(device), _resume_dir)

    @classmethod
    def resume(cls, config, directory, device="host"):
        """A trainer restored from the latest checkpoint under `directory`."""
        return cls(config, device, _resume_dir=os.fspath(directory))

    @property
    def shape(self):
        """What one step takes: dict(grad_accum, batch, seq, vocab)."""
        return self._t.shape()

    @property
    def steps_done(self):
        return self._t.steps_done()

    def step(self, tokens=None, targets=None):
        """One optimizer step; returns its mean loss. tokens and targets:
        grad_accum * batch * seq ids each (any integer array or tensor), or
        both None for the built-in synthetic stream."""
        if (tokens is None) != (targets is None):
            raise ValueError("step: give both tokens and targets, or neither (the built-in synthetic stream)")
        if tokens is None:
            return self._t.step(None, None)
        return self._t.step(_tokens(tokens, "tokens"), _tokens(targets, "targets"))

    def save(self, directory):
        """Writes <directory>/step-<n> atomically (model.safetensors with GPT-2 names, states, trainer.json)."""
        self._t.save(os.fspath(directory))

    def load(self, directory):
        """Restores the latest checkpoint under `directory`."""
        self._t.load(os.fspath(directory))

    def describe(self):
        """The placement, plan, warnings and last step's counters, as a dict."""
        return json.loads(self._t.describe())

    def finalize(self):
        """Lands the work in flight and raises its first failure."""
        self._t.finalize()

    def abort(self):
        """Stops the trainer: every later call but describe and close raises."""
        self._t.abort()

    def close(self):
        """Finalizes and frees the trainer (raises a failure of the work in flight)."""
        self._t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def plan(config=None, device="host"):
    """The planner's placement and per-tier estimate for a config, without
    building anything: dict(text=the printed plan, fits=bool). MemoryError
    naming the nearest placement when nothing fits."""
    text, fits = _strata.plan(_config_text(config), _device(device))
    return dict(text=text, fits=fits)
