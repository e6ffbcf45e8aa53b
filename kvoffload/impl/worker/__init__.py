"""Worker side: move KV blocks between GPU and CPU.

Importing this package does not import torch; the torch-backed
:class:`CpuGpuOffloadingHandlers` loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvoffload.impl.worker.base import (
    OffloadingHandler,
    TransferResult,
    TransferSpec,
    TransferType,
)
from kvoffload.impl.worker.canonical import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
)
from kvoffload.impl.worker.region import ChunkMajorLayout, CpuRegion, SharedRegion
from kvoffload.impl.worker.spec import (
    CPUOffloadingConfig,
    CPUOffloadingSpec,
    HandlerEntry,
    OffloadingSpec,
)
from kvoffload.impl.worker.worker import OffloadingWorker

if TYPE_CHECKING:
    from kvoffload.impl.worker.cpu_gpu import (
        CpuGpuOffloadingHandlers,
        SingleDirectionOffloadingHandler,
    )

_LAZY = {
    "CpuGpuOffloadingHandlers": "kvoffload.impl.worker.cpu_gpu",
    "SingleDirectionOffloadingHandler": "kvoffload.impl.worker.cpu_gpu",
}

__all__ = [
    "CPUOffloadingConfig",
    "CPUOffloadingSpec",
    "CanonicalKVCacheRef",
    "CanonicalKVCacheTensor",
    "CanonicalKVCaches",
    "ChunkMajorLayout",
    "CpuGpuOffloadingHandlers",
    "CpuRegion",
    "HandlerEntry",
    "OffloadingHandler",
    "OffloadingSpec",
    "OffloadingWorker",
    "SharedRegion",
    "SingleDirectionOffloadingHandler",
    "TransferResult",
    "TransferSpec",
    "TransferType",
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
