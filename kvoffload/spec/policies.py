"""Replacement policies as immutable models.

A policy model orders the keys a manager tracks and chooses eviction victims.
It knows nothing of slots or events; :class:`~kvoffload.spec.model.ManagerModel`
asks it four things and replaces it by the value each answer returns:

- ``inserted(keys)``: ``keys`` (newly PENDING, never tracked) join the policy.
- ``removed(key)``: a failed store leaves without a trace (no ghost).
- ``touched(keys, pending)``: a ``touch`` call; ``pending`` is the set of
  tracked keys that are PENDING (ARC keeps those in T1).
- ``choose_victims(need, eligible)``: exactly ``need`` victims among
  ``eligible`` (the READY keys outside the offered set, in ascending slot
  order), or ``None`` when that many do not exist. A pure query.
- ``check_victims(victims, need, eligible)``: ``None`` if ``victims`` (chosen
  by an implementation) are what this policy allows, else the reason why not.
- ``evicted(victims)``: the policy after ``victims`` left (ARC: ghosts).
- ``cleared()``: the policy after ``reset_cache``.
- ``committed(order, inserted_only, reused)``: a finished request's uses,
  under request-scoped recency (``RecencyCommit.REQUEST_END``): ``order``
  the keys it used, first used first; ``inserted_only`` those it only
  stored, ``reused`` the stored ones it loaded or offered again.
- ``made_evictable(keys)``: ``keys`` became evictable (a store completed,
  or a block's last load completed), in that order; ``made_unevictable(keys)``:
  READY ``keys`` were pinned by a first load. Only a policy that ranks blocks
  when they become evictable (``LRURank.EVICTABLE``) acts on them.

Sequences are tuples ordered least-recent first: the last element is the most
recently used (the *MRU end*).

- :class:`LRUModel`: one recency order.
- :class:`ARCModel`: T1, T2, ghost lists B1, B2 and the adaptive target.
- :class:`AnyPolicyModel`: no state; accepts every legal victim set, for
  auditing backends whose policy is unknown.

:data:`POLICY_REGISTRY` is the one list of policy names: the models, the
production managers (``kvoffload.impl.make_cache_policy`` accepts exactly the
``implementable`` ones), the conformance kit and the command line read it.
Adding a policy means adding its model here and one registry entry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Union

import attrs

from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import DEFAULT, LRURank, Profile

KeySeq = tuple[OffloadKey, ...]


def _without(order: KeySeq, gone: Collection[OffloadKey]) -> KeySeq:
    return tuple(key for key in order if key not in gone)


def _to_mru(order: KeySeq, key: OffloadKey) -> KeySeq:
    """``order`` with ``key`` moved (or added) to the MRU end."""
    return _without(order, (key,)) + (key,)


def _exact_choice(
    policy: str, expected: KeySeq | None, victims: Sequence[OffloadKey]
) -> str | None:
    if expected is None:
        return f"{policy} finds no such victims, yet {tuple(victims)!r} were evicted"
    if tuple(victims) != expected:
        return f"{policy} evicts {expected!r}, the implementation evicted {tuple(victims)!r}"
    return None


@attrs.frozen
class LRUModel:
    """Least-recently-used: ``order`` runs least-recent first.

    Insert appends at the MRU end; ``touch`` walks its keys in reverse moving
    each ordered key to the MRU end (so the first key ends most recent);
    victims are the ``need`` least-recent eligible keys.

    ``evictable_only`` (the profile's ``lru_rank`` is ``LRURank.EVICTABLE``):
    ``order`` holds only the evictable keys (READY, no load in flight). A key
    joins it at the MRU end when it becomes evictable (its store or its last
    load completes), leaves it when a load pins it, and is not ordered while
    PENDING; ``touch`` therefore moves evictable keys only.
    """

    order: KeySeq = ()
    evictable_only: bool = False

    name = "lru"

    def resident(self) -> frozenset[OffloadKey] | None:
        """The keys this policy orders (exactly the tracked keys), or
        ``None`` when it orders only the evictable ones."""
        return None if self.evictable_only else frozenset(self.order)

    def state_view(self) -> dict[str, object]:
        """The state in :class:`~kvoffload.spec.contract.InspectablePolicy`'s
        terms: ``{"order": keys least recent first}``."""
        return {"order": self.order}

    def problems(self, tracked: frozenset[OffloadKey]) -> str | None:
        """Why this state is incoherent for the ``tracked`` keys, or None."""
        if len(set(self.order)) != len(self.order):
            return "the LRU order repeats a key"
        if not tracked.issuperset(self.order):
            return "the LRU order holds a key that is not tracked"
        return None

    def _with(self, order: KeySeq) -> LRUModel:
        return LRUModel(order, self.evictable_only)

    def inserted(self, keys: Sequence[OffloadKey]) -> LRUModel:
        return self if self.evictable_only else self._with(self.order + tuple(keys))

    def removed(self, key: OffloadKey) -> LRUModel:
        return self._with(_without(self.order, (key,)))

    def touched(
        self, keys: Sequence[OffloadKey], pending: frozenset[OffloadKey]
    ) -> LRUModel:
        order = self.order
        for key in reversed(keys):
            if key in order:
                order = _to_mru(order, key)
        return self._with(order)

    def committed(
        self, order: Sequence[OffloadKey], inserted_only: frozenset[OffloadKey],
        reused: frozenset[OffloadKey],
    ) -> LRUModel:
        """A finished request's uses (request-scoped recency): its keys, in
        ``order``, are used as a ``touch`` of them would: the first ends most
        recent."""
        return self.touched(order, frozenset())

    def made_evictable(self, keys: Sequence[OffloadKey]) -> LRUModel:
        if not self.evictable_only:
            return self
        order = self.order
        for key in keys:
            order = _to_mru(order, key)
        return self._with(order)

    def made_unevictable(self, keys: Sequence[OffloadKey]) -> LRUModel:
        if not self.evictable_only:
            return self
        return self._with(_without(self.order, frozenset(keys)))

    def choose_victims(
        self, need: int, eligible: Sequence[OffloadKey]
    ) -> KeySeq | None:
        allowed = frozenset(eligible)
        victims = tuple(key for key in self.order if key in allowed)[:need]
        return victims if len(victims) == need else None

    def check_victims(
        self, victims: Sequence[OffloadKey], need: int, eligible: Sequence[OffloadKey]
    ) -> str | None:
        return _exact_choice("LRU", self.choose_victims(need, eligible), victims)

    def evicted(self, victims: Sequence[OffloadKey]) -> LRUModel:
        return self._with(_without(self.order, frozenset(victims)))

    def cleared(self) -> LRUModel:
        return self._with(())


@attrs.frozen
class ARCModel:
    """Adaptive replacement (vLLM's ``ARCCachePolicy``, plus the liveness rule of docs/SPEC.md).

    ``t1`` holds keys seen once (and every PENDING key), ``t2`` keys touched
    again while stored; ``b1``/``b2`` are ghosts of keys evicted from
    ``t1``/``t2``; ``target`` is the adaptive size aimed at for T1
    (``0.0 <= target <= capacity``).

    - insert: each key leaves B1/B2 if there, and joins T1's MRU end.
    - touch, keys walked in reverse: T1 & PENDING → T1's MRU end; T1 & stored
      → T2's MRU end; T2 → T2's MRU end; B1 → ``target = min(target +
      max(1, |B2|/|B1|), capacity)`` and B1's MRU end; B2 → ``target =
      max(target - max(1, |B1|/|B2|), 0)`` and B2's MRU end; else ignored.
    - evict n: ``virtual_t1 = |T1|``; for each victim prefer T1 when
      ``virtual_t1 >= int(target)``, else T2; take that list's least-recent
      eligible key not yet taken, else the other list's; none in either →
      ``None``. A T1 victim decrements ``virtual_t1``. Afterwards T1 victims
      join B1's MRU end, T2 victims B2's, and each ghost list is trimmed from
      its LRU end to ``capacity`` entries.
    """

    capacity: int
    t1: KeySeq = ()
    t2: KeySeq = ()
    b1: KeySeq = ()
    b2: KeySeq = ()
    target: float = 0.0

    name = "arc"

    def resident(self) -> frozenset[OffloadKey] | None:
        """The keys in T1 or T2 (exactly the tracked keys)."""
        return frozenset(self.t1 + self.t2)

    def state_view(self) -> dict[str, object]:
        """The state in :class:`~kvoffload.spec.contract.InspectablePolicy`'s
        terms: the four lists (least recent first) and ``target``."""
        return {"t1": self.t1, "t2": self.t2, "b1": self.b1, "b2": self.b2, "target": self.target}

    def problems(self, tracked: frozenset[OffloadKey]) -> str | None:
        """Why this state is incoherent for the ``tracked`` keys, or None:
        lists disjoint, ghosts untracked and at most ``capacity`` each,
        ``0 <= target <= capacity``."""
        lists = self.t1 + self.t2 + self.b1 + self.b2
        if len(set(lists)) != len(lists):
            return "ARC's T1, T2, B1, B2 overlap or repeat a key"
        for ghost in self.b1 + self.b2:
            if ghost in tracked:
                return f"a ghost key is tracked: {ghost!r}"
        if max(len(self.b1), len(self.b2)) > self.capacity:
            return "a ghost list is longer than the capacity"
        if not 0.0 <= self.target <= self.capacity:
            return f"ARC target {self.target} outside [0, capacity]"
        return None

    def inserted(self, keys: Sequence[OffloadKey]) -> ARCModel:
        new = frozenset(keys)
        return attrs.evolve(
            self,
            t1=self.t1 + tuple(keys),
            b1=_without(self.b1, new),
            b2=_without(self.b2, new),
        )

    def removed(self, key: OffloadKey) -> ARCModel:
        return attrs.evolve(
            self, t1=_without(self.t1, (key,)), t2=_without(self.t2, (key,))
        )

    def touched(
        self, keys: Sequence[OffloadKey], pending: frozenset[OffloadKey]
    ) -> ARCModel:
        t1, t2, b1, b2, target = self.t1, self.t2, self.b1, self.b2, self.target
        for key in reversed(keys):
            if key in t1:
                if key in pending:
                    t1 = _to_mru(t1, key)
                else:
                    t1 = _without(t1, (key,))
                    t2 = _to_mru(t2, key)
            elif key in t2:
                t2 = _to_mru(t2, key)
            elif key in b1:
                delta = max(1, len(b2) / len(b1))
                target = float(min(target + delta, self.capacity))
                b1 = _to_mru(b1, key)
            elif key in b2:
                delta = max(1, len(b1) / len(b2))
                target = float(max(target - delta, 0))
                b2 = _to_mru(b2, key)
        return attrs.evolve(self, t1=t1, t2=t2, b1=b1, b2=b2, target=target)

    def committed(
        self, order: Sequence[OffloadKey], inserted_only: frozenset[OffloadKey],
        reused: frozenset[OffloadKey],
    ) -> ARCModel:
        """A finished request's uses (request-scoped recency), keys walked
        in reverse ``order``: a key the request only inserted moves to the
        MRU end of its list (T1 or T2), no promotion; a key it reused moves
        from T1, or within T2, to T2's MRU end; other keys are left."""
        t1, t2 = self.t1, self.t2
        for key in reversed(order):
            if key in inserted_only:
                if key in t1:
                    t1 = _to_mru(t1, key)
                elif key in t2:
                    t2 = _to_mru(t2, key)
            elif key in reused and (key in t1 or key in t2):
                t1 = _without(t1, (key,))
                t2 = _to_mru(t2, key)
        return attrs.evolve(self, t1=t1, t2=t2)

    def made_evictable(self, keys: Sequence[OffloadKey]) -> ARCModel:
        return self

    def made_unevictable(self, keys: Sequence[OffloadKey]) -> ARCModel:
        return self

    def choose_victims(
        self, need: int, eligible: Sequence[OffloadKey]
    ) -> KeySeq | None:
        allowed = frozenset(eligible)
        victims: list[OffloadKey] = []
        virtual_t1 = len(self.t1)

        def oldest(order: KeySeq) -> OffloadKey | None:
            for key in order:
                if key in allowed and key not in victims:
                    return key
            return None

        while len(victims) < need:
            preferred, other = (
                (self.t1, self.t2)
                if virtual_t1 >= int(self.target)
                else (self.t2, self.t1)
            )
            victim = oldest(preferred)
            if victim is None:
                victim = oldest(other)
            if victim is None:
                return None
            if victim in self.t1:
                virtual_t1 -= 1
            victims.append(victim)
        return tuple(victims)

    def check_victims(
        self, victims: Sequence[OffloadKey], need: int, eligible: Sequence[OffloadKey]
    ) -> str | None:
        return _exact_choice("ARC", self.choose_victims(need, eligible), victims)

    def evicted(self, victims: Sequence[OffloadKey]) -> ARCModel:
        from_t1 = tuple(key for key in victims if key in self.t1)
        from_t2 = tuple(key for key in victims if key in self.t2)
        b1 = (self.b1 + from_t1)[-self.capacity :] if self.capacity else ()
        b2 = (self.b2 + from_t2)[-self.capacity :] if self.capacity else ()
        return attrs.evolve(
            self,
            t1=_without(self.t1, frozenset(from_t1)),
            t2=_without(self.t2, frozenset(from_t2)),
            b1=b1,
            b2=b2,
        )

    def cleared(self) -> ARCModel:
        return ARCModel(capacity=self.capacity)


@attrs.frozen
class AnyPolicyModel:
    """Any policy at all: the victims are the implementation's choice.

    ``check_victims`` accepts a victim tuple when it has exactly ``need``
    distinct keys, all eligible (READY, not offered). When the model runs
    alone (no victims given) it takes the first ``need`` eligible keys in
    ascending slot order. It has no state, so it never constrains recency.
    """

    name = "any"

    def resident(self) -> frozenset[OffloadKey] | None:
        """``None``: this policy keeps no order of its own."""
        return None

    def state_view(self) -> dict[str, object]:
        """No state to compare."""
        return {}

    def problems(self, tracked: frozenset[OffloadKey]) -> str | None:
        return None

    def inserted(self, keys: Sequence[OffloadKey]) -> AnyPolicyModel:
        return self

    def removed(self, key: OffloadKey) -> AnyPolicyModel:
        return self

    def touched(
        self, keys: Sequence[OffloadKey], pending: frozenset[OffloadKey]
    ) -> AnyPolicyModel:
        return self

    def committed(
        self, order: Sequence[OffloadKey], inserted_only: frozenset[OffloadKey],
        reused: frozenset[OffloadKey],
    ) -> AnyPolicyModel:
        return self

    def made_evictable(self, keys: Sequence[OffloadKey]) -> AnyPolicyModel:
        return self

    def made_unevictable(self, keys: Sequence[OffloadKey]) -> AnyPolicyModel:
        return self

    def choose_victims(
        self, need: int, eligible: Sequence[OffloadKey]
    ) -> KeySeq | None:
        return tuple(eligible[:need]) if len(eligible) >= need else None

    def check_victims(
        self, victims: Sequence[OffloadKey], need: int, eligible: Sequence[OffloadKey]
    ) -> str | None:
        if len(victims) != need:
            return f"{need} victims were needed, the implementation evicted {len(victims)}"
        if len(set(victims)) != len(victims):
            return f"victims {tuple(victims)!r} repeat a key"
        allowed = frozenset(eligible)
        for key in victims:
            if key not in allowed:
                return f"victim {key!r} is not READY or was offered (eligible: {tuple(eligible)!r})"
        return None

    def evicted(self, victims: Sequence[OffloadKey]) -> AnyPolicyModel:
        return self

    def cleared(self) -> AnyPolicyModel:
        return self


PolicyModel = Union[LRUModel, ARCModel, AnyPolicyModel]
"""Any of the three policy models (they share the methods above)."""


@attrs.frozen
class PolicyInfo:
    """One entry of :data:`POLICY_REGISTRY`.

    ``make(capacity, profile)`` builds the empty model under ``profile``'s
    conventions. ``implementable``: the policy
    determines its victims, so a manager can implement it and be held to
    exact agreement (``lru``, ``arc``); ``any`` only audits.
    """

    name: str
    make: Callable[[int, Profile], PolicyModel]
    implementable: bool
    summary: str


def _registry(*infos: PolicyInfo) -> Mapping[str, PolicyInfo]:
    return MappingProxyType({info.name: info for info in infos})


POLICY_REGISTRY: Mapping[str, PolicyInfo] = _registry(
    PolicyInfo(
        "lru",
        lambda capacity, profile: LRUModel(evictable_only=profile.lru_rank is LRURank.EVICTABLE),
        True,
        "least recently used",
    ),
    PolicyInfo(
        "arc", lambda capacity, profile: ARCModel(capacity=capacity), True, "adaptive replacement"
    ),
    PolicyInfo(
        "any", lambda capacity, profile: AnyPolicyModel(), False, "any legal victims (audits only)"
    ),
)
"""Every policy the specification knows, by name."""

POLICY_NAMES: tuple[str, ...] = tuple(POLICY_REGISTRY)
"""``("lru", "arc", "any")``: what the kit and the command line accept."""

IMPLEMENTABLE_POLICY_NAMES: tuple[str, ...] = tuple(
    name for name, info in POLICY_REGISTRY.items() if info.implementable
)
"""``("lru", "arc")``: the policies a manager implements."""


def make_policy(name: str, capacity: int, profile: Profile = DEFAULT) -> PolicyModel:
    """The empty policy model registered as ``name`` (see :data:`POLICY_NAMES`),
    keeping ``profile``'s conventions."""
    info = POLICY_REGISTRY.get(name) if isinstance(name, str) else None
    if info is None:
        raise ConfigurationError(
            f"unknown cache policy {name!r}; expected one of {', '.join(POLICY_NAMES)}"
        )
    return info.make(capacity, profile)


__all__ = [
    "IMPLEMENTABLE_POLICY_NAMES",
    "POLICY_NAMES",
    "POLICY_REGISTRY",
    "ARCModel",
    "AnyPolicyModel",
    "LRUModel",
    "PolicyInfo",
    "PolicyModel",
    "make_policy",
]
