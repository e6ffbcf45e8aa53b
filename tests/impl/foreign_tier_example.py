"""A tier written against types that are not kvoffload's (its own answer
enum, its own job record), as an out-of-tree tier named by ``type`` and
``module_path`` is: what ``tests/impl/test_tier_setup.py`` loads. It keeps
chunks in a dict and finishes jobs at once, copying the primary's rows."""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Any


class Answer(enum.Enum):
    MISS = 1
    HIT = 2
    RETRY = 3


class Job:
    """The job record this tier reads (made by the caller's ``make_job``)."""

    def __init__(self, job_id: int, keys: list[bytes], chunk_ids: list[int],
                 is_promotion: bool, req_context: Any) -> None:
        self.job_id, self.keys, self.chunk_ids = job_id, keys, chunk_ids
        self.is_promotion, self.req_context = is_promotion, req_context


class Result:
    def __init__(self, job_id: int, success: bool) -> None:
        self.job_id, self.success, self.successful_keys = job_id, success, None


class Event:
    def __init__(self, keys: list[bytes], removed: bool) -> None:
        self.keys, self.removed, self.medium = keys, removed, Medium.STORAGE


class Medium(enum.Enum):
    STORAGE = "STORAGE"


INSTANCES: list[DictTier] = []
"""Every tier built, so a test can see what became of it."""


class DictTier:
    medium = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 label: str = "") -> None:
        self.spec, self.tier_type, self.label = offloading_spec, tier_type, label
        self._flat = primary_kv_view.cast("B")
        self._chunk = primary_kv_view.nbytes // len(primary_kv_view)
        self.chunks: dict[bytes, bytes] = {}
        self.finished: list[Result] = []
        self.events: list[Event] = []
        self.contexts: list[Any] = []  # every context this tier was handed
        self.closed = False
        INSTANCES.append(self)

    def lookup(self, key: bytes, req_context: Any) -> Answer:
        self.contexts.append(req_context)
        return Answer.HIT if key in self.chunks else Answer.MISS

    def submit_store(self, job: Job) -> None:
        assert isinstance(job, Job), type(job)
        for key, chunk in zip(job.keys, job.chunk_ids):
            start = int(chunk) * self._chunk
            self.chunks[key] = bytes(self._flat[start : start + self._chunk])
        self.events.append(Event(list(job.keys), False))
        self.finished.append(Result(job.job_id, True))

    def submit_load(self, job: Job) -> None:
        assert isinstance(job, Job), type(job)
        for key, chunk in zip(job.keys, job.chunk_ids):
            start = int(chunk) * self._chunk
            self._flat[start : start + self._chunk] = self.chunks[key]
        self.finished.append(Result(job.job_id, True))

    def get_finished_jobs(self) -> list[Result]:
        done, self.finished = self.finished, []
        return done

    def drain_jobs(self) -> None:
        return None

    def has_pending_work(self) -> bool:
        return bool(self.finished)

    def touch(self, keys: Collection[bytes], req_context: Any) -> None:
        self.contexts.append(req_context)

    def on_new_request(self, req_context: Any) -> None:
        self.contexts.append(req_context)

    def on_request_finished(self, req_context: Any) -> None:
        self.contexts.append(req_context)

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def shutdown(self) -> None:
        self.closed = True


def broken_tier(**kwargs: Any) -> Any:
    """A factory that fails, as a tier whose resources are gone does."""
    raise OSError("the device is gone")
