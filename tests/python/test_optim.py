"""strata.optim: each step function in place on NumPy arrays and torch
tensors, against torch.optim (Lion against the paper's formula), and every
function's bad arguments raising with nothing written."""
import numpy as np
import pytest

import strata
import strata.optim as so

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")

N = 1031


def within(a, b, rel=1e-6, abs_=1e-7):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.all(np.abs(a - b) <= rel * np.abs(b) + abs_), np.max(np.abs(a - b))


def problem(seed, steps=20):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(N).astype(np.float32)
    grads = [(rng.standard_normal(N) * (1 + k % 3)).astype(np.float32) for k in range(steps)]
    return p, grads


def torch_reference(cls, kwargs, p, grads, state_keys):
    t = torch.nn.Parameter(torch.tensor(p))
    opt = cls([t], **kwargs)
    for g in grads:
        t.grad = torch.tensor(g)
        opt.step()
    st = opt.state[t]
    return t.detach().numpy(), [st[k].numpy() for k in state_keys]


def test_version_and_threads():
    assert strata.__version__.count(".") == 2
    strata.set_num_threads(1)
    assert strata.get_num_threads() == 1
    strata.set_num_threads(0)
    assert strata.get_num_threads() >= 1
    with pytest.raises(ValueError, match="threads"):
        strata.set_num_threads(-1)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_on_numpy_matches_torch(kind):
    p, grads = problem(1)
    m = np.zeros(N, np.float32)
    v = np.zeros(N, np.float32)
    kw = dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    fn = so.adamw_step if kind == "adamw" else so.adam_step
    ours = p.copy()
    for k, g in enumerate(grads, start=1):
        r = fn(ours, g, m, v, step=k, **kw)
        assert r == (0, False)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    want_p, (want_m, want_v) = torch_reference(cls, kw, p, grads, ["exp_avg", "exp_avg_sq"])
    for got, want in ((ours, want_p), (m, want_m), (v, want_v)):
        ok, worst = within(got, want)
        assert ok, worst


def test_adagrad_and_sgd_match_torch():
    p, grads = problem(2)
    s = np.zeros(N, np.float32)
    ours = p.copy()
    kw = dict(lr=1e-2, lr_decay=0.05, weight_decay=0.01, eps=1e-10)
    for k, g in enumerate(grads, start=1):
        so.adagrad_step(ours, g, s, step=k, **kw)
    want_p, (want_s,) = torch_reference(torch.optim.Adagrad, kw, p, grads, ["sum"])
    # fp32 results whose operations torch rounds in another order (fused
    # multiply-adds, its alpha arguments): a few ulps a step, so the bound
    # here is wider than Adam's.
    loose = dict(rel=1e-5, abs_=1e-5)
    assert within(ours, want_p, **loose)[0] and within(s, want_s, **loose)[0]
    for kw in (dict(lr=0.1), dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
               dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)):
        ours = p.copy()
        buf = np.zeros(N, np.float32) if kw.get("momentum") else None
        for k, g in enumerate(grads, start=1):
            so.sgd_step(ours, g, buf, step=k, **kw)
        want_p, _ = torch_reference(torch.optim.SGD, kw, p, grads, [])
        assert within(ours, want_p, **loose)[0], kw


def test_lion_follows_the_paper():
    p, grads = problem(3)
    m = np.zeros(N, np.float32)
    ours = p.copy()
    lr, b1, b2, wd = 1e-3, 0.9, 0.99, 0.1
    want = p.astype(np.float64)
    want_m = np.zeros(N)
    for k, g in enumerate(grads, start=1):
        so.lion_step(ours, g, m, step=k, lr=lr, betas=(b1, b2), weight_decay=wd)
        c = b1 * want_m + (1 - b1) * g
        want = want * (1 - lr * wd) - lr * np.sign(c)
        want_m = b2 * want_m + (1 - b2) * g
    assert within(ours, want, rel=1e-5, abs_=1e-6)[0]
    assert within(m, want_m, rel=1e-5, abs_=1e-6)[0]


def test_torch_tensors_bf16_gradients_and_states_in_place():
    torch.manual_seed(0)
    p = torch.randn(N)
    ref = p.clone()
    g = torch.randn(N).to(torch.bfloat16)
    m = torch.zeros(N, dtype=torch.bfloat16)
    v = torch.zeros(N, dtype=torch.bfloat16)
    out = torch.empty(N, dtype=torch.bfloat16)
    so.adamw_step(p, g, m, v, step=1, lr=1e-2, weights_out=out)
    assert not torch.equal(p, ref)
    assert torch.equal(out, p.to(torch.bfloat16))
    # One step of AdamW from zero states moves each weight by about lr.
    assert torch.allclose((ref * (1 - 1e-2 * 1e-2) - p).abs(), torch.full((N,), 1e-2), rtol=0.02)


def test_q8_states_train_like_fp32():
    p, grads = problem(4, steps=50)
    q = so.q8_state(N)
    a = p.copy()
    b = p.copy()
    m = np.zeros(N, np.float32)
    v = np.zeros(N, np.float32)
    for k, g in enumerate(grads, start=1):
        so.adamw_step(a, g, **q, step=k, lr=1e-3)
        so.adamw_step(b, g, m, v, step=k, lr=1e-3)
    assert np.any(q["exp_avg"] != 0) and np.all(q["exp_avg_scale"] > 0)
    assert np.max(np.abs(a - b)) < 5e-3  # 8-bit states: close, not equal
    assert np.max(np.abs(a - p)) > 1e-2


def test_nonfinite_gradients_skip_or_report():
    p, grads = problem(5, steps=1)
    g = grads[0].copy()
    g[7] = np.inf
    g[9] = np.nan
    m = np.zeros(N, np.float32)
    v = np.zeros(N, np.float32)
    before = p.copy()
    r = so.adamw_step(p, g, m, v, step=1)
    assert r.skipped and r.nonfinite == 2
    assert np.array_equal(p, before) and not m.any()
    r = so.adamw_step(p, g, m, v, step=1, skip_nonfinite=False)
    assert not r.skipped and r.nonfinite == 2
    assert not np.isfinite(p[7]) and np.isfinite(p[0])


def test_grad_scale_multiplies_the_gradient():
    p, grads = problem(6, steps=1)
    a, b = p.copy(), p.copy()
    z = lambda: np.zeros(N, np.float32)  # noqa: E731
    so.sgd_step(a, grads[0] * 4, step=1, lr=0.1, grad_scale=0.25)
    so.sgd_step(b, grads[0], step=1, lr=0.1)
    assert np.array_equal(a, b)
    ma, va, mb, vb = z(), z(), z(), z()
    a, b = p.copy(), p.copy()
    so.adam_step(a, grads[0] * 2, ma, va, step=1, grad_scale=0.5)
    so.adam_step(b, grads[0], mb, vb, step=1)
    assert np.array_equal(a, b)


def test_empty_arrays_are_a_no_op():
    e = np.zeros(0, np.float32)
    assert so.adamw_step(e, e.copy(), e.copy(), e.copy(), step=1) == (0, False)


# Every function's bad arguments: the exception type, the C++ or Python
# message, and params and states untouched.
def fresh():
    p, grads = problem(7, steps=1)
    return p, grads[0], np.zeros(N, np.float32), np.zeros(N, np.float32)


BAD_ADAM = [
    (TypeError, "params: expected float32", lambda p, g, m, v: dict(params=p.astype(np.float16))),
    (ValueError, "grads: 1030 elements", lambda p, g, m, v: dict(grads=g[:-1])),
    (TypeError, "grads: expected float32, bfloat16 or float16", lambda p, g, m, v: dict(grads=g.view(np.int8)[:N])),
    (TypeError, "exp_avg, exp_avg_sq: expected both float32", lambda p, g, m, v: dict(exp_avg_sq=v.astype(np.float16))),
    (ValueError, "exp_avg: 1030 elements", lambda p, g, m, v: dict(exp_avg=m[:-1])),
    (ValueError, "not contiguous", lambda p, g, m, v: dict(exp_avg=np.zeros(2 * N, np.float32)[::2])),
    (TypeError, "expected a numpy.ndarray or a torch.Tensor", lambda p, g, m, v: dict(grads=list(g))),
    (TypeError, "dtype float64 is not supported", lambda p, g, m, v: dict(grads=g.astype(np.float64))),
    (ValueError, "read-only", lambda p, g, m, v: dict(exp_avg=np.frombuffer(m.tobytes(), np.float32))),
    (ValueError, "lr", lambda p, g, m, v: dict(lr=-1.0)),
    (ValueError, "beta", lambda p, g, m, v: dict(betas=(1.5, 0.9))),
    (ValueError, "betas: expected a pair", lambda p, g, m, v: dict(betas=0.9)),
    (ValueError, "eps", lambda p, g, m, v: dict(eps=float("nan"))),
    (ValueError, "step count starts at 1", lambda p, g, m, v: dict(step=0)),
    (TypeError, "step: expected an int", lambda p, g, m, v: dict(step=1.5)),
    (ValueError, "exp_avg_scale is required", lambda p, g, m, v: dict(exp_avg=m.view(np.int8)[:N],
                                                                      exp_avg_sq=v.view(np.uint8)[:N])),
    (TypeError, "weights_out: expected bfloat16 or float16", lambda p, g, m, v: dict(weights_out=m)),
    (ValueError, "overlap", lambda p, g, m, v: dict(exp_avg_sq=m)),
]


@pytest.mark.parametrize("fn", [so.adam_step, so.adamw_step])
@pytest.mark.parametrize("err,msg,change", BAD_ADAM, ids=[b[1] for b in BAD_ADAM])
def test_adam_bad_arguments(fn, err, msg, change):
    p, g, m, v = fresh()
    args = dict(params=p, grads=g, exp_avg=m, exp_avg_sq=v, step=1)
    args.update(change(p, g, m, v))
    before = [a.copy() for a in (p, m, v)]
    with pytest.raises(err, match=msg):
        fn(**args)
    for a, b in zip((p, m, v), before):
        assert np.array_equal(a, b)


def test_misaligned_buffers_are_refused():
    p, g, m, v = fresh()
    raw = np.zeros(4 * N + 4, np.uint8)
    params = np.frombuffer(bytearray(raw.tobytes()), dtype=np.float32, offset=2, count=N)
    assert not params.flags.aligned
    with pytest.raises(ValueError, match="align"):
        so.adamw_step(params, g, m, v, step=1)
    assert not m.any() and not params.any()


@pytest.mark.parametrize("call", [
    lambda p, g, s: so.adagrad_step(p, g, s.astype(np.float16), step=1),
    lambda p, g, s: so.adagrad_step(p, g, s, step=1, lr_decay=-1),
    lambda p, g, s: so.adagrad_step(p, g, s[:-1], step=1),
    lambda p, g, s: so.lion_step(p, g, None, step=1),
    lambda p, g, s: so.lion_step(p, g, s, step=1, betas=(0.9, 1.5)),
    lambda p, g, s: so.lion_step(p, g, s, step=1, weight_decay=-0.1),
    lambda p, g, s: so.sgd_step(p, g, None, step=1, lr=0.1, momentum=0.9),
    lambda p, g, s: so.sgd_step(p, g, s, step=1, lr=0.1, momentum=0.9, nesterov=True, dampening=0.1),
    lambda p, g, s: so.sgd_step(p, g, step=1, lr=float("inf")),
    lambda p, g, s: so.q8_state(4, like="jax"),
], ids=["adagrad-dtype", "adagrad-lr_decay", "adagrad-length", "lion-no-state", "lion-beta", "lion-wd",
        "sgd-no-buffer", "sgd-nesterov-dampening", "sgd-lr", "q8_state-like"])
def test_other_functions_bad_arguments(call):
    p, g, s, _ = fresh()
    before = p.copy()
    with pytest.raises((TypeError, ValueError)) as e:
        call(p, g, s)
    assert str(e.value)
    assert np.array_equal(p, before) and not s.any()


def test_gpu_tensors_are_refused_before_anything_runs():
    class FakeCuda:
        pass
    with pytest.raises(TypeError, match="expected a numpy.ndarray"):
        so.sgd_step(FakeCuda(), FakeCuda(), step=1, lr=0.1)


@pytest.mark.parametrize("gdtype", [np.float16, "bfloat16"])
def test_half_gradients_equal_their_fp32_values(gdtype):
    p, grads = problem(8, steps=3)
    a, b = p.copy(), p.copy()
    ma, va, mb, vb = (np.zeros(N, np.float32) for _ in range(4))
    for k, g in enumerate(grads, start=1):
        if gdtype == "bfloat16":
            half = torch.from_numpy(g).to(torch.bfloat16)
            full = half.float().numpy()
        else:
            half = g.astype(np.float16)
            full = half.astype(np.float32)
        so.adamw_step(a, half, ma, va, step=k, lr=1e-2)
        so.adamw_step(b, full, mb, vb, step=k, lr=1e-2)
    assert np.array_equal(a, b) and np.array_equal(ma, mb) and np.array_equal(va, vb)
