"""F9 (convention, 0.33): the fs tier answers MISS for a key whose store
has completed, while a request that asked before is open.

tiering/async_lookup.py caches each key's probe verdict until every request
that asked about it has finished (``on_request_finished``). A key probed
before its cascade landed stays MISS, for that request and for any other,
after the cascade reports success. A MISS there is safe (a hit is lost, nothing is
corrupted), so this is a convention, the profile option
``tier_stale_misses`` (True for ``vllm-0.33``); under the default profile
the kit reads such a MISS as an eviction: ``T0 tier lifecycle`` (no
cascade was submitted since the key was seen held, ``tier_evicts_on_store``),
else ``T1 tier readable`` when a promotion of the key then succeeds.

    python docs/findings/F9_fs_tier_stale_miss.py DIR...   (0.33 or later)
"""

import importlib
import mmap
import shutil
import sys
import tempfile
import time

from release_calls import for_each_release, key

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
    view = memoryview(memory).cast("B", (2, CHUNK))
    root = tempfile.mkdtemp()
    tier = fs.FileSystemTierManager(offloading_spec_record(), view, "fs", root_dir=root,
                                    n_read_threads=1, n_write_threads=1)
    try:
        a, ctx = key("A"), req(req_id="r1")
        before = settle(tier, a, ctx)
        tier.submit_store(base.TransferJob(0, [a], np.array([0]), False, ctx))
        tier.drain_jobs()
        stored = [(r.job_id, r.success) for r in tier.get_finished_jobs()]
        after = settle(tier, a, ctx)
        fresh = settle(tier, a, req(req_id="r2"))
        tier.on_request_finished(ctx)
        print(f"  lookup {before}; cascade {stored}; same request: {after}; "
              f"another request: {fresh}")
        return stored == [(0, True)] and after == "MISS"
    finally:
        tier.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(for_each_release(check))
