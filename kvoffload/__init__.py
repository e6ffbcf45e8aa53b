"""kvoffload: KV-cache offloading for LLM inference engines.

Scheduler-side managers (:mod:`kvoffload.impl`), their executable
specification (:mod:`kvoffload.spec`) and the conformance kit that holds one
to the other (:mod:`kvoffload.stateful`). Importing this package needs
neither torch nor a GPU.
"""

from kvoffload.impl import (
    ARCCachePolicy,
    Backend,
    BlockIDsLoadStoreSpec,
    BlockStatus,
    CachePolicy,
    CPUBackend,
    CPULoadStoreSpec,
    CPUOffloadingManager,
    FilterReusedOffloadingManager,
    LRUCachePolicy,
    LRUOffloadingManager,
    OffloadingManagerCore,
    make_cache_policy,
)
from kvoffload.spec import (
    Call,
    ConfigurationError,
    IllegalTransitionError,
    InvalidKeyError,
    LoadStoreSpec,
    OffloadingError,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    Phase,
    PhaseKind,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferError,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_offload_key,
)

__version__ = "0.1.0"

__all__ = [
    "ARCCachePolicy",
    "Backend",
    "BlockIDsLoadStoreSpec",
    "BlockStatus",
    "CPUBackend",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "Call",
    "ConfigurationError",
    "FilterReusedOffloadingManager",
    "IllegalTransitionError",
    "InvalidKeyError",
    "LRUCachePolicy",
    "LRUOffloadingManager",
    "LoadStoreSpec",
    "OffloadKey",
    "OffloadingError",
    "OffloadingEvent",
    "OffloadingManager",
    "OffloadingManagerCore",
    "Phase",
    "PhaseKind",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "TransferError",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "validate_offload_key",
]
