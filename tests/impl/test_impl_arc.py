"""ARC against hand-worked examples (vLLM's ARC arithmetic, the liveness rule of docs/SPEC.md).

Notation in the comments: lists are written least recent first (LRU → MRU),
``p`` is ``target_t1_size``, ``vt1`` the virtual T1 size an eviction counts
down. A victim comes from T1 when ``vt1 >= int(p)``, else from T2; when the
preferred list has no READY unprotected member the other list is used.
"""

from __future__ import annotations

import pytest

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.policies import ARCCachePolicy
from kvoffload.spec.keys import OffloadKey
from tests.impl.impl_helpers import (
    ABSENT,
    CTX,
    PENDING,
    READY,
    cpu_manager,
    keys,
    loading,
    observe,
    probe,
    removed,
    slots,
    store,
    stored,
)

Lists = tuple[list[OffloadKey], list[OffloadKey], list[OffloadKey], list[OffloadKey]]


def arc(manager: CPUOffloadingManager) -> ARCCachePolicy:
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    return policy


def lists(manager: CPUOffloadingManager) -> Lists:
    """(T1, T2, B1, B2), each least recent first."""
    policy = arc(manager)
    return list(policy.t1), list(policy.t2), list(policy.b1), list(policy.b2)


def evict_by_storing(manager: CPUOffloadingManager, new: list[OffloadKey]) -> tuple[OffloadKey, ...]:
    output = manager.prepare_store(new, CTX)
    assert output is not None
    manager.complete_store(new, CTX)
    return output.evicted_keys


def test_new_keys_enter_t1_and_a_second_use_promotes_to_t2() -> None:
    manager = cpu_manager(4, "arc")
    a, b, c, d, e = keys("a b c d e")
    store(manager, [a, b, c, d])
    assert lists(manager) == ([a, b, c, d], [], [], [])
    manager.touch([b], CTX)
    assert lists(manager) == ([a, c, d], [b], [], [])
    # p = 0, vt1 = 3 >= 0 → T1's least recent, a, becomes a B1 ghost
    output = manager.prepare_store([e], CTX)
    assert output is not None
    assert output.evicted_keys == (a,)
    assert slots(output.store_spec) == [0]  # a's slot
    assert lists(manager) == ([c, d, e], [b], [a], [])
    assert manager.phase(e) == PENDING
    assert arc(manager).target_t1_size == 0


def test_touch_by_phase_and_reverse_walk() -> None:
    manager = cpu_manager(4, "arc")
    a, b, c, d, e, f = keys("a b c d e f")
    store(manager, [a, b, c])
    manager.prepare_store([d], CTX)  # d PENDING
    manager.prepare_load([c], CTX)  # c LOADING(1)
    assert lists(manager) == ([a, b, c, d], [], [], [])
    # reverse walk: a (READY, T1) → T2; c (LOADING, T1) → T2; d (PENDING,
    # T1) stays in T1 as its most recent; e is unknown: ignored
    manager.touch([d, c, e, a], CTX)
    assert lists(manager) == ([b, d], [a, c], [], [])
    manager.touch([a], CTX)  # T2 → T2 MRU
    assert lists(manager) == ([b, d], [c, a], [], [])
    assert [manager.phase(k) for k in (a, b, c, d, e)] == [READY, READY, loading(1), PENDING, ABSENT]
    # two victims, p = 0: vt1 = 2 → b (vt1 = 1); vt1 = 1 >= 0 but T1 holds
    # only the PENDING d → T2, whose least recent c is LOADING: a
    output = manager.prepare_store([e, f], CTX)
    assert output is not None
    assert output.evicted_keys == (b, a)
    assert lists(manager) == ([d, e, f], [c], [b], [a])
    # c is evictable again once its load completes
    manager.complete_load([c], CTX)
    manager.complete_store([d, e, f], CTX)
    assert evict_by_storing(manager, keys("g")) == (d,)  # T1 first (vt1 3 >= 0)


def test_ghost_hits_move_the_target_and_the_target_picks_the_list() -> None:
    manager = cpu_manager(6, "arc")
    a, b, c, d, e, f, g, h, i, j = keys("a b c d e f g h i j")
    store(manager, [a, b, c, d, e, f])  # slots a0 b1 c2 d3 e4 f5
    manager.touch([d, e, f], CTX)  # reverse walk: f, e, d enter T2 in that order
    assert lists(manager) == ([a, b, c], [f, e, d], [], [])

    assert evict_by_storing(manager, [g]) == (a,)  # vt1 3 >= p 0
    assert lists(manager) == ([b, c, g], [f, e, d], [a], [])

    # B1 hit: p += max(1, |B2| / |B1|) = max(1, 0 / 1) = 1, twice
    manager.touch([a], CTX)
    assert arc(manager).target_t1_size == 1
    manager.touch([a], CTX)
    assert arc(manager).target_t1_size == 2
    assert lists(manager) == ([b, c, g], [f, e, d], [a], [])  # a stays a ghost

    # three victims, p = 2: vt1 3 >= 2 → b (vt1 2); 2 >= 2 → c (vt1 1);
    # 1 < 2 → T2's least recent, f
    output = manager.prepare_store([h, i, j], CTX)
    assert output is not None
    assert output.evicted_keys == (b, c, f)
    # slots freed b1, c2, f5 are handed out last freed first
    assert slots(output.store_spec) == [5, 2, 1]
    manager.complete_store([h, i, j], CTX)
    assert lists(manager) == ([g, h, i, j], [e, d], [a, b, c], [f])
    assert manager.take_events()[-2:] == [removed([b, c, f]), stored([h, i, j])]

    # B2 hit: p -= max(1, |B1| / |B2|) = max(1, 3 / 1) = 3 → max(2 - 3, 0) = 0
    manager.touch([f], CTX)
    assert arc(manager).target_t1_size == 0
    assert lists(manager)[3] == [f]
    # B1 hit moves the ghost to B1's most recent end
    manager.touch([a], CTX)  # p = 0 + max(1, 1 / 3) = 1
    assert arc(manager).target_t1_size == 1
    assert lists(manager)[2] == [b, c, a]


def test_fractional_target_and_ghost_trimming() -> None:
    manager = cpu_manager(4, "arc")
    a, b, c, d, e, f, g, h, i, j, k, l = keys("a b c d e f g h i j k l")  # noqa: E741
    store(manager, [a, b, c, d])  # slots a0 b1 c2 d3
    manager.touch([a, b, c, d], CTX)
    assert lists(manager) == ([], [d, c, b, a], [], [])

    # p = 0, vt1 = 0 >= 0 prefers T1, which is empty, every time → T2
    assert evict_by_storing(manager, [e, f, g]) == (d, c, b)
    assert [manager.slot_of(x) for x in (e, f, g)] == [1, 2, 3]
    assert lists(manager) == ([e, f, g], [a], [], [d, c, b])
    assert evict_by_storing(manager, [h]) == (e,)
    assert evict_by_storing(manager, [i]) == (f,)
    assert lists(manager) == ([g, h, i], [a], [e, f], [d, c, b])

    # B1 hit: p += max(1, |B2| / |B1|) = max(1, 3 / 2) = 1.5
    manager.touch([e], CTX)
    assert arc(manager).target_t1_size == 1.5
    assert lists(manager)[2] == [f, e]

    # int(p) = 1: vt1 3 → g, 2 → h, 1 >= 1 → i (comparing with 1.5 would
    # have taken a from T2 instead)
    assert evict_by_storing(manager, [j, k, l]) == (g, h, i)
    # B1 = f e g h i has 5 > 4 ghosts: trimmed from the least recent end
    assert lists(manager) == ([j, k, l], [a], [e, g, h, i], [d, c, b])

    # B2 hit: p -= max(1, |B1| / |B2|) = 4 / 3 → 1.5 - 4/3 = 1/6
    manager.touch([d], CTX)
    assert arc(manager).target_t1_size == pytest.approx(1 / 6)
    assert lists(manager)[3] == [c, b, d]


def test_target_is_capped_at_capacity() -> None:
    manager = cpu_manager(3, "arc")
    a, b, c, d, e, f = keys("a b c d e f")
    store(manager, [a, b, c])
    manager.touch([a, b, c], CTX)  # T2 = c b a
    assert evict_by_storing(manager, [d, e]) == (c, b)  # T1 empty → T2
    assert evict_by_storing(manager, [f]) == (d,)  # vt1 2 >= 0
    assert lists(manager) == ([e, f], [a], [d], [c, b])
    manager.touch([d], CTX)  # p = min(0 + max(1, 2 / 1), 3) = 2
    assert arc(manager).target_t1_size == 2
    manager.touch([d], CTX)  # p = min(2 + 2, 3) = 3
    assert arc(manager).target_t1_size == 3
    # vt1 2 < 3 → T2's a goes to B2
    assert evict_by_storing(manager, keys("g")) == (a,)
    assert lists(manager)[3] == [c, b, a]
    # B2 hit: p = max(3 - max(1, 1 / 3), 0) = 2
    manager.touch([c], CTX)
    assert arc(manager).target_t1_size == 2
    assert lists(manager)[3] == [b, a, c]


def test_preferred_t1_all_pinned_evicts_from_t2() -> None:
    """Liveness: vt1 >= p prefers T1, but T1 holds only loading or offered
    blocks; the victim comes from T2 instead of the store being refused."""
    manager = cpu_manager(3, "arc")
    a, b, c, d = keys("a b c d")
    store(manager, [a, b, c])
    manager.touch([c], CTX)
    assert lists(manager) == ([a, b], [c], [], [])
    manager.prepare_load([a], CTX)  # a pinned; b is offered below: protected
    output = manager.prepare_store([b, d], CTX)
    assert output is not None
    assert output.evicted_keys == (c,)
    assert lists(manager) == ([a, b, d], [], [], [c])  # a T2 victim → B2
    assert manager.phase(b) == READY


def test_preferred_t2_all_pinned_evicts_from_t1() -> None:
    manager = cpu_manager(3, "arc")
    a, b, c, d, e, f = keys("a b c d e f")
    store(manager, [a, b, c])
    manager.touch([c], CTX)  # T1 a b, T2 c
    assert evict_by_storing(manager, [d]) == (a,)
    for _ in range(3):
        manager.touch([a], CTX)  # p: 1, 2, 3 (capped at 3)
    assert arc(manager).target_t1_size == 3
    assert lists(manager) == ([b, d], [c], [a], [])
    manager.prepare_load([c], CTX)
    # two victims: vt1 2 < 3 prefers T2, whose only member is loading → T1 b
    # (vt1 1); again T2 has nothing → T1 d
    output = manager.prepare_store([e, f], CTX)
    assert output is not None
    assert output.evicted_keys == (b, d)
    assert lists(manager) == ([e, f], [c], [a, b, d], [])


def test_no_eligible_victim_anywhere_refuses_and_changes_nothing() -> None:
    manager, twin = cpu_manager(3, "arc"), cpu_manager(3, "arc")
    a, b, c, x, y = keys("a b c x y")
    for m in (manager, twin):
        store(m, [a, b, c])
        m.touch([c], CTX)
        assert evict_by_storing(m, [x]) == (a,)  # B1 = a
        m.touch([a], CTX)  # p = 1
        m.prepare_load([c], CTX)
    # T1 b x, T2 c (pinned): two READY outside the offer, three new keys
    before = observe(manager, [a, b, c, x, y])
    assert manager.prepare_store(keys("n1 n2 n3"), CTX) is None
    assert observe(manager, [a, b, c, x, y]) == before
    assert probe(manager, 3) == probe(twin, 3)


def test_failed_store_leaves_no_ghost_and_reinserted_ghost_leaves_its_list() -> None:
    manager = cpu_manager(2, "arc")
    a, b, c, d = keys("a b c d")
    store(manager, [a, b])
    output = manager.prepare_store([c], CTX)
    assert output is not None and output.evicted_keys == (a,)
    manager.complete_store([c], CTX, success=False)
    assert lists(manager) == ([b], [], [a], [])  # c: no history
    output = manager.prepare_store([a], CTX)  # a free slot: no eviction
    assert output is not None and output.evicted_keys == ()
    assert lists(manager) == ([b, a], [], [], [])
    manager.complete_store([a], CTX)
    # a B2 ghost re-inserted leaves B2 and enters T1
    manager.touch([b], CTX)  # T2 = b
    assert evict_by_storing(manager, [d]) == (a,)  # vt1 1 >= 0
    manager.touch([d], CTX)  # T1 empty, T2 = b d
    assert evict_by_storing(manager, [a]) == (b,)  # T1 empty → T2
    assert lists(manager) == ([a], [d], [], [b])
    manager.complete_store([d], CTX, success=False)  # READY: no-op
    output = manager.prepare_store([b], CTX)
    assert output is not None and output.evicted_keys == (a,)  # vt1 1 >= 0
    assert lists(manager) == ([b], [d], [a], [])


def test_b2_is_trimmed_to_capacity() -> None:
    manager = cpu_manager(2, "arc")
    a, b, c, d, e, f = keys("a b c d e f")
    store(manager, [a, b])
    manager.touch([a, b], CTX)  # T2 = b a
    assert evict_by_storing(manager, [c, d]) == (b, a)
    manager.touch([c, d], CTX)  # T2 = d c
    assert evict_by_storing(manager, [e, f]) == (d, c)
    # B2 = b a d c trimmed to 2 from the least recent end
    assert lists(manager) == ([e, f], [], [], [d, c])


def test_reset_forgets_ghosts_and_target() -> None:
    manager = cpu_manager(2, "arc")
    a, b, c = keys("a b c")
    store(manager, [a, b])
    assert evict_by_storing(manager, [c]) == (a,)
    manager.touch([a], CTX)
    assert arc(manager).target_t1_size == 1
    manager.reset_cache()
    assert lists(manager) == ([], [], [], [])
    assert arc(manager).target_t1_size == 0
    manager.touch([a], CTX)  # no longer a ghost: no effect
    assert arc(manager).target_t1_size == 0
