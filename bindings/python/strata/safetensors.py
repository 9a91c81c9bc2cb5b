"""strata.safetensors: a checkpoint's weights for other tools, and reading
safetensors files.

    strata.safetensors.export("ckpt", "gpt/model.safetensors", dtype="bf16")
    # gpt/model.safetensors and gpt/config.json: Hugging Face's
    # GPT2LMHeadModel.from_pretrained("gpt") loads them; plain torch:
    weights = strata.safetensors.load("gpt/model.safetensors")   # name -> torch tensor

export() takes a checkpoint directory (strata train --checkpoint DIR,
Trainer.save(DIR): its latest step) or one step's directory, and writes
the fp32 master weights ("fp32") or their bf16 rounding ("bf16", the
default) as one file, named as GPT-2's (wte.weight, h.0.attn.c_attn.weight,
...) with hf_prefix="transformer." in front by default, the layout
Hugging Face's GPT2LMHeadModel reads (lm_head.weight is tied to
transformer.wte.weight, so it is not stored). With config=True (default) a
config.json for GPT2LMHeadModel lands beside the file.
"""
import json
import os

import numpy as np

from . import _strata

__all__ = ["export", "load"]


def export(checkpoint, path, dtype="bf16", hf_prefix="transformer.", config=True):
    """Writes `checkpoint`'s weights to `path`; returns the model's shape (a dict)."""
    path = os.fspath(path)
    model = _strata.export_checkpoint(os.fspath(checkpoint), path, str(dtype), str(hf_prefix))
    if config:
        hf = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": model["vocab"],
              "n_positions": model["max_seq"], "n_ctx": model["max_seq"], "n_embd": model["hidden"],
              "n_layer": model["layers"], "n_head": model["heads"], "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0,
              "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16" if dtype == "bf16" else "float32"}
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), "config.json"), "w") as f:
            json.dump(hf, f, indent=2)
    return model


_NUMPY = {"F32": np.float32, "F16": np.float16, "U8": np.uint8}


def load(path, like="torch"):
    """Every tensor of a safetensors file (F32, F16, BF16 or U8) as a dict
    name -> tensor ("torch") or array ("numpy"; BF16 as uint16 bits),
    checked against strata's checksums when the file carries them."""
    out = {}
    entries = _strata.read_safetensors(os.fspath(path))
    if like == "torch":
        import torch
        types = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}
        for name, dtype, shape, raw in entries:
            out[name] = torch.from_numpy(raw).view(types[dtype]).reshape(shape)
        return out
    if like != "numpy":
        raise ValueError(f"like: expected 'torch' or 'numpy', got {like!r}")
    for name, dtype, shape, raw in entries:
        out[name] = raw.view(_NUMPY.get(dtype, np.uint16)).reshape(shape)
    return out
