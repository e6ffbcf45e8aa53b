"""The blind corpus: every manager, how to audit it, and (for defects) the slip.

Audit options follow README "Audit your own backend": ``policy`` is
``--policy``, ``reuse_threshold`` is ``--reuse-threshold`` (None: not a
filter), ``flags`` are extra CLI flags (none of these managers needs
``--legacy``, ``--no-typed-errors`` or ``--no-reset``). ``twin`` is the
correct manager a defect was derived from; ``rule`` the documented rule the
slip breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["lru", "arc", "any"]
PKG = "tests.blind_corpus"


@dataclass(frozen=True)
class Entry:
    name: str
    design: str
    factory: str  # "module.path:function", takes num_blocks
    policy: Policy
    reuse_threshold: int | None = None
    tracker_size: int | None = None  # --tracker-size (reuse filters with a small table)
    flags: tuple[str, ...] = field(default=())
    defect: str | None = None  # None: a correct manager
    rule: str | None = None
    twin: str | None = None

    @property
    def correct(self) -> bool:
        return self.defect is None

    def cli_args(self) -> list[str]:
        args = ["--target", self.factory, "--policy", self.policy]
        if self.reuse_threshold is not None:
            args += ["--reuse-threshold", str(self.reuse_threshold)]
        if self.tracker_size is not None:
            args += ["--tracker-size", str(self.tracker_size)]
        return args + list(self.flags)


def _f(module: str, fn: str) -> str:
    return f"{PKG}.{module}:{fn}"


CORRECT: list[Entry] = [
    Entry("odict_lru", "OrderedDict LRU", _f("odict_lru", "make"), "lru"),
    Entry("counter_lru", "timestamp LRU", _f("counter_lru", "make"), "lru"),
    Entry("heap_lru", "heap LRU, lazy deletion", _f("heap_lru", "make"), "lru"),
    Entry("log_lru", "append-only log LRU", _f("log_lru", "make"), "lru"),
    Entry("clock_slab", "CLOCK slab, own spec class", _f("clock_slab", "make"), "any"),
    Entry("random_any", "seeded random victims", _f("random_any", "make"), "any"),
    Entry("arc4", "four-list ARC", _f("arc4", "make"), "arc"),
    Entry(
        "tagged_arc", "ARC, one tagged record per key", _f("tagged_arc", "make"), "arc"
    ),
    Entry(
        "reuse_gate",
        "own reuse filter over CPUOffloadingManager",
        _f("reuse_gate", "make"),
        "lru",
        2,
    ),
    Entry(
        "reuse_gate3",
        "own reuse filter, threshold 3",
        _f("reuse_gate", "make_threshold3"),
        "lru",
        3,
    ),
    Entry(
        "reuse_gate_small",
        "own reuse filter, 3-entry table",
        _f("reuse_gate", "make_small_table"),
        "lru",
        2,
        3,
    ),
    Entry(
        "fifo_core",
        "FIFO CachePolicy in OffloadingManagerCore",
        _f("plugged_core", "make_fifo"),
        "any",
    ),
    Entry(
        "stack_backend_lru",
        "own Backend under LRUOffloadingManager",
        _f("plugged_core", "make_stack_lru"),
        "lru",
    ),
    Entry(
        "stack_backend_arc",
        "own Backend + ARCCachePolicy in the core",
        _f("plugged_core", "make_stack_arc"),
        "arc",
    ),
]

_TWIN_POLICY: dict[str, tuple[str, Policy, int | None, int | None]] = {
    e.name: (e.design, e.policy, e.reuse_threshold, e.tracker_size) for e in CORRECT
}


def _d(twin: str, module: str, fn: str, defect: str, rule: str) -> Entry:
    design, policy, threshold, tracker = _TWIN_POLICY[twin]
    return Entry(
        name=f"{twin}.{fn.removeprefix('make_')}",
        design=design,
        factory=_f(module, fn),
        policy=policy,
        reuse_threshold=threshold,
        tracker_size=tracker,
        defect=defect,
        rule=rule,
        twin=twin,
    )


DEFECTS: list[Entry] = [
    # A: OrderedDict LRU
    _d(
        "odict_lru",
        "odict_lru",
        "make_refuses_at_exact_fit",
        "refuses when eligible victims == need ('>' for '>=')",
        "§4 liveness / inv. 5",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_protects_only_new",
        "protects only the new offered keys; a tracked offered key can be evicted",
        "§4 room / inv. 3",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_touch_forward",
        "touch walks forward, so the last key ends most recent",
        "§4 touch / §6 LRU",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_failed_store_announced",
        "complete_store(success=False) emits a stored event",
        "§3 table (never announced) / inv. 6",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_non_atomic_refusal",
        "pops victims one by one, then returns None when short: refusal changes state",
        "§4 room / inv. 4",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_no_dedup_on_offer",
        "repeated keys in one offer are not deduplicated: two slots for one key",
        "§4 prepare_store dedup / inv. 1, 7",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_keyerror_on_unknown_store",
        "complete_store of an untracked key raises KeyError, not IllegalTransitionError",
        "§4 complete_store Pre / README typed errors",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_store_completion_refreshes",
        "complete_store(success=True) moves the key to the MRU end",
        "§4 complete_store (recency unchanged)",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_events_not_drained",
        "take_events returns the queue without emptying it",
        "§4 take_events / inv. 6 events_taken",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_failure_drops_ready",
        "complete_store(success=False) also drops READY keys",
        "§3 table (READY: no-op) / inv. 2, 6",
    ),
    _d(
        "odict_lru",
        "odict_lru",
        "make_filters_after_slicing",
        "takes the `need` oldest keys, then drops pinned/offered ones: refuses when room exists",
        "§4 liveness / inv. 5",
    ),
    # B: timestamp LRU
    _d(
        "counter_lru",
        "counter_lru",
        "make_evicts_loading",
        "LOADING blocks are eligible victims (ref >= 0)",
        "§2 evictable / inv. 2",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_evicts_pending",
        "PENDING blocks are eligible victims (ref <= 0)",
        "§2 evictable / inv. 2",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_nothing_new_touches",
        "an offer with nothing new still refreshes the offered keys' recency",
        "§4 nothing new: not even recency",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_repeated_load_once",
        "prepare_load adds one load per distinct key, not per occurrence",
        "§4 prepare_load multiset",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_load_pins_before_check",
        "prepare_load pins earlier keys before raising on a later bad key",
        "§4 Pre: no change / inv. 0",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_load_refreshes",
        "prepare_load bumps recency",
        "§4 prepare_load: no recency change",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_empty_stored_event",
        "complete_store emits a stored event even when no key was PENDING",
        "§4 complete_store: at least one such key / inv. 6",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_touch_skips_pending",
        "touch ignores PENDING keys",
        "§6 LRU touch: each tracked key (any phase)",
    ),
    _d(
        "counter_lru",
        "counter_lru",
        "make_store_completes_before_checking",
        "complete_store marks earlier keys READY, then raises on an untracked one",
        "§4 complete_store Pre: no change",
    ),
    # C: heap LRU
    _d(
        "heap_lru",
        "heap_lru",
        "make_free_list_fifo",
        "freed slots reused oldest first",
        "§4 Post 2 (LIFO) / inv. 7",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_reset_keeps_slot_order",
        "after reset, slots are handed out from the old high-water mark down",
        "§4 reset_cache: ascending again",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_reset_announces_pending",
        "reset's removed event also lists PENDING keys",
        "§4 reset_cache / inv. 6",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_unload_ignores_repeats",
        "complete_load checks each occurrence against the old count ([A, A] on LOADING(1) passes)",
        "§4 complete_load Pre",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_event_per_victim",
        "one removed event per victim instead of one per call",
        "§4 Post 1 (one event) / inv. 6",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_failed_store_leaks_slot",
        "a failed store never returns its slot",
        "§4 complete_store failure / inv. 1, 5",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_stale_heap_entries",
        "stale heap entries of a touched key are taken as live: it is evicted by its old tick",
        "§6 LRU victims",
    ),
    _d(
        "heap_lru",
        "heap_lru",
        "make_removed_event_reversed",
        "removed events list their keys reversed (eviction order, and reset's slot order)",
        "§4 Post 1 / reset_cache order",
    ),
    # D: CLOCK slab
    _d(
        "clock_slab",
        "clock_slab",
        "make_single_pass",
        "the sweep stops after one revolution: refuses when every eligible block is referenced",
        "§4 liveness / inv. 5",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_evicts_for_whole_batch",
        "when short of room evicts len(new) blocks, ignoring the free slots",
        "inv. 5 (exactly max(0, len(new) - free))",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_unload_clears_all_loads",
        "any complete_load makes LOADING(n) READY",
        "§3 table LOADING(n) -> LOADING(n-1)",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_first_empty_slot",
        "new keys take the lowest empty slot, not the backend's order",
        "§4 Post 2 slot order",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_reannounces_stored",
        "complete_store(success=True) re-announces READY/LOADING keys",
        "§3 table (no-op) / inv. 6",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_double_free_on_failure",
        "a failed store frees its slot twice: the slot is handed to two keys",
        "inv. 1 capacity (distinct slots)",
    ),
    _d(
        "clock_slab",
        "clock_slab",
        "make_prefix_counts_all_hits",
        "lookup_prefix counts every readable key, not the prefix",
        "§4 lookup_prefix",
    ),
    # E: four-list ARC
    _d(
        "arc4",
        "arc4",
        "make_ghosts_not_trimmed",
        "ghost lists are never trimmed to capacity",
        "§6 ARC trim / inv. 0",
    ),
    _d(
        "arc4",
        "arc4",
        "make_b1_delta_inverted",
        "B1 hit uses len(B1)/len(B2) for delta",
        "§6 ARC touch in B1",
    ),
    _d(
        "arc4",
        "arc4",
        "make_prefer_t1_strict",
        "prefers T1 only if virtual_t1 > int(target)",
        "§6 ARC victims",
    ),
    _d(
        "arc4",
        "arc4",
        "make_virtual_t1_frozen",
        "virtual_t1 not decremented after a T1 victim",
        "§6 ARC victims",
    ),
    _d(
        "arc4",
        "arc4",
        "make_insert_keeps_ghost",
        "a re-stored key stays in B1/B2",
        "§6 ARC insert / inv. 0",
    ),
    _d(
        "arc4",
        "arc4",
        "make_promotes_pending",
        "touch promotes a PENDING key from T1 to T2",
        "§6 ARC touch",
    ),
    _d(
        "arc4",
        "arc4",
        "make_reset_keeps_target",
        "reset_cache keeps the target",
        "§4 reset_cache (ARC target 0.0)",
    ),
    _d(
        "arc4",
        "arc4",
        "make_failed_store_ghosted",
        "a failed store leaves a B1 ghost",
        "§4 complete_store failure / §6 ARC",
    ),
    _d(
        "arc4",
        "arc4",
        "make_no_fallback_list",
        "textbook ARC: no fallback to the other list, refuses when room exists",
        "§6 ARC fallback / inv. 5",
    ),
    _d(
        "arc4",
        "arc4",
        "make_target_not_clamped",
        "target not clamped to capacity on a B1 hit",
        "§6 ARC / inv. 0",
    ),
    # K: tagged-record ARC
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_b2_delta_inverted",
        "B2 hit uses len(B2)/len(B1) for delta",
        "§6 ARC touch in B2",
    ),
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_trims_newest_ghost",
        "ghost trimming drops the most recent ghosts",
        "§6 ARC trim from the LRU end",
    ),
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_t2_victims_to_b1",
        "T2 victims are remembered in B1",
        "§6 ARC: T2 victims join B2",
    ),
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_ghost_hit_stays_put",
        "a ghost hit adapts the target but does not move the key to its list's MRU end",
        "§6 ARC touch in B1/B2",
    ),
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_virtual_t1_counts_stored",
        "virtual_t1 counts only READY/LOADING members of T1",
        "§6 ARC: len(T1), all members, any phase",
    ),
    _d(
        "tagged_arc",
        "tagged_arc",
        "make_target_not_truncated",
        "preference compares virtual_t1 with the float target, not int(target)",
        "§6 ARC victims",
    ),
    # F: reuse gate
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_forgets_protection",
        "stored offered keys below threshold are not passed on, so they can be evicted",
        "§7 protection rule / inv. 3",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_prefix_stops_at_miss",
        "lookup_prefix stops counting at the first miss",
        "§7 lookup_prefix counts every key",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_store_counts_offers",
        "prepare_store counts the offered keys",
        "§7 counts do not change",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_threshold_strict",
        "count > threshold instead of >=",
        "§7 prepare_store",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_reset_keeps_counts",
        "reset_cache keeps the count table",
        "§7 reset_cache empties the table",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_validates_passed_only",
        "invalid keys are dropped silently instead of InvalidKeyError",
        "§7 validate every key",
    ),
    _d(
        "reuse_gate",
        "reuse_gate",
        "make_lookup_not_counted",
        "lookup (single key) does not count",
        "§7 lookup records the key",
    ),
    _d(
        "reuse_gate_small",
        "reuse_gate",
        "make_small_forgets_protection",
        "stored offered keys below threshold not passed on (small table: reachable)",
        "§7 protection rule / inv. 3",
    ),
    _d(
        "reuse_gate_small",
        "reuse_gate",
        "make_small_drops_newest",
        "a full table drops its most recent entry",
        "§7 recording a key",
    ),
    _d(
        "reuse_gate_small",
        "reuse_gate",
        "make_small_recount_keeps_place",
        "recounting a key does not move it to the MRU end",
        "§7 recording a key",
    ),
    # G: FIFO CachePolicy in the library core
    _d(
        "fifo_core",
        "plugged_core",
        "make_fifo_ignores_protected",
        "evict ignores the protected (offered) keys",
        "inv. 3 / CachePolicy.evict contract",
    ),
    _d(
        "fifo_core",
        "plugged_core",
        "make_fifo_evicts_readers",
        "evict takes LOADING blocks (ref_cnt >= 0)",
        "inv. 2 / CachePolicy.evict contract",
    ),
    _d(
        "fifo_core",
        "plugged_core",
        "make_fifo_partial_evict",
        "evict removes blocks before giving up and returning None",
        "inv. 4 / CachePolicy.evict atomic",
    ),
    # H: append-only log LRU
    _d(
        "log_lru",
        "log_lru",
        "make_compaction_keeps_stored_only",
        "compaction drops records of PENDING keys: they leave the recency order",
        "§6 LRU / inv. 5",
    ),
    _d(
        "log_lru",
        "log_lru",
        "make_touch_forgets_latest",
        "touch appends a record but does not mark it latest",
        "§6 LRU touch",
    ),
    _d(
        "log_lru",
        "log_lru",
        "make_compaction_forgets_renumber",
        "compaction renumbers records without updating last[]",
        "§6 LRU / inv. 5",
    ),
    _d(
        "log_lru",
        "log_lru",
        "make_rejects_bare_group_keys",
        "rejects 4-byte keys (len <= 4 for < 4)",
        "§1 Key: at least 4 bytes",
    ),
    # I: random victims
    _d(
        "random_any",
        "random_any",
        "make_draws_with_replacement",
        "victims drawn with replacement: the same key twice, crash mid-eviction",
        "inv. 5 (distinct victims) / §4",
    ),
    # J: own Backend
    _d(
        "stack_backend_lru",
        "plugged_core",
        "make_backend_fifo_free",
        "backend reuses freed slots oldest first",
        "§4 Post 2 (LIFO)",
    ),
    _d(
        "stack_backend_lru",
        "plugged_core",
        "make_backend_sorted_spec",
        "backend's load/store spec lists the slots sorted, not in key order",
        "§4 prepare_load (slots in call order) / inv. 7",
    ),
    _d(
        "stack_backend_lru",
        "plugged_core",
        "make_backend_undercounts",
        "backend reports one free slot fewer than it has",
        "§4 room / inv. 5",
    ),
    _d(
        "stack_backend_lru",
        "plugged_core",
        "make_backend_resetless",
        "backend reset frees tracked slots but keeps the fresh mark",
        "§4 reset_cache: ascending again",
    ),
]

MANIFEST: list[Entry] = CORRECT + DEFECTS
