"""Per-block bookkeeping shared by managers, policies and backends."""

from __future__ import annotations

from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)
class BlockStatus:
    """Offloading status of one block.

    ``ref_cnt`` is -1 while the store is in flight (PENDING), 0 when the block
    is stored and unread (READY), and ``n > 0`` while ``n`` loads read it
    (LOADING(n)). ``block_id`` is the slot in the backend's pool.
    """

    __slots__ = ("block_id", "park_seq", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.ref_cnt: int = -1
        self.block_id: int = block_id
        # when a recency order set the block aside while pinned: its age there
        # (read only while the block is parked; a reused block keeps a stale one)
        self.park_seq: int = 0

    @property
    def is_ready(self) -> bool:
        """Whether the block's bytes are stored and may be read."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"
