"""The built-in managers as kit targets: ``factory(num_blocks) -> manager``.

Each factory enables events (the kit checks them). They are importable as
``kvoffload.stateful.targets:NAME``, which is how replay scripts and
``python -m kvoffload audit --target`` name them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvoffload.impl.backend import CPUBackend
from kvoffload.impl.manager import CPUOffloadingManager, LRUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingManager
from kvoffload.stateful.harness import ReuseFilterParams

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


@attrs.frozen
class BuiltinTarget:
    """One row of the default audit."""

    name: str
    factory: Callable[[int], OffloadingManager]
    policy: str
    reuse_filter: ReuseFilterParams | None = None

    @property
    def import_path(self) -> str:
        return f"{__name__}:{self.factory.__name__}"


BUILTIN_TARGETS: tuple[BuiltinTarget, ...] = (
    BuiltinTarget("CPUOffloadingManager(lru)", cpu_lru, "lru"),
    BuiltinTarget("CPUOffloadingManager(arc)", cpu_arc, "arc"),
    BuiltinTarget("LRUOffloadingManager(CPUBackend)", backend_lru, "lru"),
    BuiltinTarget("CPUOffloadingManager(lru) as any", cpu_lru, "any"),
    BuiltinTarget("CPUOffloadingManager(arc) as any", cpu_arc, "any"),
    BuiltinTarget("FilterReused(lru)", filtered_lru, "lru", FILTER),
    BuiltinTarget("FilterReused(arc)", filtered_arc, "arc", FILTER),
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


BUILTIN_TIER_TARGETS: tuple[BuiltinTierTarget, ...] = ()
"""The library's own secondary tiers, audited by the main job after the
managers (one row each). A tier joins with one line here, e.g.
``BuiltinTierTarget("FileSystemTier", file_system_tier)`` where
``file_system_tier(capacity_blocks, primary_kv_view)``, a function of this
module, returns ``TempDirTier(FileSystemTier(d, capacity_blocks,
primary_kv_view), d)`` for ``d = tempfile.mkdtemp()``
(:class:`~kvoffload.stateful.tier_harness.TempDirTier` removes ``d`` at
shutdown)."""
