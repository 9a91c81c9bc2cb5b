"""torch.optim drop-ins on strata's CPU kernels: CPUAdam and CPUAdamW.

    opt = strata.torch.CPUAdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)

They take torch.optim.Adam's / AdamW's keyword arguments and defaults,
param groups with their own hyper-parameters, closures, learning-rate
schedulers, zero_grad, state_dict() and load_state_dict() (the state is
torch's: step, exp_avg, exp_avg_sq). Parameters are float32 CPU tensors;
their gradients float32, bfloat16 or float16. Options beyond torch's:

    state_dtype   "fp32" (default), "bf16" or "q8" (8-bit blockwise states,
                  with exp_avg_scale and exp_avg_sq_scale in the state)
    fp32_optimizer_states, adamw_mode, bias_correction
                  DeepSpeedCPUAdam's: fp32_optimizer_states=False is
                  state_dtype="bf16"; adamw_mode=True makes CPUAdam
                  decouple weight decay (AdamW), False makes CPUAdamW
                  add it to the gradient (Adam); bias_correction must be True
    weights_out   a dict param -> bfloat16/float16 tensor of its size that
                  each step also writes the new weights to (the copy a GPU
                  model computes with), in the same pass

amsgrad, capturable and differentiable are not supported (ValueError);
foreach and fused are accepted and ignored (strata's step is always one
vectorised, multithreaded pass per tensor).
"""
import torch

from . import optim as _optim

__all__ = ["CPUAdam", "CPUAdamW"]

_STATE_DTYPES = ("fp32", "bf16", "q8")


class _CPUAdamBase(torch.optim.Optimizer):
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 state_dtype=None, weights_out=None, fp32_optimizer_states=True, bias_correction=True,
                 adamw_mode=None):
        # DeepSpeedCPUAdam's options: fp32_optimizer_states=False keeps the
        # moments in bf16 (state_dtype, when given, decides); adamw_mode
        # picks AdamW's decoupled weight decay (default: the class's).
        if state_dtype is None:
            state_dtype = "fp32" if fp32_optimizer_states else "bf16"
        if not bias_correction:
            raise ValueError("bias_correction=False is not supported by strata's CPU Adam")
        if adamw_mode is not None:
            self._decoupled = bool(adamw_mode)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if amsgrad:
            raise ValueError("amsgrad=True is not supported by strata's CPU Adam")
        if capturable or differentiable:
            raise ValueError("capturable and differentiable are not supported by strata's CPU Adam")
        if state_dtype not in _STATE_DTYPES:
            raise ValueError(f"state_dtype: expected one of {', '.join(_STATE_DTYPES)}, got {state_dtype!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=maximize,
                        foreach=foreach, capturable=False, differentiable=False, fused=fused,
                        state_dtype=state_dtype)
        super().__init__(params, defaults)
        self._weights_out = dict(weights_out or {})
        for group in self.param_groups:
            for p in group["params"]:
                self._check_param(p)

    @staticmethod
    def _check_param(p):
        if p.dtype != torch.float32:
            raise TypeError(f"strata's CPU Adam updates float32 parameters, got {p.dtype}")
        if p.device.type != "cpu":
            raise TypeError(f"strata's CPU Adam updates CPU parameters, got one on {p.device}")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["state_dtype"] not in _STATE_DTYPES:
            raise ValueError(f"state_dtype: expected one of {', '.join(_STATE_DTYPES)}, got {group['state_dtype']!r}")
        for p in group["params"]:
            self._check_param(p)

    def _init_state(self, p, state, state_dtype):
        state["step"] = torch.tensor(0.0)
        n = p.numel()
        if state_dtype == "q8":
            state.update(_optim.q8_state(n, like="torch"))
            state["exp_avg"] = state["exp_avg"].view(p.shape)
            state["exp_avg_sq"] = state["exp_avg_sq"].view(p.shape)
        else:
            dtype = torch.bfloat16 if state_dtype == "bf16" else torch.float32
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)

    @torch.no_grad()
    def step(self, closure=None):
        """One step over every parameter with a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        run = _optim.adamw_step if self._decoupled else _optim.adam_step
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise TypeError("strata's CPU Adam does not take sparse gradients")
                if not p.is_contiguous():
                    raise ValueError("strata's CPU Adam needs contiguous parameters")
                if not grad.is_contiguous():
                    grad = grad.contiguous()
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state, group["state_dtype"])
                run(p, grad, state["exp_avg"], state["exp_avg_sq"], step=int(state["step"].item()) + 1,
                    lr=group["lr"], betas=(beta1, beta2), eps=group["eps"], weight_decay=group["weight_decay"],
                    grad_scale=-1.0 if group["maximize"] else 1.0, weights_out=self._weights_out.get(p),
                    exp_avg_scale=state.get("exp_avg_scale"), exp_avg_sq_scale=state.get("exp_avg_sq_scale"),
                    skip_nonfinite=False)
                state["step"] += 1  # after the update: a refused one leaves everything as it was
        return loss

    def load_state_dict(self, state_dict):
        # torch casts every state tensor to a floating-point parameter's
        # dtype on load: bfloat16 and 8-bit states go back to the dtypes
        # they were saved with (exact: their values are float32's too).
        saved = {i: {k: v.dtype for k, v in s.items() if torch.is_tensor(v) and k != "step"}
                 for i, s in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for i, dtypes in saved.items():
            state = self.state[params[i]]
            for key, dtype in dtypes.items():
                state[key] = state[key].to(dtype).contiguous()


class CPUAdam(_CPUAdamBase):
    """torch.optim.Adam on strata's CPU kernels (weight decay as L2)."""
    _decoupled = False


class CPUAdamW(_CPUAdamBase):
    """torch.optim.AdamW on strata's CPU kernels (decoupled weight decay)."""
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)
