"""Load a released vLLM's ``vllm.v1.kv_offload`` for auditing and benchmarking.

``load_release(DIR)`` makes the release under ``DIR`` importable and says what
it is: ``DIR`` is a directory from which ``import vllm`` finds a release, an
installed one (``site-packages``) or one extracted from its wheel (only
``vllm/v1/kv_offload/*`` and ``vllm-VERSION.dist-info/METADATA`` are needed;
``scripts/fetch_vllm.py`` makes one).

The release's own modules are imported unchanged. The handful of other vLLM
modules they import (a logger, the ``BlockHash`` type, ``cdiv``, a metrics
record, two enums, the canonical-layout name the file tier's path mapper
imports) are replaced by small stand-ins *only when missing* from
``DIR``; none of them carries any of vLLM's offloading logic. vLLM's
``vllm/__init__.py`` is not run: the ``vllm`` and ``vllm.v1`` packages are
set up to point at ``DIR`` without it, so an installed release does not pull
in the rest of vLLM.

The generation (:class:`Generation`) is read from what the code has (class
names, signatures, methods), not from the version number: :class:`Features`
lists each fact and how it is found. One process holds one release at a time
(they are all called ``vllm``); :func:`unload_release` drops it.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import inspect
import logging
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NewType

import attrs

from kvoffload.spec.errors import OffloadingError

__all__ = [
    "Features",
    "Generation",
    "NoReleaseError",
    "ReleaseImportError",
    "VllmAlreadyImportedError",
    "VllmRelease",
    "VllmReleaseError",
    "load_release",
    "loaded_release",
    "unload_release",
]


class VllmReleaseError(OffloadingError):
    """A vLLM release cannot be loaded (see the subclasses)."""


class NoReleaseError(VllmReleaseError):
    """The directory holds no ``vllm/v1/kv_offload`` package."""


class VllmAlreadyImportedError(VllmReleaseError):
    """Another ``vllm`` (a full install, or another release) is already
    imported in this process."""


class ReleaseImportError(VllmReleaseError):
    """The release's ``kv_offload`` modules failed to import (a vLLM module
    they need is neither in the directory nor stubbed here)."""


class Generation(enum.Enum):
    """A shape of the scheduler-side contract, named after the first release
    that has it. Later generations keep everything earlier ones added unless
    said otherwise."""

    #: ``lookup(block_hashes) -> int``; every call takes a list of block
    #: hashes; ``CPUOffloadingManager(block_size, num_blocks, ...)``; events
    #: carry ``block_size``; separate ``FilterReusedOffloadingManager``.
    V0_19 = "0.19"
    #: ``OffloadKey`` and ``ReqContext`` for ``lookup``/``prepare_*``; ``touch``
    #: and ``complete_*`` still without a context; no ``block_size``.
    V0_20 = "0.20"
    #: Every call takes keys and a request context; filter still separate.
    V0_21 = "0.21"
    #: Filter folded into the manager (``store_threshold``,
    #: ``max_tracker_size``); ``reset_cache``; ``ReqContext.req_id``.
    V0_22 = "0.22"
    #: Request hooks: ``on_new_request`` (abstract), ``on_request_finished``,
    #: ``on_schedule_end()``.
    V0_23 = "0.23"
    #: LRU keeps only evictable blocks in its order: ``touch`` skips pinned
    #: blocks, a block becomes most recent when its store or last load
    #: completes.
    V0_24 = "0.24"
    #: ``lookup -> LookupResult``; ``on_schedule_end(ScheduleEndContext)``.
    V0_25 = "0.25"
    #: The filter counts keys offered to ``prepare_store``, not lookups.
    V0_29 = "0.29"
    #: Capacity in chunks (``num_chunks``); an offer never pushes its own
    #: keys out of the count table.
    V0_30 = "0.30"
    #: Request-scoped recency: LRU order and ARC promotion are committed in
    #: ``on_request_finished``; ARC adapts when a request stores a ghost key.
    V0_31 = "0.31"
    #: A failed store emits a ``metadata_only`` removal; ``on_reset_flushed``.
    V0_33 = "0.33"

    @property
    def label(self) -> str:
        return f"vLLM {self.value}"


@attrs.frozen
class Features:
    """What the release's code has, each fact read from the code.

    - ``block_hash_api``: ``PrepareStoreOutput`` has ``block_hashes_to_store``.
    - ``touch_context`` / ``complete_context``: ``OffloadingManager.touch`` /
      ``complete_load`` take a ``req_context``.
    - ``separate_filter``: ``vllm.v1.kv_offload.reuse_manager`` defines
      ``FilterReusedOffloadingManager``.
    - ``folded_filter``: ``CPUOffloadingManager.__init__`` takes
      ``store_threshold``.
    - ``reset``: ``CPUOffloadingManager`` defines ``reset_cache``.
    - ``req_id``: ``ReqContext`` has a ``req_id`` field.
    - ``request_hooks``: ``OffloadingManager`` has ``on_new_request``.
    - ``schedule_end_context``: ``on_schedule_end`` takes a context.
    - ``lookup_result``: the base module defines ``LookupResult``.
    - ``event_block_size``: ``OffloadingEvent`` has a ``block_size`` field.
    - ``release_recency``: the LRU policy defines ``mark_evictable``.
    - ``counts_offers``: ``CPUOffloadingManager.prepare_store`` records
      accesses (its source calls ``_record_access``).
    - ``chunks``: ``CPUOffloadingManager.__init__`` takes ``num_chunks``.
    - ``request_recency``: ``CachePolicy`` defines ``on_request_finished``.
    - ``private_events``: ``OffloadingEvent`` has a ``metadata_only`` field.
    """

    block_hash_api: bool
    touch_context: bool
    complete_context: bool
    separate_filter: bool
    folded_filter: bool
    reset: bool
    req_id: bool
    request_hooks: bool
    schedule_end_context: bool
    lookup_result: bool
    event_block_size: bool
    release_recency: bool
    counts_offers: bool
    chunks: bool
    request_recency: bool
    private_events: bool

    def generation(self) -> Generation:
        """The newest generation whose defining fact the code has."""
        ladder: tuple[tuple[bool, Generation], ...] = (
            (self.private_events, Generation.V0_33),
            (self.request_recency, Generation.V0_31),
            (self.chunks, Generation.V0_30),
            (self.counts_offers, Generation.V0_29),
            (self.lookup_result, Generation.V0_25),
            (self.release_recency, Generation.V0_24),
            (self.request_hooks, Generation.V0_23),
            (self.folded_filter, Generation.V0_22),
            (self.touch_context, Generation.V0_21),
            (not self.block_hash_api, Generation.V0_20),
        )
        for present, generation in ladder:
            if present:
                return generation
        return Generation.V0_19


@attrs.frozen(eq=False)
class VllmRelease:
    """A loaded release: its version, generation and the classes the kit and
    the benchmarks drive.

    ``manager_cls`` is ``CPUOffloadingManager``; ``filter_cls`` is
    ``FilterReusedOffloadingManager`` where the filter is a separate class
    (None where it is folded into the manager); ``lookup_result`` is the
    ``LookupResult`` enum (None before it existed); ``req_context_cls`` is
    ``ReqContext`` (None for the block-hash API); ``schedule_end_context``
    is ``ScheduleEndContext`` (None before it existed). ``base`` is the module
    holding the contract (``vllm.v1.kv_offload.base``, ``.abstract`` before).
    """

    root: Path
    version: str
    features: Features
    base: types.ModuleType
    manager_cls: type[Any]
    filter_cls: type[Any] | None
    lookup_result: type[enum.Enum] | None
    req_context_cls: type[Any] | None
    schedule_end_context: type[Any] | None
    stubbed: tuple[str, ...]

    @property
    def generation(self) -> Generation:
        return self.features.generation()

    def new_manager(
        self,
        capacity: int,
        policy: str = "lru",
        *,
        enable_events: bool = True,
        store_threshold: int | None = None,
        max_tracker_size: int | None = None,
        block_size: int = 16,
    ) -> Any:
        """The release's CPU manager over ``capacity`` blocks (chunks from
        0.30 on), with ``policy`` (``"lru"``/``"arc"``), behind the release's
        reuse filter when ``store_threshold`` is given (the separate class
        where there is one, the folded-in one otherwise). ``block_size`` is
        used only where the constructor takes one (0.19)."""
        kwargs: dict[str, Any] = {"cache_policy": policy, "enable_events": enable_events}
        if self.features.chunks:
            kwargs["num_chunks"] = capacity
        else:
            kwargs["num_blocks"] = capacity
        if self.features.block_hash_api:
            kwargs["block_size"] = block_size
        filter_kwargs: dict[str, int] = {}
        if store_threshold is not None:
            filter_kwargs["store_threshold"] = store_threshold
            if max_tracker_size is not None:
                filter_kwargs["max_tracker_size"] = max_tracker_size
        if self.filter_cls is None:
            return self.manager_cls(**kwargs, **filter_kwargs)
        manager = self.manager_cls(**kwargs)
        if store_threshold is None:
            return manager
        return self.filter_cls(manager, **filter_kwargs)

    def new_context(self, req_id: str = "kit") -> Any:
        """A fresh ``ReqContext`` for request ``req_id`` (None for the
        block-hash API, which has no context)."""
        if self.req_context_cls is None:
            return None
        if self.features.req_id:
            return self.req_context_cls(req_id=req_id)
        return self.req_context_cls()

    def lookup_answer(self, answer: object) -> bool | None:
        """A ``lookup`` answer in the bool/None terms: ``True`` for a hit,
        ``False`` for a miss, ``None`` for "ask again" (``RETRY``, and a
        store in flight: ``HIT_PENDING``)."""
        if isinstance(answer, enum.Enum):
            if answer.name == "HIT":
                return True
            if answer.name == "MISS":
                return False
            return None
        if answer is None:
            return None
        return bool(answer)

    def describe(self) -> str:
        return f"vLLM {self.version} ({self.generation.label} contract) at {self.root}"


# --- stand-ins for the vLLM modules kv_offload imports from elsewhere ----------


class _OnceLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Stand-in for vLLM's logger: a standard logger with vLLM's ``*_once``
    methods (``factory.py`` calls ``warning_once`` for an out-of-tree spec),
    which log each distinct message once."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})
        self._said: set[tuple[int, str]] = set()

    def _once(self, level: int, msg: str, *args: object) -> None:
        if (level, msg) not in self._said:
            self._said.add((level, msg))
            self.log(level, msg, *args)

    def debug_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once(logging.DEBUG, msg, *args)

    def info_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once(logging.WARNING, msg, *args)


def _stub_logger(module: types.ModuleType) -> None:
    def init_logger(name: str) -> _OnceLogger:
        return _OnceLogger(logging.getLogger(name))

    module.init_logger = init_logger  # type: ignore[attr-defined]


def _stub_kv_cache_utils(module: types.ModuleType) -> None:
    def resolve_kv_cache_block_sizes(*args: object, **kwargs: object) -> Any:
        raise NotImplementedError(
            "kvoffload's stand-in for vllm.v1.core.kv_cache_utils has no "
            "resolve_kv_cache_block_sizes: the engine side is not loaded"
        )

    module.BlockHash = NewType("BlockHash", bytes)  # type: ignore[attr-defined]
    module.resolve_kv_cache_block_sizes = resolve_kv_cache_block_sizes  # type: ignore[attr-defined]


def _stub_kv_events(module: types.ModuleType) -> None:
    module.MEDIUM_CPU = "CPU"  # type: ignore[attr-defined]


class _StatsRecord:
    """Stand-in for vLLM's ``OffloadingConnectorStats``: keeps what it is
    told, in dictionaries."""

    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        self.histograms: dict[str, list[float]] = {}

    def set_gauge(self, name: str, value: float, *args: object, **kwargs: object) -> None:
        self.gauges[name] = value

    def increase_counter(self, name: str, value: float = 1, *args: object, **kwargs: object) -> None:
        self.counters[name] = self.counters.get(name, 0) + value

    def observe_histogram(self, name: str, value: float, *args: object, **kwargs: object) -> None:
        self.histograms.setdefault(name, []).append(value)


def _stub_metrics(module: types.ModuleType) -> None:
    module.OffloadingConnectorStats = _StatsRecord  # type: ignore[attr-defined]


def _stub_math_utils(module: types.ModuleType) -> None:
    def cdiv(a: int, b: int) -> int:
        return -(a // -b)

    def round_up(x: int, y: int) -> int:
        return cdiv(x, y) * y

    module.cdiv = cdiv  # type: ignore[attr-defined]
    module.round_up = round_up  # type: ignore[attr-defined]


def _stub_shm_broadcast(module: types.ModuleType) -> None:
    def check_shm_free_space(size: int, allocation_name: str = "", **kwargs: object) -> None:
        """Stand-in: refuses an allocation larger than /dev/shm's free space."""
        import os

        stats = os.statvfs("/dev/shm")
        if stats.f_bavail * stats.f_frsize < size:
            raise RuntimeError(f"not enough space in /dev/shm for {allocation_name} ({size} bytes)")

    module.check_shm_free_space = check_shm_free_space  # type: ignore[attr-defined]


class _CudaRTLibrary:
    """Stand-in for vLLM's CUDA runtime wrapper: no GPU is loaded."""

    def __init__(self) -> None:
        raise RuntimeError("kvoffload's stand-in: no CUDA runtime (the engine side is not loaded)")


def _stub_cuda_wrapper(module: types.ModuleType) -> None:
    module.CudaRTLibrary = _CudaRTLibrary  # type: ignore[attr-defined]


class _CpuPlatform:
    """Stand-in for ``vllm.platforms.current_platform``: a host without an
    accelerator (pinning host memory is then skipped)."""

    device_name = "cpu"

    def is_cuda_alike(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False


def _stub_platforms(module: types.ModuleType) -> None:
    module.current_platform = _CpuPlatform()  # type: ignore[attr-defined]


class _KvHintsEnvelope:
    """Stand-in for ``vllm.v1.kv_hints.KvHintsEnvelope`` (a type name only)."""


def _stub_kv_hints(module: types.ModuleType) -> None:
    module.KvHintsEnvelope = _KvHintsEnvelope  # type: ignore[attr-defined]


class _CacheHitSource(enum.Enum):
    """Stand-in for ``vllm.v1.metrics.cache_hit_source.CacheHitSource``."""

    HOST = "host"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"


def _stub_cache_hit_source(module: types.ModuleType) -> None:
    module.CacheHitSource = _CacheHitSource  # type: ignore[attr-defined]


def _stub_canonical_mapping(module: types.ModuleType) -> None:
    def canonical_format_id(layout: object) -> str:
        """Stand-in: a name for a canonical KV layout (the file tier puts it
        in its directory name)."""
        return f"canonical-{layout}"

    module.canonical_format_id = canonical_format_id  # type: ignore[attr-defined]


_STUBS: dict[str, Callable[[types.ModuleType], None]] = {
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping": (
        _stub_canonical_mapping
    ),
    "vllm.logger": _stub_logger,
    "vllm.v1.core.kv_cache_utils": _stub_kv_cache_utils,
    "vllm.distributed.kv_events": _stub_kv_events,
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics": _stub_metrics,
    "vllm.utils.math_utils": _stub_math_utils,
    # the tiering manager's CPU primary tier (cpu/shared_offload_region.py,
    # cpu/host_register.py), 0.33 on
    "vllm.distributed.device_communicators.shm_broadcast": _stub_shm_broadcast,
    "vllm.distributed.device_communicators.cuda_wrapper": _stub_cuda_wrapper,
    "vllm.platforms": _stub_platforms,
    "vllm.v1.kv_hints": _stub_kv_hints,
    "vllm.v1.metrics.cache_hit_source": _stub_cache_hit_source,
}
"""vLLM modules outside ``kv_offload`` that its scheduler-side modules
import at run time, with what each stand-in provides."""

_MARK = "__kvoffload_release_root__"


# --- loading -------------------------------------------------------------------


def _module_path(root: Path, name: str) -> Path:
    return root.joinpath(*name.split("."))


def _exists(root: Path, name: str) -> bool:
    path = _module_path(root, name)
    return path.with_suffix(".py").is_file() or path.is_dir()


def _top_package(root: Path) -> types.ModuleType:
    """The ``vllm`` package pointing into ``root``, its ``__init__`` not run
    (it would import the rest of vLLM), registered in ``sys.modules``."""
    module = types.ModuleType("vllm")
    module.__path__ = [str(root / "vllm")]
    setattr(module, _MARK, str(root))
    sys.modules["vllm"] = module
    return module


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stand-in for a vLLM module in :data:`_STUBS` (and an empty
    package for each of its missing parents) when the release imports it and
    ``root`` does not have it. Installed at the end of ``sys.meta_path``, so
    whatever the directory has wins."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.served: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _STUBS:
            return importlib.machinery.ModuleSpec(fullname, self)
        if any(name.startswith(fullname + ".") for name in _STUBS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        fill = _STUBS.get(module.__name__)
        if fill is not None:
            module.__doc__ = f"kvoffload stand-in for {module.__name__}"
            fill(module)
            self.served.append(module.__name__)
        else:
            module.__path__ = []


def read_version(root: Path) -> str:
    """The release's version: ``Version:`` of ``vllm-*.dist-info/METADATA``,
    else ``__version__`` in ``vllm/version.py`` or ``vllm/_version.py``;
    ``"unknown"`` when neither says."""
    for metadata in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    for name in ("version.py", "_version.py"):
        path = root / "vllm" / name
        if path.is_file():
            found = re.search(
                r"""__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""",
                path.read_text(encoding="utf-8", errors="replace"),
            )
            if found:
                return found.group(1)
    return "unknown"


def loaded_release() -> Path | None:
    """The root of the release this module loaded, if one is loaded."""
    module = sys.modules.get("vllm")
    if module is None:
        return None
    root = getattr(module, _MARK, None)
    return Path(root) if isinstance(root, str) else None


def _vllm_modules() -> Iterator[str]:
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            yield name


def unload_release() -> None:
    """Forget the release this module loaded (objects already made from it
    keep working). Raises :class:`VllmAlreadyImportedError` when the ``vllm``
    in ``sys.modules`` was not loaded here."""
    if "vllm" not in sys.modules:
        return
    if loaded_release() is None:
        raise VllmAlreadyImportedError(
            "the imported vllm was not loaded by kvoffload.vllm_release; not unloading it"
        )
    _forget(None)


BOUND_MODULES = ("kvoffload.vllm",)
"""kvoffload's modules that import vLLM when they are imported, and so hold
the classes of the release loaded then (``kvoffload.vllm`` subclasses its
``OffloadingSpec``): forgetting a release forgets them too, so that the
next import binds them to the next release."""


def _forget(finder: _StubFinder | None) -> None:
    root = loaded_release()
    if root is not None:
        _CACHE.pop(root, None)
    for name in _vllm_modules():
        del sys.modules[name]
    for name in BOUND_MODULES:
        sys.modules.pop(name, None)
    for entry in list(sys.meta_path):
        if isinstance(entry, _StubFinder) and (finder is None or entry is finder):
            sys.meta_path.remove(entry)


_CACHE: dict[Path, VllmRelease] = {}


def load_release(directory: str | Path) -> VllmRelease:
    """Load the release under ``directory`` (see the module docstring).

    Raises :class:`NoReleaseError` when ``directory`` has no
    ``vllm/v1/kv_offload/__init__.py``, :class:`VllmAlreadyImportedError`
    when another ``vllm`` is imported (call :func:`unload_release` first if
    it was loaded here), :class:`ReleaseImportError` when its modules fail
    to import. Loading the same directory again returns the same handle.
    """
    root = Path(directory).expanduser().resolve()
    package = root / "vllm" / "v1" / "kv_offload"
    if not root.is_dir():
        raise NoReleaseError(f"{directory}: no such directory")
    if not (package / "__init__.py").is_file():
        raise NoReleaseError(
            f"{directory} holds no vLLM release: no vllm/v1/kv_offload/__init__.py "
            f"(fetch one with `python scripts/fetch_vllm.py VERSION {directory}`)"
        )
    current = loaded_release()
    if "vllm" in sys.modules:
        if current == root and root in _CACHE:
            return _CACHE[root]
        where = current if current is not None else getattr(sys.modules["vllm"], "__path__", "?")
        raise VllmAlreadyImportedError(
            f"another vllm is already imported in this process (from {where}); "
            "load one release per process, or call kvoffload.vllm_release.unload_release()"
        )
    finder = _StubFinder(root)
    try:
        _top_package(root)
        sys.meta_path.append(finder)
        release = _inspect(root, finder)
    except VllmReleaseError:
        _forget(finder)
        raise
    _CACHE[root] = release
    return release


def _import(root: Path, name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as error:
        raise ReleaseImportError(
            f"cannot import {name} from {root}: {type(error).__name__}: {error}"
        ) from error


def _has_parameter(function: object, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _field_names(cls: object) -> set[str]:
    fields = getattr(cls, "__dataclass_fields__", None)
    if isinstance(fields, dict):
        return set(fields)
    return set(getattr(cls, "__annotations__", {}))


def _inspect(root: Path, finder: _StubFinder) -> VllmRelease:
    base_name = "vllm.v1.kv_offload.base"
    if not _exists(root, base_name):
        base_name = "vllm.v1.kv_offload.abstract"
    if not _exists(root, base_name):
        raise NoReleaseError(f"{root}: vllm/v1/kv_offload has neither base.py nor abstract.py")
    base = _import(root, base_name)
    manager_module = _import(root, "vllm.v1.kv_offload.cpu.manager")
    manager_cls = getattr(manager_module, "CPUOffloadingManager", None)
    if not isinstance(manager_cls, type):
        raise ReleaseImportError(f"{root}: cpu/manager.py defines no CPUOffloadingManager")
    filter_cls: type[Any] | None = None
    if _exists(root, "vllm.v1.kv_offload.reuse_manager"):
        reuse = _import(root, "vllm.v1.kv_offload.reuse_manager")
        found = getattr(reuse, "FilterReusedOffloadingManager", None)
        filter_cls = found if isinstance(found, type) else None
    lru_module = _import(root, "vllm.v1.kv_offload.cpu.policies.lru")
    lru_cls = getattr(lru_module, "LRUCachePolicy", object)
    policy_base = next(
        (
            getattr(_import(root, name), "CachePolicy", None)
            for name in (
                "vllm.v1.kv_offload.cpu.policies.base",
                "vllm.v1.kv_offload.cpu.policies.abstract",
            )
            if _exists(root, name)
        ),
        None,
    )
    abstract_manager = getattr(base, "OffloadingManager")
    store_output = getattr(base, "PrepareStoreOutput")
    event_cls = getattr(base, "OffloadingEvent")
    req_context_cls = getattr(base, "ReqContext", None)
    lookup_result = getattr(base, "LookupResult", None)
    schedule_end = getattr(base, "ScheduleEndContext", None)
    init = vars(manager_cls).get("__init__")
    try:
        prepare_store_source = inspect.getsource(getattr(manager_cls, "prepare_store"))
    except (OSError, TypeError):
        prepare_store_source = ""
    on_schedule_end = getattr(abstract_manager, "on_schedule_end", None)
    features = Features(
        block_hash_api="block_hashes_to_store" in _field_names(store_output),
        touch_context=_has_parameter(abstract_manager.touch, "req_context"),
        complete_context=_has_parameter(abstract_manager.complete_load, "req_context"),
        separate_filter=filter_cls is not None,
        folded_filter=_has_parameter(init, "store_threshold"),
        reset="reset_cache" in vars(manager_cls),
        req_id="req_id" in _field_names(req_context_cls) if req_context_cls else False,
        request_hooks=hasattr(abstract_manager, "on_new_request"),
        schedule_end_context=on_schedule_end is not None
        and _has_parameter(on_schedule_end, "context"),
        lookup_result=isinstance(lookup_result, type),
        event_block_size="block_size" in _field_names(event_cls),
        release_recency="mark_evictable" in vars(lru_cls),
        counts_offers="_record_access" in prepare_store_source,
        chunks=_has_parameter(init, "num_chunks"),
        request_recency=policy_base is not None
        and hasattr(policy_base, "on_request_finished"),
        private_events="metadata_only" in _field_names(event_cls),
    )
    return VllmRelease(
        root=root,
        version=read_version(root),
        features=features,
        base=base,
        manager_cls=manager_cls,
        filter_cls=filter_cls,
        lookup_result=lookup_result if isinstance(lookup_result, type) else None,
        req_context_cls=req_context_cls if isinstance(req_context_cls, type) else None,
        schedule_end_context=schedule_end if isinstance(schedule_end, type) else None,
        stubbed=tuple(finder.served),
    )
