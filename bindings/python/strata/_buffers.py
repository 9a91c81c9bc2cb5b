"""Describes NumPy arrays and torch tensors to the native module without
copying them: (address, elements, dtype name, writable).

Only contiguous CPU memory is taken; anything else is refused here with a
TypeError (not an array, a GPU tensor, an unsupported dtype) or a
ValueError (not contiguous), naming the argument.
"""
import sys

_NUMPY_DTYPES = {"float32", "float16", "int8", "uint8"}
_TORCH_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
                 "torch.int8": "int8", "torch.uint8": "uint8"}


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def describe(x, name):
    """(address, elements, dtype, writable) of `x`, or None for None."""
    if x is None:
        return None
    if _is_torch_tensor(x):
        if x.device.type != "cpu":
            raise TypeError(f"{name}: a tensor on {x.device}; strata's CPU optimizers take CPU tensors")
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise TypeError(f"{name}: dtype {x.dtype} is not supported")
        if x.is_sparse:
            raise TypeError(f"{name}: sparse tensors are not supported")
        if not x.is_contiguous():
            raise ValueError(f"{name}: not contiguous (call .contiguous() on it first)")
        return (x.data_ptr(), x.numel(), dtype, True)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        dtype = str(x.dtype)
        if dtype not in _NUMPY_DTYPES:
            raise TypeError(f"{name}: dtype {dtype} is not supported (float32, float16, int8, uint8; "
                            "bfloat16 through torch tensors)")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: not contiguous (numpy.ascontiguousarray makes a contiguous copy)")
        return (x.__array_interface__["data"][0], x.size, dtype, bool(x.flags.writeable))
    raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")
