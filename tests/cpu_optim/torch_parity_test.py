"""cpu_optim against torch.optim itself (Debian's python3-torch, 1.13).

The C++ tests hold every vector kernel to the scalar reference; this holds
the reference, and every kernel with it, to torch.optim.{Adam, AdamW,
Adagrad, SGD}: the same initial fp32 params and per-step fp32 gradients
through several steps, on every instruction set this CPU has
(torch_parity_tool.cpp runs them), params and states compared element by
element. Lion is not in torch 1.13; its reference follows the paper.
"""
import json
import os
import subprocess
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")

TOOL = os.environ.get("STRATA_PARITY_TOOL", "")
STEPS = 6
N = 1031  # odd: every instruction set's tail path runs too

# (name, torch optimizer, its keyword arguments, the tool's fields)
CASES = [
    ("adam_l2", torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
     dict(optimizer="adam", lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)),
    ("adamw", torch.optim.AdamW, dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
     dict(optimizer="adamw", lr=3e-3, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)),
    ("adamw_tiny_eps", torch.optim.AdamW, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-30, weight_decay=0.0),
     dict(optimizer="adamw", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-30, weight_decay=0.0)),
    ("adagrad", torch.optim.Adagrad, dict(lr=1e-2, lr_decay=0.05, weight_decay=0.01, eps=1e-10),
     dict(optimizer="adagrad", lr=1e-2, lr_decay=0.05, weight_decay=0.01, eps=1e-10)),
    ("sgd", torch.optim.SGD, dict(lr=0.1),
     dict(optimizer="sgd", lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
     dict(optimizer="sgd", lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False)),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
     dict(optimizer="sgd", lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)),
]


def torch_run(opt_class, kwargs, params, grads):
    p = torch.nn.Parameter(torch.tensor(params, dtype=torch.float32))
    opt = opt_class([p], **kwargs)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    state = opt.state[p]
    m = state.get("exp_avg", state.get("momentum_buffer"))
    v = state.get("exp_avg_sq", state.get("sum"))
    as_np = lambda t: None if t is None else t.detach().numpy().astype(np.float64)
    return as_np(p), as_np(m), as_np(v)


def problem(seed):
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(N).astype(np.float32)
    grads = []
    for _ in range(STEPS):
        g = (rng.standard_normal(N) * 0.05).astype(np.float32)
        g[::97] *= 20.0  # a few large ones
        g[5::211] = 0.0  # and some zeros
        grads.append(g)
    return params, grads


@pytest.mark.parametrize("name,opt_class,kwargs,fields", CASES, ids=[c[0] for c in CASES])
def test_matches_torch_optim(name, opt_class, kwargs, fields, tmp_path):
    assert TOOL and os.path.exists(TOOL), "STRATA_PARITY_TOOL must name cpu_optim_torch_parity_tool (its ctest entry sets it)"
    params, grads = problem(seed=zlib.crc32(name.encode()))
    want_p, want_m, want_v = torch_run(opt_class, kwargs, params, grads)
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(dict(fields, params=params.tolist(), grads=[g.tolist() for g in grads])))
    out = subprocess.run([TOOL, str(path)], capture_output=True, text=True, check=True)
    results = json.loads(out.stdout)
    assert "scalar" in results
    # Six steps of fp32 arithmetic in another order (and, in the kernels,
    # square roots and reciprocals from refined estimates, ~22 bits): a few
    # ulps of each value, or of the largest step for values near 0.
    step = np.max(np.abs(want_p - params.astype(np.float64)))
    for isa, got in results.items():
        got_p = np.asarray(got["params"], dtype=np.float64)
        np.testing.assert_allclose(got_p, want_p, rtol=2e-6, atol=1e-5 * step, err_msg=f"{name} {isa} params")
        for key, want in (("m", want_m), ("v", want_v)):
            if want is None:  # a state this optimizer does not keep
                continue
            np.testing.assert_allclose(np.asarray(got[key], dtype=np.float64), want, rtol=2e-6,
                                       atol=1e-6 * np.max(np.abs(want)), err_msg=f"{name} {isa} {key}")
