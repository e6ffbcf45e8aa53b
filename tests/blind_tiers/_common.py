"""Small pieces every tier of the corpus uses: row access to the primary
view, job results and named hook points (a test seam for fault injection and
for forcing thread interleavings)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from kvoffload.spec.contract import LookupResult, ReqContext, RequestOffloadingContext
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.tier_contract import TierJobLike, TierJobResult

__all__ = [
    "Hooks",
    "LookupResult",
    "OffloadKey",
    "ReqContext",
    "RequestOffloadingContext",
    "Rows",
    "TierFactory",
    "TierJobLike",
    "TierJobResult",
    "TierLike",
    "dedup_pairs",
    "job_result",
]


class Rows:
    """The primary tier's memory as rows of ``strides[0]`` bytes."""

    def __init__(self, view: memoryview) -> None:
        strides = view.strides
        if not strides:
            raise ValueError("primary_kv_view must be at least 1-D")
        self.chunk_bytes = int(strides[0])
        self.num_rows = int(view.shape[0]) if view.shape else 0
        self._flat = view.cast("B") if (view.ndim != 1 or view.format != "B") else view

    def read(self, row: int) -> bytes:
        if not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} outside [0, {self.num_rows})")
        start = row * self.chunk_bytes
        return bytes(self._flat[start : start + self.chunk_bytes])

    def write(self, row: int, data: bytes) -> None:
        if not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} outside [0, {self.num_rows})")
        if len(data) != self.chunk_bytes:
            raise ValueError(f"chunk of {len(data)} bytes, rows hold {self.chunk_bytes}")
        start = row * self.chunk_bytes
        self._flat[start : start + self.chunk_bytes] = data

    def write_range(self, start: int, data: bytes) -> None:
        """Raw byte write at ``start`` (clipped to the view)."""
        end = min(start + len(data), len(self._flat))
        self._flat[start:end] = data[: end - start]


class Hooks:
    """Named points a test may attach a callable to (fault injection, or a
    pause that forces an interleaving). Unset points do nothing."""

    def __init__(self) -> None:
        self._points: dict[str, Callable[[], None]] = {}

    def set(self, name: str, fn: Callable[[], None]) -> None:
        self._points[name] = fn

    def fire(self, name: str) -> None:
        fn = self._points.get(name)
        if fn is not None:
            fn()


def dedup_pairs(job: TierJobLike) -> list[tuple[OffloadKey, int]]:
    """The job's ``(key, primary row)`` pairs, first occurrence of a key kept.
    ``job.keys`` is any collection and ``job.chunk_ids`` any sequence of
    ints (a numpy array in vLLM)."""
    keys = list(job.keys)
    rows = [int(c) for c in job.chunk_ids]
    if len(keys) != len(rows):
        raise ValueError(f"job {job.job_id}: {len(keys)} keys but {len(rows)} chunk ids")
    seen: set[OffloadKey] = set()
    out: list[tuple[OffloadKey, int]] = []
    for key, row in zip(keys, rows):
        if key not in seen:
            seen.add(key)
            out.append((key, row))
    return out


def job_result(job_id: int, keys: Iterable[OffloadKey], ok: Collection[OffloadKey]) -> TierJobResult:
    """The result of a job whose keys ``ok`` made it: success when all did,
    ``successful_keys`` only on a partial failure."""
    all_keys = set(keys)
    good = frozenset(k for k in ok if k in all_keys)
    if good == all_keys:
        return TierJobResult(job_id, True, None)
    if not good:
        return TierJobResult(job_id, False, None)
    return TierJobResult(job_id, False, good)


class TierLike(Protocol):
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult: ...
    def submit_store(self, job: TierJobLike) -> None: ...
    def submit_load(self, job: TierJobLike) -> None: ...
    def get_finished_jobs(self) -> Iterable[TierJobResult]: ...
    def drain_jobs(self) -> None: ...
    def has_pending_work(self) -> bool: ...
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None: ...
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext: ...
    def on_request_finished(self, req_context: ReqContext) -> None: ...
    def take_events(self) -> Iterable[object]: ...
    def shutdown(self) -> None: ...


class TierFactory(Protocol):
    def __call__(self, capacity_blocks: int, primary_kv_view: memoryview) -> TierLike: ...
