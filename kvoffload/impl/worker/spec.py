"""Offloading specs: the one place where the scheduler half (a manager) and
the worker half (handlers) are built from one configuration (vLLM's
``OffloadingSpec``, without vLLM's config objects)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.base import OffloadingHandler
from kvoffload.impl.worker.canonical import CanonicalKVCaches
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.contract import LoadStoreSpec, OffloadingManager
from kvoffload.spec.errors import ConfigurationError

if TYPE_CHECKING:
    from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers
    from kvoffload.impl.worker.region import CpuRegion

HandlerEntry = tuple[type[LoadStoreSpec], type[LoadStoreSpec], OffloadingHandler]
"""``(source spec type, destination spec type, handler)``."""

CACHE_POLICIES = ("lru", "arc")


class OffloadingSpec(ABC):
    """Builds both halves of one offloading setup."""

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        """The scheduler-side manager that tracks offloaded blocks."""

    @abstractmethod
    def get_handlers(self, kv_caches: CanonicalKVCaches) -> Iterator[HandlerEntry]:
        """The worker-side handlers for ``kv_caches``, each with the spec
        types of its source and destination."""

    def build_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """An :class:`OffloadingWorker` with every handler registered."""
        worker = OffloadingWorker()
        for src_cls, dst_cls, handler in self.get_handlers(kv_caches):
            worker.register_handler(src_cls, dst_cls, handler)
        return worker


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{attribute.name} must be a positive int, got {value!r}")


def _optional_positive_int(
    instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


@attrs.frozen
class CPUOffloadingConfig:
    """Configuration of CPU offloading.

    - ``gpu_block_size``: tokens per GPU block.
    - ``offloaded_block_size``: tokens per CPU block, a multiple of
      ``gpu_block_size`` (default: equal to it).
    - ``num_cpu_blocks``, or ``cpu_bytes`` with ``gpu_page_bytes`` (bytes one
      GPU block takes over all KV tensors): exactly one way to size the tier.
    - ``cache_policy``: ``"lru"`` or ``"arc"``.
    - ``store_threshold``: with 2 or more, a reuse filter sits in front of the
      manager and offloads only blocks looked up that many times; 1 stores
      everything. ``max_tracker_size`` bounds the filter's table.
    - ``enable_events``: the manager records stored/removed events.
    - ``pin_memory``: pin the CPU tier when the KV caches are on CUDA.
    - ``direct_copy_min_bytes``: runs of consecutive blocks at least this
      long are copied one copy per run; shorter ones are batched (default:
      chosen by the device, see :class:`CpuGpuOffloadingHandlers`).
    - ``zero_copy``: on CUDA, move batched rows with GPU kernels over the
      pinned CPU tier mapped into the GPU (``None``: where the driver maps
      it; ``True``: insist; ``False``: through staging buffers).

    Every field is checked on construction; a bad value raises
    :class:`~kvoffload.spec.errors.ConfigurationError`.
    """

    gpu_block_size: int = attrs.field(validator=_positive_int)
    offloaded_block_size: int | None = attrs.field(
        default=None, validator=_optional_positive_int, kw_only=True
    )
    num_cpu_blocks: int | None = attrs.field(
        default=None, validator=_optional_positive_int, kw_only=True
    )
    cpu_bytes: int | None = attrs.field(
        default=None, validator=_optional_positive_int, kw_only=True
    )
    gpu_page_bytes: int | None = attrs.field(
        default=None, validator=_optional_positive_int, kw_only=True
    )
    cache_policy: str = attrs.field(default="lru", kw_only=True)
    store_threshold: int = attrs.field(default=1, validator=_positive_int, kw_only=True)
    max_tracker_size: int = attrs.field(
        default=64_000, validator=_positive_int, kw_only=True
    )
    enable_events: bool = attrs.field(default=False, kw_only=True)
    pin_memory: bool = attrs.field(default=True, kw_only=True)
    direct_copy_min_bytes: int | None = attrs.field(default=None, kw_only=True)
    zero_copy: bool | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.cache_policy not in CACHE_POLICIES:
            raise ConfigurationError(
                f"cache_policy must be one of {CACHE_POLICIES}, got {self.cache_policy!r}"
            )
        if self.offloaded_block_size is not None and (
            self.offloaded_block_size % self.gpu_block_size
        ):
            raise ConfigurationError(
                f"offloaded_block_size {self.offloaded_block_size} is not a "
                f"multiple of gpu_block_size {self.gpu_block_size}"
            )
        if self.direct_copy_min_bytes is not None and (
            isinstance(self.direct_copy_min_bytes, bool)
            or not isinstance(self.direct_copy_min_bytes, int)
            or self.direct_copy_min_bytes < 0
        ):
            raise ConfigurationError(
                "direct_copy_min_bytes must be an int >= 0, got "
                f"{self.direct_copy_min_bytes!r}"
            )
        if self.zero_copy is not None and not isinstance(self.zero_copy, bool):
            raise ConfigurationError(f"zero_copy must be None or a bool, got {self.zero_copy!r}")
        if (self.num_cpu_blocks is None) == (self.cpu_bytes is None):
            raise ConfigurationError("give exactly one of num_cpu_blocks and cpu_bytes")
        if self.cpu_bytes is not None:
            if self.gpu_page_bytes is None:
                raise ConfigurationError(
                    "cpu_bytes needs gpu_page_bytes (bytes of one GPU block over "
                    "all KV tensors) to count CPU blocks"
                )
            if self.cpu_bytes < self.gpu_page_bytes * self.block_size_factor:
                raise ConfigurationError(
                    f"cpu_bytes {self.cpu_bytes} hold no offloaded block of "
                    f"{self.gpu_page_bytes * self.block_size_factor} bytes"
                )

    @property
    def block_size_factor(self) -> int:
        """GPU blocks per offloaded block."""
        if self.offloaded_block_size is None:
            return 1
        return self.offloaded_block_size // self.gpu_block_size

    @property
    def cpu_block_size(self) -> int:
        """Tokens per offloaded block."""
        return self.offloaded_block_size or self.gpu_block_size

    @property
    def cpu_block_count(self) -> int:
        """Number of offloaded blocks the CPU tier holds."""
        if self.num_cpu_blocks is not None:
            return self.num_cpu_blocks
        if self.cpu_bytes is None or self.gpu_page_bytes is None:
            raise ConfigurationError("give exactly one of num_cpu_blocks and cpu_bytes")
        return self.cpu_bytes // (self.gpu_page_bytes * self.block_size_factor)


class CPUOffloadingSpec(OffloadingSpec):
    """Offloading to CPU memory: a :class:`CPUOffloadingManager` (behind a
    reuse filter when ``store_threshold >= 2``) and the CPU<->GPU handlers.

    :meth:`get_manager` and :meth:`get_handlers` build their half once and
    hand the same objects out afterwards.

    ``cpu_region`` places the CPU tier in a caller-given chunk-major buffer
    (see :class:`CpuGpuOffloadingHandlers`); without it (the default) each
    canonical tensor gets its own CPU tensor.
    """

    def __init__(
        self, config: CPUOffloadingConfig, *, cpu_region: CpuRegion | None = None
    ) -> None:
        if not isinstance(config, CPUOffloadingConfig):
            raise ConfigurationError(
                f"expected a CPUOffloadingConfig, got {type(config).__name__}"
            )
        self.config = config
        self.cpu_region = cpu_region
        self.block_size_factor = config.block_size_factor
        self.num_cpu_blocks = config.cpu_block_count
        self._manager: OffloadingManager | None = None
        self._handlers: CpuGpuOffloadingHandlers | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            from kvoffload.impl.manager import CPUOffloadingManager
            from kvoffload.impl.reuse import FilterReusedOffloadingManager

            config = self.config
            manager: OffloadingManager = CPUOffloadingManager(
                block_size=config.cpu_block_size,
                num_blocks=self.num_cpu_blocks,
                cache_policy=config.cache_policy,
                enable_events=config.enable_events,
            )
            if config.store_threshold >= 2:
                manager = FilterReusedOffloadingManager(
                    manager,
                    store_threshold=config.store_threshold,
                    max_tracker_size=config.max_tracker_size,
                )
            self._manager = manager
        return self._manager

    def get_handlers(self, kv_caches: CanonicalKVCaches) -> Iterator[HandlerEntry]:
        """Yield ``(GPULoadStoreSpec, CPULoadStoreSpec, store handler)`` and
        ``(CPULoadStoreSpec, GPULoadStoreSpec, load handler)``.

        Raises :class:`ConfigurationError` (before yielding anything) for bad
        ``kv_caches``, or if ``gpu_page_bytes`` was given and the caches'
        bytes per GPU block differ from it.
        """
        handlers = self.build_handlers(kv_caches)
        yield GPULoadStoreSpec, CPULoadStoreSpec, handlers.gpu_to_cpu_handler
        yield CPULoadStoreSpec, GPULoadStoreSpec, handlers.cpu_to_gpu_handler

    def build_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        # Build first so that a bad configuration raises here, not mid-way.
        self.build_handlers(kv_caches)
        return super().build_worker(kv_caches)

    def build_handlers(self, kv_caches: CanonicalKVCaches) -> CpuGpuOffloadingHandlers:
        """The CPU tier and both handlers for ``kv_caches``, built on the
        first call; later calls must pass the same caches.

        Raises :class:`ConfigurationError` as :meth:`get_handlers` does, or
        if ``kv_caches`` differ from the first call's.
        """
        if self._handlers is not None:
            if self._handlers.kv_caches is not kv_caches:
                raise ConfigurationError(
                    "this spec's handlers were built for other KV caches"
                )
            return self._handlers
        from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers

        kv_caches.validate()
        page_bytes = sum(item.page_size_bytes for item in kv_caches.tensors)
        expected = self.config.gpu_page_bytes
        if expected is not None and expected != page_bytes:
            raise ConfigurationError(
                f"gpu_page_bytes is {expected} but one GPU block of these KV "
                f"caches takes {page_bytes} bytes"
            )
        self._handlers = CpuGpuOffloadingHandlers(
            kv_caches,
            block_size_factor=self.block_size_factor,
            num_cpu_blocks=self.num_cpu_blocks,
            pin_memory=self.config.pin_memory,
            direct_copy_min_bytes=self.config.direct_copy_min_bytes,
            zero_copy=self.config.zero_copy,
            cpu_region=self.cpu_region,
        )
        return self._handlers
