"""F10 (defect, 0.33): the tiering manager's ``reset_cache`` announces a
promotion it drops.

tiering/manager.py ``reset_cache`` drains the tiers and takes their
finished jobs (``_process_finished_jobs``) before resetting the primary
tier: a promotion in flight completes there, and the primary's
``complete_store`` queues a ``stored`` event for its key. The primary's
``reset_cache`` then drops every chunk, that key's included, announcing
nothing (the engine publishes its own all-cleared event, F5). The engine
took the queue before the reset, so the next ``take_events`` hands a
consumer (a KV-event router) "stored" for a chunk the CPU tier no longer
holds, after the all-cleared. The kit reports ``6 events`` ("events
[stored [K[..]]], expected []") on the ``tiered`` row of ``audit --vllm``.

    python docs/findings/F10_reset_announces_dropped_promotion.py DIR...   (0.33 or later)
"""

import importlib
import sys
import uuid

from release_calls import for_each_release, key, show

from kvoffload.stateful.vllm_tiers import has_tiering, offloading_spec_record

CHUNK = 4096


def check(release):
    if not has_tiering(release):
        print("  no kv_offload/tiering in this release")
        return False
    tiering = importlib.import_module("vllm.v1.kv_offload.tiering.manager")
    regions = importlib.import_module("vllm.v1.kv_offload.cpu.shared_offload_region")
    example = importlib.import_module("vllm.v1.kv_offload.tiering.example.manager")
    # one primary chunk, in /dev/shm, and the example tier over it
    region = regions.SharedOffloadRegion(f"f10-{uuid.uuid4().hex}", 1, None, CHUNK, CHUNK)
    primary = tiering.CPUPrimaryTierOffloadingManager(1, region, enable_events=True)
    tier = example.ExampleSecondaryTierManager(
        offloading_spec_record(), primary.get_kv_memoryview(), "example"
    )
    m = tiering.TieringOffloadingManager(primary, [tier], tier_poll_interval_s=0)
    step_end = release.schedule_end_context((), ())
    ctx = release.new_context("req-1")
    a, b = key("A"), key("B")
    try:
        m.on_new_request(ctx)
        m.prepare_store([a], ctx)
        m.complete_store([a], ctx)  # A in the primary, cascaded to the tier
        m.prepare_store([b], ctx)  # B evicts A from the primary
        m.complete_store([b], ctx)
        m.on_schedule_end(step_end)
        answer = m.lookup(a, ctx)  # A only in the tier: a promotion starts
        m.on_schedule_end(step_end)  # the promotion is submitted
        list(m.take_events())  # the engine takes the queue, then resets
        m.reset_cache()
        after = [(show(e.keys), "removed" if e.removed else "stored") for e in m.take_events()]
        in_primary = primary.lookup(a, ctx).name
    finally:
        m.shutdown()
    print(f"  lookup(A) before the reset: {answer.name}; events queued by the reset: "
          f"{after}; the primary's lookup(A) after it: {in_primary}")
    return ("[A]", "stored") in after and in_primary != "HIT"


if __name__ == "__main__":
    sys.exit(for_each_release(check))
