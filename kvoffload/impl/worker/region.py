"""A CPU tier that is one shared, chunk-major region (no torch needed).

When secondary tiers sit behind the CPU tier, they read and write its
memory a chunk at a time, in another process than the workers' (the
scheduler's), so the CPU tier must be one region that both map, laid out so
that a chunk's bytes are one contiguous row.

:class:`ChunkMajorLayout` says where every byte goes. The region is a run of
*rows* of :attr:`~ChunkMajorLayout.row_stride` bytes, one per GPU-sized
sub-block: row ``r = chunk * block_size_factor + sub_block``. A row holds
every worker's part of that sub-block, worker after worker, and within a
worker's part its canonical tensors one after another::

    row r:  | rank 0: t0 | t1 | ... | rank 1: t0 | t1 | ... | padding |

So tensor ``i`` of rank ``k`` is a 2-D strided view ``[num_rows, w_i]``
(row stride :attr:`~ChunkMajorLayout.row_stride`) at column
``k * sum(w) + sum(w[:i])``, and chunk ``c`` is the contiguous bytes of
rows ``c * factor .. c * factor + factor - 1``: :attr:`~ChunkMajorLayout.
chunk_bytes` bytes, which :meth:`SharedRegion.chunk_view` hands the tiers as
one row each. The padding makes :attr:`~ChunkMajorLayout.chunk_bytes` a
multiple of the page size (as vLLM 0.33 pads its chunk rows), so a file
tier can move chunks with ``O_DIRECT``.

:class:`SharedRegion` is the region itself: a file (in ``/dev/shm`` by
default) that the scheduler creates and every worker maps by name, removed
by its creator's :meth:`~SharedRegion.cleanup`.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import time
from pathlib import Path
from typing import Any

import attrs

from kvoffload.spec.errors import ConfigurationError

__all__ = ["ChunkMajorLayout", "CpuRegion", "SharedRegion", "region_name"]

DEFAULT_DIRECTORY = "/dev/shm"
"""Where :class:`SharedRegion` puts its file unless told otherwise."""


def _positive_ints(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple) or not value or any(
        isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in value
    ):
        raise ConfigurationError(
            f"{attribute.name} must be a non-empty tuple of positive ints, got {value!r}"
        )


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class ChunkMajorLayout:
    """Where each byte of a chunk-major CPU tier lives (module docstring).

    ``tensor_row_bytes``: bytes one GPU block takes in each canonical tensor
    of one worker (its ``page_size_bytes``), in tensor order; every worker
    has the same. ``block_size_factor``: GPU blocks per chunk.
    ``world_size``: workers sharing each chunk. ``alignment``: a chunk's
    bytes are padded to a multiple of it.

    Raises :class:`ConfigurationError` for a value that is not a positive
    int (or a non-empty tuple of them).
    """

    tensor_row_bytes: tuple[int, ...] = attrs.field(validator=_positive_ints)
    block_size_factor: int = attrs.field(default=1, validator=_positive_int)
    world_size: int = attrs.field(default=1, validator=_positive_int)
    alignment: int = attrs.field(default=mmap.PAGESIZE, validator=_positive_int)

    @property
    def worker_row_bytes(self) -> int:
        """Bytes of one worker's part of a row (all its tensors)."""
        return sum(self.tensor_row_bytes)

    @property
    def row_stride(self) -> int:
        """Bytes from one row to the next: every worker's part, padded so
        that ``block_size_factor`` rows fill whole alignment units."""
        unit = self.alignment // math.gcd(self.block_size_factor, self.alignment)
        return -(self.world_size * self.worker_row_bytes // -unit) * unit

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk (a multiple of ``alignment``)."""
        return self.block_size_factor * self.row_stride

    def region_bytes(self, num_chunks: int) -> int:
        """Bytes of a region holding ``num_chunks`` chunks."""
        return num_chunks * self.chunk_bytes

    def column_offsets(self, rank: int = 0) -> tuple[int, ...]:
        """Where, within a row, each tensor of worker ``rank`` starts.

        Raises :class:`ConfigurationError` for a rank outside
        ``[0, world_size)``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigurationError(
                f"rank must be an int in [0, {self.world_size}), got {rank!r}"
            )
        offsets = []
        column = rank * self.worker_row_bytes
        for width in self.tensor_row_bytes:
            offsets.append(column)
            column += width
        return tuple(offsets)


_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def region_name(engine_id: str) -> str:
    """The file name of an engine's region: ``kvoffload_<engine_id>.mmap``
    (characters outside ``[A-Za-z0-9_.-]`` become ``_``)."""
    return f"kvoffload_{_NAME.sub('_', str(engine_id))}.mmap"


class SharedRegion:
    """A file of ``size_bytes`` bytes mapped shared into this process.

    ``create=True`` makes the file, which must not exist yet;
    ``create=False`` maps an existing one, waiting up to ``timeout_s`` for
    its creator to size it; ``create=None`` (what an engine's processes
    use, since a worker may come up before the scheduler) creates it when
    absent and maps it otherwise. All see the same memory: a worker's
    stores are what the scheduler's tiers read. Whoever created the file
    removes it in :meth:`cleanup` (mappings made before stay valid); every
    mapper's :meth:`cleanup` unmaps it (or leaves that to the garbage
    collector while views of it are alive).

    Raises :class:`ConfigurationError` for a size that is not a positive
    int, a file that exists (``create=True``), or one that is missing or
    does not reach ``size_bytes`` in time (``create=False``), or has more;
    nothing is left behind then.
    """

    def __init__(
        self,
        name: str,
        size_bytes: int,
        *,
        create: bool | None,
        directory: str | os.PathLike[str] = DEFAULT_DIRECTORY,
        timeout_s: float = 30.0,
    ) -> None:
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
            raise ConfigurationError(f"size_bytes must be a positive int, got {size_bytes!r}")
        if not name or "/" in name or name in (".", ".."):
            raise ConfigurationError(f"a region name is a plain file name, got {name!r}")
        self.path = Path(directory) / name
        self.size_bytes = size_bytes
        self._closed = False
        fd, self.creator = self._open(create)
        try:
            if self.creator:
                os.ftruncate(fd, size_bytes)
            else:
                self._wait_for_size(fd, timeout_s)
            self._mmap = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            if self.creator:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            raise
        os.close(fd)  # the mapping keeps the memory

    def _open(self, create: bool | None) -> tuple[int, bool]:
        """The file's descriptor, and whether this call created it."""
        if create is not False:
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), True
            except FileExistsError:
                if create:
                    raise ConfigurationError(
                        f"shared region {self.path} exists (another engine with this "
                        "id, or one that did not clean up)"
                    ) from None
        try:
            return os.open(self.path, os.O_RDWR), False
        except FileNotFoundError:
            raise ConfigurationError(
                f"shared region {self.path} does not exist (the scheduler creates it)"
            ) from None

    def _wait_for_size(self, fd: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            size = os.fstat(fd).st_size
            if size == self.size_bytes:
                return
            if size > self.size_bytes or time.monotonic() >= deadline:
                raise ConfigurationError(
                    f"shared region {self.path} has {size} bytes, expected {self.size_bytes}"
                )
            time.sleep(0.005)

    @property
    def buffer(self) -> mmap.mmap:
        """The region's memory (writable). Raises :class:`ConfigurationError`
        after :meth:`cleanup`."""
        if self._closed:
            raise ConfigurationError(f"shared region {self.path} was cleaned up")
        return self._mmap

    def chunk_view(self, chunk_bytes: int) -> memoryview:
        """The region as a 2-D view with one row of ``chunk_bytes`` per chunk
        (what secondary tiers are given). Raises :class:`ConfigurationError`
        unless ``chunk_bytes`` divides the region's size."""
        if (
            isinstance(chunk_bytes, bool)
            or not isinstance(chunk_bytes, int)
            or chunk_bytes <= 0
            or self.size_bytes % chunk_bytes
        ):
            raise ConfigurationError(
                f"chunk_bytes {chunk_bytes!r} does not divide the region's "
                f"{self.size_bytes} bytes"
            )
        return memoryview(self.buffer).cast("B", (self.size_bytes // chunk_bytes, chunk_bytes))

    def cleanup(self) -> None:
        """Unmap (where no view is alive) and, for the creator, remove the
        file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):  # views alive: the GC unmaps later
            self._mmap.close()
        if self.creator:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@attrs.frozen(eq=False)
class CpuRegion:
    """Where a worker puts its CPU tier: ``buffer`` (writable, e.g. a
    :attr:`SharedRegion.buffer`) laid out by ``layout``, this worker being
    ``rank``. The buffer holds ``len(buffer) // layout.chunk_bytes`` chunks.

    Raises :class:`ConfigurationError` for a rank outside the layout's
    world."""

    buffer: object
    layout: ChunkMajorLayout
    rank: int = 0

    def __attrs_post_init__(self) -> None:
        self.layout.column_offsets(self.rank)  # validates the rank
