"""Secondary tiers from configuration: the ``secondary_tiers`` an engine's
configuration lists, built over the primary (CPU) tier's memory.

The configuration follows vLLM 0.33's tiering spec: ``secondary_tiers`` is a
list of dicts, each with a ``type`` and that tier's own parameters.

- ``"fs"``: :class:`~kvoffload.impl.fs_tier.FileSystemTier`. ``directory``
  (required), its size as ``capacity_blocks`` (chunks) or ``capacity_bytes``
  (exactly one), and any of its options (``cache_policy``, ``num_threads``,
  ``fsync``, ``checksum``, ``verify_loads``, ``direct_io``, ``recycle_files``,
  ``compiled_io``, ``medium``).
- ``"memory"``: :class:`~kvoffload.impl.memtier.MemoryTier`, sized the same
  way; options ``medium``.
- any other ``type`` with ``module_path``: ``getattr(import_module(
  module_path), type)``, a class or factory in vLLM 0.33's
  ``SecondaryTierManager`` shape, called as vLLM's tier factory calls it
  (``offloading_spec=``, ``primary_kv_view=``, ``tier_type=``, then the
  tier's parameters) and wrapped in :class:`ForeignTier`, which reads its
  answers by name and hands it the caller's job and context types (vLLM's
  own tiers included).

Beside the list, the tiered manager's own options:
``tier_cascade`` (``"write-through"``, the default, or ``"write-back"``)
and ``tier_max_promotions_in_flight`` (default: a quarter of the primary's
chunks). :func:`tier_settings` reads and checks all of it before anything is
built; :func:`build_tiers` builds the tiers, and shuts down the ones it
built when a later one fails.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from kvoffload.impl.tiered import CascadeMode, TieredOffloadingManager
from kvoffload.impl.worker.region import DEFAULT_DIRECTORY, ChunkMajorLayout, SharedRegion
from kvoffload.spec.contract import (
    LookupResult,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.tier_contract import SecondaryTier, TierJobLike, TierJobResultLike

__all__ = [
    "BUILT_IN_TIERS",
    "ForeignTier",
    "TierSettings",
    "build_tiered_manager",
    "build_tiers",
    "open_tiers",
    "tier_settings",
]

logger = logging.getLogger(__name__)

_FS_OPTIONS = frozenset(
    {
        "cache_policy",
        "num_threads",
        "fsync",
        "checksum",
        "verify_loads",
        "direct_io",
        "recycle_files",
        "compiled_io",
        "crc32",
        "medium",
    }
)
_MEMORY_OPTIONS = frozenset({"medium"})

BUILT_IN_TIERS: Mapping[str, frozenset[str]] = {
    "fs": _FS_OPTIONS | {"directory"},
    "memory": _MEMORY_OPTIONS,
}
"""The ``type`` names kvoffload builds itself, with the parameters each
takes beside ``type`` and its capacity."""

_SIZES = ("capacity_blocks", "capacity_bytes")

UNSUPPORTED_KEYS: Mapping[str, str] = {
    "backpressure": "kvoffload's tiered manager has no back-pressure detector",
    "tier_poll_interval_s": (
        "kvoffload runs no tier-poll thread: tier results are taken at "
        "on_schedule_end (set it to 0 or leave it out)"
    ),
}
"""vLLM 0.33 tiering keys kvoffload refuses rather than ignore, and why."""


@attrs.frozen
class TierSettings:
    """The checked tier configuration: each tier's ``type``, the class or
    factory of a foreign one (None for a built-in), and its parameters
    (without ``type``/``module_path``); the cascade mode; the promotion
    bound (None: the tiered manager's default)."""

    tiers: tuple[tuple[str, Any, Mapping[str, Any]], ...]
    cascade: str = CascadeMode.WRITE_THROUGH.value
    max_promotions_in_flight: int | None = None


def tier_settings(
    extra_config: Mapping[str, Any], resolve: Callable[[str], Any] | None = None
) -> TierSettings | None:
    """The tier configuration in ``extra_config`` (module docstring), or
    None when it lists no secondary tier. ``resolve`` names the class or
    factory of a ``type`` that is neither built in nor given a
    ``module_path`` (None when it knows none): an engine's own registry.

    Raises :class:`ConfigurationError` for anything malformed: a
    ``secondary_tiers`` that is not a list of dicts, a tier without
    ``type``, an unknown ``type`` without ``module_path``, a module or name
    that does not import, a built-in tier's unknown parameter or missing
    size, an unknown cascade mode, a promotion bound that is not a positive
    int, or a key kvoffload does not support (:data:`UNSUPPORTED_KEYS`).
    Nothing is built or opened.
    """
    configs = extra_config.get("secondary_tiers")
    if configs is None or configs == []:
        for key in ("tier_cascade", "tier_max_promotions_in_flight"):
            if key in extra_config:
                raise ConfigurationError(f"{key} is set but secondary_tiers lists no tier")
        return None
    if not isinstance(configs, list):
        raise ConfigurationError(
            f"secondary_tiers must be a list of tier configurations, got {configs!r}"
        )
    _refuse_unsupported(extra_config, "kv_connector_extra_config")
    tiers = [_one_tier(index, config, resolve) for index, config in enumerate(configs)]
    cascade = extra_config.get("tier_cascade", CascadeMode.WRITE_THROUGH.value)
    try:
        CascadeMode(cascade)
    except ValueError:
        raise ConfigurationError(
            f"tier_cascade must be 'write-through' or 'write-back', got {cascade!r}"
        ) from None
    bound = extra_config.get("tier_max_promotions_in_flight")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
        raise ConfigurationError(
            f"tier_max_promotions_in_flight must be a positive int, got {bound!r}"
        )
    return TierSettings(tuple(tiers), cascade, bound)


def _refuse_unsupported(config: Mapping[str, Any], where: str) -> None:
    for key, why in UNSUPPORTED_KEYS.items():
        value = config.get(key)
        if value is None or (key == "tier_poll_interval_s" and value == 0):
            continue
        raise ConfigurationError(f"{where}: {key} is not supported: {why}")


def _one_tier(
    index: int, config: object, resolve: Callable[[str], Any] | None
) -> tuple[str, Any, Mapping[str, Any]]:
    where = f"secondary_tiers[{index}]"
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"{where} must be a dict, got {config!r}")
    tier_type = config.get("type")
    if not isinstance(tier_type, str) or not tier_type:
        raise ConfigurationError(f"{where} needs a 'type' (a non-empty str)")
    _refuse_unsupported(config, where)
    params = {k: v for k, v in config.items() if k not in ("type", "module_path")}
    module_path = config.get("module_path")
    if tier_type in BUILT_IN_TIERS and module_path is None:
        allowed = BUILT_IN_TIERS[tier_type] | set(_SIZES)
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ConfigurationError(
                f"{where} ({tier_type!r}): unknown parameters {unknown}; "
                f"it takes {sorted(allowed)}"
            )
        if sum(name in params for name in _SIZES) != 1:
            raise ConfigurationError(
                f"{where} ({tier_type!r}) needs exactly one of capacity_blocks "
                "and capacity_bytes"
            )
        if tier_type == "fs" and not params.get("directory"):
            raise ConfigurationError(f"{where} ('fs') needs a 'directory'")
        return tier_type, None, params
    if module_path is None:
        factory = None if resolve is None else resolve(tier_type)
        if factory is not None:
            return tier_type, factory, params
        raise ConfigurationError(
            f"{where}: unknown tier type {tier_type!r}; kvoffload builds "
            f"{sorted(BUILT_IN_TIERS)}, and any other type needs a 'module_path'"
        )
    try:
        factory = getattr(importlib.import_module(str(module_path)), tier_type)
    except (ImportError, AttributeError) as error:
        raise ConfigurationError(
            f"{where}: cannot load {tier_type!r} from {module_path!r}: {error}"
        ) from None
    if not callable(factory):
        raise ConfigurationError(f"{where}: {module_path}.{tier_type} is not callable")
    return tier_type, factory, params


def _capacity_blocks(params: Mapping[str, Any], chunk_bytes: int, where: str) -> int:
    if "capacity_blocks" in params:
        blocks = params["capacity_blocks"]
    else:
        size = params["capacity_bytes"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise ConfigurationError(f"{where}: capacity_bytes must be an int, got {size!r}")
        blocks = size // chunk_bytes
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ConfigurationError(
            f"{where}: the tier must hold at least one chunk of {chunk_bytes} bytes, "
            f"got {params}"
        )
    return blocks


def _identity(value: Any) -> Any:
    return value


def build_tiers(
    settings: TierSettings,
    primary_kv_view: memoryview,
    *,
    enable_events: bool = False,
    medium_of: Mapping[str, str] | None = None,
    offloading_spec: object = None,
    make_job: Callable[[TierJobLike], Any] = _identity,
    context_of: Callable[[ReqContext], Any] = _identity,
) -> list[SecondaryTier]:
    """The tiers of ``settings`` over ``primary_kv_view`` (2-D, one row per
    primary chunk). ``medium_of`` gives a built-in tier type's default
    ``medium`` (a tier's own ``medium`` parameter wins); ``offloading_spec``,
    ``make_job`` and ``context_of`` are what a foreign tier is given
    (:class:`ForeignTier`).

    Raises :class:`ConfigurationError` when a tier cannot be built (its
    constructor's error, chained); the tiers built before it are shut down
    first.
    """
    strides = primary_kv_view.strides
    if primary_kv_view.ndim != 2 or not strides:
        raise ConfigurationError("primary_kv_view must be 2-D, one row per primary chunk")
    chunk_bytes = strides[0]
    built: list[SecondaryTier] = []
    try:
        for index, (tier_type, factory, params) in enumerate(settings.tiers):
            where = f"secondary_tiers[{index}] ({tier_type!r})"
            try:
                built.append(
                    _build_one(
                        tier_type, factory, params, primary_kv_view, chunk_bytes, where,
                        enable_events, medium_of or {}, offloading_spec, make_job, context_of,
                    )
                )
            except ConfigurationError:
                raise
            except Exception as error:
                raise ConfigurationError(f"{where} could not be built: {error}") from error
    except BaseException:
        for tier in reversed(built):
            try:
                tier.shutdown()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                logger.warning("shutting down a tier after a failed build", exc_info=True)
        raise
    return built


def _build_one(
    tier_type: str,
    factory: Any,
    params: Mapping[str, Any],
    view: memoryview,
    chunk_bytes: int,
    where: str,
    enable_events: bool,
    medium_of: Mapping[str, str],
    offloading_spec: object,
    make_job: Callable[[TierJobLike], Any],
    context_of: Callable[[ReqContext], Any],
) -> SecondaryTier:
    if factory is not None:
        tier = factory(
            offloading_spec=offloading_spec,
            primary_kv_view=view,
            tier_type=tier_type,
            **params,
        )
        return ForeignTier(tier, make_job=make_job, context_of=context_of)
    options = {k: v for k, v in params.items() if k not in _SIZES and k != "directory"}
    if "medium" not in options and tier_type in medium_of:
        options["medium"] = medium_of[tier_type]
    capacity = _capacity_blocks(params, chunk_bytes, where)
    if tier_type == "fs":
        from kvoffload.impl.fs_tier import FileSystemTier

        return FileSystemTier(
            params["directory"], capacity, view, enable_events=enable_events, **options
        )
    from kvoffload.impl.memtier import MemoryTier

    return MemoryTier(capacity, view, enable_events=enable_events, **options)


def build_tiered_manager(
    primary: Any, tiers: Sequence[SecondaryTier], settings: TierSettings
) -> TieredOffloadingManager:
    """The tiered manager over ``primary`` (an
    :class:`~kvoffload.impl.manager.OffloadingManagerCore`) and ``tiers``,
    with ``settings``' cascade mode and promotion bound."""
    return TieredOffloadingManager(
        primary,
        tiers,
        cascade=settings.cascade,
        max_promotions_in_flight=settings.max_promotions_in_flight,
    )


def _answer(raw: object) -> LookupResult:
    """A foreign tier's lookup answer, read by name (HIT, MISS, RETRY; an
    answer by any other name, HIT_PENDING included, means ask again)."""
    name = getattr(raw, "name", None)
    if name == "HIT":
        return LookupResult.HIT
    if name == "MISS":
        return LookupResult.MISS
    return LookupResult.RETRY


def _medium_name(medium: object) -> str:
    value = getattr(medium, "value", medium)
    return value if isinstance(value, str) else str(medium)


class ForeignTier:
    """A tier written against another library's types (vLLM 0.33's
    ``SecondaryTierManager``) as a kvoffload
    :class:`~kvoffload.spec.tier_contract.SecondaryTier`: every call is
    passed on, with kvoffload's job and request context turned into the
    tier's (``make_job``, ``context_of``), its lookup answer read by name
    and its events as kvoffload's (their ``medium`` by its value). Results
    pass through as they are (they have the fields the tiered manager
    reads). :meth:`on_schedule_end` passes the step's end on to tiers that
    take it."""

    def __init__(
        self,
        tier: Any,
        *,
        make_job: Callable[[TierJobLike], Any] = _identity,
        context_of: Callable[[ReqContext], Any] = _identity,
    ) -> None:
        self.tier = tier
        self._make_job = make_job
        self._context_of = context_of
        self.medium = _medium_name(getattr(tier, "medium", None))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return _answer(self.tier.lookup(key, self._context_of(req_context)))

    def submit_store(self, job: TierJobLike) -> None:
        self.tier.submit_store(self._make_job(job))

    def submit_load(self, job: TierJobLike) -> None:
        self.tier.submit_load(self._make_job(job))

    def get_finished_jobs(self) -> Iterable[TierJobResultLike]:
        results: Iterable[TierJobResultLike] = self.tier.get_finished_jobs()
        return results

    def drain_jobs(self) -> None:
        self.tier.drain_jobs()

    def has_pending_work(self) -> bool:
        return bool(self.tier.has_pending_work())

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.tier.touch(keys, self._context_of(req_context))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.tier.on_new_request(self._context_of(req_context))
        return RequestOffloadingContext(req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.tier.on_request_finished(self._context_of(req_context))

    def on_schedule_end(self, context: object) -> None:
        step_end = getattr(self.tier, "on_schedule_end", None)
        if step_end is not None:
            step_end(context)

    def take_events(self) -> list[OffloadingEvent]:
        return [
            OffloadingEvent(
                tuple(event.keys),
                0,
                _medium_name(getattr(event, "medium", self.medium)),
                bool(event.removed),
            )
            for event in self.tier.take_events()
        ]

    def shutdown(self) -> None:
        self.tier.shutdown()


def open_tiers(
    settings: TierSettings,
    layout: ChunkMajorLayout,
    num_chunks: int,
    region_file: str,
    *,
    directory: str | os.PathLike[str] = DEFAULT_DIRECTORY,
    **tier_options: Any,
) -> tuple[SharedRegion, list[SecondaryTier]]:
    """The scheduler's side of a CPU tier with secondary tiers: the shared
    region ``directory/region_file`` of ``num_chunks`` chunks laid out by
    ``layout`` (created, or mapped when a worker created it first), and the
    tiers of ``settings`` over its chunk rows (``tier_options`` as for
    :func:`build_tiers`). On any failure what was built is released (the
    tiers shut down, the region cleaned up) and the error raised."""
    region = SharedRegion(
        region_file, layout.region_bytes(num_chunks), create=None, directory=directory
    )
    try:
        return region, build_tiers(
            settings, region.chunk_view(layout.chunk_bytes), **tier_options
        )
    except BaseException:
        region.cleanup()
        raise
