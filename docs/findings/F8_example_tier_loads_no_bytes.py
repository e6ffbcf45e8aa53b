"""F8 (defect, 0.33): the example tier reports a promotion successful
without writing a byte into the primary slots.

tiering/example/manager.py keeps only the presence of each key
(``self.chunks[key] = True``) and completes every job at once: a cascade
copies nothing out of the primary, a promotion copies nothing into it and
reports ``success=True``. The tiering manager then hands the GPU whatever
the slot held before. Its docstring calls it "a reference for writing new
tiers". The kit reports ``T1 tier readable`` ("the promotion wrote nothing
there").

    python docs/findings/F8_example_tier_loads_no_bytes.py DIR...   (0.33 or later)
"""

import importlib
import sys

from release_calls import for_each_release, key

from kvoffload.stateful.vllm_tiers import has_tiering, offloading_spec_record

CHUNK = 64


def check(release):
    if not has_tiering(release):
        print("  no kv_offload/tiering in this release")
        return False
    import numpy as np

    example = importlib.import_module("vllm.v1.kv_offload.tiering.example.manager")
    base = importlib.import_module("vllm.v1.kv_offload.tiering.base")
    ctx = importlib.import_module("vllm.v1.kv_offload.base").ReqContext(req_id="r")
    memory = bytearray(2 * CHUNK)
    view = memoryview(memory).cast("B", (2, CHUNK))
    tier = example.ExampleSecondaryTierManager(offloading_spec_record(), view, "example")
    a = key("A")
    memory[0:CHUNK] = b"\xaa" * CHUNK  # A's chunk, in primary slot 0
    tier.submit_store(base.TransferJob(0, [a], np.array([0]), False, ctx))
    stored = [(r.job_id, r.success) for r in tier.get_finished_jobs()]
    tier.submit_load(base.TransferJob(1, [a], np.array([1]), True, ctx))
    loaded = [(r.job_id, r.success) for r in tier.get_finished_jobs()]
    holds_a = bytes(memory[CHUNK:]) == b"\xaa" * CHUNK
    print(f"  cascade {stored}, promotion into slot 1 {loaded}; slot 1 holds A's bytes: "
          f"{holds_a}")
    return loaded == [(1, True)] and not holds_a


if __name__ == "__main__":
    sys.exit(for_each_release(check))
