"""F11 (convention, 0.33): the fs tier reports a cascade failed as a whole
although the keys it wrote before the failing one stay readable.

tiering/fs/manager.py submits one task per store job, io.py's
``batch_store_block``, which writes the keys one after another and "raises
on first error"; the job is then reported ``success=False`` with no
``successful_keys`` (every key failed), while the files of the keys written
before the error stay in place and ``lookup`` answers HIT for them. Their
bytes are whole (each file is written then renamed), so nothing is
corrupted: a key the manager believes absent is readable. Here the second
key's write fails because its directory cannot be made (a regular file
stands where it goes), as a full disk or an I/O error would make it fail.
The kit's disk faults (profile option ``tier_disk_faults``) are off for
``vllm-0.33`` for this reason; the default profile wants a failed key
unreadable (``T1 tier readable``).

    python docs/findings/F11_fs_tier_failed_batch_keeps_keys.py DIR...   (0.33 or later)
"""

import importlib
import mmap
import os
import shutil
import sys
import tempfile
import time

from release_calls import for_each_release, key

from kvoffload.spec.keys import make_offload_key
from kvoffload.stateful.vllm_tiers import has_tiering, offloading_spec_record

CHUNK = 4096


def settle(tier, k, ctx):
    """Ask until the answer is not RETRY (flushing the probe batch)."""
    for _ in range(200):
        answer = tier.lookup(k, ctx)
        if answer.name != "RETRY":
            return answer.name
        tier.on_schedule_end(None)
        time.sleep(0.005)
    return "RETRY"


def check(release):
    if not has_tiering(release):
        print("  no kv_offload/tiering in this release")
        return False
    import numpy as np

    fs = importlib.import_module("vllm.v1.kv_offload.tiering.fs.manager")
    base = importlib.import_module("vllm.v1.kv_offload.tiering.base")
    req = importlib.import_module("vllm.v1.kv_offload.base").ReqContext
    memory = mmap.mmap(-1, 2 * CHUNK)
    memory[:CHUNK] = b"A" * CHUNK
    view = memoryview(memory).cast("B", (2, CHUNK))
    root = tempfile.mkdtemp()
    tier = fs.FileSystemTierManager(offloading_spec_record(), view, "fs", root_dir=root,
                                    n_read_threads=1, n_write_threads=1)
    try:
        a = key("A")
        b = make_offload_key(bytes(a)[:8], 1)  # same block, group 1: another directory
        blocker = os.path.dirname(tier.file_mapper.get_file_name(b))
        os.makedirs(os.path.dirname(blocker), exist_ok=True)
        with open(blocker, "w") as f:  # B's directory cannot be made: its write fails
            f.write("not a directory")
        ctx = req(req_id="r1")
        tier.submit_store(base.TransferJob(0, [a, b], np.array([0, 1]), False, ctx))
        tier.drain_jobs()
        results = [(r.job_id, r.success, r.successful_keys) for r in tier.get_finished_jobs()]
        answer = settle(tier, a, req(req_id="r2"))
        print(f"  cascade of [A, B] reported {results}; lookup(A) afterwards: {answer}")
        failed = bool(results) and not results[0][1] and results[0][2] is None
        return failed and answer == "HIT"
    finally:
        tier.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(for_each_release(check))
