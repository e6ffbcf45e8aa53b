"""kvoffload inside vLLM 0.33: an out-of-tree offloading spec.

vLLM loads it by module path (docs/VLLM.md)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KVOffloadingSpec",
        "spec_module_path": "kvoffload.vllm", "cpu_bytes_to_use": 8000000000}}'

:class:`KVOffloadingSpec` reads the ``extra_config`` keys vLLM's own
``CPUOffloadingSpec`` reads (``cpu_bytes_to_use``, ``eviction_policy``,
``store_threshold``, ``max_tracker_size``) and sizes the tier the same way,
so switching an engine to kvoffload changes ``spec_name`` and
``spec_module_path`` only.

:class:`KVOffloadingManager` is vLLM 0.33's ``OffloadingManager`` face of
kvoffload's one manager core (:class:`~kvoffload.impl.manager.OffloadingManagerCore`,
behind :class:`~kvoffload.impl.reuse.FilterReusedOffloadingManager` when
``store_threshold >= 2``). It converts shapes only: vLLM's request contexts,
``LookupResult``, store outputs and events. Where 0.33's conventions differ
from kvoffload's defaults, it sets the core's options named after the
``vllm-0.33`` profile's (:data:`kvoffload.spec.releases.VLLM_0_33`):
request-scoped recency, the filter counting offers (keeping the offer's
keys) and keeping its counts across a reset, ``reset_cache`` emitting
nothing, ``complete_store`` skipping untracked keys. Illegal calls raise
kvoffload's typed errors and change nothing (where vLLM 0.33 asserts after
changing state, docs/FINDINGS.md F3).

:class:`KVOffloadingWorker` is vLLM 0.33's ``OffloadingWorker`` face of
kvoffload's worker (:class:`~kvoffload.impl.worker.worker.OffloadingWorker`
over the CPU<->GPU handlers).

This is the only kvoffload module that imports vLLM; ``import kvoffload``
never imports it. Threads: the manager's ``lock`` is the core's own lock;
vLLM's scheduler holds it around every call (docs/SPEC.md, "Threads and
the lock").
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.base import OffloadingEvent as VllmOffloadingEvent
from vllm.v1.kv_offload.base import PrepareStoreOutput as VllmPrepareStoreOutput
from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
from vllm.v1.kv_offload.base import TransferResult as VllmTransferResult
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import (
    CPULoadStoreSpec as VllmCPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import (
    CPUOffloadingInfo,
    CPUOffloadingMetrics,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload.impl.manager import CPUOffloadingManager, KeyAnswers
from kvoffload.impl.policies import require_policy_name
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.specs import BlockIDsLoadStoreSpec
from kvoffload.impl.stats import ManagerStats
from kvoffload.spec.contract import LoadStoreSpec, ReqContext
from kvoffload.spec.contract import LookupResult as LibraryLookupResult
from kvoffload.spec.contract import OffloadingManager as LibraryManager
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.releases import VLLM_0_33

if TYPE_CHECKING:
    from kvoffload.impl.tier_setup import TierSettings
    from kvoffload.impl.tiered import TieredOffloadingManager
    from kvoffload.impl.worker.region import ChunkMajorLayout
    from kvoffload.impl.worker.worker import OffloadingWorker as LibraryWorker
    from kvoffload.spec.tier_contract import SecondaryTier

__all__ = [
    "KVOffloadingManager",
    "KVOffloadingSpec",
    "KVOffloadingWorker",
]

PROFILE = VLLM_0_33
"""The conventions the face keeps (the kit audits it under this profile)."""

BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE
"""Bytes a chunk is rounded up to (vLLM 0.33's ``CPUOffloadingSpec`` rounds
to its shared region's page size)."""

_NO_REQUEST = ReqContext(req_id="")

_MEDIA = {medium.value: medium for medium in Medium}
"""vLLM's medium of an event, by the name kvoffload's event carries."""

_VLLM_RESULTS = {result: LookupResult[result.name] for result in LibraryLookupResult}
"""vLLM's lookup answer for kvoffload's."""

_TIER_MEDIA = {"fs": Medium.STORAGE.value, "memory": Medium.CPU.value}
"""The ``medium`` of kvoffload's tier types unless a tier's config names one."""


def _block_ids(spec: LoadStoreSpec) -> list[int]:
    """The chunk ids of a spec the core built (a ``CPULoadStoreSpec``), as
    the list vLLM's spec makes its own array from (the core's spec then
    builds none)."""
    if not isinstance(spec, BlockIDsLoadStoreSpec):
        raise TypeError(f"the core built a {type(spec).__name__}, not a block-id spec")
    return spec.id_list()


def _context(req_context: VllmReqContext) -> ReqContext:
    """kvoffload's context for vLLM's, kept in the vLLM context's
    per-request state (made on first use)."""
    ours: ReqContext | None = req_context.get_state(ReqContext)
    if ours is None:
        ours = ReqContext(
            req_id=req_context.req_id, kv_transfer_params=req_context.kv_transfer_params
        )
        req_context.set_state(ours)
    return ours


class KVOffloadingManager(OffloadingManager):  # type: ignore[misc]
    """vLLM 0.33's ``OffloadingManager`` over kvoffload's manager core
    (module docstring). ``num_chunks`` may be 0: every store of a new key is
    then refused, as vLLM's manager does.

    Raises :class:`ConfigurationError` for a negative ``num_chunks``, an
    unknown ``cache_policy`` (``"lru"``/``"arc"``) or a
    ``max_tracker_size < 1`` with ``store_threshold >= 2``.
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        info: CPUOffloadingInfo | None = None,
        *,
        tiers: Sequence[SecondaryTier] = (),
        tier_settings: TierSettings | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 0:
            raise ConfigurationError(f"num_chunks must be an int >= 0, got {num_chunks!r}")
        require_policy_name(cache_policy)
        self.core = CPUOffloadingManager(
            1,  # slots are chunks: the block size plays no part here
            num_chunks,
            cache_policy,
            enable_events,
            recency_commit=PROFILE.recency_commit,
            reset_announce=PROFILE.reset_announce,
            complete_store_ignores_absent=PROFILE.complete_store_ignores_absent,
            reset_with_loads=PROFILE.reset_with_loads,
            allow_empty=True,
        )
        # lookup's hot path: one native call per key (the class's lookup
        # says the same, for readers and for vLLM's ABC)
        self._answers = KeyAnswers(
            self.core, LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS
        )
        self.lookup = self._answers.lookup  # type: ignore[method-assign]
        self.manager: LibraryManager = self.core
        self.filter: FilterReusedOffloadingManager | None = None
        if store_threshold >= 2:
            self.filter = FilterReusedOffloadingManager(
                self.core,
                store_threshold,
                max_tracker_size,
                filter_counts=PROFILE.filter_counts,
                filter_reset_clears=PROFILE.filter_reset_clears,
            )
            self.manager = self.filter
        self.num_chunks = num_chunks
        self.cache_policy = cache_policy
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.medium = Medium.CPU
        self._config_info: ConfigInfoMapping = info.as_config_info() if info is not None else {}
        self._allocation_sizes: list[int] = []
        self._skipped_reported = 0
        self._last_vllm_context: VllmReqContext | None = None
        self._last_context = _NO_REQUEST
        self.tiered: TieredOffloadingManager | None = None
        self._step_tiers: list[Any] = []
        self._on_shutdown = on_shutdown
        self.vllm_contexts: dict[str, VllmReqContext] = {}
        if tiers:
            self._add_tiers(tiers, tier_settings)

    def _add_tiers(
        self, tiers: Sequence[SecondaryTier], settings: TierSettings | None
    ) -> None:
        """Put the tiered manager (``tiers`` behind the core) in front:
        every call then goes to it, lookups answer HIT_PENDING while a
        promotion runs, and :attr:`lock` is its lock."""
        from kvoffload.impl.tier_setup import ForeignTier, TierSettings, build_tiered_manager

        if self.filter is not None:
            raise ConfigurationError("store_threshold >= 2 is not supported with secondary tiers")
        self.tiered = build_tiered_manager(self.core, tiers, settings or TierSettings(()))
        self.manager = self.tiered
        self._step_tiers = [tier for tier in tiers if isinstance(tier, ForeignTier)]
        self.lookup = self._tiered_lookup  # type: ignore[method-assign]

    def _tiered_lookup(self, key: OffloadKey, req_context: VllmReqContext) -> LookupResult:
        """``lookup`` with secondary tiers: HIT, HIT_PENDING (a promotion
        runs or starts now, or a GPU store is in flight), RETRY (a tier
        asked to be asked again) or MISS."""
        if self.tiered is None:  # bound only with tiers
            raise ConfigurationError("no secondary tiers")
        return _VLLM_RESULTS[self.tiered.lookup_result(key, self._ours(req_context))]

    def _ours(self, req_context: VllmReqContext) -> ReqContext:
        """kvoffload's context for vLLM's (:func:`_context`); the last one is
        kept, as a request's calls come in a row (the vLLM context is held,
        so its identity cannot be reused)."""
        if req_context is self._last_vllm_context:
            return self._last_context
        ours = _context(req_context)
        self._last_vllm_context = req_context
        self._last_context = ours
        return ours

    @property
    def lock(self) -> AbstractContextManager[object]:
        """The core's lock (one real lock guards the core and the filter);
        with secondary tiers, the tiered manager's."""
        if self.tiered is not None:
            return self.tiered.lock
        return self.core.lock

    # --- lookups and loads ---------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: VllmReqContext) -> LookupResult:
        """``HIT`` for a readable key, ``HIT_PENDING`` while its store is in
        flight, ``MISS`` otherwise; :class:`InvalidKeyError` for a malformed
        key. Each instance answers through its core's
        :class:`~kvoffload.impl.manager.KeyAnswers` (bound over this
        method in ``__init__``: one native call per key)."""
        result: LookupResult = self._answers.lookup(key, req_context)
        return result

    def get_load_source(self, key: OffloadKey, req_context: VllmReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: VllmReqContext
    ) -> VllmCPULoadStoreSpec:
        spec = self.manager.prepare_load(keys, self._ours(req_context))
        return VllmCPULoadStoreSpec(_block_ids(spec))

    def touch(self, keys: Collection[OffloadKey], req_context: VllmReqContext) -> None:
        self.manager.touch(keys, self._ours(req_context))

    def complete_load(self, keys: Collection[OffloadKey], req_context: VllmReqContext) -> None:
        self.manager.complete_load(keys, self._ours(req_context))

    # --- stores -------------------------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: VllmReqContext
    ) -> VllmPrepareStoreOutput | None:
        output = self.manager.prepare_store(keys, self._ours(req_context))
        if output is None:
            return None
        if output.keys_to_store:
            self._allocation_sizes.append(len(output.keys_to_store))
        return VllmPrepareStoreOutput(
            keys_to_store=list(output.keys_to_store),
            store_spec=VllmCPULoadStoreSpec(_block_ids(output.store_spec)),
            evicted_keys=list(output.evicted_keys),
        )

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: VllmReqContext,
        success: bool = True,
    ) -> None:
        self.manager.complete_store(keys, self._ours(req_context), success)

    # --- requests and steps ------------------------------------------------

    def on_new_request(self, req_context: VllmReqContext) -> RequestOffloadingContext:
        if self.tiered is not None:  # foreign tiers are handed vLLM's context
            self.vllm_contexts[req_context.req_id] = req_context
        self.manager.on_new_request(self._ours(req_context))
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: VllmReqContext) -> None:
        """Commits the request's uses to the replacement policy (0.33's
        request-scoped recency)."""
        self.manager.on_request_finished(self._ours(req_context))
        self.vllm_contexts.pop(req_context.req_id, None)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """With secondary tiers: submits the step's promotions (and
        write-back cascades), takes every finished tier job, and passes the
        step's end on to tiers that take it. kvoffload runs no tier-poll
        thread: this is where tier results come in (vLLM keeps calling it
        while :meth:`has_pending_work`)."""
        self.manager.on_schedule_end()
        for tier in self._step_tiers:
            tier.on_schedule_end(context)

    def has_pending_work(self) -> bool:
        """Whether a tier job is in flight or batched (never without tiers)."""
        return self.tiered is not None and self.tiered.has_pending_work()

    def take_events(self) -> Iterable[VllmOffloadingEvent]:
        """The core's events as vLLM's (``medium=Medium.CPU``), then each
        secondary tier's (its ``medium``). A failed store emits nothing: its
        keys were never announced (vLLM's own manager emits a
        ``metadata_only`` removal the engine never publishes)."""
        medium = self.medium
        media = _MEDIA
        return [
            VllmOffloadingEvent(
                keys=list(event.keys),
                medium=media.get(event.medium, medium),
                removed=event.removed,
            )
            for event in self.manager.take_events()
        ]

    def reset_cache(self) -> None:
        """Drops every chunk; emits no event (the engine publishes its own
        all-cleared event). The engine completes no pre-reset job after it
        (vLLM's scheduler discards them); their chunks may be handed out
        again at once."""
        self.manager.reset_cache()

    def on_reset_flushed(self) -> None:
        return None

    # --- metrics ------------------------------------------------------------

    def stats(self) -> ManagerStats:
        """kvoffload's snapshot (:class:`~kvoffload.impl.stats.ManagerStats`)."""
        if self.filter is not None:
            return self.filter.stats()
        return self.core.stats()

    def get_stats(self) -> Any:
        """vLLM's ``OffloadingConnectorStats`` with the metrics of vLLM's CPU
        manager (``CPUOffloadingMetrics``): the usage gauges now, the
        allocation sizes and (with a filter) the stores skipped since the
        last call."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        snapshot = self.stats()
        stats = OffloadingConnectorStats()
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, snapshot.usage)
        for size in self._allocation_sizes:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self._allocation_sizes.clear()
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, snapshot.write_usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, snapshot.read_usage)
        if self.store_threshold >= 2:
            stats.increase_counter(
                CPUOffloadingMetrics.STORES_SKIPPED,
                snapshot.stores_skipped - self._skipped_reported,
            )
            self._skipped_reported = snapshot.stores_skipped
        return stats

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        return [self._config_info]

    def shutdown(self) -> None:
        """Shuts the manager down (with tiers: every tier, then the core),
        then releases what the spec built for it (the shared region)."""
        try:
            self.manager.shutdown()
        finally:
            if self._on_shutdown is not None:
                self._on_shutdown()


def _library_spec(spec: Any, kind: str) -> LoadStoreSpec:
    """kvoffload's spec for vLLM's (``kind``: ``"gpu"`` or ``"cpu"``)."""
    from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec

    if kind == "gpu":
        return GPULoadStoreSpec(
            spec.block_ids, list(spec.group_sizes), list(spec.block_indices)
        )
    return CPULoadStoreSpec(spec.block_ids)


class KVOffloadingWorker(OffloadingWorker):  # type: ignore[misc]
    """vLLM 0.33's ``OffloadingWorker`` over kvoffload's worker: stores go
    GPU -> CPU, loads CPU -> GPU, through kvoffload's handlers (their own
    streams; an ``expedited`` load is submitted at once like any other, as
    submission never blocks). A transfer the worker cannot run is reported
    failed by :meth:`get_finished`."""

    def __init__(
        self, worker: LibraryWorker, on_shutdown: Callable[[], None] | None = None
    ) -> None:
        self.worker = worker
        self._on_shutdown = on_shutdown

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self.worker.transfer_async(
            job_id, (_library_spec(src_spec, "gpu"), _library_spec(dst_spec, "cpu"))
        )

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self.worker.transfer_async(
            job_id, (_library_spec(src_spec, "cpu"), _library_spec(dst_spec, "gpu"))
        )

    def get_finished(self) -> list[VllmTransferResult]:
        return [
            VllmTransferResult(
                job_id=result.job_id,
                success=result.success,
                transfer_size=result.transfer_size,
                transfer_time=result.transfer_time,
            )
            for result in self.worker.get_finished()
        ]

    def wait(self, job_ids: set[int]) -> None:
        self.worker.wait(job_ids)

    def shutdown(self) -> None:
        """Waits for every transfer, then releases the shared region (with
        secondary tiers)."""
        try:
            self.worker.shutdown()
        finally:
            if self._on_shutdown is not None:
                self._on_shutdown()


def _round_up(value: int, multiple: int) -> int:
    return -(value // -multiple) * multiple


_USAGE_DOCS = {
    CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC: (
        "Fraction of the CPU KV-cache chunks pinned by transfers in flight "
        "(stores and loads)."
    ),
    CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC: (
        "Fraction of the CPU KV-cache chunks pinned by stores in flight."
    ),
    CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC: (
        "Fraction of the CPU KV-cache chunks pinned by loads in flight."
    ),
}


class KVOffloadingSpec(OffloadingSpec):  # type: ignore[misc]
    """vLLM 0.33's ``OffloadingSpec`` for kvoffload's CPU tier, built from
    vLLM's ``OffloadingConfig`` (module docstring).

    ``extra_config``: ``cpu_bytes_to_use`` (required: the CPU bytes of the
    tier over all workers), ``eviction_policy`` (``"lru"``, the default, or
    ``"arc"``), ``store_threshold`` (2 or more: offload a chunk only once it
    was offered that many times; default 0, no filter), ``max_tracker_size``
    (the filter's table, default 64000). The tier holds
    ``cpu_bytes_to_use // round_up(chunk bytes, page size)`` chunks, as in
    vLLM's ``CPUOffloadingSpec``; 0 chunks make a manager that refuses every
    store.

    Secondary tiers, as vLLM 0.33's ``TieringOffloadingSpec`` takes them:
    ``secondary_tiers`` (a list of tier dicts: ``type`` ``"fs"`` or
    ``"memory"`` for kvoffload's tiers, a tier vLLM registers by name, or
    any ``SecondaryTierManager`` class named by ``type`` and
    ``module_path``; see :mod:`kvoffload.impl.tier_setup`), with
    ``tier_cascade`` and ``tier_max_promotions_in_flight`` for the tiered
    manager, and ``shared_region_dir`` (default ``/dev/shm``) for the CPU
    tier's shared file. With tiers the CPU tier is one chunk-major region
    (:class:`~kvoffload.impl.worker.region.ChunkMajorLayout`) in a file named
    after ``engine_id``, mapped by the scheduler (where the tiers run) and
    by every worker; a chunk is ``round_up(world_size * worker bytes per
    block, page size / gcd(blocks per chunk, page size)) * blocks per
    chunk`` bytes (the same as above unless a chunk spans several blocks
    that do not fill whole pages). :meth:`get_manager` then returns the
    manager over :class:`~kvoffload.impl.tiered.TieredOffloadingManager`.

    Raises :class:`ConfigurationError` without ``cpu_bytes_to_use``, for an
    unknown ``eviction_policy``, for ``cache_policy_module_path``
    (kvoffload implements its own policies only), and, with tiers, for a
    malformed tier configuration, ``store_threshold >= 2``,
    ``canonical_layout``, a tier that serves external requests
    (``serve_external_requests``: kvoffload gives tiers no parent manager),
    or too few bytes for one chunk. Nothing is created then.
    """

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        definitions: dict[str, OffloadingMetricMetadata] = {
            name: OffloadingGaugeMetadata(documentation=text) for name, text in _USAGE_DOCS.items()
        }
        definitions[CPUOffloadingMetrics.CPU_ALLOCATION_SIZE] = OffloadingHistogramMetadata(
            documentation="CPU chunks allocated by each admitted prepare_store call.",
            buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144),
        )
        if int(extra_config.get("store_threshold", 0)) >= 2:
            definitions[CPUOffloadingMetrics.STORES_SKIPPED] = OffloadingCounterMetadata(
                documentation=(
                    "Offered KV chunks not stored because they were offered "
                    "fewer than store_threshold times."
                ),
            )
        return definitions

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        keys: tuple[str, ...] = CPUOffloadingInfo.config_info_keys()
        return keys

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        cpu_bytes_to_use = self.extra_config.get("cpu_bytes_to_use")
        if not cpu_bytes_to_use:
            raise ConfigurationError(
                "cpu_bytes_to_use must be specified in kv_connector_extra_config"
            )
        if self.extra_config.get("cache_policy_module_path"):
            raise ConfigurationError(
                "kvoffload implements its own eviction policies ('lru', 'arc'); "
                "cache_policy_module_path is not supported"
            )
        self.eviction_policy: str = require_policy_name(
            self.extra_config.get("eviction_policy", "lru")
        )
        self.store_threshold = int(self.extra_config.get("store_threshold", 0))
        self.max_tracker_size = int(self.extra_config.get("max_tracker_size", 64_000))
        world_size = config.parallel.world_size
        self.num_chunks = 0
        self.kv_bytes_per_chunk = 0
        if config.worker_kv_bytes_per_block > 0 and world_size > 0:
            kv_bytes_per_chunk = (
                config.worker_kv_bytes_per_block * world_size * self.blocks_per_chunk
            )
            self.kv_bytes_per_chunk = _round_up(kv_bytes_per_chunk, BLOCK_SIZE_ALIGNMENT)
            self.num_chunks = int(cpu_bytes_to_use) // self.kv_bytes_per_chunk
        self.tier_settings = _tier_settings(self.extra_config)
        self.region_layout: ChunkMajorLayout | None = None
        if self.tier_settings is not None:
            self._size_shared_region(config, int(cpu_bytes_to_use))
        self.cpu_info = CPUOffloadingInfo.from_config(
            config, self.num_chunks, self.kv_bytes_per_chunk
        )
        self._manager: KVOffloadingManager | None = None
        self._worker: KVOffloadingWorker | None = None

    def _size_shared_region(self, config: OffloadingConfig, cpu_bytes_to_use: int) -> None:
        """With tiers: the checks that need the whole configuration, and the
        chunk-major region's layout and size."""
        from kvoffload.impl.worker.region import DEFAULT_DIRECTORY, ChunkMajorLayout

        if self.store_threshold >= 2:
            raise ConfigurationError(
                "store_threshold >= 2 is not supported with secondary_tiers "
                "(as in vLLM's TieringOffloadingSpec)"
            )
        if config.canonical_layout:
            raise ConfigurationError(
                "canonical_layout is not supported with kvoffload's secondary tiers: "
                "they hold each worker's bytes as its KV caches lay them out"
            )
        world_size = config.parallel.world_size
        if config.worker_kv_bytes_per_block <= 0 or world_size <= 0:
            raise ConfigurationError("secondary_tiers need KV bytes per block and workers")
        self.region_layout = ChunkMajorLayout(
            (config.worker_kv_bytes_per_block,),
            self.blocks_per_chunk,
            world_size,
            BLOCK_SIZE_ALIGNMENT,
        )
        self.kv_bytes_per_chunk = self.region_layout.chunk_bytes
        self.num_chunks = cpu_bytes_to_use // self.kv_bytes_per_chunk
        if self.num_chunks == 0:
            raise ConfigurationError(
                f"cpu_bytes_to_use {cpu_bytes_to_use} holds no chunk of "
                f"{self.kv_bytes_per_chunk} bytes; secondary tiers need at least one"
            )
        self.region_directory = str(self.extra_config.get("shared_region_dir", DEFAULT_DIRECTORY))
        self.region_name = region_name_of(config.engine_id)

    def get_manager(self) -> KVOffloadingManager:
        if self._manager is None and self.tier_settings is not None:
            self._manager = self._tiered_manager(self.tier_settings)
        if self._manager is None:
            self._manager = KVOffloadingManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=self.store_threshold,
                max_tracker_size=self.max_tracker_size,
                info=self.cpu_info,
            )
        return self._manager

    def get_worker(self, kv_caches: Any) -> KVOffloadingWorker:
        """The worker for ``kv_caches`` (vLLM's ``CanonicalKVCaches``),
        built on the first call. CPU tensors work too (synchronous copies):
        that is how it is tested without a GPU."""
        if self._worker is None:
            from kvoffload.impl.worker.canonical import (
                CanonicalKVCacheRef,
                CanonicalKVCaches,
                CanonicalKVCacheTensor,
            )
            from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
            from kvoffload.impl.worker.worker import OffloadingWorker as LibraryWorker

            caches = CanonicalKVCaches(
                [CanonicalKVCacheTensor(t.tensor, t.page_size_bytes) for t in kv_caches.tensors],
                [
                    [CanonicalKVCacheRef(ref.tensor_idx, ref.page_size_bytes) for ref in group]
                    for group in kv_caches.group_data_refs
                ],
            )
            if self.region_layout is not None:
                self._worker = self._region_worker(caches)
                return self._worker
            if self.num_chunks == 0:
                worker = LibraryWorker()  # no tier: every transfer is reported failed
            else:
                library_spec = CPUOffloadingSpec(
                    CPUOffloadingConfig(
                        1,
                        offloaded_block_size=self.blocks_per_chunk,
                        num_cpu_blocks=self.num_chunks,
                    )
                )
                worker = library_spec.build_worker(caches)
            self._worker = KVOffloadingWorker(worker)
        return self._worker

    # --- secondary tiers ----------------------------------------------------

    def _tiered_manager(self, settings: TierSettings) -> KVOffloadingManager:
        """The scheduler's side with tiers: map (or create) the shared
        region, build the tiers over its chunk rows, and the manager over
        them; on any failure everything built is released."""
        from kvoffload.impl.tier_setup import open_tiers

        region, tiers = open_tiers(
            settings,
            self._layout(),
            self.num_chunks,
            self.region_name,
            directory=self.region_directory,
            enable_events=self.kv_events_config.enable_kv_cache_events,
            medium_of=_TIER_MEDIA,
            offloading_spec=self,
            make_job=self._vllm_job,
            context_of=self._vllm_context,
        )
        try:
            return KVOffloadingManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                info=self.cpu_info,
                tiers=tiers,
                tier_settings=settings,
                on_shutdown=region.cleanup,
            )
        except BaseException:
            for tier in reversed(tiers):
                try:
                    tier.shutdown()
                except Exception:  # noqa: BLE001 - the first error is the one raised
                    pass
            region.cleanup()
            raise

    def _layout(self) -> ChunkMajorLayout:
        if self.region_layout is None:
            raise ConfigurationError("no secondary tiers: the CPU tier is not a shared region")
        return self.region_layout

    def _vllm_context(self, ours: ReqContext) -> VllmReqContext:
        """vLLM's context of a request, for a foreign tier: the one the
        scheduler passed (between on_new_request and on_request_finished),
        else a fresh one with the same id and parameters."""
        manager = self._manager
        known = None if manager is None else manager.vllm_contexts.get(ours.req_id)
        if known is not None:
            return known
        params = None if ours.kv_transfer_params is None else dict(ours.kv_transfer_params)
        return VllmReqContext(req_id=ours.req_id, kv_transfer_params=params)

    def _vllm_job(self, job: Any) -> Any:
        """vLLM's ``TransferJob`` for a foreign tier."""
        import numpy as np
        from vllm.v1.kv_offload.tiering.base import TransferJob

        return TransferJob(
            job_id=job.job_id,
            keys=list(job.keys),
            chunk_ids=np.asarray(job.chunk_ids, dtype=np.int64),
            is_promotion=job.is_promotion,
            req_context=self._vllm_context(getattr(job, "req_context", _NO_REQUEST)),
        )

    def _region_worker(self, caches: Any) -> KVOffloadingWorker:
        """A worker whose CPU tier is this rank's columns of the shared
        region (mapped here, created if the scheduler has not yet)."""
        from kvoffload.impl.worker.region import ChunkMajorLayout, CpuRegion, SharedRegion
        from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec

        layout = ChunkMajorLayout(
            tuple(t.page_size_bytes for t in caches.tensors),
            self.blocks_per_chunk,
            self.config.parallel.world_size,
            BLOCK_SIZE_ALIGNMENT,
        )
        if layout.chunk_bytes != self.kv_bytes_per_chunk:
            raise ConfigurationError(
                f"these KV caches take {layout.worker_row_bytes} bytes per block; "
                f"the configuration says {self._layout().worker_row_bytes}"
            )
        region = SharedRegion(
            self.region_name,
            layout.region_bytes(self.num_chunks),
            create=None,
            directory=self.region_directory,
        )
        try:
            library_spec = CPUOffloadingSpec(
                CPUOffloadingConfig(
                    1, offloaded_block_size=self.blocks_per_chunk, num_cpu_blocks=self.num_chunks
                ),
                cpu_region=CpuRegion(region.buffer, layout, self.config.parallel.rank),
            )
            worker = library_spec.build_worker(caches)
            handlers = library_spec.build_handlers(caches)
        except BaseException:
            region.cleanup()
            raise

        def release() -> None:
            handlers.release_region()
            region.cleanup()

        return KVOffloadingWorker(worker, on_shutdown=release)


def region_name_of(engine_id: str) -> str:
    """The shared region's file name for ``engine_id``."""
    from kvoffload.impl.worker.region import region_name

    return region_name(engine_id)


def _tier_settings(extra_config: Any) -> TierSettings | None:
    """``extra_config``'s tiers, checked (:func:`~kvoffload.impl.tier_setup.
    tier_settings`), vLLM's registered tier names resolved through vLLM's
    ``SecondaryTierFactory``; a tier that serves external requests is
    refused."""
    from kvoffload.impl.tier_setup import tier_settings

    settings = tier_settings(extra_config, resolve=_vllm_tier_class)
    if settings is None:
        return None
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

    base = SecondaryTierManager.serve_external_requests
    for index, (tier_type, factory, params) in enumerate(settings.tiers):
        medium = params.get("medium", _TIER_MEDIA.get(tier_type))
        if factory is None and medium not in _MEDIA:
            raise ConfigurationError(
                f"secondary_tiers[{index}] ({tier_type!r}): medium {medium!r} is not "
                f"one of vLLM's {sorted(_MEDIA)}"
            )
        serves = getattr(factory, "serve_external_requests", base)
        if isinstance(factory, type) and serves is not base:
            raise ConfigurationError(
                f"secondary_tiers[{index}] ({tier_type!r}) serves external requests, "
                "which needs vLLM's tiering manager as its parent; kvoffload's does "
                "not provide one"
            )
    return settings


def _vllm_tier_class(tier_type: str) -> Any:
    """The class vLLM registers under ``tier_type``, or None."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    if tier_type not in SecondaryTierFactory._registry:
        return None
    try:
        return SecondaryTierFactory.get_tier_class({"type": tier_type})
    except (ImportError, AttributeError) as error:
        raise ConfigurationError(f"vLLM's {tier_type!r} tier does not load: {error}") from None
