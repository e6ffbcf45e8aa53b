"""The file tier's chunk I/O: the C functions of the compiled build
(``_chunkio``) and the Python ones do the same steps with the same
outcomes. Every case runs both ways (the C one is skipped in the pure
build) through the seams the tier calls, ``_read_chunks`` and
``_write_chunks``."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from kvoffload.impl import fs_tier
from kvoffload.impl.fs_tier import CHUNK_SUFFIX, FsyncPolicy, _read_chunks, _write_chunks

CHUNK = 3 * 4096

compiled_only = pytest.mark.skipif(not fs_tier.COMPILED_IO, reason="this build has no C chunk I/O")


@pytest.fixture(params=[False, pytest.param(True, marks=compiled_only)], ids=["python", "compiled"])
def compiled(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def payload(seed: int, size: int = CHUNK) -> memoryview:
    return memoryview(np.random.default_rng(seed).bytes(size))


def spare() -> memoryview:
    return memoryview(mmap.mmap(-1, 4096))


def read(paths: list[Path], compiled: bool, size: int = CHUNK) -> tuple[list[int | Exception], list[bytes]]:
    buffers = [memoryview(bytearray(size)) for _ in paths]
    results = _read_chunks([str(p) for p in paths], buffers, spare(), False, compiled)
    return results, [bytes(b) for b in buffers]


# --- reads -------------------------------------------------------------------------


def test_a_batch_reads_each_file_and_fails_only_the_bad_ones(tmp_path: Path, compiled: bool) -> None:
    whole, short, longer = tmp_path / "whole", tmp_path / "short", tmp_path / "longer"
    whole.write_bytes(bytes(payload(1)))
    short.write_bytes(bytes(payload(2))[:-10])
    longer.write_bytes(bytes(payload(3)) + b"xyz")
    missing, folder = tmp_path / "missing", tmp_path / "folder"
    folder.mkdir()
    results, data = read([whole, missing, short, folder, longer], compiled)
    assert results[0] == CHUNK and data[0] == bytes(payload(1))
    assert isinstance(results[1], FileNotFoundError) and results[1].filename == str(missing)
    assert results[2] == CHUNK - 10 and data[2][: CHUNK - 10] == bytes(payload(2))[:-10]
    assert isinstance(results[3], IsADirectoryError)
    assert results[4] == CHUNK + 3 and data[4] == bytes(payload(3))


def test_an_empty_batch_reads_nothing(compiled: bool) -> None:
    assert _read_chunks([], [], spare(), False, compiled) == []


def test_a_read_that_comes_back_short_reads_on_until_the_chunk_is_whole(
    tmp_path: Path, compiled: bool
) -> None:
    """A FIFO hands the bytes over as the writer writes them, so each read
    comes back short, as on a network file system."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = bytes(payload(4))

    def writer() -> None:
        with open(fifo, "wb", buffering=0) as out:
            for start in range(0, CHUNK, 1000):
                out.write(data[start : start + 1000])
                time.sleep(0.001)

    thread = threading.Thread(target=writer, daemon=True)  # a writer a failed read left blocked cannot hold the run
    thread.start()
    results, got = read([fifo], compiled)
    thread.join(10)
    assert results == [CHUNK] and got[0] == data


# --- writes ------------------------------------------------------------------------


def write(tmp_path: Path, compiled: bool, seed: int = 1, recycled: Path | None = None,
          fsync: FsyncPolicy = FsyncPolicy.NONE, name: str = "c") -> Path:
    """One item through ``_write_chunks``, its error raised."""
    [outcome] = _write_chunks(
        [str(tmp_path / f"{name}.tmp")], [str(tmp_path / name)], [payload(seed)],
        [None if recycled is None else str(recycled)], fsync, False, None, compiled,
    )
    if isinstance(outcome, OSError):
        raise outcome
    assert outcome == 0, "no CRC-32 asked for"
    return tmp_path / f"{name}{CHUNK_SUFFIX}"


@pytest.mark.parametrize("fsync", list(FsyncPolicy))
def test_a_write_lands_under_its_final_name_only(
    tmp_path: Path, compiled: bool, fsync: FsyncPolicy
) -> None:
    final = write(tmp_path, compiled, fsync=fsync)
    assert final.read_bytes() == bytes(payload(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.kvc"]


def test_a_recycled_file_is_overwritten_and_cut_to_the_chunk(tmp_path: Path, compiled: bool) -> None:
    old = tmp_path / "old.kvc"
    old.write_bytes(bytes(payload(9, 2 * CHUNK)))
    final = write(tmp_path, compiled, recycled=old)
    assert final.read_bytes() == bytes(payload(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.kvc"]


def test_a_vanished_recycled_file_is_replaced_by_a_new_one(tmp_path: Path, compiled: bool) -> None:
    final = write(tmp_path, compiled, recycled=tmp_path / "gone.kvc")
    assert final.read_bytes() == bytes(payload(1))


def test_a_missing_shard_folder_is_made(tmp_path: Path, compiled: bool) -> None:
    final = write(tmp_path / "shard", compiled)
    assert final.read_bytes() == bytes(payload(1))
    assert sorted(p.name for p in (tmp_path / "shard").iterdir()) == ["c.kvc"]


def test_a_recycled_file_is_moved_into_a_shard_with_no_folder_yet(
    tmp_path: Path, compiled: bool
) -> None:
    """Regression (found by the file-tier state machine): the rename of the
    recycled file into a missing shard folder failed like a vanished
    recycled file, so a new file was written and the evicted chunk's file
    was left behind, to come back when the tier was reopened."""
    old = tmp_path / "old.kvc"
    old.write_bytes(bytes(payload(9)))
    final = write(tmp_path / "shard", compiled, recycled=old)
    assert final.read_bytes() == bytes(payload(1))
    assert not old.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]


def test_a_missing_folder_above_the_shard_is_a_file_not_found_error(
    tmp_path: Path, compiled: bool
) -> None:
    """One level is made, not more: a tier whose chunk folder is gone fails
    its writes rather than making the tier's directory again."""
    with pytest.raises(FileNotFoundError) as raised:
        write(tmp_path / "gone" / "shard", compiled)
    assert raised.value.filename == str(tmp_path / "gone" / "shard" / "c.tmp")
    assert list(tmp_path.iterdir()) == []


def test_a_temp_name_in_use_is_left_alone(tmp_path: Path, compiled: bool) -> None:
    (tmp_path / "c.tmp").write_bytes(b"another writer's")
    with pytest.raises(FileExistsError):
        write(tmp_path, compiled)
    assert (tmp_path / "c.tmp").read_bytes() == b"another writer's"
    assert not (tmp_path / "c.kvc").exists()


def test_a_failed_rename_leaves_no_temp_file(tmp_path: Path, compiled: bool) -> None:
    (tmp_path / "c.kvc").mkdir()
    (tmp_path / "c.kvc" / "inside").write_bytes(b"x")
    with pytest.raises(OSError) as raised:
        write(tmp_path, compiled)
    assert raised.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert not (tmp_path / "c.tmp").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_write_that_runs_out_of_room_fails_and_leaves_no_temp_file(
    tmp_path: Path, compiled: bool
) -> None:
    """A file size limit stops the write half-way (EFBIG, as a full disk
    stops it with ENOSPC); in a subprocess, so the limit binds nothing else."""
    script = textwrap.dedent(
        f"""
        import resource, sys
        import numpy as np
        from kvoffload.impl.fs_tier import FsyncPolicy, _write_chunks
        resource.setrlimit(resource.RLIMIT_FSIZE, ({CHUNK // 2}, {CHUNK // 2}))
        data = memoryview(np.ones({CHUNK}, dtype=np.uint8)).cast("B")
        [error] = _write_chunks([sys.argv[1] + "/c.tmp"], [sys.argv[1] + "/c."], [data],
                                [None], FsyncPolicy.NONE, False, None, {compiled})
        print(type(error).__name__, getattr(error, "errno", None))
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.split() == ["OSError", str(errno.EFBIG)], done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


@compiled_only
def test_a_batch_the_c_call_refuses_fails_each_of_its_reads(tmp_path: Path) -> None:
    """An error of the C call itself (here a read-only buffer) fails every
    read of the batch, as results: the pool thread goes on."""
    (tmp_path / "f").write_bytes(bytes(payload(1)))
    results = _read_chunks([str(tmp_path / "f")], [memoryview(bytes(CHUNK))], spare(), False, True)
    assert len(results) == 1 and isinstance(results[0], (TypeError, BufferError))


# --- batches of writes -------------------------------------------------------------

CRC_FUNCTIONS = [
    pytest.param(None, id="crc-before"),
    pytest.param("zlib", id="zlib",
                 marks=pytest.mark.skipif(fs_tier._zlib_c_crc32() is None,
                                          reason="no zlib with crc32_z to open")),
    pytest.param("libdeflate", id="libdeflate",
                 marks=pytest.mark.skipif(fs_tier._FAST_CRC32 is None,
                                          reason="the system has no libdeflate")),
    pytest.param("pclmul", id="pclmul",
                 marks=pytest.mark.skipif(fs_tier._CLMUL_CRC32 is None,
                                          reason="no carry-less multiplication CRC-32 here")),
]


def crc_function(name: str | None) -> fs_tier._CFunction | None:
    if name == "zlib":
        return fs_tier._zlib_c_crc32()
    if name in ("libdeflate", "pclmul"):
        return fs_tier._c_crc32(name)
    return None


@pytest.mark.parametrize("crc_name", CRC_FUNCTIONS)
def test_a_batch_names_each_chunk_by_its_crc32(
    tmp_path: Path, compiled: bool, crc_name: str | None
) -> None:
    """With a CRC-32 function, each file's final name is its prefix, the
    CRC-32 of its bytes (zlib's, whichever library computes it) as 8 hex
    digits, then the suffix; the result is that CRC-32."""
    crc32 = crc_function(crc_name)
    data = [payload(seed, CHUNK + seed) for seed in range(3)]
    outcomes = _write_chunks(
        [str(tmp_path / f"{i}.tmp") for i in range(3)], [str(tmp_path / f"{i}.") for i in range(3)],
        data, [None] * 3, FsyncPolicy.NONE, False, crc32, compiled,
    )
    if crc32 is None:
        assert outcomes == [0, 0, 0]
        expected = [f"{i}.{CHUNK_SUFFIX}" for i in range(3)]
    else:
        assert outcomes == [zlib.crc32(d) for d in data]
        expected = [f"{i}.{zlib.crc32(d):08x}{CHUNK_SUFFIX}" for i, d in enumerate(data)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
    for name, d in zip(expected, data):
        assert (tmp_path / name).read_bytes() == bytes(d)


def test_a_failed_item_fails_that_item_only(tmp_path: Path, compiled: bool) -> None:
    """The middle item's temp name is taken (another writer's file) and the
    last one's folder is missing two levels deep: each fails with its own
    error; the first is written all the same, the other writer's file is
    left alone."""
    (tmp_path / "b.tmp").write_bytes(b"another writer's")
    gone = tmp_path / "gone" / "shard"
    outcomes = _write_chunks(
        [str(tmp_path / "a.tmp"), str(tmp_path / "b.tmp"), str(gone / "c.tmp")],
        [str(tmp_path / "a"), str(tmp_path / "b"), str(gone / "c")],
        [payload(1), payload(2), payload(3)], [None] * 3, FsyncPolicy.NONE, False, None,
        compiled,
    )
    assert outcomes[0] == 0
    assert isinstance(outcomes[1], FileExistsError)
    assert isinstance(outcomes[2], FileNotFoundError)
    assert (tmp_path / "a.kvc").read_bytes() == bytes(payload(1))
    assert (tmp_path / "b.tmp").read_bytes() == b"another writer's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kvc", "b.tmp"]


@compiled_only
def test_a_batch_the_c_call_refuses_raises_and_writes_nothing(tmp_path: Path) -> None:
    """Lists of different lengths or an unknown CRC-32 signature are refused
    before any file is touched (the tier then fails every item)."""
    write_chunks = fs_tier._COMPILED_IO[1]  # type: ignore[index]
    with pytest.raises(ValueError, match="differ in length"):
        write_chunks([str(tmp_path / "a.tmp")], [], CHUNK_SUFFIX, [payload(1)], [None], 0,
                     False, 0, 0)
    with pytest.raises(ValueError, match="crc_kind"):
        write_chunks([str(tmp_path / "a.tmp")], [str(tmp_path / "a.")], CHUNK_SUFFIX,
                     [payload(1)], [None], 0, False, 1, 7)
    with pytest.raises(ValueError, match="need a crc_function"):
        write_chunks([str(tmp_path / "a.tmp")], [str(tmp_path / "a.")], CHUNK_SUFFIX,
                     [payload(1)], [None], 0, False, 0, 1)
    assert list(tmp_path.iterdir()) == []


@compiled_only
def test_the_c_crc32_runs_once_per_opened_write(tmp_path: Path) -> None:
    """The C call computes an item's CRC-32 once its temp file is open: an
    item whose file cannot be created (its folder is missing two levels
    deep) costs no CRC-32, and a written item costs one. A counting CRC-32
    function (a ctypes callback with libdeflate's signature) tells."""
    calls: list[int] = []

    def count(crc: int, address: int, length: int) -> int:
        calls.append(length)
        return zlib.crc32(ctypes.string_at(address, length), crc)

    signature = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_size_t)
    counting = signature(count)
    crc32 = fs_tier._CFunction(ctypes.cast(counting, ctypes.c_void_p).value or 0,
                               fs_tier._CRC_LIBDEFLATE)
    temps = [str(tmp_path / "a.tmp"), str(tmp_path / "gone" / "shard" / "b.tmp")]
    prefixes = [str(tmp_path / "a."), str(tmp_path / "gone" / "shard" / "b.")]
    data = [payload(1), payload(2)]
    first = _write_chunks(temps, prefixes, data, [None, None], FsyncPolicy.NONE, False, crc32,
                          True)
    assert first[0] == zlib.crc32(data[0]) and isinstance(first[1], FileNotFoundError)
    assert calls == [CHUNK]
    (tmp_path / "gone").mkdir()
    again = _write_chunks(temps[1:], prefixes[1:], data[1:], [None], FsyncPolicy.NONE, False,
                          crc32, True)
    assert again == [zlib.crc32(data[1])]
    assert calls == [CHUNK, CHUNK]
    assert (tmp_path / "gone" / "shard" / f"b.{zlib.crc32(data[1]):08x}{CHUNK_SUFFIX}").exists()


@compiled_only
def test_the_built_in_crc32_is_zlibs() -> None:
    """``_chunkio.crc32`` (carry-less multiplication where the CPU has it:
    64-byte folds, then 16-byte ones, then a table for the rest) gives
    zlib's values at every length around the fold boundaries, at unaligned
    addresses, and continued from a previous value."""
    from kvoffload.impl import _chunkio

    data = bytes(payload(5, 1 << 20))
    lengths = [*range(0, 300), 1023, 1024, 1025, 4095, 65535, 65536, 65537, 1 << 20]
    for length in lengths:
        for offset in (0, 1, 7):
            chunk = memoryview(data)[offset : offset + min(length, len(data) - offset)]
            assert _chunkio.crc32(chunk) == zlib.crc32(chunk), (length, offset)
            assert _chunkio.crc32(chunk, 0xDEADBEEF) == zlib.crc32(chunk, 0xDEADBEEF)
    half = len(data) // 3
    assert _chunkio.crc32(data[half:], _chunkio.crc32(data[:half])) == zlib.crc32(data)
