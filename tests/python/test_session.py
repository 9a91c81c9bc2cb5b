"""strata.Session: a model written in NumPy drives the session directly.

A 3-layer MLP (its forward and backward by hand) registers one chunk per
layer, acquires each layer's weights as a zero-copy NumPy view, writes each
gradient into the session's buffer and submits it; strata updates the
states wherever the config puts them. Trained 20 steps with its states in
RAM and again on NVMe, both runs give the same bits, and the same bits as
the MLP trained by strata.optim.adamw_step on the same gradients.
"""
import json

import numpy as np
import pytest

import strata
import strata.optim

SIZES = [(12, 16), (16, 16), (16, 4)]  # in, out per layer; each chunk: W [in, out] then b [out]
LR, WD, BETAS, EPS = 1e-2, 0.01, (0.9, 0.999), 1e-8


def config(tmp_path, states):
    c = {"precision": "fp32",
         "optimizer": {"type": "adamw", "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD},
         "placement": {"states": states}}
    if states == "nvme":
        d = tmp_path / "nvme"
        d.mkdir(exist_ok=True)
        c["nvme_paths"] = [str(d)]
    return c


def initial_layers(seed=7):
    rng = np.random.default_rng(seed)
    return [np.concatenate([(rng.standard_normal(i * o) / np.sqrt(i)).astype(np.float32), np.zeros(o, np.float32)])
            for i, o in SIZES]


def batch(step):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((8, SIZES[0][0])).astype(np.float32)
    y = rng.standard_normal((8, SIZES[-1][1])).astype(np.float32)
    return x, y


def split(flat, layer):
    i, o = SIZES[layer]
    return flat[: i * o].reshape(i, o), flat[i * o: i * o + o]


def forward(x, layer, flat):
    w, b = split(flat, layer)
    z = x @ w + b
    return np.maximum(z, 0) if layer < len(SIZES) - 1 else z


def backward(x, out, dout, layer, flat, grad):
    """dout: the gradient at the layer's output; writes dW, db into grad; returns dx."""
    w, _ = split(flat, layer)
    if layer < len(SIZES) - 1:
        dout = dout * (out > 0)
    i, o = SIZES[layer]
    grad[: i * o] = (x.T @ dout).reshape(-1)
    grad[i * o: i * o + o] = dout.sum(axis=0)
    return dout @ w.T


def train_with_session(cfg, steps=20):
    losses = []
    with strata.Session(cfg) as s:
        chunks = [s.add_chunk(f"layer{l}", v) for l, v in enumerate(initial_layers())]
        for step in range(steps):
            x, y = batch(step)
            with s.step():
                acts = [x]
                for l, c in enumerate(chunks):  # forward: each layer's weights, then released
                    acts.append(forward(acts[-1], l, s.acquire(c).numpy()))
                    s.release(c)
                losses.append(float(np.mean((acts[-1] - y) ** 2)))
                dout = (2.0 / acts[-1].size) * (acts[-1] - y)
                for l in reversed(range(len(chunks))):  # backward: acquired again, gradient submitted
                    w = s.acquire(chunks[l]).numpy()
                    g = s.gradient_buffer(chunks[l]).numpy()
                    dout = backward(acts[l], acts[l + 1], dout, l, w, g)
                    s.release(chunks[l])
                    s.submit_gradient(chunks[l])
            assert s.verdict["step"] == step + 1
        weights = [s.read_master(c) for c in chunks]
    return losses, weights


def train_with_optim(steps=20):
    params = initial_layers()
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses = []
    for step in range(steps):
        x, y = batch(step)
        acts = [x]
        for l, p in enumerate(params):
            acts.append(forward(acts[-1], l, p))
        losses.append(float(np.mean((acts[-1] - y) ** 2)))
        dout = (2.0 / acts[-1].size) * (acts[-1] - y)
        grads = [np.empty_like(p) for p in params]
        for l in reversed(range(len(params))):
            dout = backward(acts[l], acts[l + 1], dout, l, params[l], grads[l])
        for l in range(len(params)):
            strata.optim.adamw_step(params[l], grads[l], m[l], v[l], step=step + 1, lr=LR, betas=BETAS, eps=EPS,
                                    weight_decay=WD)
    return losses, params


def bits(arrays):
    return [a.view(np.uint32).copy() for a in arrays]


def test_a_numpy_mlp_on_the_session_matches_strata_optim_to_the_last_bit_in_ram_and_on_nvme(tmp_path):
    ref_losses, ref_weights = train_with_optim()
    ram_losses, ram_weights = train_with_session(config(tmp_path, "host"))
    nvme_losses, nvme_weights = train_with_session(config(tmp_path, "nvme"))
    assert ram_losses == ref_losses
    assert nvme_losses == ref_losses
    for got in (ram_weights, nvme_weights):
        for a, b in zip(bits(got), bits(ref_weights)):
            assert np.array_equal(a, b)
    assert ref_losses[-1] < ref_losses[0]  # it learns


def small_session(tmp_path, **placement):
    cfg = {"precision": "fp32", "optimizer": {"type": "adamw", "lr": 1e-2}}
    if placement:
        cfg["placement"] = placement
    s = strata.Session(cfg)
    a = s.add_chunk("a", np.arange(10, dtype=np.float32))
    b = s.add_chunk("b", count=6)
    return s, a, b


def test_views_are_zero_copy_and_end_with_their_release_or_submit(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        s.begin_step()
        w = s.acquire(a)
        arr = w.numpy()
        assert arr.dtype == np.float32 and arr.shape == (10,)
        assert not arr.flags.writeable  # the working weights are the session's
        assert np.array_equal(arr, np.arange(10, dtype=np.float32))
        assert np.shares_memory(arr, np.asarray(w))
        s.release(a)
        assert not w.valid
        with pytest.raises(RuntimeError, match="used after its release"):
            w.numpy()
        g = s.gradient_buffer(b)
        garr = g.numpy()
        assert garr.flags.writeable and garr.shape == (6,)
        garr[:] = 1.0
        s.submit_gradient(b)
        with pytest.raises(RuntimeError, match="used after its submit"):
            g.numpy()
        s.gradient_buffer(a).numpy()[:] = 0.5
        s.submit_gradient(a)
        verdict = s.end_step()
        assert verdict["step"] == 1 and not verdict["skipped"]
        assert s.describe()["steps_done"] == 1


def test_a_chunk_acquired_twice_is_the_same_memory_until_both_releases(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        with s.step():
            first = s.acquire(a)
            second = s.acquire(a)  # a tied weight's second use
            assert np.shares_memory(first.numpy(), second.numpy())
            s.release(a)
            assert first.valid != second.valid  # the later view ended; the weights stay held
            s.release(a)
            assert not first.valid and not second.valid
            with pytest.raises(RuntimeError) as e:
                s.release(a)
            assert e.value.status == "FAILED_PRECONDITION"
            for c in (b, a):
                s.gradient_buffer(c).numpy()[:] = 1.0
                s.submit_gradient(c)
        assert s.steps_done == 1


def test_weights_read_outside_a_step_are_the_last_steps(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        initial = s.acquire(a).numpy().copy()  # before any step: the initial values
        s.release(a)
        assert np.array_equal(initial, np.arange(10, dtype=np.float32))
        with s.step():
            for c in (b, a):
                s.gradient_buffer(c).numpy()[:] = 1.0
                s.submit_gradient(c)
        after = s.acquire(a).numpy().copy()  # an evaluation: what the step left
        with pytest.raises(RuntimeError) as e:
            s.gradient_buffer(a)  # reading only, outside a step
        assert e.value.status == "FAILED_PRECONDITION"
        s.release(a)
        assert np.array_equal(after, s.read_master(a))  # fp32: the working weights are the master's
        assert not np.array_equal(after, initial)


def test_torch_views_share_the_memory(tmp_path):
    torch = pytest.importorskip("torch")
    s, a, b = small_session(tmp_path)
    with s:
        with s.step():
            w = s.acquire(a).torch()
            assert w.dtype == torch.float32 and w.tolist() == list(range(10))
            s.release(a)
            for c in (b, a):
                g = s.gradient_buffer(c).torch()
                g.fill_(0.25)  # written through the tensor, read by the session
                s.submit_gradient(c)
        assert s.verdict["grad_norm"] == pytest.approx(0.25 * 4.0)  # 16 elements of 0.25


def test_errors_carry_their_status_and_change_nothing(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        with pytest.raises(RuntimeError) as e:
            s.submit_gradient(a)  # no step open
        assert e.value.status == "FAILED_PRECONDITION"
        s.begin_step()
        with pytest.raises(ValueError) as e:
            s.acquire(5)
        assert e.value.status == "INVALID_ARGUMENT"
        s.gradient_buffer(b).numpy()[:] = 1.0
        s.submit_gradient(b)
        with pytest.raises(RuntimeError) as e:
            s.submit_gradient(b)  # twice in a step of one micro-batch
        assert e.value.status == "FAILED_PRECONDITION"
        with pytest.raises(RuntimeError) as e:
            s.end_step()  # a's gradient is missing
        assert e.value.status == "FAILED_PRECONDITION" and "a" in str(e.value)
        s.gradient_buffer(a).numpy()[:] = 1.0
        s.submit_gradient(a)
        s.end_step()  # the step was still open where it was
        assert s.steps_done == 1
    with pytest.raises(RuntimeError, match="after close"):
        s.steps_done


def test_a_body_that_raises_cancels_the_step_and_nothing_is_applied(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        s.start()
        before = s.read_master(a)
        with pytest.raises(ZeroDivisionError):
            with s.step():
                s.gradient_buffer(b).numpy()[:] = 1.0
                s.submit_gradient(b)
                1 / 0
        assert s.steps_done == 0
        assert np.array_equal(s.read_master(a), before)
        with s.step():  # the session goes on
            for c in (b, a):
                s.gradient_buffer(c).numpy()[:] = 1.0
                s.submit_gradient(c)
        assert s.steps_done == 1
        assert not np.array_equal(s.read_master(a), before)


def test_a_session_saves_and_loads_through_python(tmp_path):
    s, a, b = small_session(tmp_path)
    with s:
        with s.step():
            for c in (b, a):
                s.gradient_buffer(c).numpy()[:] = 0.5
                s.submit_gradient(c)
        s.save(tmp_path / "ckpt")
        saved = s.read_master(a)
    t, a2, _ = small_session(tmp_path)
    with t:
        t.load(tmp_path / "ckpt")
        assert t.steps_done == 1
        assert np.array_equal(t.read_master(a2), saved)
    bad = json.dumps({"precision": "fp32", "budgets": {"device": "nonsense"}})
    with pytest.raises(ValueError) as e:
        strata.Session(bad)
    assert e.value.status == "INVALID_ARGUMENT"
