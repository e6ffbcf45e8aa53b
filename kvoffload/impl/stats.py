"""A manager's counters, read on demand (``stats()``)."""

from __future__ import annotations

import attrs


@attrs.frozen
class ManagerStats:
    """One snapshot of a manager's occupancy and counters.

    Occupancy, at the moment of the call (slots are blocks of the CPU tier,
    chunks in vLLM 0.33's terms):

    - ``capacity``: slots in all; ``free``: slots holding no block;
    - ``pending``: blocks whose store is in flight (PENDING);
    - ``loading``: blocks with at least one load in flight (LOADING);
    - ``ready``: stored blocks with no load in flight (READY, evictable).
      ``free + pending + loading + ready == capacity``.

    Counters, since the manager was built (never reset, ``reset_cache``
    included; a consumer takes differences between two snapshots):

    - ``blocks_stored``: stores completed (PENDING → READY);
    - ``store_failures``: stores completed with ``success=False``;
    - ``blocks_evicted``: blocks evicted to make room;
    - ``stores_refused``: ``prepare_store`` calls answering None (no room);
    - ``stores_skipped``: offered keys a reuse filter did not pass on
      (counted below its threshold and not readable); 0 without a filter.
    """

    capacity: int
    free: int
    pending: int
    loading: int
    ready: int
    blocks_stored: int = 0
    store_failures: int = 0
    blocks_evicted: int = 0
    stores_refused: int = 0
    stores_skipped: int = 0

    @property
    def usage(self) -> float:
        """Fraction of the slots pinned by transfers in flight (stores and
        loads): vLLM's ``kv_offload_cpu_cache_usage_perc``; 0.0 with no
        slot."""
        return (self.pending + self.loading) / self.capacity if self.capacity else 0.0

    @property
    def write_usage(self) -> float:
        """Fraction of the slots pinned by stores in flight."""
        return self.pending / self.capacity if self.capacity else 0.0

    @property
    def read_usage(self) -> float:
        """Fraction of the slots pinned by loads in flight."""
        return self.loading / self.capacity if self.capacity else 0.0
