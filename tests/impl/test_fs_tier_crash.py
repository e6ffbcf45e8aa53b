"""A process killed (SIGKILL) while its FileSystemTier writes large chunks
leaves no readable torn chunk: the tier opened again finds every chunk whose
store had completed, with exactly its bytes, and nothing else."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvoffload import FileSystemTier
from kvoffload.impl.fs_tier import MEMORY_FILE_SYSTEMS, file_system_type
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.tier_contract import TierJob, TierJobResult

CHUNK = 1 << 20  # large chunks: the kill lands mid-write
SLOTS = 4
RECYCLING = 3
SHM = "/dev/shm"

# The writer: with a capacity of RECYCLING chunks every store from the fourth
# on evicts a chunk and rewrites its file (recycle_files), so the kill lands in
# a recycled file's write. It stores chunk i (the base pattern XOR i's low
# byte, payload(i) below) under key b"\xab" + i, one job at a time, and prints
# i once the job is reported a success. Keys share the first byte, so every
# file lands in one shard, the one the test watches for a temp file. A
# chunk's bytes cost a XOR, not a random draw: the writer then spends a good
# part of its time writing, so the test sees a temp file soon even when
# other processes hold the CPUs (with a 1 MiB draw per chunk, a write was a
# few percent of the writer's time, and on a loaded 2-CPU machine the test's
# polls could miss every one for 20 s). A torn chunk mixes two chunks' bytes,
# which differ at every position (consecutive seeds differ in their low byte).
WRITER = r"""
import sys
import numpy as np
from kvoffload import FileSystemTier
from kvoffload.spec.tier_contract import TierJob

directory, chunk, io, capacity = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
primary = np.zeros((4, chunk), dtype=np.uint8)
base = np.random.default_rng(0).integers(0, 256, chunk, dtype=np.uint8)
tier = FileSystemTier(
    directory, capacity, primary.data, num_threads=2, direct_io=io == "direct"
)
print("ready", flush=True)
for i in range(100_000):
    slot = i % 4
    np.bitwise_xor(base, i & 0xFF, out=primary[slot])
    tier.submit_store(TierJob(i, (b"\xab" + i.to_bytes(7, "big"),), (slot,), False))
    tier.drain_jobs()
    [result] = tier.get_finished_jobs()
    if result.success:
        print(i, flush=True)
"""


def key_of(i: int) -> OffloadKey:
    return OffloadKey(b"\xab" + i.to_bytes(7, "big"))


def seed_of(k: OffloadKey) -> int:
    return int.from_bytes(k[1:], "big")


@functools.cache
def _base() -> np.ndarray:
    """The writer's base pattern (drawn once: a test checks every chunk it finds)."""
    return np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8)


def payload(seed: int) -> np.ndarray:
    """The bytes the writer stores for ``seed``."""
    chunk: np.ndarray = np.bitwise_xor(_base(), seed & 0xFF)
    return chunk


def temp_files(shard: Path) -> list[str]:
    try:
        return [name for name in os.listdir(shard) if name.endswith(".tmp")]
    except FileNotFoundError:
        return []


@pytest.fixture(params=["temporary", "memory"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The temporary directory, and one on tmpfs (``/dev/shm``), where
    ``checksum="auto"`` records no CRC-32 and files are recycled without
    one: the rename alone must keep a killed write unreadable."""
    if request.param == "temporary":
        yield tmp_path
        return
    if file_system_type(SHM) not in MEMORY_FILE_SYSTEMS:
        pytest.skip(f"{SHM} is not a file system kept in memory here")
    directory = Path(tempfile.mkdtemp(prefix="kvoffload-crash-", dir=SHM))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("capacity", [10_000, RECYCLING])
@pytest.mark.parametrize("io", ["buffered", "direct"])
@pytest.mark.parametrize("round_", range(2))
def test_a_killed_writer_leaves_only_complete_chunks(
    where: Path, round_: int, io: str, capacity: int
) -> None:
    directory = where / "tier"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(CHUNK), io, str(capacity)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    completed: list[int] = []
    caught_mid_write = False
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().startswith("ready")
        shard = directory / "chunks" / "ab"
        # let a few chunks complete, then kill while a temp file exists
        for _ in range(3 + round_ + (RECYCLING if capacity == RECYCLING else 0)):
            line = writer.stdout.readline()
            assert line, "the writer died on its own"
            completed.append(int(line))
        # the rest of its lines read as they come, so that a full pipe never
        # stops the writer between two chunks while the test looks for one
        # being written
        later: list[str] = []
        reader = threading.Thread(target=later.extend, args=(writer.stdout,), daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if temp_files(shard):
                caught_mid_write = True
                break
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=20)
        reader.join(timeout=20)
        completed.extend(int(line) for line in later)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=20)
        if writer.stdout is not None:
            writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    assert caught_mid_write, "the kill never landed while a chunk was being written"

    primary = np.zeros((SLOTS, CHUNK), dtype=np.uint8)
    tier = FileSystemTier(directory, capacity, primary.data)
    try:
        in_memory = tier.file_system in MEMORY_FILE_SYSTEMS
        assert tier.checksums is not in_memory
        assert tier.recycles_files
        found = tier.stored_keys()
        # the chunks not evicted when killed: all of them, or (recycling) the
        # last two completed (a third may have been evicted by the store the
        # kill cut short); an evicted chunk whose file was not yet recycled
        # may come back, with its own bytes
        kept = completed if capacity > len(completed) + 1 else completed[-(RECYCLING - 1) :]
        assert {key_of(i) for i in kept} <= found, "a completed chunk was lost"
        # at most the chunk being written when killed had completed unreported
        assert found <= {key_of(i) for i in [*completed, max(completed) + 1]}
        assert len(found) <= min(capacity, len(completed) + 1)
        assert not temp_files(directory / "chunks" / "ab")
        for job_id, k in enumerate(sorted(found)):
            tier.submit_load(TierJob(job_id, (k,), (0,), True))
            tier.drain_jobs()
            assert tier.get_finished_jobs() == [TierJobResult(job_id, True)]
            assert np.array_equal(primary[0], payload(seed_of(k))), f"chunk {seed_of(k)} torn"
    finally:
        tier.shutdown()
