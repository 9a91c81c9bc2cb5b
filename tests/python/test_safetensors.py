"""strata.safetensors: a checkpoint exported under GPT-2 / Hugging Face
names, loaded by plain torch into a GPT-2 written here from its paper's
equations, gives the trainer's own loss on the same batch; every dtype
reads back; bad inputs raise."""
import json
import math

import numpy as np
import pytest

import strata
import strata.safetensors as st

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")

CFG = {"model": {"layers": 2, "hidden": 64, "heads": 2, "vocab": 256, "max_seq": 32},
       "batch": {"micro_batch": 4, "seq": 32}, "optimizer": {"lr": 3e-3}, "seed": 5}


def gpt2_loss(w, tokens, targets, cfg, prefix="transformer."):
    """GPT-2 (pre-LayerNorm, GELU tanh, tied head) in plain torch, fp32."""
    c, nh = cfg["hidden"], cfg["heads"]
    g = lambda name: w[prefix + name].float()  # noqa: E731
    b, t = tokens.shape
    x = g("wte.weight")[tokens] + g("wpe.weight")[:t]
    mask = torch.ones(t, t).tril().bool()
    for i in range(cfg["layers"]):
        p = f"h.{i}."
        h = torch.nn.functional.layer_norm(x, (c,), g(p + "ln_1.weight"), g(p + "ln_1.bias"), 1e-5)
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        q, k, v = (z.view(b, t, nh, c // nh).transpose(1, 2) for z in qkv.split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // nh)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = torch.nn.functional.layer_norm(x, (c,), g(p + "ln_2.weight"), g(p + "ln_2.bias"), 1e-5)
        h = torch.nn.functional.gelu(h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = torch.nn.functional.layer_norm(x, (c,), g("ln_f.weight"), g("ln_f.bias"), 1e-5)
    logits = x @ g("wte.weight").T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


def batch(seed):
    rng = np.random.default_rng(seed)
    pattern = rng.integers(0, 256, 13)
    x = np.resize(pattern, 4 * 32 + 1)
    return x[:-1].reshape(4, 32), x[1:].reshape(4, 32)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_exported_weights_give_the_trainers_loss_in_plain_torch(tmp_path, dtype):
    ckpt = tmp_path / "ckpt"
    with strata.Trainer(CFG) as t:
        for k in range(6):
            x, y = batch(k)
            t.step(x, y)
        t.save(ckpt)
        x, y = batch(100)
        trainer_loss = t.step(x, y)  # the forward on the saved weights, before this step's update
    out = tmp_path / "hf" / "model.safetensors"
    out.parent.mkdir()
    model = st.export(ckpt, out, dtype=dtype)
    assert model["layers"] == 2 and model["step"] == 6
    hf = json.loads((out.parent / "config.json").read_text())
    assert hf["model_type"] == "gpt2" and hf["n_embd"] == 64 and hf["n_layer"] == 2 and hf["n_head"] == 2
    w = st.load(out)
    assert w["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)
    assert w["transformer.wte.weight"].dtype == (torch.float32 if dtype == "fp32" else torch.bfloat16)
    assert len(w) == 4 + 2 * 12
    torch_loss = gpt2_loss(w, torch.from_numpy(x).long(), torch.from_numpy(y).long(), CFG["model"])
    # The trainer computes in bf16; a wrong name, shape or orientation
    # would be off by whole units, not this.
    print(f"{dtype}: torch {torch_loss:.5f}, trainer {trainer_loss:.5f}")
    assert abs(torch_loss - trainer_loss) < 1e-3 * trainer_loss, (torch_loss, trainer_loss)


def test_fp32_export_is_the_master_weights_and_bf16_their_rounding(tmp_path):
    ckpt = tmp_path / "c"
    with strata.Trainer(CFG) as t:
        t.step(*batch(1))
        t.save(ckpt)
    st.export(ckpt, tmp_path / "a.safetensors", dtype="fp32", hf_prefix="", config=False)
    st.export(ckpt / "step-1", tmp_path / "b.safetensors", dtype="bf16", hf_prefix="", config=False)
    a = st.load(tmp_path / "a.safetensors")
    b = st.load(tmp_path / "b.safetensors")
    assert "wte.weight" in a and not (tmp_path / "config.json").exists()
    for name in a:
        assert torch.equal(a[name].to(torch.bfloat16), b[name])
    # The checkpoint's own bf16 working weights are the same rounding.
    own = st.load(ckpt / "step-1" / "model.safetensors")
    for name in own:
        assert torch.equal(own[name], b[name]), name


def test_numpy_reading_and_every_dtype(tmp_path):
    ckpt = tmp_path / "c"
    with strata.Trainer(CFG) as t:
        t.step(*batch(2))
        t.save(ckpt)
    opt = st.load(ckpt / "step-1" / "optimizer.safetensors", like="numpy")
    assert opt["chunk-0.master"].dtype == np.float32
    model = st.load(ckpt / "step-1" / "model.safetensors", like="numpy")
    assert model["wte.weight"].dtype == np.uint16  # bf16 bits
    with pytest.raises(ValueError, match="like"):
        st.load(ckpt / "step-1" / "model.safetensors", like="jax")


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        st.export(tmp_path / "nothing-here", tmp_path / "x.safetensors")
    ckpt = tmp_path / "c"
    with strata.Trainer(CFG) as t:
        t.step(*batch(3))
        t.save(ckpt)
    with pytest.raises(ValueError, match="dtype"):
        st.export(ckpt, tmp_path / "x.safetensors", dtype="fp8")
    with pytest.raises(FileNotFoundError):
        st.load(tmp_path / "absent.safetensors")
    # A flipped byte in the data: strata's checksum catches it.
    path = ckpt / "step-1" / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x10
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(OSError, match="DATA_LOSS"):
        st.load(bad)
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{not")
    with pytest.raises(OSError, match="DATA_LOSS"):
        st.load(tmp_path / "junk.safetensors")


def test_export_verifies_the_checkpoint_and_writes_nothing_from_a_damaged_one(tmp_path):
    ckpt = tmp_path / "c"
    with strata.Trainer(CFG) as t:
        t.step(*batch(4))
        t.save(ckpt)
    path = ckpt / "step-1" / "optimizer.safetensors"
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    begin = header["chunk-0.master"]["data_offsets"][0]
    raw[8 + header_len + begin + 5] ^= 0x01  # one bit of one master weight
    path.write_bytes(bytes(raw))
    out = tmp_path / "out.safetensors"
    with pytest.raises(OSError, match="DATA_LOSS.*chunk-0.master"):
        st.export(ckpt, out, config=False)
    assert not out.exists()
