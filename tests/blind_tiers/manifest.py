"""The corpus: every tier, its factory, its design, and whether it is
correct; a defective entry says its one defect in a line.

Each factory is ``make(capacity_blocks, primary_kv_view)`` at the dotted path
``tests.blind_tiers.<module>.<function>``. ``kit_visible`` is False for a
defect that only breaks the design's own declared policy (LRU order), not
the tier contract itself. ``policy`` names the replacement policy a design
declares (``"lru"`` for design (e), the only one that promises an order;
None where the victim choice is the tier's own business).
"""

from __future__ import annotations

import importlib

import attrs

from kvoffload.spec.profile import DEFAULT, LOSSY_TIER, Profile, profile_named
from tests.blind_tiers._common import TierFactory

DESIGNS: dict[str, str] = {
    "dict_poll": "(a) in-memory dict, jobs completed at poll time",
    "thread_worker": "(b) worker thread and queue, lock-protected index",
    "file_chunks": "(c) file per chunk, write to temp and rename, two I/O threads",
    "slab_file": "(d) one slab file with a slot allocator, I/O at poll time",
    "lru_bounded": "(e) LRU-bounded tier with eviction and touch",
    "async_lookup": "(f) lookups answer RETRY until an index query finishes",
    "partial_faults": "(g) lossy backend: jobs succeed for some keys only",
    "zlib_compressed": "(h) zlib-compressed chunks, raw when incompressible",
    "events_dict": "(i) the dict tier announcing stored and removed keys as events",
}


@attrs.frozen
class Entry:
    name: str
    factory: str
    design: str
    correct: bool
    defect: str | None = None
    kit_visible: bool = True
    policy: str | None = None

    def profile(self) -> Profile:
        """The profile a user of this design audits with: the lossy design
        (g) declares that its reads fail (AUTHOR_NOTES.md: every 3rd chunk
        read fails), so a promotion of a HIT key may fail
        (``tier_loads_succeed=False``); every other design, the default."""
        return profile_named(_PROFILES.get(self.design, DEFAULT.name))

    def load(self) -> TierFactory:
        module, _, attr = self.factory.rpartition(".")
        fn: TierFactory = getattr(importlib.import_module(module), attr)
        return fn


_POLICIES = {"lru_bounded": "lru"}
_PROFILES = {"partial_faults": LOSSY_TIER.name}


def _ok(design: str) -> Entry:
    return Entry(
        f"{design}.correct",
        f"tests.blind_tiers.{design}.make",
        design,
        True,
        policy=_POLICIES.get(design),
    )


def _bad(design: str, short: str, defect: str, kit_visible: bool = True) -> Entry:
    return Entry(
        f"{design}.{short}",
        f"tests.blind_tiers.{design}.make_{short}",
        design,
        False,
        defect,
        kit_visible,
        _POLICIES.get(design),
    )


ENTRIES: tuple[Entry, ...] = (
    _ok("dict_poll"),
    _bad("dict_poll", "reports_twice", "get_finished_jobs never empties its results: every job is reported again at each poll"),
    _bad("dict_poll", "store_row_off_by_one", "a store copies primary row chunk_id + 1 instead of chunk_id"),
    _bad("dict_poll", "drain_drops_queued", "drain_jobs cancels queued jobs without reporting a result for them (jobs lost)"),
    _bad("dict_poll", "failed_store_indexed", "a store that found no room is reported failed but its key is indexed anyway (failed store reads HIT)"),
    _bad("dict_poll", "evicts_pinned", "eviction ignores the pins of queued loads: a key being loaded is evicted and its load fails"),
    _bad("dict_poll", "pending_ignores_results", "has_pending_work is False while finished results wait to be taken"),
    _bad("dict_poll", "truthiness_on_chunk_ids", "tests `not job.chunk_ids`: a vLLM job (chunk_ids a numpy array of 2+ ids) makes submit raise"),
    _ok("thread_worker"),
    _bad("thread_worker", "copy_on_write_index_race", "the worker rebuilds the index without the lock: a key the caller evicts meanwhile comes back and capacity is exceeded"),
    _bad("thread_worker", "drain_polls_queue", "drain_jobs waits for the queue to empty, not for the worker: it returns with a job in flight and its result missing"),
    _bad("thread_worker", "indexed_at_submit", "a placeholder index entry at submit makes the key HIT before its copy ran"),
    _bad("thread_worker", "load_zero_fills_past_end", "a load zero-fills one row past the job's last row (writes a row that is not its job's)"),
    _bad("thread_worker", "takes_results_unlocked", "get_finished_jobs copies then clears the results without the lock: a result published in between is lost"),
    _bad("thread_worker", "reports_at_submit", "a store is reported finished when queued, before the worker copied the (then unpinned, reused) primary rows"),
    _bad("thread_worker", "drain_event_starts_clear", "drain_jobs waits on an 'all done' event that starts clear: on a tier that never ran a job it blocks"),
    _bad("thread_worker", "shutdown_without_join", "shutdown posts the stop sentinel and returns while the worker still runs a job"),
    _bad("thread_worker", "load_reports_before_copy", "a load is reported finished (keys unpinned) before the worker writes its primary rows"),
    _ok("file_chunks"),
    _bad("file_chunks", "writes_in_place", "writes straight to the final file name: a half-written chunk reads HIT and loads torn"),
    _bad("file_chunks", "renames_before_writing", "renames the temporary file into place before writing it: the final file exists short while the write goes on"),
    _bad("file_chunks", "evicts_while_loading", "eviction deletes the file of a chunk a load is reading: the load fails"),
    _bad("file_chunks", "renames_failed_write", "renames the temporary file in a finally: a failed write is put in place and reads HIT"),
    _bad("file_chunks", "file_name_ignores_group", "files are named by block hash without the KV-group index: two groups of one block share a file"),
    _bad("file_chunks", "shutdown_keeps_directory", "shutdown stops the threads but leaves the chunk files and the temporary directory behind"),
    _bad("file_chunks", "skipped_key_reported_early", "a job skipping a key in flight in an earlier job reports it failed before that job stores it (the key then reads HIT)"),
    _ok("slab_file"),
    _bad("slab_file", "bump_allocator", "the allocator hands out slot 'number of chunks held', a slot still in use after an eviction (double allocation)"),
    _bad("slab_file", "refreshes_present_key", "a store of a key already held rewrites its slot from the new row instead of skipping it"),
    _bad("slab_file", "one_slot_too_many", "evicts only when over capacity (> for >=): holds capacity_blocks + 1 chunks"),
    _bad("slab_file", "skip_misaligns_rows", "skipping keys already held drops their keys but not their chunk ids: later keys are copied from the wrong rows"),
    _bad("slab_file", "sorted_reads_permute_rows", "a load reads chunks in slab order but assigns rows in job order: keys land in each other's rows"),
    _ok("lru_bounded"),
    _bad("lru_bounded", "touch_adds_absent", "touch inserts keys it does not hold: a never-stored key reads HIT"),
    _bad("lru_bounded", "touch_demotes", "touch moves keys to the least-recent end: touched chunks are evicted first (breaks the declared LRU policy only)", kit_visible=False),
    _bad("lru_bounded", "ignores_in_flight", "in-flight stores do not count against capacity: stores submitted before a poll overfill the tier"),
    _bad("lru_bounded", "stale_bytes_cache", "presence is asked of a bytes map eviction does not clear: a key stored again after eviction is reported stored and reads MISS"),
    _ok("async_lookup"),
    _bad("async_lookup", "coalesced_query_starves", "coalesced index queries answer only the first request: a second request asking meanwhile gets RETRY forever"),
    _bad("async_lookup", "caches_answer_for_request", "a resolved answer is cached for the request and not re-checked: an evicted key still reads HIT"),
    _bad("async_lookup", "counts_reserved_as_present", "a key whose store is only queued reads HIT"),
    _ok("partial_faults"),
    _bad("partial_faults", "success_set_not_reset", "successful_keys accumulate across jobs: a result names keys not in its job"),
    _bad("partial_faults", "failed_position_off_by_one", "failed positions are recorded off by one: successful_keys claims the failed key and drops the next"),
    _bad("partial_faults", "index_before_write", "the key is indexed before the backend write and left there when it fails: a failed store reads HIT"),
    _bad("partial_faults", "success_if_any", "success is True when any key made it, with a partial successful_keys"),
    _ok("zlib_compressed"),
    _bad("zlib_compressed", "raw_flag_lost", "incompressible chunks are kept raw but always decompressed on load: they read HIT and never load"),
    _bad("zlib_compressed", "budget_in_bytes", "capacity is a byte budget of compressed sizes: compressible chunks overfill capacity_blocks"),
    _bad("zlib_compressed", "lazy_compression", "a store keeps a view of the primary row instead of a copy: the chunk reads back whatever the row holds later"),
    _ok("events_dict"),
    _bad("events_dict", "announces_failed_keys", "announces as stored the keys of a job that found no room and were never stored"),
    _bad("events_dict", "silent_eviction", "evicts without a removed event: consumers keep the victims"),
    _bad("events_dict", "announces_at_submit", "announces keys stored when the store is submitted, before they are readable"),
    _bad("events_dict", "announces_skipped", "announces skipped (already held) keys as stored again: stored twice with no removed between"),
)

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}

#: The same, as plain dicts (name, factory, design, correct, defect, kit_visible,
#: policy).
MANIFEST: list[dict[str, object]] = [attrs.asdict(e) for e in ENTRIES]


def correct_entry(design: str) -> Entry:
    """The correct tier of ``design``."""
    (entry,) = [e for e in ENTRIES if e.design == design and e.correct]
    return entry
