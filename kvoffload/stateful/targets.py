"""The built-in managers as kit targets: ``factory(num_blocks) -> manager``.

Each factory enables events (the kit checks them). They are importable as
``kvoffload.stateful.targets:NAME``, which is how replay scripts and
``python -m kvoffload audit --target`` name them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import attrs

from kvoffload.impl.backend import CPUBackend
from kvoffload.impl.fs_tier import FileSystemTier
from kvoffload.impl.manager import CPUOffloadingManager, LRUOffloadingManager
from kvoffload.impl.memtier import MemoryTier
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.tiered import TieredOffloadingManager
from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.profile import DEFAULT, TIERED, TIERED_WRITE_BACK, Profile
from kvoffload.stateful.harness import ReuseFilterParams
from kvoffload.stateful.tier_harness import PolledTier, TempDirTier

BLOCK_SIZE = 16
FILTER = ReuseFilterParams(store_threshold=2, max_tracker_size=5)
"""The filter the built-in filtered targets use: a small table, so the
kit reaches its LRU bound."""


def cpu_lru(num_blocks: int) -> OffloadingManager:
    return CPUOffloadingManager(BLOCK_SIZE, num_blocks, "lru", enable_events=True)


def cpu_arc(num_blocks: int) -> OffloadingManager:
    return CPUOffloadingManager(BLOCK_SIZE, num_blocks, "arc", enable_events=True)


def backend_lru(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(CPUBackend(BLOCK_SIZE, num_blocks), enable_events=True)


def filtered_lru(num_blocks: int) -> OffloadingManager:
    return FilterReusedOffloadingManager(
        cpu_lru(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


def filtered_arc(num_blocks: int) -> OffloadingManager:
    return FilterReusedOffloadingManager(
        cpu_arc(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


TIER_CAPACITY = 1 << 16
"""Chunks a built-in tiered target's tier holds: more than the kit's keys,
so the tier never evicts (the tiered profiles' premise)."""

CHUNK_BYTES = 64
"""Bytes per primary slot of the built-in tiered targets."""

FILE_TIER_EXAMPLES = 150
"""The budget of the tiered row over the file tier: each run opens a tier
(256 folders made, scanned and removed: about 0.1 s a run here, loaded),
so 500 runs took 22-32 s. The MemoryTier rows run the full budget through
the same manager code."""

MAX_PROMOTIONS = TIERED.max_promotions_in_flight
"""The promotion bound of the built-in tiered targets (their profiles')."""


SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
"""Where the built-in file tiers make their temporary directories: memory
(tmpfs) where the machine has it, else the default temporary folder. A
tier opens 256 folders; removing them from a busy disk took up to 0.8 s
per tier here, a run of the kit each."""


def file_system_tier(
    capacity_blocks: int, primary_kv_view: memoryview, num_threads: int = 4
) -> Any:
    """A :class:`FileSystemTier` in a fresh temporary directory (under
    :data:`SCRATCH`), removed at shutdown (the built-in tier target)."""
    directory = tempfile.mkdtemp(prefix="kvoffload-fs-tier-", dir=SCRATCH)
    try:
        tier = FileSystemTier(directory, capacity_blocks, primary_kv_view, num_threads=num_threads)
    except BaseException:
        TempDirTier(None, directory).shutdown()
        raise
    return TempDirTier(tier, directory)


def _primary_view(num_blocks: int) -> memoryview:
    """Primary memory, one ``CHUNK_BYTES`` row per slot."""
    return memoryview(bytearray(num_blocks * CHUNK_BYTES)).cast("B", (num_blocks, CHUNK_BYTES))


def _tiered(num_blocks: int, tier: Any, cascade: str) -> OffloadingManager:
    primary = CPUOffloadingManager(BLOCK_SIZE, num_blocks, "lru", enable_events=True)
    return TieredOffloadingManager(
        primary, [tier], cascade=cascade, max_promotions_in_flight=MAX_PROMOTIONS
    )


def tiered_memory(num_blocks: int) -> OffloadingManager:
    """The tiered manager (LRU, write-through) over a :class:`MemoryTier`
    (profile ``kvoffload-tiered``)."""
    tier = MemoryTier(TIER_CAPACITY, _primary_view(num_blocks), enable_events=False)
    return _tiered(num_blocks, tier, "write-through")


def tiered_memory_write_back(num_blocks: int) -> OffloadingManager:
    """As :func:`tiered_memory`, write-back (``kvoffload-tiered-write-back``)."""
    tier = MemoryTier(TIER_CAPACITY, _primary_view(num_blocks), enable_events=False)
    return _tiered(num_blocks, tier, "write-back")


def _polled_file_tier(num_blocks: int) -> Any:
    # one pool thread: each run starts and joins the pool, and the tier's
    # own races are audit_tier's (the FileSystemTier row, 4 threads)
    tier = file_system_tier(TIER_CAPACITY, _primary_view(num_blocks), num_threads=1)
    return PolledTier(tier)


def tiered_fs(num_blocks: int) -> OffloadingManager:
    """The tiered manager (LRU, write-through) over a :class:`FileSystemTier`
    in a temporary directory, its jobs taken at each poll point
    (:class:`PolledTier`; profile ``kvoffload-tiered``)."""
    return _tiered(num_blocks, _polled_file_tier(num_blocks), "write-through")


def tiered_fs_write_back(num_blocks: int) -> OffloadingManager:
    """As :func:`tiered_fs`, write-back (``kvoffload-tiered-write-back``)."""
    return _tiered(num_blocks, _polled_file_tier(num_blocks), "write-back")


@attrs.frozen
class BuiltinTarget:
    """One row of the default audit. ``profile``: the conventions the
    target keeps, in place of the audit's (``--profile``) own. ``examples``:
    the row's budget when ``--examples`` gives none (None: the audit's
    default)."""

    name: str
    factory: Callable[[int], OffloadingManager]
    policy: str
    reuse_filter: ReuseFilterParams | None = None
    profile: Profile | None = None
    examples: int | None = None

    @property
    def import_path(self) -> str:
        return f"{__name__}:{self.factory.__name__}"

    @property
    def audit_profile(self) -> Profile:
        """The profile the target is audited under by default."""
        return DEFAULT if self.profile is None else self.profile


BUILTIN_TARGETS: tuple[BuiltinTarget, ...] = (
    BuiltinTarget("CPUOffloadingManager(lru)", cpu_lru, "lru"),
    BuiltinTarget("CPUOffloadingManager(arc)", cpu_arc, "arc"),
    BuiltinTarget("LRUOffloadingManager(CPUBackend)", backend_lru, "lru"),
    BuiltinTarget("CPUOffloadingManager(lru) as any", cpu_lru, "any"),
    BuiltinTarget("CPUOffloadingManager(arc) as any", cpu_arc, "any"),
    BuiltinTarget("FilterReused(lru)", filtered_lru, "lru", FILTER),
    BuiltinTarget("FilterReused(arc)", filtered_arc, "arc", FILTER),
    BuiltinTarget("Tiered(lru, MemoryTier)", tiered_memory, "lru", profile=TIERED),
    BuiltinTarget(
        "Tiered(lru, MemoryTier, wb)", tiered_memory_write_back, "lru",
        profile=TIERED_WRITE_BACK,
    ),
    BuiltinTarget(
        "Tiered(lru, FileSystemTier)", tiered_fs, "lru", profile=TIERED,
        examples=FILE_TIER_EXAMPLES,
    ),
)


TierFactory = Callable[[int, memoryview], Any]
"""``factory(capacity_blocks, primary_kv_view) -> tier``."""


@attrs.frozen
class BuiltinTierTarget:
    """One secondary tier of the default audit (``audit_tier``)."""

    name: str
    factory: TierFactory

    @property
    def import_path(self) -> str:
        return f"{self.factory.__module__}:{self.factory.__name__}"


BUILTIN_TIER_TARGETS: tuple[BuiltinTierTarget, ...] = (
    BuiltinTierTarget("FileSystemTier", file_system_tier),
)
"""The library's own secondary tiers, audited by the main job after the
managers (one row each). A tier joins with one line here: a module-level
``factory(capacity_blocks, primary_kv_view)`` (as :func:`file_system_tier`)."""
