"""vLLM 0.33's own secondary tiers as tier-kit targets.

:func:`release_tier_factories` gives, for a loaded release that has
``vllm/v1/kv_offload/tiering/``, a factory per tier the kit can build
without a GPU or a server: ``example`` (``ExampleSecondaryTierManager``)
and ``fs`` (``FileSystemTierManager``, in a fresh temporary directory per
tier, two read and two write threads). Each is the release's class,
constructed as vLLM's tier factory constructs it; the only thing supplied
here is the ``OffloadingSpec`` they read, as a plain record of the fields
they touch. Neither tier takes a capacity: audit them under the
``vllm-0.33`` profile (``tier_capacity_bounded=False``).
"""

from __future__ import annotations

import importlib
import tempfile
import types
from collections.abc import Callable
from typing import Any

from kvoffload.stateful.tier_harness import TempDirTier
from kvoffload.vllm_release import VllmRelease

TIERING = "vllm.v1.kv_offload.tiering"


def has_tiering(release: VllmRelease) -> bool:
    """Whether the release ships ``kv_offload/tiering`` (0.33 on)."""
    return (release.root / "vllm" / "v1" / "kv_offload" / "tiering" / "base.py").is_file()


def offloading_spec_record() -> Any:
    """The fields of an ``OffloadingSpec`` that the example and fs tiers
    read: one KV group, no parallelism, events off."""
    group = types.SimpleNamespace(tokens_per_block=16, layer_names=["layer.0"])
    parallel = types.SimpleNamespace(
        tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0, is_parallelism_agnostic=True
    )
    config = types.SimpleNamespace(
        groups=[group],
        parallel=parallel,
        canonical_layout=False,
        kv_cache_layout=None,
        replicated_layout=False,
        model=types.SimpleNamespace(name="kvoffload/kit", dtype="uint8"),
        cache=types.SimpleNamespace(tokens_per_hash=16),
    )
    return types.SimpleNamespace(
        config=config,
        blocks_per_chunk=1,
        kv_events_config=types.SimpleNamespace(enable_kv_cache_events=False),
    )


def release_tier_factories(release: VllmRelease) -> dict[str, Callable[[int, memoryview], Any]]:
    """``{"example": factory, "fs": factory}`` for a release with tiering
    (empty without). A factory ignores ``capacity_blocks`` (the tiers take
    none)."""
    if not has_tiering(release):
        return {}
    example = importlib.import_module(f"{TIERING}.example.manager")
    fs = importlib.import_module(f"{TIERING}.fs.manager")

    def example_tier(capacity_blocks: int, primary_kv_view: memoryview) -> Any:
        return example.ExampleSecondaryTierManager(
            offloading_spec_record(), primary_kv_view, "example"
        )

    def fs_tier(capacity_blocks: int, primary_kv_view: memoryview) -> Any:
        directory = tempfile.mkdtemp(prefix="kvoffload-vllm-fs-")
        tier = fs.FileSystemTierManager(
            offloading_spec_record(),
            primary_kv_view,
            "fs",
            root_dir=directory,
            n_read_threads=2,
            n_write_threads=2,
        )
        return TempDirTier(tier, directory)

    return {"example": example_tier, "fs": fs_tier}


def new_tiered_manager(release: VllmRelease, num_chunks: int) -> Any:
    """vLLM's ``TieringOffloadingManager`` over ``num_chunks`` chunks, built
    as its tiering spec builds it (``tiering/spec.py``): a
    ``CPUPrimaryTierOffloadingManager`` (LRU, events on) over a
    ``SharedOffloadRegion`` of :data:`CHUNK_BYTES` per chunk in ``/dev/shm``
    (removed at ``shutdown``), one ``ExampleSecondaryTierManager`` over the
    primary's memory, and the tier-poll thread off
    (``tier_poll_interval_s=0``; the example tier does not ask for it)."""
    import uuid

    manager = importlib.import_module(f"{TIERING}.manager")
    region_module = importlib.import_module("vllm.v1.kv_offload.cpu.shared_offload_region")
    example = importlib.import_module(f"{TIERING}.example.manager")
    region = region_module.SharedOffloadRegion(
        f"kvoffload-{uuid.uuid4().hex}", num_chunks, None, CHUNK_BYTES, CHUNK_BYTES
    )
    primary = manager.CPUPrimaryTierOffloadingManager(
        num_chunks, region, cache_policy="lru", enable_events=True
    )
    tier = example.ExampleSecondaryTierManager(
        offloading_spec_record(), primary.get_kv_memoryview(), "example"
    )
    return manager.TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)


def shared_on_copy(inner: Any) -> dict[int, Any]:
    """What a ``copy.deepcopy`` of a ``TieringOffloadingManager`` (built by
    :func:`new_tiered_manager`) must not copy, as a ``memo`` to start from:
    the primary's memory (its shared region and the views of it the
    primary and the tiers hold: shared, not copied; neither the CPU
    manager nor the example tier reads or writes it) and the manager's lock
    and stop event (a fresh one each). Empty for any other manager."""
    import threading

    primary = getattr(inner, "primary_tier", None)
    if primary is None:
        return {}
    memo: dict[int, Any] = {}
    for shared in (
        getattr(primary, "_mmap_region", None),
        getattr(primary, "_kv_memoryview", None),
        *(getattr(tier, "_primary_kv_view", None) for tier in inner.secondary_tiers),
    ):
        if shared is not None:
            memo[id(shared)] = shared
    if isinstance(getattr(inner, "_lock", None), type(threading.Lock())):
        memo[id(inner._lock)] = threading.Lock()
    if isinstance(getattr(inner, "_tier_poll_stop", None), threading.Event):
        memo[id(inner._tier_poll_stop)] = threading.Event()
    return memo


def make_tier_factory(directory: str, name: str) -> Callable[[int, memoryview], Any]:
    """The factory of tier ``name`` (``"example"``, ``"fs"``) of the release
    under ``directory`` (loaded here): what a replay script of ``audit
    --vllm`` imports."""
    from kvoffload.vllm_release import load_release

    return release_tier_factories(load_release(directory))[name]


TIER_EXAMPLES: dict[str, int] = {"fs": 200}
"""Runs per tier when ``audit --vllm`` is given no ``--examples``, where the
default (500) would take longer than a passing audit may (15 s): each run of
the fs tier starts its thread pool and lookup thread and writes real files
(500 runs took 30 s on the shared 2-core VM at load 7)."""

CHUNK_BYTES = 4096
"""Bytes per primary slot when auditing vLLM's tiers (the fs tier writes
with ``O_DIRECT``, which needs whole disk blocks)."""


__all__ = [
    "CHUNK_BYTES",
    "TIER_EXAMPLES",
    "has_tiering",
    "make_tier_factory",
    "shared_on_copy",
    "new_tiered_manager",
    "offloading_spec_record",
    "release_tier_factories",
]
