"""The outcome of replaying one trace under one policy and capacity."""

from __future__ import annotations

import attrs


@attrs.frozen
class SimResult:
    """Counters of one replay.

    ``hit_blocks`` sums the ready prefix length found for each request;
    ``block_refs`` sums the chain lengths; ``blocks_loaded`` counts blocks
    passed to ``prepare_load``; ``stores_refused`` counts ``prepare_store``
    calls that returned None.
    """

    policy: str
    capacity: int
    requests: int
    block_refs: int
    hit_blocks: int
    blocks_stored: int
    blocks_evicted: int
    blocks_loaded: int
    stores_refused: int
    seconds: float = attrs.field(eq=False)

    @property
    def hit_ratio(self) -> float:
        """Hit blocks over requested blocks (0 for an empty trace)."""
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    def as_dict(self) -> dict[str, object]:
        data = attrs.asdict(self)
        data["hit_ratio"] = self.hit_ratio
        return data
