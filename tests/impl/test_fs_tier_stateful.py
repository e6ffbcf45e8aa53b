"""The file tier under random sequences of stores (some failing mid-write),
loads, evictions, touches, damaged files and reopenings: after every step
each readable key reads back exactly the bytes last stored under it, a
failed write never becomes a HIT, the events replay to the readable keys,
capacity holds and no temp file outlives its job."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvoffload import FileSystemTier, ReqContext
from kvoffload.impl import fs_tier
from kvoffload.spec.contract import LookupResult
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.tier_contract import TierJob, TierJobResult
from tests.fs_faults import per_item_writes

CHUNK = 512
SLOTS = 8
CAPACITY = 4
KEYS = [make_offload_key(bytes([i]) * 8, i % 2) for i in range(7)]
CTX = ReqContext(req_id="machine")

#: hex of the keys whose next write dies midway (read by the patched writer)
FAILING: set[str] = set()


def pattern(seed: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.random.default_rng(seed).integers(0, 256, CHUNK, dtype=np.uint8)


def torn_write(temp: str, prefix: str, payload: memoryview, recycled: str | None) -> OSError | None:
    """A write of a key in ``FAILING`` dies midway (once): half the chunk
    written to its temp file, which the dying write then removes."""
    name = Path(prefix).name.split(".")[0]
    if name not in FAILING:
        return None
    FAILING.discard(name)
    Path(temp).parent.mkdir(exist_ok=True)  # (the shard's first chunk)
    if recycled is not None:  # taken over as the temp file, as the real writer does
        Path(recycled).rename(temp)
    with open(temp, "r+b" if recycled else "wb") as half:  # torn, then the "crash"
        half.write(payload[: len(payload) // 2])
    Path(temp).unlink()
    return OSError("the write died midway")


class FileTierMachine(RuleBasedStateMachine):
    """The file tier with ``verify_loads="always"``: damage during the run
    is caught (:class:`ReopenedFileTierMachine`: the default)."""

    VERIFY_LOADS = "always"

    def __init__(self) -> None:
        super().__init__()
        # every write goes through a writer that can die midway (restored in teardown)
        self.real_writer = fs_tier._write_chunks
        fs_tier._write_chunks = per_item_writes(torn_write, self.real_writer)
        self.directory = Path(tempfile.mkdtemp(prefix="kvoffload-fs-machine-"))
        self.primary = np.zeros((SLOTS, CHUNK), dtype=np.uint8)
        self.tier = self.open()
        self.last: dict[OffloadKey, int] = {}  # readable key -> seed of its bytes
        self.announced: set[OffloadKey] = set()
        self.job_id = 0
        self.seed = 0

    def open(self) -> FileSystemTier:
        return FileSystemTier(
            self.directory,
            CAPACITY,
            self.primary.data,
            num_threads=2,
            enable_events=True,
            verify_loads=self.VERIFY_LOADS,
            checksum=True,  # it tears and damages files, whatever holds them
        )

    @initialize()
    def start(self) -> None:
        FAILING.clear()

    def apply_events(self) -> None:
        for event in self.tier.take_events():
            for key in event.keys:
                if event.removed:
                    assert key in self.announced, "removal of a key never announced"
                    self.announced.discard(key)
                else:
                    assert key not in self.announced, "a key announced twice"
                    self.announced.add(key)

    def run(self, job: TierJob) -> TierJobResult:
        if job.is_promotion:
            self.tier.submit_load(job)
        else:
            self.tier.submit_store(job)
        self.tier.drain_jobs()
        [result] = self.tier.get_finished_jobs()
        assert result.job_id == job.job_id
        if result.successful_keys is not None:
            assert not result.success and result.successful_keys <= set(job.keys)
        return result

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        failing=st.sets(st.integers(0, 2), max_size=2),
    )
    def store(self, keys: list[OffloadKey], failing: set[int]) -> None:
        readable_before = set(self.last)
        seeds = []
        for slot, key in enumerate(keys):
            self.seed += 1
            seeds.append(self.seed)
            self.primary[slot] = pattern(self.seed)
            if slot in failing:
                FAILING.add(key.hex())
        self.job_id += 1
        result = self.run(TierJob(self.job_id, tuple(keys), tuple(range(len(keys))), False))
        FAILING.clear()
        made_it = set(keys) if result.success else set(result.successful_keys or ())
        readable = self.tier.stored_keys()
        for key, seed in zip(keys, seeds):
            if key in made_it and key not in readable_before:
                self.last[key] = seed
            if key not in made_it:
                assert key not in readable or key in readable_before, "a failed write is a HIT"
        for key in list(self.last):
            if key not in readable:
                del self.last[key]  # evicted
        self.apply_events()

    @precondition(lambda self: bool(self.last))
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        keys = data.draw(
            st.lists(st.sampled_from(sorted(self.last)), min_size=1, max_size=3, unique=True)
        )
        slots = list(range(SLOTS - len(keys), SLOTS))
        self.job_id += 1
        result = self.run(TierJob(self.job_id, tuple(keys), tuple(slots), True))
        assert result == TierJobResult(self.job_id, True)
        for key, slot in zip(keys, slots):
            assert np.array_equal(self.primary[slot], pattern(self.last[key])), "wrong bytes"

    @rule(key=st.sampled_from(KEYS))
    def load_what_is_not_there(self, key: OffloadKey) -> None:
        if key in self.last:
            return
        self.job_id += 1
        result = self.run(TierJob(self.job_id, (key,), (SLOTS - 1,), True))
        assert result == TierJobResult(self.job_id, False, None)

    @precondition(lambda self: bool(self.last))
    @rule(data=st.data(), how=st.sampled_from(["flip", "truncate"]))
    def damage(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.last)))
        path = self.tier.path_of(key)
        assert path is not None
        if self.VERIFY_LOADS == "reopened":
            # the damage this mode guards against happens while no tier runs
            # (a crash, a power loss); the chunk is verified on its next load
            self.tier.shutdown()
        content = bytearray(path.read_bytes())
        if how == "flip":
            content[len(content) // 3] ^= 0x5A
        else:
            del content[-7:]
        path.write_bytes(content)
        if self.VERIFY_LOADS == "reopened":
            self.tier = self.open()
            self.announced = set()
            self.apply_events()
        self.job_id += 1
        result = self.run(TierJob(self.job_id, (key,), (SLOTS - 1,), True))
        assert result == TierJobResult(self.job_id, False, None), "damaged bytes were loaded"
        assert self.tier.lookup(key, CTX) is LookupResult.MISS
        del self.last[key]
        self.apply_events()

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def touch(self, keys: list[OffloadKey]) -> None:
        self.tier.touch(keys, CTX)

    @rule()
    def reopen(self) -> None:
        before = self.tier.stored_keys()
        self.tier.shutdown()
        self.tier = self.open()
        assert self.tier.stored_keys() == before, "a reopened tier lost or gained chunks"
        self.announced = set()
        self.apply_events()

    @invariant()
    def readable_keys_are_the_models(self) -> None:
        readable = self.tier.stored_keys()
        assert readable == set(self.last)
        assert readable == self.announced
        assert len(self.tier) <= CAPACITY
        for key in KEYS:
            hit = self.tier.lookup(key, CTX) is LookupResult.HIT
            assert hit == (key in readable)

    @invariant()
    def no_temp_file_outlives_its_job(self) -> None:
        assert not list(self.directory.rglob("*" + fs_tier.TEMP_SUFFIX))

    def teardown(self) -> None:
        self.tier.shutdown()
        fs_tier._write_chunks = self.real_writer
        shutil.rmtree(self.directory, ignore_errors=True)


FileTierMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFileTierMachine = FileTierMachine.TestCase


class ReopenedFileTierMachine(FileTierMachine):
    """The default ``verify_loads="reopened"``: chunks damaged while the
    tier was closed are caught on their first load after the reopen."""

    VERIFY_LOADS = "reopened"


ReopenedFileTierMachine.TestCase.settings = FileTierMachine.TestCase.settings
TestReopenedFileTierMachine = ReopenedFileTierMachine.TestCase
