"""An engine process killed (SIGKILL) while its tiered manager cascades into
the file tier: a fresh manager over the reopened tier promotes every chunk
the tier finds, each with exactly the bytes stored under its key, and
nothing torn becomes a hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from kvoffload import CPUOffloadingManager, FileSystemTier, TieredOffloadingManager
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import PhaseKind

CHUNK = 1 << 18  # 256 KiB: the kill lands mid-write
SLOTS = 8

# The engine: stores key i with bytes drawn from seed i through the tiered
# manager (write-through into the file tier), one request per step, and
# prints how many cascades have completed after each step.
ENGINE = r"""
import sys
import numpy as np
from kvoffload import CPUOffloadingManager, FileSystemTier, TieredOffloadingManager
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.keys import make_offload_key

directory, chunk, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
memory = np.zeros((slots, chunk), dtype=np.uint8)
tier = FileSystemTier(directory, 10_000, memory.data, num_threads=2)
manager = TieredOffloadingManager(CPUOffloadingManager(16, slots), [tier])
for i in range(10_000):
    ctx = ReqContext(str(i))
    key = make_offload_key(i.to_bytes(8, "big"), 0)
    with manager.lock:
        out = manager.prepare_store([key], ctx)
        if out is None:
            manager.on_schedule_end()
            continue
        slot = manager.slot_of(key)
        memory[slot] = np.random.default_rng(i).integers(0, 256, chunk, dtype=np.uint8)
        manager.complete_store([key], ctx)
        manager.on_schedule_end()
        print(sum(manager.stats.cascades_done), flush=True)
"""


def key_of(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def test_a_killed_engine_leaves_only_whole_chunks_that_promote_exactly(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "tier"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
    )
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(directory), str(CHUNK), str(SLOTS)],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert engine.stdout is not None
        for line in engine.stdout:  # until a dozen cascades completed
            if int(line) >= 12:
                break
        engine.send_signal(signal.SIGKILL)
    finally:
        engine.kill()
        engine.wait(timeout=30)

    memory = np.zeros((64, CHUNK), dtype=np.uint8)
    tier = FileSystemTier(str(directory), 10_000, memory.data, num_threads=2)
    manager = TieredOffloadingManager(
        CPUOffloadingManager(16, 64), [tier], max_promotions_in_flight=64
    )
    try:
        stored = sorted(tier.stored_keys())
        assert len(stored) >= 12
        ctx = ReqContext("after")
        checked = 0
        for batch in range(0, len(stored), 32):
            keys = stored[batch:batch + 32]
            for k in keys:
                assert manager.lookup(k, ctx) is None  # a promotion starts
            manager.on_schedule_end()
            tier.drain_jobs()
            manager.poll()
            for k in keys:
                assert manager.phase(k).kind is PhaseKind.READY, k
                slot = manager.slot_of(k)
                assert slot is not None
                seed = int.from_bytes(k[:8], "big")
                want = np.random.default_rng(seed).integers(0, 256, CHUNK, dtype=np.uint8)
                assert np.array_equal(memory[slot], want), f"bytes of {k!r}"
                checked += 1
            manager.reset_cache()
        assert checked == len(stored)
    finally:
        manager.shutdown()
