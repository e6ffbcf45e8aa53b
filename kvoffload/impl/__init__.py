"""Production code: managers, policies, the reuse filter, backends.

Worker-side transfer handlers live in :mod:`kvoffload.impl.worker` and import
torch lazily.
"""

from kvoffload.impl.backend import Backend, CPUBackend
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.fs_tier import FileSystemTier, FsyncPolicy
from kvoffload.impl.manager import (
    CPUOffloadingManager,
    LRUOffloadingManager,
    OffloadingManagerCore,
)
from kvoffload.impl.memtier import MemoryTier
from kvoffload.impl.policies import (
    ARCCachePolicy,
    CachePolicy,
    LRUCachePolicy,
    make_cache_policy,
)
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.specs import BlockIDsLoadStoreSpec, CPULoadStoreSpec
from kvoffload.impl.tiered import CascadeMode, TieredOffloadingManager

__all__ = [
    "ARCCachePolicy",
    "Backend",
    "BlockIDsLoadStoreSpec",
    "BlockStatus",
    "CPUBackend",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "CascadeMode",
    "FileSystemTier",
    "FilterReusedOffloadingManager",
    "FsyncPolicy",
    "LRUCachePolicy",
    "LRUOffloadingManager",
    "MemoryTier",
    "OffloadingManagerCore",
    "TieredOffloadingManager",
    "make_cache_policy",
]
