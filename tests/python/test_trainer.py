"""strata.Trainer and strata.plan: the built-in GPT through the C API."""
import json

import numpy as np
import pytest

import strata

CFG = {"model": {"layers": 2, "hidden": 64, "heads": 2, "vocab": 256, "max_seq": 32},
       "batch": {"micro_batch": 4, "seq": 32}, "optimizer": {"lr": 3e-3}, "seed": 3}


def batches(trainer, count, seed=0):
    sh = trainer.shape
    n = sh["grad_accum"] * sh["batch"] * sh["seq"]
    rng = np.random.default_rng(seed)
    # A learnable stream: a repeating byte pattern.
    pattern = rng.integers(0, 256, 17)
    out = []
    for k in range(count):
        x = np.resize(np.roll(pattern, k), n + 1)
        out.append((x[:-1], x[1:]))
    return out


def test_versions_match():
    assert strata.__version__ == strata.library_version()


def test_steps_lower_the_loss_and_describe_is_a_dict():
    with strata.Trainer(CFG) as t:
        assert t.shape == {"grad_accum": 1, "batch": 4, "seq": 32, "vocab": 256}
        losses = [t.step(x, y) for x, y in batches(t, 20)]
        assert losses[-1] < losses[0] - 1.0
        assert t.steps_done == 20
        d = t.describe()
        assert d["parameters"] > 0 and d["steps_done"] == 20 and "placement" in d


def test_save_then_resume_continues_bit_for_bit(tmp_path):
    data = None
    with strata.Trainer(CFG) as a:
        data = batches(a, 10)
        for x, y in data[:5]:
            a.step(x, y)
        a.save(tmp_path)
        rest = [a.step(x, y) for x, y in data[5:]]
    with strata.Trainer.resume(CFG, tmp_path) as b:
        assert b.steps_done == 5
        again = [b.step(x, y) for x, y in data[5:]]
    assert np.array_equal(np.float32(rest), np.float32(again))


def test_torch_tensors_and_the_synthetic_stream():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")
    with strata.Trainer(CFG) as t:
        x, y = batches(t, 1)[0]
        assert np.isfinite(t.step(torch.from_numpy(x), torch.from_numpy(y)))
        assert np.isfinite(t.step())


def test_plan_fits_and_does_not():
    p = strata.plan(CFG)
    assert p["fits"] and "plan:" in p["text"]
    tight = json.loads(json.dumps(CFG))
    tight["budgets"] = {"device": "1MiB", "host": "2MiB"}
    with pytest.raises(MemoryError, match="RESOURCE_EXHAUSTED"):
        strata.plan(tight)


def test_config_from_a_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(CFG))
    assert strata.plan(path)["fits"]
    assert strata.plan(str(path))["fits"]


@pytest.mark.parametrize("config,err,msg", [
    ({"batch": {"micro_batch": "three"}}, ValueError, "batch.micro_batch"),
    ({"precision": "fp8"}, ValueError, "precision"),
    ({"budgets": {"host": -5}}, ValueError, "budgets.host"),
    ({"zero_optimization": {"offload_optimizer": {"device": "tape"}}}, ValueError, "offload_optimizer.device"),
    ('{"batch": ', ValueError, "JSON"),
    ("/nonexistent/strata.json", FileNotFoundError, "/nonexistent/strata.json"),
    (42, TypeError, "config"),
])
def test_bad_configs_raise_naming_the_key(config, err, msg):
    with pytest.raises(err, match=msg):
        strata.Trainer(config)
    with pytest.raises(err, match=msg):
        strata.plan(config)


def test_bad_step_arguments_change_nothing():
    with strata.Trainer(CFG) as t:
        x, y = batches(t, 1)[0]
        with pytest.raises(ValueError, match="expected 128 tokens"):
            t.step(x[:-1], y[:-1])
        with pytest.raises(ValueError, match="both tokens and targets"):
            t.step(x, None)
        with pytest.raises(ValueError, match="128 tokens but 127 targets"):
            t.step(x, y[:-1])
        bad = x.copy()
        bad[3] = 300
        with pytest.raises(ValueError, match="INVALID_ARGUMENT"):
            t.step(bad, y)
        with pytest.raises(ValueError, match="token ids"):
            t.step(-x - 1, y)
        with pytest.raises(TypeError, match="integer"):
            t.step(x.astype(np.float32), y)
        assert t.steps_done == 0
    with pytest.raises(ValueError, match="device"):
        strata.Trainer(CFG, device="tpu")


def test_abort_and_close():
    t = strata.Trainer(CFG)
    t.abort()
    with pytest.raises(RuntimeError, match="CANCELLED"):
        t.step()
    t.close()
    with pytest.raises(RuntimeError, match="closed"):
        t.step()
    t.close()  # twice: nothing


def test_resume_from_nothing_is_an_error(tmp_path):
    with pytest.raises((FileNotFoundError, ValueError, RuntimeError), match=str(tmp_path)):
        strata.Trainer.resume(CFG, tmp_path / "none")
