"""The corpus' own scenario tests (no conformance kit involved).

* every defective manager differs from its correct twin on a concrete call
  sequence, observed through the documented contract only (results, typed
  errors, events);
* every correct manager handles the worked examples of docs/SPEC.md and a
  set of sequences the same way as the library's reference managers (LRU,
  ARC, reuse filter), or is accepted step by step by the executable model of
  SPEC.md §8 (policy "any").
"""

from __future__ import annotations

import importlib
import random
from typing import cast

import pytest

from kvoffload import (
    CPUOffloadingManager,
    FilterReusedOffloadingManager,
    IllegalTransitionError,
    InvalidKeyError,
    OffloadingError,
    OffloadingManager,
    OffloadKey,
    Phase,
    PhaseKind,
    make_offload_key,
)

from . import log_lru, reuse_gate
from ._trace import CTX, Factory, K, Script, model_check, random_script, trace
from .manifest import CORRECT, DEFECTS, MANIFEST, Entry


def load(path: str) -> Factory:
    module, fn = path.split(":")
    factory: Factory = getattr(importlib.import_module(module), fn)
    return factory


TWINS = {e.name: e for e in CORRECT}

# Key indices: A=0, B=1, C=2, ... (``K(i)`` builds the key).
A, B, C, D, E, F, G, H, I = range(9)  # noqa: E741
X = 9  # a key only ever offered and failed

# name -> (num_blocks, script) on which the defect's trace differs from its
# twin's. The ARC ones and a few others are derived by hand (comments); the
# short ones are minimal sequences. A "lookup" step calls lookup_prefix(keys)
# and then lookup(k) per key, so a reuse filter counts each key twice.
WITNESSES: dict[str, tuple[int, Script]] = {
    "odict_lru.refuses_at_exact_fit": (
        1,
        [("store", [0]), ("ok", [0]), ("store", [1])],
    ),
    "odict_lru.protects_only_new": (
        1,
        [("store", [3, 3]), ("ok", [3]), ("store", [3, 0])],
    ),
    "odict_lru.touch_forward": (
        2,
        [("store", [2, 0, 0]), ("ok", [2, 2, 0]), ("touch", [2, 0]), ("store", [1])],
    ),
    "odict_lru.failed_store_announced": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1])],
    ),
    "odict_lru.non_atomic_refusal": (
        2,
        [
            ("store", [1, 0, 1]),
            ("ok", [0]),
            ("store", [5, 4, 3]),
            ("lookup", [1, 0, 2]),
        ],
    ),
    "odict_lru.no_dedup_on_offer": (2, [("store", [0, 2, 0])]),
    "odict_lru.keyerror_on_unknown_store": (1, [("ok", [1])]),
    "odict_lru.store_completion_refreshes": (
        4,
        [
            ("store", [1, 2, 0]),
            ("store", [3, 3]),
            ("ok", [3]),
            ("ok", [0, 2]),
            ("store", [4, 0]),
        ],
    ),
    "odict_lru.events_not_drained": (
        1,
        [("store", [0]), ("ok", [0, 0]), ("events", [1])],
    ),
    "counter_lru.evicts_loading": (
        2,
        [
            ("store", [2, 1, 2]),
            ("ok", [1, 1, 2]),
            ("load", [1, 1, 2]),
            ("store", [0, 1]),
        ],
    ),
    "counter_lru.evicts_pending": (1, [("store", [0]), ("store", [3, 3])]),
    "counter_lru.nothing_new_touches": (
        3,
        [
            ("store", [3]),
            ("store", [2, 2, 0]),
            ("ok", [0, 0]),
            ("store", [3]),
            ("store", [2, 1]),
            ("ok", [2, 3, 1]),
            ("store", [1, 0]),
        ],
    ),
    "counter_lru.repeated_load_once": (
        2,
        [
            ("store", [0, 1]),
            ("ok", [1, 0]),
            ("load", [1, 0]),
            ("load", [0, 0, 1]),
            ("done", [0, 0, 0]),
        ],
    ),
    "counter_lru.load_pins_before_check": (
        3,
        [("store", [3, 5, 4]), ("ok", [5]), ("load", [5, 3, 3]), ("store", [4, 0])],
    ),
    "counter_lru.empty_stored_event": (
        2,
        [("store", [1, 1]), ("store", [0, 0]), ("ok", [0, 1, 0]), ("ok", [0])],
    ),
    "counter_lru.touch_skips_pending": (
        2,
        [
            ("store", [0]),
            ("store", [2]),
            ("touch", [0]),
            ("ok", [0, 2]),
            ("store", [1]),
        ],
    ),
    "heap_lru.free_list_fifo": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1]), ("store", [0, 2, 0])],
    ),
    "heap_lru.reset_keeps_slot_order": (
        2,
        [("store", [0]), ("reset", [1, 3]), ("store", [2, 1, 1])],
    ),
    "heap_lru.reset_announces_pending": (1, [("store", [0]), ("reset", [1, 1, 3])]),
    "heap_lru.unload_ignores_repeats": (
        2,
        [("store", [0, 1]), ("ok", [1, 0, 0]), ("load", [1]), ("done", [1, 1, 1])],
    ),
    "heap_lru.event_per_victim": (
        3,
        [("store", [1, 2, 0]), ("ok", [2, 0]), ("reset", [1, 1, 3])],
    ),
    "heap_lru.failed_store_leaks_slot": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1]), ("store", [0, 2, 0])],
    ),
    "heap_lru.stale_heap_entries": (
        3,
        [
            ("store", [1, 1]),
            ("ok", [1]),
            ("store", [3, 3, 0]),
            ("touch", [0, 1]),
            ("ok", [3]),
            ("store", [0, 2]),
        ],
    ),
    "clock_slab.single_pass": (
        1,
        [("store", [0]), ("touch", [0]), ("ok", [0]), ("store", [1])],
    ),
    "clock_slab.evicts_for_whole_batch": (
        2,
        [("store", [0, 0, 1]), ("ok", [0]), ("fail", [1, 1, 0]), ("store", [1, 2, 2])],
    ),
    "clock_slab.unload_clears_all_loads": (
        2,
        [
            ("store", [1, 0]),
            ("ok", [1, 1, 0]),
            ("load", [1, 1]),
            ("done", [1]),
            ("done", [1]),
        ],
    ),
    "clock_slab.first_empty_slot": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1]), ("store", [0, 2, 0])],
    ),
    "clock_slab.reannounces_stored": (
        2,
        [("store", [3, 0]), ("ok", [3, 3]), ("ok", [0, 3, 0])],
    ),
    "clock_slab.double_free_on_failure": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1]), ("store", [0, 2, 0])],
    ),
    "arc4.promotes_pending": (
        4,
        [
            ("store", [1, 2, 0]),
            ("touch", [2, 0, 2]),
            ("store", [3, 3]),
            ("ok", [3]),
            ("ok", [0, 2]),
            ("store", [4, 0]),
        ],
    ),
    "arc4.no_fallback_list": (
        1,
        [("store", [1]), ("ok", [1]), ("touch", [1, 2]), ("store", [0])],
    ),
    "reuse_gate.prefix_stops_at_miss": (1, [("lookup", [1, 0]), ("store", [0])]),
    "reuse_gate.store_counts_offers": (
        1,
        [("store", [0, 2, 0]), ("store", [1, 0]), ("store", [1, 0, 2])],
    ),
    "reuse_gate.threshold_strict": (1, [("lookup", [4, 3, 3]), ("store", [4, 0])]),
    "reuse_gate.reset_keeps_counts": (
        1,
        [("lookup", [4]), ("reset", [2, 0, 2]), ("store", [4, 0, 3])],
    ),
    "reuse_gate.lookup_not_counted": (1, [("lookup", [4, 3, 3]), ("store", [4, 0])]),
    "fifo_core.fifo_ignores_protected": (
        2,
        [("store", [2, 1]), ("ok", [1]), ("store", [2, 0, 1])],
    ),
    "fifo_core.fifo_evicts_readers": (
        2,
        [
            ("store", [2, 1, 2]),
            ("ok", [1, 1, 2]),
            ("load", [1, 1, 2]),
            ("store", [0, 1]),
        ],
    ),
    "fifo_core.fifo_partial_evict": (
        2,
        [("store", [1, 0, 1]), ("ok", [0]), ("store", [5, 4, 3]), ("store", [4, 4])],
    ),
    "log_lru.compaction_keeps_stored_only": (
        4,
        [
            ("store", [1, 0, 3]),
            ("store", [1, 4]),
            ("touch", [2, 4]),
            ("fail", [4, 3]),
            ("store", [4]),
            ("touch", [4, 3, 4]),
            ("store", [3, 1, 3]),
            ("fail", [4]),
            ("touch", [3, 0, 2]),
            ("store", [4]),
            ("touch", [0, 4, 4]),
            ("ok", [3, 4]),
            ("store", [2, 1, 1]),
        ],
    ),
    "log_lru.touch_forgets_latest": (
        3,
        [
            ("store", [1, 1]),
            ("ok", [1]),
            ("store", [3, 3, 0]),
            ("touch", [0, 1]),
            ("ok", [3]),
            ("store", [0, 2]),
        ],
    ),
    "log_lru.compaction_forgets_renumber": (
        1,
        [
            ("store", [1]),
            ("touch", [1, 0, 1]),
            ("touch", [1, 1, 1]),
            ("touch", [0, 1, 1]),
            ("ok", [1, 1]),
            ("touch", [1]),
            ("store", [0]),
        ],
    ),
    "random_any.draws_with_replacement": (
        4,
        [("store", [1, 3, 4]), ("store", [2]), ("ok", [4, 1, 2]), ("store", [3, 5, 0])],
    ),
    "stack_backend_lru.backend_fifo_free": (
        3,
        [("store", [1, 0, 2]), ("fail", [0, 2, 1]), ("store", [0, 2, 0])],
    ),
    "stack_backend_lru.backend_undercounts": (2, [("store", [1, 0])]),
    "stack_backend_lru.backend_resetless": (
        2,
        [("store", [0]), ("reset", [1, 3]), ("store", [2, 1, 1])],
    ),
    "odict_lru.failure_drops_ready": (
        2,
        [("store", [A, B]), ("ok", [A, B]), ("fail", [A]), ("lookup", [A, B])],
    ),
    "counter_lru.store_completes_before_checking": (
        1,
        [("store", [B]), ("fail", [B, A]), ("ok", [B])],
    ),
    # victims (A, B) in eviction order, in the event too
    "heap_lru.removed_event_reversed": (
        2,
        [("store", [A, B]), ("ok", [A, B]), ("store", [C, D])],
    ),
    "clock_slab.prefix_counts_all_hits": (
        2,
        [("store", [D, C]), ("ok", [D]), ("lookup", [A, D])],
    ),
    # 3-entry table: the stored key A falls out of the table, yet stays protected
    "reuse_gate_small.small_forgets_protection": (
        1,
        [
            ("lookup", [A, A]),
            ("store", [A]),
            ("ok", [A]),
            ("lookup", [B, B, C, D]),
            ("store", [B, A]),
        ],
    ),
    # 3-entry table: D (count 2) must be the one dropped when C arrives; the
    # twin refuses B, A (both reused, one slot), the slip keeps D and stores it
    "reuse_gate_small.small_drops_newest": (
        1,
        [("lookup", [D]), ("lookup", [B, A, C]), ("store", [B, A, D])],
    ),
    # recounting must refresh a key's place in the table, which decides what
    # the 3-entry table drops, hence which offered keys reach the threshold
    "reuse_gate_small.small_recount_keeps_place": (
        1,
        [
            ("lookup", [B, C]),
            ("lookup", [D]),
            ("lookup", [B, A, C]),
            ("store", [B, A, D]),
        ],
    ),
    # A, the oldest, is loading: the victim is B, the next oldest
    "odict_lru.filters_after_slicing": (
        2,
        [("store", [A, B]), ("ok", [A, B]), ("load", [A]), ("store", [C])],
    ),
    # the load spec names the slots in call order: (1, 0)
    "stack_backend_lru.backend_sorted_spec": (
        2,
        [("store", [A, B]), ("ok", [A, B]), ("load", [B, A])],
    ),
    # prepare_load must not bump recency: A stays least recent.
    "counter_lru.load_refreshes": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("load", [A]),
            ("done", [A]),
            ("store", [C]),
        ],
    ),
    # B is trimmed from B1 (capacity 2); touching it twice must not move the target.
    "arc4.ghosts_not_trimmed": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("store", [D]),
            ("ok", [D]),
            ("store", [E]),
            ("ok", [E]),
            ("touch", [B]),
            ("touch", [B]),
            ("store", [F]),
        ],
    ),
    # B1 = [C, D], B2 = []: a B1 hit adds max(1, 0/2) = 1, not 2.
    "arc4.b1_delta_inverted": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("store", [D]),
            ("ok", [D]),
            ("store", [E]),
            ("ok", [E]),
            ("touch", [C]),
            ("store", [F]),
        ],
    ),
    # target 1.0, len(T1) = 1: T1 is preferred (>=), C is the victim, not A.
    "arc4.prefer_t1_strict": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("touch", [B]),
            ("store", [D]),
        ],
    ),
    # target 2.0, T1 = [C, D]: after C, virtual_t1 = 1 < 2, so the second victim is A (T2).
    "arc4.virtual_t1_frozen": (
        3,
        [
            ("store", [A, B, C]),
            ("ok", [A, B, C]),
            ("touch", [A]),
            ("store", [D]),
            ("ok", [D]),
            ("touch", [B]),
            ("touch", [B]),
            ("store", [E, F]),
        ],
    ),
    # A, re-stored while a B1 ghost, is later evicted from T2; touches of A are then
    # B2 hits (target stays 0), not B1 hits.
    "arc4.insert_keeps_ghost": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("store", [C]),
            ("ok", [C]),
            ("store", [A]),
            ("ok", [A]),
            ("touch", [A]),
            ("load", [C]),
            ("store", [D]),
            ("touch", [A]),
            ("touch", [A]),
            ("ok", [D]),
            ("done", [C]),
            ("touch", [C]),
            ("store", [E]),
        ],
    ),
    # target 2.0 before the reset must be 0.0 after it.
    "arc4.reset_keeps_target": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("touch", [B]),
            ("touch", [B]),
            ("reset", []),
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
        ],
    ),
    # X's failed store leaves no ghost, so touching X changes nothing.
    "arc4.failed_store_ghosted": (
        2,
        [
            ("store", [A]),
            ("ok", [A]),
            ("store", [X]),
            ("fail", [X]),
            ("touch", [A]),
            ("store", [B]),
            ("ok", [B]),
            ("touch", [X]),
            ("touch", [X]),
            ("store", [C]),
        ],
    ),
    # three B1 hits clamp the target at 2, a B2 hit takes it to 1: T1 preferred.
    "arc4.target_not_clamped": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("load", [C]),
            ("store", [D]),
            ("ok", [D]),
            ("done", [C]),
            ("touch", [C]),
            ("touch", [B]),
            ("touch", [B]),
            ("touch", [B]),
            ("touch", [A]),
            ("store", [E]),
        ],
    ),
    # ghost trimming: B1 = [B, C, D] trimmed to [C, D]; B is no ghost, target stays 0
    "tagged_arc.trims_newest_ghost": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("store", [D]),
            ("ok", [D]),
            ("store", [E]),
            ("ok", [E]),
            ("touch", [B]),
            ("touch", [B]),
            ("store", [F]),
        ],
    ),
    # B's ghost hit moves it to B1's MRU end, so the next trim keeps it
    "tagged_arc.ghost_hit_stays_put": (
        2,
        [
            ("store", [A, B]),
            ("ok", [A, B]),
            ("touch", [A]),
            ("store", [C]),
            ("ok", [C]),
            ("store", [D]),
            ("ok", [D]),
            ("touch", [B]),
            ("store", [E]),
            ("ok", [E]),
            ("touch", [B]),
            ("store", [F]),
        ],
    ),
    # B1 = [D, E], B2 = [C, B, A]: D's hit adds 1.5; int(1.5) = 1 = len(T1) prefers T1
    "tagged_arc.target_not_truncated": (
        3,
        [
            ("store", [A, B, C]),
            ("ok", [A, B, C]),
            ("touch", [A, B, C]),
            ("store", [D]),
            ("store", [E]),
            ("store", [F]),
            ("ok", [D, E, F]),
            ("store", [G]),
            ("store", [H]),
            ("ok", [G, H]),
            ("touch", [D]),
            ("touch", [F, G]),
            ("store", [I]),
        ],
    ),
    # target 3, B1 = [B, C, D], B2 = [A]: A's hit subtracts max(1, 3/1) = 3
    "tagged_arc.b2_delta_inverted": (
        3,
        [
            ("store", [A, B, C]),
            ("ok", [A, B, C]),
            ("touch", [A]),
            ("load", [B, C]),
            ("store", [D]),
            ("done", [B, C]),
            ("ok", [D]),
            ("store", [E]),
            ("store", [F]),
            ("store", [G]),
            ("ok", [E, F, G]),
            ("touch", [B]),
            ("touch", [C]),
            ("touch", [D]),
            ("touch", [A]),
            ("touch", [E, F]),
            ("store", [H]),
        ],
    ),
    # found by a seeded search, kept as is
    "tagged_arc.t2_victims_to_b1": (
        2,
        [
            ("store", [2]),
            ("store", [4]),
            ("ok", [2, 4]),
            ("touch", [4]),
            ("store", [1]),
            ("store", [6]),
            ("ok", [1, 6]),
            ("touch", [2, 6]),
            ("touch", [4]),
            ("store", [4]),
        ],
    ),
    "tagged_arc.virtual_t1_counts_stored": (
        4,
        [
            ("store", [6, 3]),
            ("store", [5]),
            ("ok", [3]),
            ("store", [2, 7]),
            ("touch", [3]),
            ("touch", [3]),
            ("ok", [6, 5]),
            ("touch", [6]),
            ("store", [4]),
        ],
    ),
}

# Defects whose witness needs keys outside the script language: own tests below.
SPECIAL = {
    "reuse_gate.forgets_protection",
    "reuse_gate.validates_passed_only",
    "log_lru.rejects_bare_group_keys",
}


# -- the manifest ----------------------------------------------------------


def test_manifest_shape() -> None:
    names = [e.name for e in MANIFEST]
    assert len(names) == len(set(names))
    assert len(CORRECT) >= 8 and len(DEFECTS) >= 40
    assert len({e.design for e in DEFECTS}) >= 5
    for e in DEFECTS:
        assert e.twin in TWINS and e.defect and e.rule
        twin = TWINS[e.twin]
        assert (e.policy, e.reuse_threshold) == (twin.policy, twin.reuse_threshold)
    for e in CORRECT:
        assert e.defect is None and e.twin is None


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e.name)
def test_factory_builds_fresh_manager(entry: Entry) -> None:
    factory = load(entry.factory)
    first, second = factory(2), factory(2)
    assert isinstance(first, OffloadingManager) and first is not second
    assert first.prepare_store([K(0)], CTX) is not None
    assert second.lookup_prefix([K(0)], CTX) == 0  # no shared state


# -- every defect is observable --------------------------------------------


def test_every_defect_has_a_witness() -> None:
    assert {e.name for e in DEFECTS} == set(WITNESSES) | SPECIAL


@pytest.mark.parametrize(
    "entry", [e for e in DEFECTS if e.name not in SPECIAL], ids=lambda e: e.name
)
def test_defect_differs_from_twin(entry: Entry) -> None:
    assert entry.twin is not None
    nb, script = WITNESSES[entry.name]
    good = trace(load(TWINS[entry.twin].factory), nb, script)
    bad = trace(load(entry.factory), nb, script)
    assert good != bad


def test_reuse_forgets_protection() -> None:
    # A is stored, then pushed out of the 64000-entry table: offered again with
    # B, A must still be passed on (protected), so B finds no victim.
    for factory, expect_refusal in (
        (reuse_gate.make, True),
        (reuse_gate.make_forgets_protection, False),
    ):
        m = factory(1)
        m.lookup_prefix([K(A), K(A)], CTX)
        assert m.prepare_store([K(A)], CTX) is not None
        m.complete_store([K(A)], CTX)
        m.lookup_prefix([OffloadKey(b"f%07d" % i) for i in range(64000)], CTX)
        m.lookup_prefix([K(B), K(B)], CTX)
        out = m.prepare_store([K(B), K(A)], CTX)
        assert (out is None) is expect_refusal
        if out is not None:
            assert out.evicted_keys == (K(A),)


def test_reuse_validates_every_key() -> None:
    # a key that is not bytes: the slip drops it before the backing (which
    # validates every key it is given) ever sees it
    not_bytes = cast(OffloadKey, "blk00\x00\x00\x00\x00")
    good = reuse_gate.make(2)
    with pytest.raises(InvalidKeyError):
        good.prepare_store([K(A), not_bytes], CTX)
    bad = reuse_gate.make_validates_passed_only(2)
    bad.prepare_store([K(A), not_bytes], CTX)  # no error: the slip


def test_four_byte_key_is_valid() -> None:
    bare = make_offload_key(b"", 7)  # an empty hash and a group index: 4 bytes
    for factory, ok in (
        (log_lru.make, True),
        (log_lru.make_rejects_bare_group_keys, False),
    ):
        m = factory(1)
        if ok:
            out = m.prepare_store([bare], CTX)
            assert out is not None and out.keys_to_store == (bare,)
        else:
            with pytest.raises(InvalidKeyError):
                m.prepare_store([bare], CTX)


def test_reuse_worked_example() -> None:
    # docs/SPEC.md §7 example: threshold 2, table size 2, LRU backing with 1 slot
    lib_backing = CPUOffloadingManager(16, 1, cache_policy="lru", enable_events=True)
    mine = reuse_gate.ReuseGate(
        CPUOffloadingManager(16, 1, cache_policy="lru", enable_events=True),
        2,
        table_size=2,
    )
    lib = FilterReusedOffloadingManager(
        lib_backing, store_threshold=2, max_tracker_size=2
    )
    for m in (mine, lib):
        assert m.lookup_prefix([K(A), K(B), K(A)], CTX) == 0
        out = m.prepare_store([K(A), K(B)], CTX)
        assert out is not None and out.keys_to_store == (K(A),)
        m.complete_store([K(A)], CTX)
        assert m.lookup_prefix([K(C), K(B), K(C), K(B)], CTX) == 0
        assert m.prepare_store([K(B), K(A)], CTX) is None
        out = m.prepare_store([K(B)], CTX)
        assert out is not None and out.evicted_keys == (K(A),)
        assert list(out.store_spec.block_ids) == [0]  # type: ignore[attr-defined]


# -- correct managers ------------------------------------------------------

LRU_EXAMPLE: Script = [  # docs/SPEC.md §6, LRU worked example (2 slots)
    ("store", [A, B]),
    ("ok", [A, B]),
    ("touch", [B, A]),
    ("store", [C]),
    ("store", [A, B]),
    ("ok", [C]),
    ("load", [B]),
    ("store", [A]),
    ("events", []),
]
ARC_EXAMPLE: Script = [  # docs/SPEC.md §6, ARC worked example (2 slots)
    ("store", [A, B]),
    ("ok", [A, B]),
    ("touch", [A]),
    ("store", [C]),
    ("touch", [C]),
    ("ok", [C]),
    ("touch", [B]),
    ("touch", [C]),
    ("store", [D]),
    ("touch", [A]),
    ("ok", [D]),
    ("store", [E]),
    ("events", []),
]


def _reference(entry: Entry) -> Factory | None:
    if entry.reuse_threshold is not None:
        threshold = entry.reuse_threshold

        size = entry.tracker_size or 64000

        def filt(n: int) -> OffloadingManager:
            backing = CPUOffloadingManager(
                16, n, cache_policy="lru", enable_events=True
            )
            return FilterReusedOffloadingManager(
                backing, store_threshold=threshold, max_tracker_size=size
            )

        return filt
    if entry.policy in ("lru", "arc"):
        policy = entry.policy

        def ref(n: int) -> OffloadingManager:
            return CPUOffloadingManager(16, n, cache_policy=policy, enable_events=True)

        return ref
    return None


def _scripts(seed: int) -> list[tuple[int, Script]]:
    rng = random.Random(seed)
    out: list[tuple[int, Script]] = [(2, LRU_EXAMPLE), (2, ARC_EXAMPLE)]
    out += list(WITNESSES.values())
    out += [
        (rng.randint(1, 4), random_script(rng, rng.randint(2, 7), rng.randint(5, 25)))
        for _ in range(40)
    ]
    return out


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.name)
def test_correct_manager_agrees_with_reference(entry: Entry) -> None:
    factory = load(entry.factory)
    reference = _reference(entry)
    for nb, script in _scripts(seed=11):
        if reference is not None:
            assert trace(factory, nb, script) == trace(reference, nb, script), script
        else:
            assert model_check(factory, nb, script, "any") is None, script


def test_lru_worked_example_by_hand() -> None:
    m = load(TWINS["odict_lru"].factory)(2)
    out = m.prepare_store([K(A), K(B)], CTX)
    assert out is not None and list(out.store_spec.block_ids) == [0, 1]  # type: ignore[attr-defined]
    m.complete_store([K(A), K(B)], CTX)
    m.touch([K(B), K(A)], CTX)
    out = m.prepare_store([K(C)], CTX)
    assert out is not None and out.evicted_keys == (K(A),)
    assert m.prepare_store([K(A), K(B)], CTX) is None
    m.complete_store([K(C)], CTX)
    m.prepare_load([K(B)], CTX)
    out = m.prepare_store([K(A)], CTX)
    assert out is not None and out.evicted_keys == (K(C),)
    events = list(m.take_events())
    assert [(e.keys, e.removed) for e in events] == [
        ((K(A), K(B)), False),
        ((K(A),), True),
        ((K(C),), False),
        ((K(C),), True),
    ]


def test_arc_worked_example_by_hand() -> None:
    m = load(TWINS["arc4"].factory)(2)
    m.prepare_store([K(A), K(B)], CTX)
    m.complete_store([K(A), K(B)], CTX)
    m.touch([K(A)], CTX)
    out = m.prepare_store([K(C)], CTX)
    assert out is not None and out.evicted_keys == (K(B),)
    m.touch([K(C)], CTX)
    m.complete_store([K(C)], CTX)
    m.touch([K(B)], CTX)  # B1 hit: target 1.0
    m.touch([K(C)], CTX)
    out = m.prepare_store([K(D)], CTX)
    assert out is not None and out.evicted_keys == (K(A),)  # T2 first
    m.touch([K(A)], CTX)  # B2 hit: target 0.0
    m.complete_store([K(D)], CTX)
    out = m.prepare_store([K(E)], CTX)
    assert out is not None and out.evicted_keys == (K(D),)


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.name)
def test_correct_manager_typed_errors_change_nothing(entry: Entry) -> None:
    m = load(entry.factory)(2)
    for _ in range(entry.reuse_threshold or 0):  # make A, B, C reused enough
        m.lookup_prefix([K(A), K(B), K(C)], CTX)
    out = m.prepare_store([K(A), K(B)], CTX)
    assert out is not None and out.keys_to_store == (K(A), K(B))
    m.complete_store([K(A)], CTX)
    m.prepare_load([K(A)], CTX)
    list(m.take_events())
    before = trace_state(m)
    with pytest.raises(InvalidKeyError):
        m.prepare_store([K(C), OffloadKey(b"ab")], CTX)
    with pytest.raises(IllegalTransitionError) as err:
        m.prepare_load([K(A), K(B)], CTX)
    assert err.value.key == K(B) and err.value.phase == Phase(PhaseKind.PENDING)
    with pytest.raises(IllegalTransitionError) as err:
        m.complete_load([K(A), K(A)], CTX)
    assert err.value.key == K(A) and err.value.phase == Phase(PhaseKind.READY)
    with pytest.raises(OffloadingError):
        m.complete_load([123], CTX)  # type: ignore[list-item]  # a malformed key
    with pytest.raises(IllegalTransitionError) as err:
        m.complete_store([K(A), K(C)], CTX, success=False)
    assert err.value.key == K(C) and err.value.phase == Phase(PhaseKind.ABSENT)
    assert trace_state(m) == before


def trace_state(m: OffloadingManager) -> tuple[object, ...]:
    """What a caller can see without changing anything (no reuse filter here
    counts these lookups into a store decision for keys A..C)."""
    return (
        tuple(m.lookup(K(i), CTX) for i in (A, B, C)),
        len(list(m.take_events())),
    )
