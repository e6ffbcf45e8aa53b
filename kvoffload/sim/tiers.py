"""Replaying a trace through the tiered manager: hit ratios per tier.

``--tiers cpu=1024,fs=16384`` builds the production
:class:`~kvoffload.impl.tiered.TieredOffloadingManager` over a
:class:`~kvoffload.impl.manager.CPUOffloadingManager` of 1024 slots (the
policy under test) and one :class:`~kvoffload.impl.memtier.MemoryTier` of
16384 chunks per further tier, keeping keys only and completing each job at
submit: what a tier holds and when depends on the capacities, the policies
and the manager, not on the medium, so the file tier's disk would only make
the replay slower. Each further tier evicts least recently used first.

Each request goes through the scheduler protocol of
:mod:`kvoffload.sim.replay`, with one addition: while ``lookup_prefix``
answers None (promotions started), the scheduler ends the step
(``on_schedule_end``: the promotions are submitted, completed and taken)
and asks again. A hit is counted for the tier the block came from: the CPU
tier when it was there, tier ``i`` when this request promoted it.

OPT is reported twice, both from :func:`kvoffload.sim.opt.simulate_opt`:
at the CPU tier's capacity (the best a single CPU tier of that size could
do) and at the sum of all capacities. The second is an upper bound on the
total hits of any tiered scheme, not an attainable optimum: the union of
what the tiers hold never exceeds the sum of their capacities, it changes
only by blocks offered to a store (promotions and cascades copy blocks
already in the union), so it plays the single-cache game of that size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.memtier import MemoryTier
from kvoffload.impl.tiered import CascadeMode, TieredOffloadingManager
from kvoffload.sim.opt import simulate_opt
from kvoffload.sim.replay import PolicySpec, simulate
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey
from kvoffload.workloads import Trace


@attrs.frozen
class TierSpec:
    """One tier of ``--tiers``: its name and capacity in blocks."""

    name: str
    capacity: int


def parse_tiers(text: str) -> list[TierSpec]:
    """Tiers from ``cpu=1024,fs=16384``: ``cpu`` first, then at least one
    further tier, each ``name=blocks`` with a distinct name. Raises
    :class:`ConfigurationError` otherwise."""
    tiers: list[TierSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, number = part.partition("=")
        name = name.strip()
        try:
            capacity = int(number)
        except ValueError:
            capacity = 0
        if not sep or not name or capacity < 1:
            raise ConfigurationError(
                f"tier {part!r} is not name=blocks with a positive block count"
            )
        if any(t.name == name for t in tiers):
            raise ConfigurationError(f"tier {name!r} given twice")
        tiers.append(TierSpec(name, capacity))
    if len(tiers) < 2 or tiers[0].name != "cpu":
        raise ConfigurationError(
            "--tiers needs the cpu tier first and at least one more, e.g. cpu=1024,fs=16384"
        )
    return tiers


@attrs.frozen
class TieredSimResult:
    """Counters of one tiered replay (``label`` names the row)."""

    label: str
    capacities: tuple[int, ...]
    block_refs: int
    hit_blocks: int
    tier_hits: tuple[int, ...]
    """Hits per tier, the CPU tier first; they sum to ``hit_blocks``."""
    promotions_refused: int
    cascaded: int
    steps_waited: int
    """Extra scheduler steps requests waited for their promotions."""
    seconds: float = attrs.field(eq=False)

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    def tier_ratio(self, index: int) -> float:
        return self.tier_hits[index] / self.block_refs if self.block_refs else 0.0

    def as_dict(self) -> dict[str, object]:
        data = attrs.asdict(self)
        data["hit_ratio"] = self.hit_ratio
        return data


def make_tiered_manager(
    tiers: Sequence[TierSpec],
    policy: str,
    cascade: str = CascadeMode.WRITE_THROUGH.value,
    max_promotions_in_flight: int | None = None,
) -> TieredOffloadingManager:
    """The production tiered manager for ``tiers`` (keys-only memory tiers
    behind the CPU tier, which evicts by ``policy``)."""
    primary = CPUOffloadingManager(16, tiers[0].capacity, cache_policy=policy)
    secondary = [MemoryTier(t.capacity, medium=t.name, enable_events=False) for t in tiers[1:]]
    return TieredOffloadingManager(
        primary, secondary, cascade=cascade, max_promotions_in_flight=max_promotions_in_flight
    )


def replay_tiered(
    manager: TieredOffloadingManager,
    key_chains: Sequence[Sequence[OffloadKey]],
    req_ids: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, list[int], int]:
    """Drive ``manager`` through every chain. Returns (block refs, hits per
    tier with the CPU tier first, extra steps waited for promotions)."""
    tier_hits = [0] * (len(manager.tiers) + 1)
    refs = waited = 0
    done = manager.stats.promotions_done
    for index, chain in enumerate(key_chains):
        ctx = ReqContext(req_ids[index] if req_ids is not None else str(index))
        refs += len(chain)
        before = list(done)
        found = manager.lookup_prefix(chain, ctx)
        steps = 0
        while found is None and steps <= len(chain):
            manager.on_schedule_end()
            steps += 1
            found = manager.lookup_prefix(chain, ctx)
        hits = found or 0
        waited += steps
        promoted = [after - earlier for after, earlier in zip(done, before)]
        tier_hits[0] += hits - sum(promoted)
        for tier_index, count in enumerate(promoted):
            tier_hits[tier_index + 1] += count
        if hits:
            loaded = chain[:hits]
            manager.prepare_load(loaded, ctx)
            manager.complete_load(loaded, ctx)
        manager.touch(chain, ctx)
        if hits < len(chain):
            output = manager.prepare_store(chain[hits:], ctx)
            if output is not None and output.keys_to_store:
                manager.complete_store(output.keys_to_store, ctx)
        manager.on_schedule_end()
        if progress is not None and index % 512 == 0:
            progress(index)
    if progress is not None:
        progress(len(key_chains))
    return refs, tier_hits, waited


def simulate_tiers(
    trace: Trace,
    tiers: Sequence[TierSpec],
    policy: str,
    cascade: str = CascadeMode.WRITE_THROUGH.value,
    max_promotions_in_flight: int | None = None,
    progress: Callable[[int], None] | None = None,
    key_chains: Sequence[Sequence[OffloadKey]] | None = None,
) -> TieredSimResult:
    """Replay ``trace`` through the tiered manager (see the module doc)."""
    if key_chains is None:
        key_chains = trace.key_chains()
    manager = make_tiered_manager(tiers, policy, cascade, max_promotions_in_flight)
    started = time.perf_counter()
    refs, tier_hits, waited = replay_tiered(manager, key_chains, trace.req_ids, progress)
    return TieredSimResult(
        label=f"{policy} tiered ({cascade}, ≤{manager.max_promotions_in_flight} promoting)",
        capacities=tuple(t.capacity for t in tiers),
        block_refs=refs,
        hit_blocks=sum(tier_hits),
        tier_hits=tuple(tier_hits),
        promotions_refused=manager.stats.promotions_refused,
        cascaded=sum(manager.stats.cascades_done),
        steps_waited=waited,
        seconds=time.perf_counter() - started,
    )


def single_tier_row(
    trace: Trace,
    tiers: Sequence[TierSpec],
    policy: str,
    key_chains: Sequence[Sequence[OffloadKey]] | None = None,
) -> TieredSimResult:
    """The plain CPU manager of the CPU tier's capacity, no further tier
    (what the tiers add is the difference)."""
    result = simulate(trace, PolicySpec(policy), tiers[0].capacity, key_chains=key_chains)
    return TieredSimResult(
        label=f"{policy}, cpu tier alone",
        capacities=(tiers[0].capacity,),
        block_refs=result.block_refs,
        hit_blocks=result.hit_blocks,
        tier_hits=(result.hit_blocks,) + (0,) * (len(tiers) - 1),
        promotions_refused=0,
        cascaded=0,
        steps_waited=0,
        seconds=result.seconds,
    )


def opt_rows(
    trace: Trace, tiers: Sequence[TierSpec], progress: Callable[[int], None] | None = None
) -> list[TieredSimResult]:
    """OPT at the CPU tier's capacity, and at the sum of every capacity
    (an upper bound on any tiered scheme's total hits)."""
    rows = []
    alone = tiers[0].capacity
    for label, capacity in (
        ("opt, cpu tier alone", alone),
        ("opt at the total (bound)", sum(t.capacity for t in tiers)),
    ):
        result = simulate_opt(trace, capacity, progress)
        per_tier = (
            (result.hit_blocks,) + (0,) * (len(tiers) - 1) if capacity == alone else ()
        )
        rows.append(
            TieredSimResult(
                label=label,
                capacities=(capacity,),
                block_refs=result.block_refs,
                hit_blocks=result.hit_blocks,
                tier_hits=per_tier,
                promotions_refused=0,
                cascaded=0,
                steps_waited=0,
                seconds=result.seconds,
            )
        )
    return rows


def format_tiered_table(tiers: Sequence[TierSpec], rows: Sequence[TieredSimResult]) -> str:
    """Rows as an aligned table: total hit ratio, then per tier."""
    header = ["row", "capacity", "hit ratio", *(f"{t.name} hits" for t in tiers),
              "refused", "waited", "seconds"]
    lines = []
    for row in rows:
        per_tier = (
            [f"{row.tier_ratio(i):.4f}" for i in range(len(tiers))]
            if len(row.tier_hits) == len(tiers)
            else ["-"] * len(tiers)
        )
        lines.append([
            row.label, "+".join(str(c) for c in row.capacities), f"{row.hit_ratio:.4f}",
            *per_tier, f"{row.promotions_refused}", f"{row.steps_waited}",
            f"{row.seconds:.2f}",
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    return "\n".join([render(header), *(render(line) for line in lines)])
