"""A secondary tier on a local file system: :class:`FileSystemTier`.

It speaks the secondary-tier contract (:mod:`kvoffload.spec.tier_contract`,
vLLM 0.33's ``SecondaryTierManager`` shape). One chunk, one file::

    DIRECTORY/
      kvoffload-tier.json   manifest: format version, chunk size in bytes
      .lock                 held (flock) while a tier has the directory open
      chunks/<hh>/<key hex>.<serial hex>.<crc hex>.kvc   a complete chunk
      chunks/<hh>/<key hex>.<serial hex>.tmp             a chunk being written

``<hh>`` is the first two hex digits of the key (256 shards). A chunk file
holds exactly the chunk's bytes; its name carries the CRC-32 of those bytes
(``n`` when checksums are off). It is written under its ``.tmp`` name and
renamed to ``.kvc`` when complete, so a crash mid-write leaves only a temp
file (removed when the directory is opened again), never a readable torn
chunk. A load reads the file straight into the primary slot and checks its
length and (by default) its checksum: a truncated or corrupt file is a failed
load, never wrong bytes, and the file is dropped.

A store that evicts a chunk rewrites the evicted chunk's file rather than
removing it and creating a new one (``recycle_files``): the file is renamed to
the new chunk's temp name, overwritten and renamed again, so the same rules
hold (its old bytes are never readable under the new name).

The serial in the name (one counter per directory, never reused) makes every
store of a key a distinct file: removing an evicted chunk can never race with
a later store of the same key, and when a crash left two files for one key
the newest wins on reopen.

Scheduler-side calls run on the caller's thread and only queue work; copies,
checksums and file I/O run on a small pool of threads, with ``O_DIRECT``
where the file system, the chunk size and the primary buffer's alignment
allow it. One lock guards the index, the queues and the results: callers
never enter concurrently, but completions arrive from pool threads.

In the compiled build a pool thread's file I/O runs in C
(:mod:`kvoffload.impl._chunkio`) with the interpreter lock released once per
batch of loads or of stores (a thread's share of a job's items; stores at
most :data:`STORE_BATCH_BYTES`), instead of once per system call, and a
store's CRC-32 computed in the same call; the Python functions below are
the same steps and run where it is not built (``compiled_io``,
:attr:`FileSystemTier.io_source`).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import enum
import json
import logging
import mmap
import operator
import os
import re
import sys
import threading
import zlib
from _ctypes import CFuncPtr as _CFuncPtr
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import Any, NamedTuple

from kvoffload.impl.backend import require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.policies import CachePolicy, EvictedBlocks, make_cache_policy
from kvoffload.spec.contract import (
    LookupResult,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.errors import (
    ConfigurationError,
    InvalidKeyError,
    TierClosedError,
    TransferError,
)
from kvoffload.spec.keys import OffloadKey, validate_offload_key, validate_offload_keys
from kvoffload.spec.tier_contract import JobId, TierJobLike, TierJobResult

__all__ = [
    "CHUNK_SUFFIX",
    "COMPILED_IO",
    "CRC32_SOURCE",
    "CRC32_CHOICES",
    "choose_crc32",
    "crc32_sources",
    "MANIFEST_NAME",
    "MAX_KEY_BYTES",
    "TEMP_SUFFIX",
    "NO_CHECKSUM",
    "MEMORY_FILE_SYSTEMS",
    "FileSystemTier",
    "FsyncPolicy",
    "file_system_type",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "kvoffload-tier.json"
"""The manifest at the top of a tier's directory."""
LOCK_NAME = ".lock"
CHUNK_DIR = "chunks"
CHUNK_SUFFIX = ".kvc"
"""A complete chunk file."""
TEMP_SUFFIX = ".tmp"
"""A chunk file being written (never read; removed on reopen)."""
FORMAT_VERSION = 1
MAX_KEY_BYTES = 100
"""The longest key a tier stores (its hex name must fit a file name)."""

NO_CHECKSUM = "n"
"""The checksum field of a chunk written without one."""
DIRECT_ALIGNMENT = 4096
"""Alignment ``O_DIRECT`` needs of buffers, sizes and offsets (bytes)."""
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)

DEFAULT_THREADS = 32
"""The pool threads of a tier built without ``num_threads`` on a device."""

VERIFY_LOADS = ("reopened", "always")
"""The values of :class:`FileSystemTier`'s ``verify_loads`` option."""

MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})
"""File systems kept in memory: none of their files outlives a power loss
or a kernel crash, the events a chunk's CRC-32 guards against (a process
killed mid-write leaves only a temp name). ``checksum="auto"`` records
none on them."""


class FsyncPolicy(enum.Enum):
    """When a store forces its bytes to the disk.

    ``NONE`` (the default): never. A process that dies mid-write leaves no
    readable chunk (the rename is atomic); after a power loss a chunk whose
    bytes had not reached the disk fails its length or checksum check on
    load. ``CHUNK``: ``fsync`` each chunk file before its rename, so a chunk
    that became readable keeps its bytes through a power loss. ``FULL``: also
    ``fsync`` the chunk's directory after the rename, so its name survives
    too.
    """

    NONE = "none"
    CHUNK = "chunk"
    FULL = "full"


_FSYNC_CODE = {FsyncPolicy.NONE: 0, FsyncPolicy.CHUNK: 1, FsyncPolicy.FULL: 2}
"""The C chunk I/O's code for each :class:`FsyncPolicy`."""

STORE_BATCH_BYTES = 1 << 20
"""The most bytes a pool thread writes in one batch of store items (at
least one item): batching amortizes a call's fixed cost (the interpreter
lock's hand-offs, the bookkeeping) over small chunks, while a chunk this
large costs far more than the call, and a second one in the same batch
would only wait for the first where another thread could write it (on 16
CPUs, 1 MiB stores into tmpfs ran at 0.78-0.79x the rate of one item per
call when threads took batches of 2-4; docs/PERFORMANCE.md)."""


# --- file I/O (module functions, so tests can make one fail) -------------------


def _advance(buffers: list[memoryview], done: int) -> list[memoryview]:
    """``buffers`` with their first ``done`` bytes dropped."""
    rest: list[memoryview] = []
    for buffer in buffers:
        if done >= len(buffer):
            done -= len(buffer)
            continue
        rest.append(buffer[done:] if done else buffer)
        done = 0
    return rest


def _make_folder_of(path: str) -> bool:
    """Make the folder ``path`` is in (one level: its parent must exist);
    whether it is there now."""
    try:
        os.mkdir(os.path.dirname(path))
    except FileExistsError:
        return True
    except OSError:
        return False
    return True


def _write_chunk(
    temp_path: str,
    final_path: str,
    payload: memoryview,
    fsync: FsyncPolicy,
    direct: bool,
    recycled: str | None = None,
) -> None:
    """Write ``payload`` to ``temp_path`` and rename it to ``final_path``;
    raises OSError (and leaves no temp file) on failure.

    With ``recycled`` (the file of a chunk no longer in the index), that file
    is renamed to ``temp_path`` first and overwritten in place: its blocks
    are already allocated, which spares the create and the allocation. Its
    old bytes are never readable under ``final_path``: the rename to it comes
    only after the whole payload is written (and the file cut to its length);
    a crash before leaves a temp file. When ``recycled`` is gone, a new file
    is created. The folder of ``temp_path`` is made when it is missing (one
    level: a shard's first chunk), before the recycled file is moved into it
    or the new file is created there. (:func:`_write_chunks` runs a batch of
    these, in C where the build has it.)"""
    direct_flag = _O_DIRECT if direct else 0
    fd = -1
    if recycled is not None:
        try:
            try:
                os.rename(recycled, temp_path)
            except FileNotFoundError:  # recycled gone, or no folder for temp_path yet
                if not _make_folder_of(temp_path):
                    raise
                os.rename(recycled, temp_path)
            fd = os.open(temp_path, os.O_WRONLY | direct_flag)
        except FileNotFoundError:
            fd = -1
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
            raise
    if fd < 0:
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | direct_flag
        try:
            fd = os.open(temp_path, create, 0o644)
        except FileNotFoundError as missing:  # the shard's first chunk: its folder
            if not _make_folder_of(temp_path):
                raise missing from None
            fd = os.open(temp_path, create, 0o644)
    try:
        try:
            if recycled is not None and os.fstat(fd).st_size > len(payload):
                os.ftruncate(fd, len(payload))
            remaining = [payload]
            while remaining:
                written = os.writev(fd, remaining)
                if written <= 0:
                    raise OSError(f"short write to {temp_path}")
                remaining = _advance(remaining, written)
            if fsync is not FsyncPolicy.NONE:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp_path, final_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
    if fsync is FsyncPolicy.FULL:
        dir_fd = os.open(os.path.dirname(final_path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read_chunk(path: str, payload: memoryview, direct: bool, spare: memoryview) -> int:
    """Read ``path`` into ``payload``; returns the bytes read, more than
    ``len(payload)`` when the file is longer (the caller checks the count).

    The read continues into ``spare`` (a page-aligned scratch page): a file
    longer than ``payload`` fills some of it, so the length is checked
    without a ``fstat``. Once ``payload`` is full the read stops: a read of
    a regular file comes back short only at the file's end, so a second
    ``readv`` to see 0 bytes would tell nothing new. That makes a load
    open, one ``readv``, close: as few system calls as a read can make,
    and each gives up and takes back the interpreter lock, which the pool
    threads contend for. A read short of ``payload`` (interrupted, on a
    network file system) is read on. The price: a read interrupted exactly
    at the end of ``payload`` hides bytes past it, so such a longer file
    reads as its first ``len(payload)`` bytes, which are whole (and
    checked against their CRC-32 where the tier verifies)."""
    fd = os.open(path, os.O_RDONLY | (_O_DIRECT if direct else 0))
    try:
        want, got, remaining = len(payload), 0, [payload, spare]
        while True:
            count = os.readv(fd, remaining)
            got += count
            if count == 0 or got >= want:
                return got
            remaining = _advance(remaining, count)
    finally:
        os.close(fd)


def _read_chunks(
    paths: Sequence[str],
    payloads: Sequence[memoryview],
    spare: memoryview,
    direct: bool,
    compiled: bool,
) -> list[int | Exception]:
    """:func:`_read_chunk` for each path into the payload at the same index:
    the bytes read, or the error that failed that read (it fails that chunk
    only). ``compiled``: the whole batch in C, the interpreter lock released
    once (where the build has it)."""
    if compiled and _COMPILED_IO is not None:
        try:
            counts = _COMPILED_IO[0](paths, payloads, spare, direct)
        except Exception as error:  # (out of memory): every read of the batch failed
            return [error] * len(paths)
        return [
            count if count >= 0 else OSError(-count, os.strerror(-count), path)
            for path, count in zip(paths, counts)
        ]
    results: list[int | Exception] = []
    for path, payload in zip(paths, payloads):
        try:
            results.append(_read_chunk(path, payload, direct, spare))
        except Exception as error:
            results.append(error)
    return results


class _CFunction(NamedTuple):
    """What the C chunk I/O calls to compute zlib's CRC-32 with the
    interpreter lock released: a C function's address and its signature
    (:data:`_CRC_LIBDEFLATE`, :data:`_CRC_ZLIB`), or the module's own
    (:data:`_CRC_CLMUL`, address 0)."""

    address: int
    kind: int


_CRC_LIBDEFLATE = 1
"""``uint32_t libdeflate_crc32(uint32_t crc, const void *data, size_t len)``"""
_CRC_ZLIB = 2
"""``uLong crc32_z(uLong crc, const Bytef *data, z_size_t len)`` (zlib >= 1.2.9)"""
_CRC_CLMUL = 3
"""The C I/O's own CRC-32 (``_chunkio.crc32``; no address)"""


def _write_chunks(
    temps: Sequence[str],
    prefixes: Sequence[str],
    payloads: Sequence[memoryview],
    recycled: Sequence[str | None],
    fsync: FsyncPolicy,
    direct: bool,
    crc32: _CFunction | None,
    compiled: bool,
) -> list[int | OSError]:
    """:func:`_write_chunk` for each item: ``payloads[i]`` written under
    ``temps[i]`` (over ``recycled[i]`` when given) and renamed to its final
    path, ``prefixes[i]``, then, with ``crc32``, the payload's CRC-32 as 8
    hex digits, then :data:`CHUNK_SUFFIX`. Each result is that CRC-32 (0
    without ``crc32``) or the error that failed that item (it fails that
    item only, and leaves no temp file). ``compiled``: the whole batch in C,
    the CRC-32s computed by ``crc32`` and the interpreter lock released once
    (where the build has it); the Python path computes the same CRC-32 with
    :func:`zlib.crc32`."""
    if compiled and _COMPILED_IO is not None:
        address, kind = crc32 if crc32 is not None else (0, 0)
        outcomes = _COMPILED_IO[1](
            temps, prefixes, CHUNK_SUFFIX, payloads, recycled, _FSYNC_CODE[fsync], direct,
            address, kind,
        )
        return [
            outcome if outcome >= 0 else OSError(-outcome, os.strerror(-outcome), temp)
            for temp, outcome in zip(temps, outcomes)
        ]
    results: list[int | OSError] = []
    for temp, prefix, payload, old in zip(temps, prefixes, payloads, recycled):
        crc = zlib.crc32(payload) if crc32 is not None else 0
        final = f"{prefix}{crc:08x}{CHUNK_SUFFIX}" if crc32 is not None else prefix + CHUNK_SUFFIX
        try:
            _write_chunk(temp, final, payload, fsync, direct, old)
            results.append(crc)
        except OSError as error:
            results.append(error)
    return results


_ReadChunks = Callable[[Sequence[str], Sequence[memoryview], memoryview, bool], list[int]]
_WriteChunks = Callable[
    [Sequence[str], Sequence[str], str, Sequence[memoryview], Sequence["str | None"], int,
     bool, int, int],
    list[int],
]


def _load_compiled_io() -> tuple[_ReadChunks, _WriteChunks] | None:
    """The C chunk I/O of the compiled build, or None (pure build)."""
    try:
        from kvoffload.impl import _chunkio
    except ImportError:
        return None
    return _chunkio.read_chunks, _chunkio.write_chunks


_COMPILED_IO = _load_compiled_io()
COMPILED_IO: bool = _COMPILED_IO is not None
"""Whether this build has the C chunk I/O (:mod:`kvoffload.impl._chunkio`)."""


def _load_clmul_crc32() -> Callable[[memoryview], int] | None:
    """The C I/O's CRC-32 where it runs by carry-less multiplication (the
    compiled build, an x86-64 CPU with PCLMULQDQ), else None."""
    try:
        from kvoffload.impl import _chunkio
    except ImportError:
        return None
    if not _chunkio.clmul_crc32():
        return None
    crc32: Callable[[memoryview], int] = _chunkio.crc32
    return crc32


_CLMUL_CRC32 = _load_clmul_crc32()


def _probe_direct_io(directory: Path) -> bool:
    """Whether ``O_DIRECT`` writes and reads work in ``directory``."""
    if not _O_DIRECT:
        return False
    path = directory / f".direct-probe-{os.getpid()}-{threading.get_ident()}"
    page = mmap.mmap(-1, DIRECT_ALIGNMENT)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
        try:
            os.write(fd, page)
            os.lseek(fd, 0, os.SEEK_SET)
            os.readv(fd, [page])
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        page.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


_MOUNTINFO = "/proc/self/mountinfo"


def _mount_field(text: str) -> str:
    """A path field of ``mountinfo``, its octal escapes (``\\040`` for a
    space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)


def _type_in_mountinfo(mountinfo: str, path: str) -> str | None:
    """The file-system type of the mount holding the absolute, resolved
    ``path`` in the ``mountinfo`` text (the deepest mount point above it;
    of two at one point, the later, which hides the earlier), or None."""
    found: str | None = None
    depth = -1
    for line in mountinfo.splitlines():
        head, separator, tail = line.partition(" - ")
        fields = head.split(" ")
        if not separator or len(fields) < 5 or not tail:
            continue
        point = _mount_field(fields[4])
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= depth:
            found, depth = tail.split(" ", 1)[0], len(point)
    return found


def file_system_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the file system that holds (or would hold) ``path``, as
    Linux names it (``"ext4"``, ``"tmpfs"``, ...), read from
    ``/proc/self/mountinfo``; None where that cannot be read (not Linux)."""
    try:
        with open(_MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            mountinfo = handle.read()
    except OSError:
        return None
    return _type_in_mountinfo(mountinfo, os.path.realpath(path))


def _address(view: memoryview) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


_Crc32At = Callable[[int, int, int], int]
"""``crc32(value, address, length)``: the CRC-32 of ``length`` bytes at
``address`` continued from ``value`` (zlib's CRC-32; 0 starts one)."""


def _open_crc32(
    libraries: Sequence[str], symbol: str, restype: Any, argtypes: tuple[Any, ...]
) -> Any:
    """The C function ``symbol`` of the first of ``libraries`` that opens,
    has it and gives zlib's CRC-32 of a probe (called ``(0, bytes, len)``),
    typed for :mod:`ctypes`; else None."""
    for name in libraries:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        function = getattr(library, symbol, None)
        if function is None:
            continue
        function.restype = restype
        function.argtypes = argtypes
        probe = b"kvoffload"
        if function(0, probe, len(probe)) == zlib.crc32(probe):
            return function  # (else not the CRC the file names record)
    return None


def _libdeflate_crc32() -> _Crc32At | None:
    """libdeflate's ``libdeflate_crc32`` when the system has the library,
    else None. It computes zlib's CRC-32 (same polynomial, same values) with
    carry-less multiplication where the CPU has it: 2-3x zlib's speed on the
    VM this is measured on. Called through ``ctypes.CDLL``, which releases
    the interpreter lock for the call, as ``zlib.crc32`` does."""
    crc32_at: _Crc32At | None = _open_crc32(
        ("libdeflate.so.0", "libdeflate.so", "libdeflate.0.dylib", "libdeflate.dylib"),
        "libdeflate_crc32", ctypes.c_uint32, (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t),
    )
    return crc32_at


_FAST_CRC32: _Crc32At | None = _libdeflate_crc32()


CRC32_CHOICES = ("auto", "libdeflate", "pclmul", "zlib")
"""The values of :class:`FileSystemTier`'s ``crc32`` option."""


def crc32_sources() -> tuple[str, ...]:
    """What can compute the chunks' CRC-32 here, fastest first (the
    ``crc32`` option of :class:`FileSystemTier`; ``"auto"`` takes the
    first): ``"libdeflate"`` where the system has it, ``"pclmul"`` in the
    compiled build on a CPU with carry-less multiplication, ``"zlib"``."""
    there = {"libdeflate": _FAST_CRC32, "pclmul": _CLMUL_CRC32, "zlib": zlib.crc32}
    return tuple(name for name in CRC32_CHOICES[1:] if there[name] is not None)


def choose_crc32(choice: object) -> str:
    """The CRC-32 source the ``crc32`` option ``choice`` names (``"auto"``:
    the fastest here); :class:`ConfigurationError` for an unknown name or
    one this machine does not have."""
    sources = crc32_sources()
    if choice == "auto":
        return sources[0]
    if choice not in CRC32_CHOICES:
        raise ConfigurationError(
            f"crc32 must be one of {', '.join(map(repr, CRC32_CHOICES))}, got {choice!r}"
        )
    if choice not in sources:
        raise ConfigurationError(
            f"crc32 {choice!r} is not available here (available: {', '.join(sources)})"
        )
    return str(choice)


CRC32_SOURCE = crc32_sources()[0]
"""What computes the chunks' CRC-32: ``"libdeflate"`` where the system has
it; else ``"pclmul"``, the compiled build's own by carry-less
multiplication (x86-64 CPUs with PCLMULQDQ: several times zlib's speed);
else ``"zlib"``. All give the same values."""


def _zlib_c_crc32() -> _CFunction | None:
    """zlib's ``crc32_z`` for the C chunk I/O to call, when the system's
    zlib library can be opened and has it (zlib >= 1.2.9), else None."""
    function = _open_crc32(
        ("libz.so.1", "libz.so", "libz.1.dylib", "libz.dylib"),
        "crc32_z", ctypes.c_ulong, (ctypes.c_ulong, ctypes.c_char_p, ctypes.c_size_t),
    )
    return None if function is None else _CFunction(_function_address(function), _CRC_ZLIB)


def _function_address(function: object) -> int:
    """The address of a C function loaded by :mod:`ctypes`."""
    if not isinstance(function, _CFuncPtr):
        raise TypeError(f"{function!r} is not a C function loaded by ctypes")
    address = ctypes.cast(function, ctypes.c_void_p).value
    if not address:
        raise ValueError(f"{function!r} has no address")
    return int(address)


def _c_crc32(source: str) -> _CFunction | None:
    """What the C chunk I/O calls to compute the CRC-32 as ``source`` (one
    of :func:`crc32_sources`) does; None when there is nothing it can call
    (the CRC-32 is then computed before the C call)."""
    if source == "libdeflate" and _FAST_CRC32 is not None:
        return _CFunction(_function_address(_FAST_CRC32), _CRC_LIBDEFLATE)
    if source == "pclmul" and _CLMUL_CRC32 is not None:
        return _CFunction(0, _CRC_CLMUL)
    return _ZLIB_C_CRC32 if source == "zlib" else None


_ZLIB_C_CRC32: _CFunction | None = _zlib_c_crc32() if COMPILED_IO else None

# ext2/3/4's "top of directory hierarchies" attribute (``chattr +T``), set
# through the generic inode-flags ioctls (both read and write an int)
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_TOPDIR_FL = 0x00020000


def _mark_top_directory(path: Path) -> bool:
    """Best effort: give ``path`` the "top of directory hierarchies"
    attribute (``chattr +T``), so that ext2/3/4 place the folders made in
    it in block groups with room (the Orlov allocator) rather than beside
    ``path``; files are created in their folder's group. Creating a file in
    a crowded group costs 0.2-0.4 ms of kernel CPU on the VM this is
    measured on, against ~15 µs in a group with room. True when the
    attribute is set; False where the platform or file system has no such
    attribute (nothing else changes)."""
    if not sys.platform.startswith("linux"):
        return False  # the ioctl numbers are Linux's
    try:
        import fcntl  # POSIX only: imported when a tier opens, not with the package

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (ImportError, OSError):
        return False
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        if not flags[0] & _FS_TOPDIR_FL:
            flags[0] |= _FS_TOPDIR_FL
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# --- jobs ----------------------------------------------------------------------


class _Item:
    """One key of a job the pool copies."""

    __slots__ = ("block", "checksum", "chunk_id", "key", "path", "serial")

    def __init__(
        self,
        key: OffloadKey,
        chunk_id: int,
        block: BlockStatus,
        serial: int = -1,
        path: str = "",
        checksum: int | None = None,
    ) -> None:
        self.key = key
        self.chunk_id = chunk_id
        self.block = block
        self.serial = serial  # a store: the serial of the file it writes
        self.path = path  # a load: the file it reads ...
        self.checksum = checksum  # ... and the checksum it must have


class _Job:
    """A submitted job until its result is queued."""

    __slots__ = (
        "doomed",
        "first_serial",
        "item_blocks",
        "item_files",
        "item_ids",
        "item_keys",
        "job_id",
        "keys",
        "next_item",
        "ok",
        "pending",
        "promotion",
    )

    def __init__(self, job_id: JobId, keys: list[OffloadKey], promotion: bool) -> None:
        self.job_id = job_id
        self.keys = keys
        self.promotion = promotion
        # the keys the pool copies, their primary slots and blocks, and a
        # promotion's files (path, checksum) as the keys' entries were at
        # submit, a cascade's first serial (the next ones follow): the pool
        # thread that takes items makes their objects (:meth:`take`), off
        # the scheduler's thread
        self.item_keys: list[OffloadKey] = []
        self.item_ids: list[int] = []
        self.item_blocks: list[BlockStatus] = []
        self.item_files: list[tuple[str, int | None]] = []
        self.first_serial = 0
        self.next_item = 0
        # items not yet copied plus keys waiting on another job's store
        self.pending = 0
        self.ok: set[OffloadKey] = set()
        # files of keys this job evicted: each rewritten by one of its store
        # items (recycle_files), else removed before it writes
        self.doomed: list[str] = []

    def size(self) -> int:
        """How many items the job has."""
        return len(self.item_keys)

    def take(self, start: int, end: int) -> list[_Item]:
        """Items ``start`` to ``end`` (exclusive)."""
        keys, ids = self.item_keys[start:end], self.item_ids[start:end]
        blocks = self.item_blocks[start:end]
        if self.promotion:
            return [
                _Item(key, chunk_id, block, -1, path, checksum)
                for key, chunk_id, block, (path, checksum) in zip(
                    keys, ids, blocks, self.item_files[start:end]
                )
            ]
        serial = self.first_serial
        return list(map(_Item, keys, ids, blocks, range(serial + start, serial + end)))


class FileSystemTier:
    """A secondary tier keeping chunks as files under ``directory``.

    ``capacity_blocks`` bounds the chunks kept; ``primary_kv_view`` is the
    primary tier's memory, a writable C-contiguous 2-D memoryview with one
    row per primary slot (``strides[0]`` is the chunk size in bytes).

    Options:

    - ``cache_policy``: a registered replacement policy (``"lru"``,
      ``"arc"``) choosing which stored chunks a store evicts. Chunks being
      stored or loaded are never evicted.
    - ``num_threads``: pool threads doing the copies, checksums and file
      I/O (default :func:`default_num_threads`: 32,
      :data:`DEFAULT_THREADS`, where the count bounds the I/Os in flight;
      on a file system kept in memory one per usable CPU, at least 2). A
      thread takes its share of the queued items of a job at once (a whole
      job when many are queued; store items at most
      :data:`STORE_BATCH_BYTES` of them).
    - ``fsync`` (``"none"``): see :class:`FsyncPolicy`.
    - ``checksum`` (``"auto"``): record a CRC-32 of each chunk (in its
      file name) and verify it on load (see ``verify_loads``). Without it a
      load checks the length only. ``"auto"``: on, except on a file system
      kept in memory (:data:`MEMORY_FILE_SYSTEMS`; :attr:`file_system` is
      the directory's, from :func:`file_system_type`), where a file that a
      crash or a power loss could leave wrong does not outlive it, unless
      ``verify_loads`` is ``"always"``; True or False forces it.
      :attr:`checksums` says whether chunks carry one, :attr:`crc32_source`
      what computes it (:data:`CRC32_SOURCE`: libdeflate where the system
      has it, else the compiled build's own on CPUs with carry-less
      multiplication, else zlib; the same values).
    - ``crc32`` (``"auto"``): what computes the CRC-32, one of
      :func:`crc32_sources` (``"auto"``: the fastest there); all give the
      same values, so chunks written one way check the others.
    - ``verify_loads`` (``"reopened"``): which loads verify the CRC-32.
      ``"reopened"``: the chunks found when the directory was opened, on
      their first load (a chunk that verified is trusted afterwards). They
      are the ones a crash or a power loss can have left wrong (a recycled
      file whose new bytes never reached the disk holds an evicted chunk's
      bytes at the right length). A chunk this tier wrote and renamed
      itself is read back from the same file system in the same run, in a
      directory no other tier may open. ``"always"``: every load verifies
      (catches damage by a process outside the tier, or by the disk,
      during the run; it costs a read of every byte, about a third of a
      256 KiB load's CPU here: docs/PERFORMANCE.md).
    - ``direct_io`` (True): read and write with ``O_DIRECT`` (bypassing the
      page cache) where the file system supports it, the chunk size is a
      multiple of 4096 and the primary view is 4096-aligned; buffered I/O
      otherwise. :attr:`direct_io` says which is used.
    - ``recycle_files`` (True): a store that evicts a chunk overwrites the
      evicted chunk's file (renamed to the new chunk's temp name first)
      instead of removing it and creating a new one; creating a file costs
      far more than rewriting one whose blocks are allocated. Old bytes are
      never readable under the new name (see ``_write_chunk``). Only with
      ``checksum`` or in memory: after a power loss a recycled file whose
      new bytes had not reached the disk holds the evicted chunk's bytes at
      the right length, which only the CRC catches. :attr:`recycles_files`
      says whether files are recycled.
    - ``compiled_io`` (True): do a pool thread's file I/O in C, the
      interpreter lock released once per batch of loads or of stores
      (a system call made from Python gives it up and takes it back, and
      the pool threads and the scheduler's thread share it). Only the
      compiled build has it (:data:`COMPILED_IO`); elsewhere, and with
      False, the same steps run in Python. :attr:`io_source` says which
      (``"compiled"``, ``"python"``).
    - ``enable_events`` (False): queue :class:`OffloadingEvent` s for
      ``take_events``; ``medium`` (``"DISK"``) and ``block_size`` (0) are
      what they carry.

    The ``chunks/`` folder gets the "top of directory hierarchies"
    attribute (``chattr +T``) where the file system has it (ext2/3/4), so
    its shard folders are placed in block groups with room; creating files
    in a crowded group is what made a fresh tier's stores slow.
    :attr:`spreads_shards` says whether it has it.

    Opening a directory that holds a tier finds every chunk it had
    completed (the newest ones first when ``capacity_blocks`` shrank; the
    rest are removed) and removes temp files left by a crash. A directory is
    tied to one chunk size: opening it with another raises
    :class:`ConfigurationError`, as does opening a directory another tier
    holds open. Raises :class:`ConfigurationError` for a malformed view or
    option.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_blocks: int,
        primary_kv_view: memoryview,
        *,
        cache_policy: str = "lru",
        num_threads: int | None = None,
        fsync: str | FsyncPolicy = FsyncPolicy.NONE,
        checksum: bool | str = "auto",
        direct_io: bool = True,
        recycle_files: bool = True,
        verify_loads: str = "reopened",
        compiled_io: bool = True,
        crc32: str = "auto",
        enable_events: bool = False,
        medium: str = "DISK",
        block_size: int = 0,
    ) -> None:
        self.capacity_blocks = require_positive_int("capacity_blocks", capacity_blocks)
        self.directory = Path(directory)
        self.file_system: str | None = file_system_type(self.directory)
        in_memory = self.file_system in MEMORY_FILE_SYSTEMS
        self.num_threads: int = (
            default_num_threads(self.file_system)
            if num_threads is None
            else require_positive_int("num_threads", num_threads)
        )
        self._flat, self.chunk_bytes, self.num_primary_slots = _check_view(primary_kv_view)
        self._fsync = _fsync_policy(fsync)
        if not isinstance(checksum, bool) and not (
            isinstance(checksum, str) and checksum == "auto"
        ):
            raise ConfigurationError(f"checksum must be a bool or 'auto', got {checksum!r}")
        for name, flag in (
            ("direct_io", direct_io),
            ("recycle_files", recycle_files),
            ("compiled_io", compiled_io),
            ("enable_events", enable_events),
        ):
            if not isinstance(flag, bool):
                raise ConfigurationError(f"{name} must be a bool, got {flag!r}")
        if not isinstance(medium, str) or not medium:
            raise ConfigurationError(f"medium must be a non-empty str, got {medium!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0:
            raise ConfigurationError(f"block_size must be an int >= 0, got {block_size!r}")
        if verify_loads not in VERIFY_LOADS:
            raise ConfigurationError(
                f"verify_loads must be one of {', '.join(map(repr, VERIFY_LOADS))}, "
                f"got {verify_loads!r}"
            )
        self.checksums: bool = (
            # "auto": none in memory, unless every load is to be verified
            (not in_memory or verify_loads == "always") if checksum == "auto" else checksum is True
        )
        self.verify_loads: str = verify_loads
        self._verify_always = verify_loads == "always"
        self._compiled_io = compiled_io and COMPILED_IO
        self.io_source: str = "compiled" if self._compiled_io else "python"
        self.crc32_source: str = choose_crc32(crc32)
        self._crc32_at = _FAST_CRC32 if self.crc32_source == "libdeflate" else None
        self._clmul = _CLMUL_CRC32 if self.crc32_source == "pclmul" else None
        # the C I/O computes a store's CRC-32 itself when it can call one
        self._c_crc32 = (
            _c_crc32(self.crc32_source) if self._compiled_io and self.checksums else None
        )
        self.spreads_shards = False
        # recycling needs the checksum where files outlive a power loss: a
        # recycled file whose new bytes never reached the disk holds the
        # evicted chunk's bytes at the right length, which only the CRC in
        # its name catches
        self.recycles_files: bool = recycle_files and (self.checksums or in_memory)
        self._recycle = self.recycles_files
        self._events_on = enable_events
        self.medium = medium
        self._event_block_size = block_size
        self._policy: CachePolicy = make_cache_policy(cache_policy, self.capacity_blocks)
        self._blocks = self._policy.blocks
        self._chunk_root = self.directory / CHUNK_DIR

        self._lock = threading.Lock()
        # idle pool threads wait on ``_wake`` for a token, put by a
        # ``submit_*`` that queued items once it has let go of the lock (the
        # woken thread does not then block on it) and by a thread that took
        # items and left some, for the next thread: one wake-up per job, not
        # one per item. A token put while every thread is busy is taken by
        # the next one to idle, which finds the queues empty and waits again
        # (cheap; a lost wake-up would leave items unrun). A C queue: putting
        # a token costs a fraction of ``Condition.notify``, which runs in
        # Python on the caller's thread. ``drain_jobs``/``shutdown`` wait on
        # ``_idle``, notified when the last job in flight finishes (not on
        # every job: idle pool threads are never woken for a finished job)
        self._wake: SimpleQueue[None] = SimpleQueue()
        self._idle = threading.Condition(self._lock)
        # readable keys: their file and the checksum it must have
        self._file_of: dict[OffloadKey, tuple[str, int | None]] = {}
        self._free_slots: list[int] = list(range(self.capacity_blocks - 1, -1, -1))
        self._waiters: dict[OffloadKey, list[_Job]] = {}
        self._job_ids: set[JobId] = set()  # submitted, result not yet taken
        self._in_flight = 0
        self._load_queue: deque[_Job] = deque()
        self._store_queue: deque[_Job] = deque()
        self._queued_loads = 0  # items of the load queue no thread has taken
        self._queued_stores = 0  # the same, of the store queue
        self._results: list[TierJobResult] = []
        self._events: list[OffloadingEvent] = []
        self._closed = False
        self._stopping = False

        self._base_address = _address(self._flat)
        self._lock_fd = self._open_directory()
        try:
            self.direct_io: bool = (
                direct_io
                and self.chunk_bytes % DIRECT_ALIGNMENT == 0
                and self._base_address % DIRECT_ALIGNMENT == 0
                and _probe_direct_io(self._chunk_root)
            )
            self._next_serial = self._rebuild_index()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._threads = [
            threading.Thread(
                target=self._worker,
                args=(index % 2 == 0,),
                name=f"kvoffload-fs-tier-{index}",
                daemon=True,
            )
            for index in range(self.num_threads)
        ]
        for thread in self._threads:
            thread.start()

    # --- opening ---------------------------------------------------------------

    def _open_directory(self) -> int:
        """Create or check the directory and its manifest; take its lock."""
        directory = self.directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigurationError(
                f"cannot create tier directory {directory}: {error}"
            ) from None
        manifest_path = directory / MANIFEST_NAME
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl  # POSIX only: imported when a tier opens, not with the package

            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigurationError(
                    f"tier directory {directory} is open in another FileSystemTier"
                ) from None
            if manifest_path.exists():
                self._check_manifest(manifest_path)
            elif self._chunk_root.exists():
                raise ConfigurationError(
                    f"{directory} has a {CHUNK_DIR}/ folder but no {MANIFEST_NAME}: "
                    "not a kvoffload tier directory"
                )
            else:
                self._write_manifest(manifest_path)
            self._chunk_root.mkdir(exist_ok=True)  # shard folders come with their first chunk
            # shard folders spread over the file system's block groups
            self.spreads_shards = _mark_top_directory(self._chunk_root)
        except BaseException:
            os.close(lock_fd)
            raise
        return lock_fd

    def _check_manifest(self, path: Path) -> None:
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigurationError(f"unreadable tier manifest {path}: {error}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
            raise ConfigurationError(
                f"{path} is not a kvoffload tier manifest of format {FORMAT_VERSION}"
            )
        if manifest.get("chunk_bytes") != self.chunk_bytes:
            raise ConfigurationError(
                f"tier directory {self.directory} holds chunks of "
                f"{manifest.get('chunk_bytes')} bytes; this tier's chunks are "
                f"{self.chunk_bytes} bytes"
            )

    def _write_manifest(self, path: Path) -> None:
        text = json.dumps({"format": FORMAT_VERSION, "chunk_bytes": self.chunk_bytes})
        temp = path.with_name(path.name + TEMP_SUFFIX)
        temp.write_text(text + "\n", encoding="utf-8")
        os.replace(temp, path)

    def _rebuild_index(self) -> int:
        """Index the complete chunks on disk; remove temp files, chunks of
        the wrong length, superseded copies and chunks beyond capacity.
        Returns the next serial."""
        # key -> (serial, path, checksum); the serial is the store's age
        found: dict[OffloadKey, tuple[int, str, int | None]] = {}
        max_serial = -1
        for shard in sorted(self._chunk_root.iterdir()):
            if not shard.is_dir():
                continue
            with os.scandir(shard) as entries:
                for entry in entries:
                    name = entry.name
                    if name.endswith(TEMP_SUFFIX):
                        _remove(entry.path)
                        continue
                    parsed = _parse_chunk_name(name)
                    if parsed is None:
                        continue  # not ours: leave it alone
                    key, serial, checksum = parsed
                    max_serial = max(max_serial, serial)
                    stat = entry.stat()
                    if stat.st_size != self.chunk_bytes:
                        _remove(entry.path)
                        continue
                    record = (serial, entry.path, checksum)
                    previous = found.get(key)
                    if previous is not None and previous[0] > serial:
                        _remove(entry.path)
                        continue
                    if previous is not None:
                        _remove(previous[1])
                    found[key] = record
        # oldest store first, by serial: the order the stores were submitted
        # in, as the running tier ranked them. Not the modification time: the
        # pool threads finish a job's files in any order, and the kernel's
        # clock ticks coarsely, so mtimes gave a different order run to run.
        ordered = sorted(found.items(), key=lambda item: item[1][0])
        excess = max(0, len(ordered) - self.capacity_blocks)
        for _, (_, path, _) in ordered[:excess]:
            _remove(path)
        keys: list[OffloadKey] = []
        blocks: list[BlockStatus] = []
        for key, (_, path, checksum) in ordered[excess:]:
            block = BlockStatus(self._free_slots.pop())
            block.ref_cnt = 0
            keys.append(key)
            blocks.append(block)
            self._file_of[key] = (path, checksum)
        self._policy.insert_many(keys, blocks)
        if keys and self._events_on:
            self._events.append(self._event(keys, removed=False))
        return max_serial + 1

    # --- paths -----------------------------------------------------------------

    def _stem(self, key: OffloadKey, serial: int) -> str:
        hex_key = key.hex()
        return f"{self._chunk_root}/{hex_key[:2]}/{hex_key}.{serial:x}"

    def path_of(self, key: OffloadKey) -> Path | None:
        """The file of ``key``'s chunk while it is readable, else None."""
        with self._lock:
            record = self._file_of.get(key)
            return None if record is None else Path(record[0])

    # --- inspection ------------------------------------------------------------

    def stored_keys(self) -> frozenset[OffloadKey]:
        """The keys whose chunk is readable now."""
        with self._lock:
            return frozenset(k for k, b in self._blocks.items() if b.ref_cnt >= 0)

    def __len__(self) -> int:
        """Chunks held: readable or being stored."""
        with self._lock:
            return len(self._blocks)

    # --- the contract ----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT when ``key``'s chunk is stored (readable), else MISS. Raises
        :class:`InvalidKeyError` for a malformed key."""
        if type(key) is not bytes:
            key = validate_offload_key(key)
        with self._lock:
            block = self._blocks.get(key)
            readable = block is not None and block.ref_cnt >= 0
        return LookupResult.HIT if readable else LookupResult.MISS

    def submit_store(self, job: TierJobLike) -> None:
        """Queue a cascade (see the contract). Keys already readable count
        as stored; a key another job is storing shares that store's fate; a
        key that finds no room (every chunk pinned) fails. Raises
        :class:`TransferError` for a malformed job and changes nothing."""
        keys, chunk_ids = self._check_job(job, promotion=False)
        with self._lock:
            self._check_open_and_id(job.job_id)
            entry = _Job(job.job_id, keys, promotion=False)
            blocks = self._blocks
            seen = set(keys)
            if len(seen) == len(keys) and not any(map(blocks.__contains__, keys)):
                # the usual cascade: distinct keys the tier does not hold (C-speed checks)
                new_keys, new_ids = list(keys), chunk_ids
            else:
                new_keys, new_ids = self._sort_keys(entry, keys, chunk_ids)
            if new_keys:
                free = self._free_slots
                if len(new_keys) > len(free):
                    room = len(free) + self._evict(len(new_keys) - len(free), seen, entry)
                    del new_keys[room:]
                entry.first_serial = self._next_serial
                self._next_serial += len(new_keys)
                new_blocks = [BlockStatus(free.pop()) for _ in new_keys]
                entry.item_keys, entry.item_ids = new_keys, new_ids
                entry.item_blocks = new_blocks
                self._policy.insert_many(new_keys, new_blocks)
            queued = self._enqueue(entry, self._store_queue)
        if queued:
            self._wake.put(None)

    def submit_load(self, job: TierJobLike) -> None:
        """Queue a promotion (see the contract). A key that is not readable
        fails; the others are pinned (never evicted) until the job ends.
        Raises :class:`TransferError` for a malformed job (including two keys
        sharing a primary slot) and changes nothing."""
        keys, chunk_ids = self._check_job(job, promotion=True)
        with self._lock:
            self._check_open_and_id(job.job_id)
            entry = _Job(job.job_id, keys, promotion=True)
            blocks = self._blocks
            item_keys, item_ids, item_blocks = entry.item_keys, entry.item_ids, entry.item_blocks
            for key, chunk_id in zip(keys, chunk_ids):
                block = blocks.get(key)
                if block is None or block.ref_cnt < 0:
                    continue
                block.ref_cnt += 1
                item_keys.append(key)
                item_ids.append(chunk_id)
                item_blocks.append(block)
            # each pinned key's file as it is now (a pinned key keeps it)
            entry.item_files = list(map(self._file_of.__getitem__, item_keys))
            queued = self._enqueue(entry, self._load_queue)
        if queued:
            self._wake.put(None)

    def get_finished_jobs(self) -> list[TierJobResult]:
        """The jobs finished since the last call, each reported once."""
        with self._lock:
            results, self._results = self._results, []
            for result in results:
                self._job_ids.discard(result.job_id)
            return results

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished; copies in progress
        are never cut short."""
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def has_pending_work(self) -> bool:
        """True while a job runs or a result waits to be taken."""
        with self._lock:
            return bool(self._job_ids)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used (untracked keys are ignored)."""
        listed = validate_offload_keys(keys)
        with self._lock:
            tracked = [key for key in listed if key in self._blocks]
            if tracked:
                self._policy.touch(tracked)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Every request may store and load."""
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing is kept per request."""
        return None

    def take_events(self) -> list[OffloadingEvent]:
        """Keys that became readable in, or left, this tier, in order (empty
        unless ``enable_events``)."""
        with self._lock:
            events, self._events = self._events, []
            return events

    def shutdown(self) -> None:
        """Finish every submitted job, stop the threads and release the
        directory. Later ``submit_*`` calls raise :class:`TierClosedError`;
        results and events not yet taken can still be taken. Idempotent."""
        with self._idle:
            if self._closed:
                return
            self._closed = True
            self._idle.wait_for(lambda: self._in_flight == 0)
            self._stopping = True
        for _ in self._threads:
            self._wake.put(None)  # each thread finds the queues empty and stops
        for thread in self._threads:
            thread.join()
        self._flat.release()  # the primary memory is the caller's again
        os.close(self._lock_fd)

    # --- submission helpers ----------------------------------------------------

    def _sort_keys(
        self, entry: _Job, keys: list[OffloadKey], chunk_ids: list[int]
    ) -> tuple[list[OffloadKey], list[int]]:
        """The keys of cascade ``entry`` to write (the first of each, the
        tier does not hold it) with their slots; a readable key counts as
        stored, a key being stored waits on that store (lock held)."""
        blocks = self._blocks
        new_keys: list[OffloadKey] = []
        new_ids: list[int] = []
        seen: set[OffloadKey] = set()
        for key, chunk_id in zip(keys, chunk_ids):
            if key in seen:
                continue
            seen.add(key)
            block = blocks.get(key)
            if block is None:
                new_keys.append(key)
                new_ids.append(chunk_id)
            elif block.ref_cnt >= 0:
                entry.ok.add(key)
            else:
                self._waiters.setdefault(key, []).append(entry)
                entry.pending += 1
        return new_keys, new_ids

    def _check_job(
        self, job: TierJobLike, promotion: bool
    ) -> tuple[list[OffloadKey], list[int]]:
        job_id = job.job_id
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise TransferError(f"job_id must be an int, got {job_id!r}")
        keys = list(validate_offload_keys(job.keys))
        if keys and max(map(len, keys)) > MAX_KEY_BYTES:  # C-speed passes first
            long_key = next(key for key in keys if len(key) > MAX_KEY_BYTES)
            raise InvalidKeyError(long_key, f"longer than {MAX_KEY_BYTES} bytes")
        raw_ids: object = job.chunk_ids
        if getattr(getattr(raw_ids, "dtype", None), "kind", None) in ("i", "u") and (
            getattr(raw_ids, "ndim", None) == 1
        ):
            # a 1-D integer array (vLLM's jobs carry numpy int64): its values
            # as Python ints at C speed (a bool or float array takes the
            # element-wise path below and is refused)
            raw_ids = raw_ids.tolist()  # type: ignore[attr-defined]
        try:
            chunk_ids = list(map(operator.index, raw_ids))  # type: ignore[call-overload]
        except TypeError:
            raise TransferError(f"job {job_id}: chunk_ids must be ints") from None
        if len(chunk_ids) != len(keys):
            raise TransferError(
                f"job {job_id}: {len(keys)} keys but {len(chunk_ids)} chunk_ids"
            )
        limit = self.num_primary_slots
        if chunk_ids and (min(chunk_ids) < 0 or max(chunk_ids) >= limit):
            outside = next(c for c in chunk_ids if not 0 <= c < limit)
            raise TransferError(f"job {job_id}: primary slot {outside} outside [0, {limit})")
        if promotion and len(set(chunk_ids)) != len(chunk_ids):
            raise TransferError(f"job {job_id}: two keys are loaded into one primary slot")
        return keys, chunk_ids

    def _check_open_and_id(self, job_id: JobId) -> None:
        if self._closed:
            raise TierClosedError(f"FileSystemTier at {self.directory} is shut down")
        if job_id in self._job_ids:
            raise TransferError(f"job {job_id} is already submitted and not yet reported")

    def _evict(self, n: int, offered: Collection[OffloadKey], entry: _Job) -> int:
        """Evict up to ``n`` readable, unpinned chunks not in ``offered``
        (files removed by ``entry`` before it writes); how many were."""
        victims = self._policy.evict(n, offered)
        if victims is None:
            victims = []
            while len(victims) < n:
                one = self._policy.evict(1, offered)
                if not one:
                    break
                victims.extend(one)
        if isinstance(victims, EvictedBlocks):
            keys, blocks = victims.keys, victims.blocks
        else:
            keys, blocks = [key for key, _ in victims], [block for _, block in victims]
        self._free_slots.extend([block.block_id for block in blocks])
        pop = self._file_of.pop
        entry.doomed.extend([pop(key)[0] for key in keys])
        if keys and self._events_on:
            self._events.append(self._event(keys, removed=True))
        return len(keys)

    def _enqueue(self, entry: _Job, queue: deque[_Job]) -> bool:
        """Register ``entry`` and queue its items (lock held); whether it
        queued any (the caller then wakes a pool thread, lock released)."""
        self._job_ids.add(entry.job_id)
        self._in_flight += 1
        size = entry.size()
        entry.pending += size
        if size:  # (a job that evicted has items: evictions make room for them)
            queue.append(entry)
            if entry.promotion:
                self._queued_loads += size
            else:
                self._queued_stores += size
        if entry.pending == 0:
            self._finish(entry)
        return size > 0

    # --- the pool --------------------------------------------------------------

    def _worker(self, loads_first: bool) -> None:
        lock, wake = self._lock, self._wake
        # the page a load reads past its chunk into (a longer file fills it)
        spare = memoryview(mmap.mmap(-1, DIRECT_ALIGNMENT))
        while True:
            with lock:
                first, second = (
                    (self._load_queue, self._store_queue)
                    if loads_first
                    else (self._store_queue, self._load_queue)
                )
                queue = first if first else second
                if not queue:
                    if self._stopping:
                        return  # nothing left to run
                    entry = None
                else:
                    entry = queue[0]
                    if entry.promotion:
                        batch = self._take_loads(entry)
                    else:
                        batch, recycled, doomed = self._take_stores(entry)
                    if entry.next_item == entry.size():
                        queue.popleft()
                    more = bool(first or second)
            if entry is None:
                wake.get()  # queued items, or stopping: look again
                continue
            if more:
                wake.put(None)  # items left: wake the next thread
            if entry.promotion:
                self._run_loads(entry, batch, spare)
            else:
                self._run_stores(entry, batch, recycled, doomed)

    def _take_share(self, entry: _Job, queued: int, most: int | None = None) -> list[_Item]:
        """The next items of ``entry`` for one pool thread (lock held): its
        share of the ``queued`` items of ``entry``'s queue, so that a thread
        takes a whole job when many are queued (fewer hand-offs, one C call)
        and the threads split a lone job; at most ``most`` items, at least
        one."""
        share = -(-queued // self.num_threads)
        if most is not None:
            share = min(share, most)
        start = entry.next_item
        end = min(entry.size(), start + max(1, share))
        entry.next_item = end
        return entry.take(start, end)

    def _take_loads(self, entry: _Job) -> list[_Item]:
        """:meth:`_take_share` of promotion ``entry``."""
        batch = self._take_share(entry, self._queued_loads)
        self._queued_loads -= len(batch)
        return batch

    def _take_stores(self, entry: _Job) -> tuple[list[_Item], list[str | None], list[str]]:
        """:meth:`_take_share` of cascade ``entry`` (at most
        :data:`STORE_BATCH_BYTES`), the evicted chunks' files its items
        overwrite (None: a new file), and the files to remove before they
        are written. Each store item recycles one of the files of the chunks
        its job evicted (a job evicts at most one chunk per item); without
        recycling they are all removed before the job's first write."""
        batch = self._take_share(
            entry, self._queued_stores, STORE_BATCH_BYTES // self.chunk_bytes
        )
        self._queued_stores -= len(batch)
        doomed = entry.doomed
        if not (doomed and self._recycle):
            entry.doomed = []
            return batch, [None] * len(batch), doomed
        recycled = [doomed.pop() if doomed else None for _ in batch]
        if entry.next_item < entry.size():
            return batch, recycled, []
        entry.doomed = []  # the last items: the files no item recycles go
        return batch, recycled, doomed

    def _run_loads(self, entry: _Job, batch: list[_Item], spare: memoryview) -> None:
        """Copy ``batch`` (items of promotion ``entry``) into their primary
        slots, verify them, then complete them under the lock at once."""
        payloads = [self._slot(item.chunk_id) for item in batch]
        reads = _read_chunks(
            [item.path for item in batch], payloads, spare, self.direct_io, self._compiled_io
        )
        done = [
            (item, self._loaded(item, payload, read))
            for item, payload, read in zip(batch, payloads, reads)
        ]
        with self._lock:
            for item, ok in done:
                self._load_done(entry, item, ok)

    def _run_stores(
        self,
        entry: _Job,
        batch: list[_Item],
        recycled: list[str | None],
        doomed: list[str],
    ) -> None:
        """Write ``batch`` (items of cascade ``entry``), then complete them
        under the lock at once."""
        for victim in doomed:
            self._remove_quietly(victim)
        written = self._store(batch, recycled)
        with self._lock:
            for item, path in zip(batch, written):
                self._store_done(entry, item, path)

    @staticmethod
    def _remove_quietly(path: str) -> None:
        try:
            _remove(path)
        except OSError as error:
            logger.warning("cannot remove %s: %s", path, error)

    def _slot(self, chunk_id: int) -> memoryview:
        size = self.chunk_bytes
        return self._flat[chunk_id * size : (chunk_id + 1) * size]

    def _crc32(self, chunk_id: int, payload: memoryview) -> int:
        """The CRC-32 of primary slot ``chunk_id`` (``payload``, its view)."""
        crc32_at = self._crc32_at
        if crc32_at is not None:
            return crc32_at(0, self._base_address + chunk_id * self.chunk_bytes, len(payload))
        if self._clmul is not None:
            return self._clmul(payload)
        return zlib.crc32(payload)

    def _store(self, batch: list[_Item], recycled: list[str | None]) -> list[str | None]:
        """Copy each item's primary slot into its file (pool thread),
        overwriting the file at the same index of ``recycled`` (an evicted
        chunk's) when given; each item's path, or None where its store
        failed (it fails that key only)."""
        crc32 = self._c_crc32
        prefixes: list[str] = []
        try:
            stems = [self._stem(item.key, item.serial) for item in batch]
            payloads = [self._slot(item.chunk_id) for item in batch]
            if not self.checksums:
                prefixes = [f"{stem}.{NO_CHECKSUM}" for stem in stems]
            elif crc32 is None:  # the CRC-32 now, here; else in the write's C call
                prefixes = [
                    f"{stem}.{self._crc32(item.chunk_id, payload):08x}"
                    for stem, item, payload in zip(stems, batch, payloads)
                ]
            else:
                prefixes = [f"{stem}." for stem in stems]
            outcomes: Sequence[int | Exception] = _write_chunks(
                [stem + TEMP_SUFFIX for stem in stems], prefixes, payloads, recycled,
                self._fsync, self.direct_io, crc32, self._compiled_io,
            )
        except Exception as error:  # (out of memory): every item of the batch fails
            outcomes = [error] * len(batch)
        paths: list[str | None] = []
        for index, (item, old, outcome) in enumerate(zip(batch, recycled, outcomes)):
            if isinstance(outcome, Exception):
                logger.warning("store of %s failed: %s", item.key.hex(), outcome)
                if old is not None:
                    self._remove_quietly(old)  # still there when the rename failed
                paths.append(None)
            else:
                crc = f"{outcome:08x}" if crc32 is not None else ""
                paths.append(f"{prefixes[index]}{crc}{CHUNK_SUFFIX}")
        return paths

    def _loaded(self, item: _Item, payload: memoryview, read: int | Exception) -> bool:
        """Whether ``item``'s file made it whole into its primary slot
        (``payload``): ``read`` is what :func:`_read_chunks` gave for it
        (pool thread)."""
        try:
            if isinstance(read, Exception):
                raise read
            size = read
            if size != self.chunk_bytes:
                raise ValueError(f"read {size} bytes, expected {self.chunk_bytes}")
            if (
                self.checksums
                and item.checksum is not None
                and self._crc32(item.chunk_id, payload) != item.checksum
            ):
                raise ValueError("checksum mismatch")
            return True
        except Exception as error:  # a damaged or missing file fails this key only
            logger.warning("load of %s from %s failed: %s", item.key.hex(), item.path, error)
            return False

    # --- completions (pool threads, lock held) ---------------------------------

    def _store_done(self, entry: _Job, item: _Item, path: str | None) -> None:
        key, block = item.key, item.block
        ok = path is not None
        if path is not None:
            # a chunk written in this run is verified on load only when asked
            self._file_of[key] = (path, _parse_checksum(path) if self._verify_always else None)
            block.ref_cnt = 0
            if self._policy.tracks_unpinning():
                self._policy.blocks_unpinned([key])
            if self._events_on:
                self._events.append(self._event([key], removed=False))
        else:
            self._policy.remove(key)
            self._free_slots.append(block.block_id)
        for job in [entry, *self._waiters.pop(key, ())]:
            if ok:
                job.ok.add(key)
            job.pending -= 1
            if job.pending == 0:
                self._finish(job)

    def _load_done(self, entry: _Job, item: _Item, ok: bool) -> None:
        key, block = item.key, item.block
        block.ref_cnt -= 1
        current = self._blocks.get(key)
        if ok:
            entry.ok.add(key)
            if item.checksum is not None and current is block and not self._verify_always:
                self._file_of[key] = (item.path, None)  # verified once: trusted
        elif current is block:
            # a corrupt or missing file: the key is not readable any more
            self._policy.remove(key)
            self._free_slots.append(block.block_id)
            self._remove_quietly(self._file_of.pop(key)[0])
            current = None
            if self._events_on:
                self._events.append(self._event([key], removed=True))
        if current is block and block.ref_cnt == 0 and self._policy.tracks_unpinning():
            self._policy.blocks_unpinned([key])
        entry.pending -= 1
        if entry.pending == 0:
            self._finish(entry)

    def _finish(self, entry: _Job) -> None:
        wanted = set(entry.keys)
        ok = entry.ok
        if ok >= wanted:
            result = TierJobResult(entry.job_id, True)
        else:
            result = TierJobResult(entry.job_id, False, frozenset(ok) if ok else None)
        self._results.append(result)
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.notify_all()

    def _event(self, keys: Iterable[OffloadKey], removed: bool) -> OffloadingEvent:
        return OffloadingEvent(tuple(keys), self._event_block_size, self.medium, removed)

    def __repr__(self) -> str:
        return (
            f"FileSystemTier({str(self.directory)!r}, capacity_blocks="
            f"{self.capacity_blocks}, chunk_bytes={self.chunk_bytes})"
        )


def _parse_chunk_name(name: str) -> tuple[OffloadKey, int, int | None] | None:
    """The key, serial and checksum a chunk file's name encodes, or None."""
    if not name.endswith(CHUNK_SUFFIX):
        return None
    parts = name[: -len(CHUNK_SUFFIX)].split(".")
    if len(parts) != 3:
        return None
    hex_key, hex_serial, hex_checksum = parts
    try:
        key = bytes.fromhex(hex_key)
        serial = int(hex_serial, 16)
        checksum = None if hex_checksum == NO_CHECKSUM else int(hex_checksum, 16)
    except ValueError:
        return None
    if len(key) < 4 or key.hex() != hex_key or serial < 0:
        return None
    return OffloadKey(key), serial, checksum


def _parse_checksum(path: str) -> int | None:
    field = path[: -len(CHUNK_SUFFIX)].rpartition(".")[2]
    return None if field == NO_CHECKSUM else int(field, 16)


def _check_view(view: object) -> tuple[memoryview, int, int]:
    """The flat byte view, chunk size and slot count of a primary view."""
    if not isinstance(view, memoryview):
        raise ConfigurationError(
            f"primary_kv_view must be a memoryview, got {type(view).__name__}"
        )
    if view.ndim != 2:
        raise ConfigurationError(
            f"primary_kv_view must be 2-D (one row per primary slot), got {view.ndim}-D"
        )
    if view.readonly:
        raise ConfigurationError("primary_kv_view must be writable (promotions write it)")
    if not view.c_contiguous:
        raise ConfigurationError("primary_kv_view must be C-contiguous")
    shape, strides = view.shape, view.strides
    if shape is None or strides is None:  # pragma: no cover - 2-D views have both
        raise ConfigurationError("primary_kv_view has no shape")
    rows = shape[0]
    chunk_bytes = strides[0]
    if rows <= 0 or chunk_bytes <= 0:
        raise ConfigurationError(
            f"primary_kv_view has {rows} rows of {chunk_bytes} bytes; both must be > 0"
        )
    return view.cast("B"), chunk_bytes, rows


def default_num_threads(file_system: str | None = None) -> int:
    """Pool threads of a tier built without ``num_threads`` in a directory
    on ``file_system`` (:func:`file_system_type`), half taking loads first
    and half stores first.

    On a device (or unknown): 32 (:data:`DEFAULT_THREADS`), whatever the
    CPUs, as vLLM's fs tier runs 16 + 16. A thread mostly waits on the
    disk, and the count bounds the I/Os in flight: at 256 KiB chunks 4
    threads left the disk idle between requests (docs/PERFORMANCE.md,
    "File tier").

    On a file system kept in memory (:data:`MEMORY_FILE_SYSTEMS`) a thread
    never waits on a device: its I/O is a copy on a CPU, so threads past
    the CPUs this process may run on only take turns with each other (and
    with the scheduler's thread) for the CPUs and the interpreter lock:
    one per such CPU, at least 2 (one of each kind) and at most 32
    (docs/DECISIONS.md "cio3")."""
    if file_system not in MEMORY_FILE_SYSTEMS:
        return DEFAULT_THREADS
    return max(2, min(DEFAULT_THREADS, _usable_cpus()))


def _usable_cpus() -> int:
    """The CPUs this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def _fsync_policy(value: object) -> FsyncPolicy:
    if isinstance(value, FsyncPolicy):
        return value
    try:
        return FsyncPolicy(value)
    except ValueError:
        raise ConfigurationError(
            f"fsync must be one of {[p.value for p in FsyncPolicy]}, got {value!r}"
        ) from None
