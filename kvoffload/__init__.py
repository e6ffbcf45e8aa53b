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
from kvoffload.impl.specs import GPULoadStoreSpec
from kvoffload.impl.worker import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    CPUOffloadingConfig,
    CPUOffloadingSpec,
    OffloadingHandler,
    OffloadingSpec,
    OffloadingWorker,
    TransferResult,
)
from kvoffload.spec import (
    Call,
    InspectableManager,
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
    "CPUOffloadingConfig",
    "CPUOffloadingManager",
    "CPUOffloadingSpec",
    "CachePolicy",
    "Call",
    "CanonicalKVCacheRef",
    "CanonicalKVCacheTensor",
    "CanonicalKVCaches",
    "ConfigurationError",
    "FilterReusedOffloadingManager",
    "GPULoadStoreSpec",
    "IllegalTransitionError",
    "InspectableManager",
    "InvalidKeyError",
    "LRUCachePolicy",
    "LRUOffloadingManager",
    "LoadStoreSpec",
    "OffloadKey",
    "OffloadingError",
    "OffloadingEvent",
    "OffloadingHandler",
    "OffloadingManager",
    "OffloadingManagerCore",
    "OffloadingSpec",
    "OffloadingWorker",
    "Phase",
    "PhaseKind",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "TransferError",
    "TransferResult",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "validate_offload_key",
]
