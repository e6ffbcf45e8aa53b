"""Replaying a trace through the production managers.

Each request goes through the scheduler protocol, in this order:

1. ``lookup_prefix(chain)``: the ready prefix, ``h`` blocks, are the hits;
2. ``prepare_load(chain[:h])`` then ``complete_load(chain[:h])`` (if h > 0);
3. ``touch(chain)``;
4. ``prepare_store(chain[h:])`` then ``complete_store`` of the keys it
   returned (a None answer counts as a refused store);
5. ``take_events()``.

The managers are :class:`~kvoffload.impl.manager.CPUOffloadingManager`,
optionally behind :class:`~kvoffload.impl.reuse.FilterReusedOffloadingManager`
— the production classes, not copies. ``opt`` is
:func:`kvoffload.sim.opt.simulate_opt`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.sim.opt import simulate_opt
from kvoffload.sim.result import SimResult
from kvoffload.spec.contract import OffloadingManager, ReqContext
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.policies import IMPLEMENTABLE_POLICY_NAMES
from kvoffload.workloads import Trace

MANAGER_POLICIES = IMPLEMENTABLE_POLICY_NAMES
"""Policies replayed through :class:`CPUOffloadingManager` (the
specification's registry)."""

DEFAULT_TRACKER_SIZE = 64_000
"""The reuse filter's default table size (as in the reference)."""


@attrs.frozen
class PolicySpec:
    """A policy to simulate: ``lru`` or ``arc`` (optionally behind a reuse
    filter of threshold ``reuse_threshold``), or ``opt``."""

    name: str
    reuse_threshold: int | None = None
    tracker_size: int = DEFAULT_TRACKER_SIZE

    def __attrs_post_init__(self) -> None:
        if self.name not in (*MANAGER_POLICIES, "opt"):
            raise ConfigurationError(
                f"unknown policy {self.name!r}; choose from lru, arc, opt"
            )
        if self.reuse_threshold is not None:
            if self.name == "opt":
                raise ConfigurationError("opt takes no reuse filter: it is the optimum")
            if self.reuse_threshold < 2:
                raise ConfigurationError(
                    f"reuse threshold must be >= 2, got {self.reuse_threshold}"
                )

    @property
    def label(self) -> str:
        """``lru``, ``arc+reuse2``, ``opt``…"""
        if self.reuse_threshold is None:
            return self.name
        return f"{self.name}+reuse{self.reuse_threshold}"


def parse_policies(
    text: str, reuse_threshold: int | None = None, tracker_size: int = DEFAULT_TRACKER_SIZE
) -> list[PolicySpec]:
    """Policies from a comma-separated list such as ``lru,arc,arc+reuse,opt``.

    A ``+reuse`` suffix puts the policy behind the reuse filter with
    ``reuse_threshold`` (2 if None). When no name carries the suffix and
    ``reuse_threshold`` is given, every ``lru``/``arc`` is filtered.
    Raises :class:`ConfigurationError` for unknown or repeated names.
    """
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ConfigurationError("no policy given")
    explicit = any(name.endswith("+reuse") for name in names)
    specs: list[PolicySpec] = []
    for name in names:
        base, _, suffix = name.partition("+")
        if suffix not in ("", "reuse"):
            raise ConfigurationError(f"unknown policy suffix in {name!r}; only +reuse")
        if suffix == "reuse":
            threshold: int | None = 2 if reuse_threshold is None else reuse_threshold
        elif not explicit and base != "opt":
            threshold = reuse_threshold
        else:
            threshold = None
        spec = PolicySpec(base, threshold, tracker_size)
        if spec in specs:
            raise ConfigurationError(f"policy {spec.label!r} given twice")
        specs.append(spec)
    return specs


def make_manager(spec: PolicySpec, capacity: int) -> OffloadingManager:
    """The production manager for ``spec`` with ``capacity`` blocks."""
    if spec.name == "opt":
        raise ConfigurationError("opt is not a manager; use simulate_opt")
    manager: OffloadingManager = CPUOffloadingManager(
        block_size=16, num_blocks=capacity, cache_policy=spec.name
    )
    if spec.reuse_threshold is not None:
        manager = FilterReusedOffloadingManager(
            manager, store_threshold=spec.reuse_threshold, max_tracker_size=spec.tracker_size
        )
    return manager


def replay(
    manager: OffloadingManager,
    key_chains: Sequence[Sequence[OffloadKey]],
    req_ids: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int, int, int, int, int]:
    """Drive ``manager`` through the protocol for every chain.

    Returns (block refs, hit blocks, stored, evicted, loaded, refused stores).
    """
    refs = hit_blocks = stored = evicted = refused = 0
    lookup_prefix = manager.lookup_prefix
    prepare_load, complete_load = manager.prepare_load, manager.complete_load
    touch = manager.touch
    prepare_store, complete_store = manager.prepare_store, manager.complete_store
    take_events = manager.take_events
    report_every = 512
    for index, chain in enumerate(key_chains):
        ctx = ReqContext(req_ids[index] if req_ids is not None else str(index))
        refs += len(chain)
        hits = lookup_prefix(chain, ctx) or 0
        if hits:
            loaded = chain[:hits]
            prepare_load(loaded, ctx)
            complete_load(loaded, ctx)
            hit_blocks += hits
        touch(chain, ctx)
        if hits < len(chain):
            output = prepare_store(chain[hits:], ctx)
            if output is None:
                refused += 1
            else:
                if output.keys_to_store:
                    stored += len(output.keys_to_store)
                    complete_store(output.keys_to_store, ctx)
                evicted += len(output.evicted_keys)
        take_events()
        if progress is not None and index % report_every == 0:
            progress(index)
    if progress is not None:
        progress(len(key_chains))
    return refs, hit_blocks, stored, evicted, hit_blocks, refused


def simulate(
    trace: Trace,
    spec: PolicySpec,
    capacity: int,
    progress: Callable[[int], None] | None = None,
    key_chains: Sequence[Sequence[OffloadKey]] | None = None,
) -> SimResult:
    """Replay ``trace`` under ``spec`` with ``capacity`` blocks.

    ``key_chains`` (``trace.key_chains()``) may be passed to share it across
    runs. Raises :class:`ConfigurationError` for a capacity below 1.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ConfigurationError(f"capacity must be a positive int, got {capacity!r}")
    if spec.name == "opt":
        return simulate_opt(trace, capacity, progress)
    if key_chains is None:
        key_chains = trace.key_chains()
    manager = make_manager(spec, capacity)
    started = time.perf_counter()
    refs, hits, stored, evicted, loaded, refused = replay(
        manager, key_chains, trace.req_ids, progress
    )
    return SimResult(
        policy=spec.label,
        capacity=capacity,
        requests=trace.num_requests,
        block_refs=refs,
        hit_blocks=hits,
        blocks_stored=stored,
        blocks_evicted=evicted,
        blocks_loaded=loaded,
        stores_refused=refused,
        seconds=time.perf_counter() - started,
    )
