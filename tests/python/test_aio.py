"""strata.aio: round trips for every dtype and size from 1 byte to 64 MiB,
on io_uring and the POSIX pool, direct and buffered; unaligned requests
(handled under direct="prefer", refused under "require"); missing
directories, read-only files and tmpfs; and every bad argument."""
import os
import subprocess
import threading

import numpy as np
import pytest

import strata.aio as aio

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")

SIZES = [1, 7, 4096, 4097, 1 << 20, (1 << 20) + 3, 64 << 20]
NUMPY_DTYPES = ["float32", "float16", "int8", "uint8", "float64", "int32", "int64"]


@pytest.fixture
def ext4_dir(tmp_path_factory):
    # /tmp is ext4 here (O_DIRECT works); pytest's tmp_path lives under it.
    return tmp_path_factory.mktemp("aio")


def rng_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# direct="require" takes aligned sizes only (test_require_refuses_unaligned).
@pytest.mark.parametrize("size,direct", [(s, d) for s in SIZES for d in ("prefer", "require", "off")
                                         if d != "require" or s % 4096 == 0])
def test_round_trip_sizes(ext4_dir, size, direct):
    h = aio.Handle(direct=direct)
    src = aio.pinned_empty(size, "uint8")
    src[:] = rng_bytes(size, size)
    path = str(ext4_dir / f"s{size}.bin")
    h.pwrite(src, path, 0)
    assert h.wait() == 1
    assert os.path.getsize(path) == size
    dst = aio.pinned_empty(size, "uint8")
    h.pread(dst, path, 0)
    assert h.wait() == 1
    assert np.array_equal(src, dst)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_round_trip_numpy_dtypes(ext4_dir, dtype):
    h = aio.Handle()
    src = (np.random.default_rng(1).standard_normal(10001) * 100).astype(dtype)
    path = str(ext4_dir / "d.bin")
    h.pwrite(src, path, 8192)
    h.wait()
    dst = np.zeros_like(src)
    h.pread(dst, path, 8192)
    h.wait()
    assert np.array_equal(src, dst)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8,
                                   torch.float64, torch.int64])
def test_round_trip_torch_dtypes_and_locked_tensors(ext4_dir, dtype):
    h = aio.Handle()
    src = aio.pinned_empty(5000, dtype=dtype, like="torch")
    assert src.data_ptr() % 4096 == 0
    src.copy_((torch.randn(5000) * 50).to(dtype))
    path = str(ext4_dir / "t.bin")
    h.pwrite(src, path, 0)
    h.wait()
    dst = torch.empty_like(src)
    h.pread(dst, path, 0)
    h.wait()
    assert torch.equal(src, dst)
    like = h.new_cpu_locked_tensor(10, src)
    assert like.dtype == dtype and like.numel() == 10


def test_many_requests_in_flight_and_the_posix_pool(ext4_dir):
    for backend in ("auto", "posix"):
        h = aio.Handle(block_size=64 << 10, queue_depth=4, intra_op_parallelism=2, backend=backend)
        if backend == "posix":
            assert h.backend != "io_uring"
        bufs = [aio.pinned_empty(300 << 10, "uint8") for _ in range(12)]
        path = str(ext4_dir / f"many-{backend}.bin")
        for k, b in enumerate(bufs):
            b[:] = k + 1
            h.pwrite(b, path, k * (300 << 10))
        assert h.pending() == 12
        assert h.wait() == 12
        back = [np.zeros(300 << 10, np.uint8) for _ in bufs]
        for k, b in enumerate(back):
            h.async_pread(b, path, k * (300 << 10))
        assert h.wait() == 12
        assert all(np.all(b == k + 1) for k, b in enumerate(back))
        h.close()


def test_unaligned_offsets_are_handled_under_prefer(ext4_dir):
    h = aio.Handle()  # direct="prefer"
    src = rng_bytes(10000, 3)
    path = str(ext4_dir / "u.bin")
    h.pwrite(src, path, 4097)
    h.wait()
    dst = np.zeros(10000, np.uint8)
    h.sync_pread(dst, path, 4097)
    assert np.array_equal(src, dst)
    with open(path, "rb") as f:
        f.seek(4097)
        assert f.read(10000) == src.tobytes()


def test_require_refuses_unaligned(ext4_dir):
    h = aio.Handle(direct="require")
    path = str(ext4_dir / "r.bin")
    aligned = aio.pinned_empty(8192, "uint8")
    with pytest.raises(ValueError, match="multiples of 4096"):
        h.pwrite(aligned, path, 100)
    with pytest.raises(ValueError, match="multiples of 4096"):
        h.pwrite(aio.pinned_empty(100, "uint8"), path, 0)
    assert h.pending() == 0
    h.pwrite(aligned, path, 4096)
    assert h.wait() == 1


def shm_dir():
    for d in ("/dev/shm", "/run/shm"):
        if os.path.isdir(d) and os.access(d, os.W_OK):
            out = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
            if out == "tmpfs":
                return d
    return None


def test_tmpfs_is_refused_under_require_and_buffered_under_prefer():
    d = shm_dir()
    if d is None:
        pytest.skip("no writable tmpfs at /dev/shm or /run/shm on this machine")
    path = os.path.join(d, f"strata-aio-{os.getpid()}.bin")
    try:
        buf = aio.pinned_empty(4096, "uint8")
        with pytest.raises(ValueError, match="O_DIRECT"):
            aio.Handle(direct="require").pwrite(buf, path, 0)
        h = aio.Handle()
        buf[:] = 9
        h.pwrite(buf, path, 0)
        h.wait()
        back = np.zeros(4096, np.uint8)
        h.sync_pread(back, path, 0)
        assert np.all(back == 9)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_missing_directory_and_missing_file(ext4_dir):
    h = aio.Handle()
    buf = aio.pinned_empty(4096, "uint8")
    with pytest.raises(FileNotFoundError, match="nope"):
        h.pwrite(buf, str(ext4_dir / "nope" / "x.bin"), 0)
    with pytest.raises(FileNotFoundError, match="absent.bin"):
        h.pread(buf, str(ext4_dir / "absent.bin"), 0)
    assert h.pending() == 0


def test_read_past_the_end_raises_at_wait_naming_the_file(ext4_dir):
    h = aio.Handle()
    path = str(ext4_dir / "short.bin")
    h.sync_pwrite(aio.pinned_empty(4096, "uint8"), path, 0)
    big = aio.pinned_empty(8192, "uint8")
    h.pread(big, path, 0)
    with pytest.raises(OSError, match="short.bin"):
        h.wait()
    assert h.pending() == 0


def test_read_only_file(ext4_dir):
    path = str(ext4_dir / "ro.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    if os.geteuid() == 0:
        # Root writes through permission bits: an immutable file stops it.
        if subprocess.run(["chattr", "+i", path], capture_output=True).returncode != 0:
            pytest.skip("root, and chattr +i is refused here (no CAP_LINUX_IMMUTABLE or no ext attributes)")
    else:
        os.chmod(path, 0o444)
    try:
        h = aio.Handle()
        with pytest.raises(PermissionError, match="ro.bin"):
            h.pwrite(aio.pinned_empty(4096, "uint8"), path, 0)
        back = np.ones(4096, np.uint8)
        h.sync_pread(back, path, 0)  # reading it still works
        assert not back.any()
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", path])


@pytest.mark.parametrize("kwargs,err,msg", [
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=(1 << 30) + 1), ValueError, "block_size"),
    (dict(queue_depth=0), ValueError, "queue_depth"),
    (dict(intra_op_parallelism=0), ValueError, "intra_op_parallelism"),
    (dict(direct="maybe"), ValueError, "direct"),
    (dict(backend="spdk"), ValueError, "spdk"),
])
def test_handle_bad_arguments(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        aio.Handle(**kwargs)


def test_request_bad_arguments(ext4_dir):
    h = aio.Handle()
    path = str(ext4_dir / "b.bin")
    buf = aio.pinned_empty(4096, "uint8")
    with pytest.raises(TypeError, match="expected a numpy.ndarray or a torch.Tensor"):
        h.pwrite(b"bytes", path, 0)
    with pytest.raises(ValueError, match="offset"):
        h.pwrite(buf, path, -1)
    with pytest.raises(TypeError, match="offset"):
        h.pwrite(buf, path, 1.5)
    with pytest.raises(ValueError, match="path"):
        h.pwrite(buf, "", 0)
    with pytest.raises(ValueError, match="contiguous"):
        h.pwrite(np.zeros(100)[::2], path, 0)
    frozen = np.zeros(10, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        h.pread(frozen, path, 0)
    assert h.pending() == 0


def test_pinned_empty_bad_arguments():
    with pytest.raises(TypeError, match="dtype"):
        aio.pinned_empty(10, "complex64")
    with pytest.raises(ValueError, match="numel"):
        aio.pinned_empty(-1)
    with pytest.raises(ValueError, match="like"):
        aio.pinned_empty(10, like="jax")
    with pytest.raises(TypeError, match="bfloat16"):
        aio.pinned_empty(10, "bfloat16")
    a = aio.pinned_empty(0)
    assert a.size == 0


def test_a_failed_close_raises_and_leaves_the_handle_clean():
    # A close whose flush fails (/dev/full refuses the write and
    # its fdatasync) raised, but kept the file attached, and the handle's
    # destructor then aborted the process on a second detach. Run in a
    # child so an abort shows as its exit status.
    script = """
import sys
import numpy as np
import strata.aio as aio
h = aio.Handle(direct="off")
h.pwrite(np.ones(4096, np.uint8), "/dev/full", 0)
try:
    h.wait()
except OSError as e:
    print("wait:", e)
try:
    h.close()
    print("close: no error")
except OSError as e:
    print("close raised:", e)
h.close()  # nothing left open: a second close is a no-op
del h
print("clean exit")
"""
    r = subprocess.run([os.sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "close raised:" in r.stdout and "/dev/full" in r.stdout, r.stdout
    assert "clean exit" in r.stdout


@pytest.mark.parametrize("block_size", [1, 1000, 1024, 4096 + 512])
@pytest.mark.parametrize("direct", ["prefer", "off"])
def test_any_block_size_reads_back_the_bytes_written(ext4_dir, block_size, direct):
    # A block size that is not a multiple of 4096 cuts a request into
    # pieces O_DIRECT cannot take: under "prefer" they go through the page
    # cache. Every piece lands at its own offset.
    h = aio.Handle(block_size=block_size, direct=direct)
    size = 3 * 4096 + 17 if block_size > 1 else 4099
    src = aio.pinned_empty(size, "uint8")
    src[:] = rng_bytes(size, block_size)
    path = str(ext4_dir / "b.bin")
    h.pwrite(src, path, 8192)
    assert h.wait() == 1
    dst = aio.pinned_empty(size, "uint8")
    assert h.sync_pread(dst, path, 8192) == 1
    assert np.array_equal(src, dst)
    with open(path, "rb") as f:
        f.seek(8192)
        assert f.read() == src.tobytes()


def test_require_refuses_a_block_size_direct_io_cannot_cut():
    h = aio.Handle(block_size=1024, direct="require")
    with pytest.raises(ValueError, match="block size"):
        h.pwrite(aio.pinned_empty(8192, "uint8"), "/tmp/unused.bin", 0)


def _rounds(handle_of, thread, rounds, size, folder, errors):
    # Each thread owns its file region; every round writes a pattern that
    # names the thread and the round, reads it back and compares.
    try:
        h = handle_of(thread)
        path = str(folder / f"t{thread}.bin")
        out = aio.pinned_empty(size, "uint8")
        back = aio.pinned_empty(size, "uint8")
        for r in range(rounds):
            out[:] = (thread * 31 + r) % 251
            if r % 2:
                assert h.sync_pwrite(out, path, 0) == 1
                assert h.sync_pread(back, path, 0) == 1
            else:
                h.async_pwrite(out, path, 0)
                h.wait()
                h.async_pread(back, path, 0)
                h.wait()
            if not np.array_equal(out, back):
                raise AssertionError(f"thread {thread} round {r}: read back other bytes")
    except BaseException as e:  # reported by the main thread
        errors.append(e)


@pytest.mark.parametrize("threads", [2, 4, 8])
@pytest.mark.parametrize("shared", [True, False], ids=["one shared handle", "a handle each"])
@pytest.mark.parametrize("size", [4096, 1 << 20])
def test_threads_on_shared_and_own_handles_finish_with_the_right_bytes(ext4_dir, threads, shared, size):
    # Two threads calling sync_pread on one handle deadlocked in the first
    # round: wait() re-took the GIL under the handle's lock, submit() took
    # the lock under the GIL. Every call now drops the GIL before the lock.
    rounds = 1000 if size == 4096 else 20
    one = aio.Handle()
    own = [aio.Handle() for _ in range(threads)]
    handle_of = (lambda t: one) if shared else (lambda t: own[t])
    errors = []
    workers = [threading.Thread(target=_rounds, args=(handle_of, t, rounds, size, ext4_dir, errors), daemon=True)
               for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert not any(w.is_alive() for w in workers), "a thread did not finish: deadlocked"
    assert not errors, errors[0]
    assert one.pending() == 0
