"""One optimizer step, in place, on NumPy arrays or torch CPU tensors.

Every function updates `params` (float32) and its states in place from
`grads` (float32, bfloat16 or float16), zero copy, with the GIL released,
on strata's vectorised multithreaded kernels — the formulas of
torch.optim's Adam, AdamW, Adagrad and SGD (1.13) and of Lion (Chen et al.
2023). `step` is the optimizer's step count, 1 on the first step.

Adam's states are both float32, both bfloat16 (torch tensors), or 8-bit:
`exp_avg` int8 and `exp_avg_sq` uint8 with one float32 scale per 256
elements in `exp_avg_scale` / `exp_avg_sq_scale` (q8_state makes them).
`weights_out` (bfloat16 or float16, optional) receives the updated weights
in the same pass. `grad_scale` multiplies every gradient (1 / loss scale,
times a clip factor). With `skip_nonfinite` (the default) a gradient
holding inf or nan updates nothing; either way the result reports how many
such elements it saw.

Bad arguments raise TypeError (a dtype, a type, a device) or ValueError (a
length, contiguity, alignment, a hyper-parameter, a read-only array,
buffers that overlap), with nothing written.
"""
from collections import namedtuple

from . import _strata
from ._buffers import describe

__all__ = ["StepResult", "adam_step", "adamw_step", "adagrad_step", "lion_step", "sgd_step", "q8_state",
           "Q8_BLOCK"]

Q8_BLOCK = _strata.Q8_BLOCK

StepResult = namedtuple("StepResult", ["nonfinite", "skipped"])
StepResult.__doc__ = "nonfinite: gradient elements that were inf or nan; skipped: nothing was written"


def _run(kind, hyper, step, grad_scale, skip_nonfinite, **arrays):
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step: expected an int (1 on the first step), got {type(step).__name__}")
    buffers = {name: describe(x, name) for name, x in arrays.items()}
    if buffers.get("params") is not None and buffers["params"][1] == 0:
        return StepResult(0, False)
    nonfinite, skipped = _strata.step(kind, hyper, step, buffers, float(grad_scale), bool(skip_nonfinite))
    return StepResult(nonfinite, skipped)


def _betas(betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
    return float(b1), float(b2)


def _adam(kind, params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, grad_scale, weights_out,
          exp_avg_scale, exp_avg_sq_scale, skip_nonfinite):
    b1, b2 = _betas(betas)
    hyper = dict(lr=float(lr), beta1=b1, beta2=b2, eps=float(eps), weight_decay=float(weight_decay))
    return _run(kind, hyper, step, grad_scale, skip_nonfinite, params=params, grads=grads, exp_avg=exp_avg,
                exp_avg_sq=exp_avg_sq, exp_avg_scale=exp_avg_scale, exp_avg_sq_scale=exp_avg_sq_scale,
                weights_out=weights_out)


def adam_step(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0, grad_scale=1.0, weights_out=None, exp_avg_scale=None, exp_avg_sq_scale=None,
              skip_nonfinite=True):
    """torch.optim.Adam's step (weight decay as L2, added to the gradient)."""
    return _adam("adam", params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, grad_scale,
                 weights_out, exp_avg_scale, exp_avg_sq_scale, skip_nonfinite)


def adamw_step(params, grads, exp_avg, exp_avg_sq, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=1e-2, grad_scale=1.0, weights_out=None, exp_avg_scale=None, exp_avg_sq_scale=None,
               skip_nonfinite=True):
    """torch.optim.AdamW's step (decoupled weight decay)."""
    return _adam("adamw", params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, grad_scale,
                 weights_out, exp_avg_scale, exp_avg_sq_scale, skip_nonfinite)


def adagrad_step(params, grads, sum, *, step, lr=1e-2, lr_decay=0.0, weight_decay=0.0, eps=1e-10,  # noqa: A002
                 grad_scale=1.0, weights_out=None, skip_nonfinite=True):
    """torch.optim.Adagrad's step; `sum` is its state of the same name."""
    hyper = dict(lr=float(lr), lr_decay=float(lr_decay), weight_decay=float(weight_decay), eps=float(eps))
    return _run("adagrad", hyper, step, grad_scale, skip_nonfinite, params=params, grads=grads, sum=sum,
                weights_out=weights_out)


def lion_step(params, grads, exp_avg, *, step, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, grad_scale=1.0,
              weights_out=None, skip_nonfinite=True):
    """Lion's step (Chen et al. 2023, Algorithm 2)."""
    b1, b2 = _betas(betas)
    hyper = dict(lr=float(lr), beta1=b1, beta2=b2, weight_decay=float(weight_decay))
    return _run("lion", hyper, step, grad_scale, skip_nonfinite, params=params, grads=grads, exp_avg=exp_avg,
                weights_out=weights_out)


def sgd_step(params, grads, momentum_buffer=None, *, step, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, grad_scale=1.0, weights_out=None, skip_nonfinite=True):
    """torch.optim.SGD's step; `momentum_buffer` (float32) when momentum is not 0."""
    hyper = dict(lr=float(lr), momentum=float(momentum), dampening=float(dampening),
                 weight_decay=float(weight_decay), nesterov=bool(nesterov))
    return _run("sgd", hyper, step, grad_scale, skip_nonfinite, params=params, grads=grads,
                momentum_buffer=momentum_buffer, weights_out=weights_out)


def q8_state(n, like="numpy"):
    """Zeroed 8-bit Adam states for `n` parameters: a dict with exp_avg
    (int8), exp_avg_sq (uint8), exp_avg_scale and exp_avg_sq_scale (float32,
    one per 256 elements), as NumPy arrays or (like="torch") tensors."""
    blocks = (int(n) + Q8_BLOCK - 1) // Q8_BLOCK
    if like == "torch":
        import torch
        return dict(exp_avg=torch.zeros(n, dtype=torch.int8), exp_avg_sq=torch.zeros(n, dtype=torch.uint8),
                    exp_avg_scale=torch.zeros(blocks, dtype=torch.float32),
                    exp_avg_sq_scale=torch.zeros(blocks, dtype=torch.float32))
    if like != "numpy":
        raise ValueError(f"like: expected 'numpy' or 'torch', got {like!r}")
    import numpy as np
    return dict(exp_avg=np.zeros(n, np.int8), exp_avg_sq=np.zeros(n, np.uint8),
                exp_avg_scale=np.zeros(blocks, np.float32), exp_avg_sq_scale=np.zeros(blocks, np.float32))
