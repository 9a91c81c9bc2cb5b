"""strata.deepspeed's aio handle, called as a DeepSpeed user calls
DeepSpeed's (deepspeed.ops.op_builder.AsyncIOBuilder().load().aio_handle):
its constructor's defaults and getters, the (buffer, filename, validate,
async, file_offset) calls and their return values, read / write of whole
files, the fd overload, any block size, and locked tensors."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")

from strata.deepspeed import AsyncIOBuilder, aio_handle  # noqa: E402


def data(n, seed):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


def test_the_builder_loads_a_module_with_the_handle():
    builder = AsyncIOBuilder()
    assert builder.is_compatible()
    assert builder.load().aio_handle is aio_handle


def test_defaults_and_getters_are_deepspeeds():
    h = aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism()) == (1 << 20, 128, False, False, 1)
    h = AsyncIOBuilder().load().aio_handle(1024, 8, True, True, 2)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism(), h.get_thread_count()) == (1024, 8, True, True, 2, 2)


@pytest.mark.parametrize("block_size", [1024, 4096, 1 << 20])
def test_sync_and_async_calls_return_deepspeeds_values_and_move_the_bytes(tmp_path, block_size):
    h = aio_handle(block_size, 32, False, False, 1)
    path = str(tmp_path / "x.bin")
    src = data(3 * 4096 + 100, block_size)
    assert h.sync_pwrite(src, path) == 1
    back = torch.zeros_like(src)
    assert h.sync_pread(back, path) == 1
    assert torch.equal(src, back)
    # async: 0 now, and wait() counts the requests it finished.
    other = data(4096, 7)
    assert h.async_pwrite(other, path, 8192) == 0
    assert h.wait() == 1
    part = torch.zeros(4096, dtype=torch.uint8)
    assert h.async_pread(part, path, file_offset=8192) == 0
    assert h.wait() == 1
    assert torch.equal(part, other)
    with open(path, "rb") as f:
        whole = f.read()
    assert whole[:8192] == src.numpy().tobytes()[:8192]
    assert whole[8192:12288] == other.numpy().tobytes()


def test_pread_and_pwrite_take_validate_async_and_file_offset(tmp_path):
    h = aio_handle()
    path = str(tmp_path / "p.bin")
    src = data(10000, 3)
    assert h.pwrite(src, path, True, False, 4096) == 1   # sync, validated
    assert h.pwrite(src, path, True, True, 20480) == 0   # async, validated at wait
    assert h.wait() == 1
    back = torch.zeros_like(src)
    assert h.pread(back, path, True, False, 20480) == 1
    assert torch.equal(back, src)
    assert h.pread(back, filename=path, validate=False, async_op=True, file_offset=4096) == 0
    assert h.wait() == 1
    assert torch.equal(back, src)
    assert h.pread(back, path, False, file_offset=4096, **{"async": False}) == 1  # DeepSpeed's keyword
    with pytest.raises(TypeError, match="async"):
        h.pread(back, path, False)


def test_validate_names_the_first_byte_that_differs(tmp_path):
    h = aio_handle()
    path = str(tmp_path / "v.bin")
    src = data(8192, 4)
    h.sync_pwrite(src, path)
    back = torch.zeros_like(src)
    h.async_pread(back, path)
    h.wait()
    back[5000] ^= 1  # the buffer no longer holds what the file does
    with pytest.raises(ValueError, match="offset 5000"):
        h._validate(back, path, 0)


def test_read_and_write_move_whole_files(tmp_path):
    h = aio_handle()
    path = str(tmp_path / "w.bin")
    src = data(5000, 5)
    assert h.write(src, path, False) == 1
    assert os.path.getsize(path) == 5000
    back = torch.zeros_like(src)
    assert h.read(back, path, True) == 1
    assert torch.equal(back, src)
    with pytest.raises(ValueError, match="5000 bytes, the buffer 4999"):
        h.read(torch.zeros(4999, dtype=torch.uint8), path, False)


def test_async_pwrite_takes_an_open_file_descriptor(tmp_path):
    h = aio_handle()
    path = str(tmp_path / "fd.bin")
    src = data(4096, 6)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        assert h.async_pwrite(src, fd, 4096) == 0
        assert h.wait() == 1
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read()[4096:] == src.numpy().tobytes()
    with pytest.raises(OSError, match="not an open file descriptor"):
        h.async_pwrite(src, 987654, 0)


def test_locked_tensors_come_and_go_through_the_handle():
    h = aio_handle()
    t = h.new_cpu_locked_tensor(num_elem=1000, example_tensor=torch.zeros(1, dtype=torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.numel() == 1000 and t.data_ptr() % 4096 == 0
    assert not t.any()
    assert h.free_cpu_locked_tensor(t)
