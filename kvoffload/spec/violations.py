"""The rules a manager keeps, as one closed set, and the values that report
breaking one.

:class:`Invariant` names every rule the specification states and the kit
checks; the specification's predicates (:mod:`kvoffload.spec.invariants`),
the models' own checks (:class:`SpecViolation`), the conformance kit's
reports and the documentation all use these members, so a rule has exactly
one name. ``Invariant.X.label`` is the short text printed in reports (e.g.
``"5 liveness"``; the number is the rule's number in docs/SPEC.md §5, 0 for
the model's own coherence); ``Invariant.X.rule`` says the rule in a line.
"""

from __future__ import annotations

import enum

import attrs


class Invariant(enum.Enum):
    """Every rule of the specification, with its report label and its text."""

    WELL_FORMED = ("0 well-formed", "the model's own bookkeeping is coherent")
    LIFECYCLE = ("0 lifecycle", "every phase change is a row of the lifecycle table")
    CAPACITY = (
        "1 capacity",
        "at most num_blocks keys tracked, their slots distinct and in range",
    )
    EVICTION_SAFETY = ("2 eviction safety", "only READY blocks are evicted")
    PROTECTION = ("3 protection", "no offered key is evicted by that prepare_store")
    ATOMICITY = ("4 atomicity", "a refused prepare_store changes nothing but what an offer records")
    LIVENESS = ("5 liveness", "prepare_store refuses only when room does not exist")
    EVENTS = (
        "6 events",
        "events alternate stored/removed per key; a consumer holds the readable keys",
    )
    STORE_SPEC = ("7 store spec", "store and load specs name the keys' slots, in order")
    EVICTION = (
        "2/3/5 eviction",
        "the victims are those the policy allows (READY, not offered, as many as needed)",
    )
    POLICY_STATE = ("policy state", "the replacement policy's state is the policy model's")
    LOOKUP = ("lookup", "lookup and lookup_prefix answer as the specification does")
    ERRORS = ("errors", "an illegal call raises (as the profile says) and changes nothing")
    CRASH = ("no crash", "a legal call returns")
    REPEATED_PROMPT = (
        "protocol: repeated prompt",
        "a prompt requested store_threshold times in a row, with room, is then read back whole",
    )

    # --- secondary tiers (kvoffload.spec.tier_model; docs/SPEC.md, "Secondary tiers")
    TIER_LIFECYCLE = (
        "T0 tier lifecycle",
        "every observed change of a tier key is a row of the tier table (no key evicted "
        "while a load of it is in flight)",
    )
    TIER_READABLE = (
        "T1 tier readable",
        "a key is readable from a tier only after its store completed, and reads back "
        "that store's bytes",
    )
    TIER_PROMOTION_SLOTS = (
        "T2 promotion slots",
        "a promotion writes only its job's primary slots, never one that is pinned or readable",
    )
    TIER_CASCADE_PINS = (
        "T3 cascade pins",
        "a cascade reads only primary slots pinned for it, until its job completes (a key's slot, until the key reads HIT)",
    )
    TIER_CAPACITY = ("T4 tier capacity", "at most capacity_blocks keys readable from a tier")
    TIER_JOBS = (
        "T5 tier jobs",
        "every job's result is reported exactly once; its successful keys are a subset of "
        "its keys",
    )
    TIER_DRAIN = (
        "T6 tier drain",
        "has_pending_work is True while a job is unreported; after drain_jobs nothing is "
        "in flight and every result is available",
    )
    TIER_PROGRESS = (
        "T7 tier progress",
        "drain_jobs and shutdown return, and a lookup asked again stops answering RETRY, "
        "within the kit's stated bounds",
    )

    def __init__(self, label: str, rule: str) -> None:
        self.label = label
        self.rule = rule

    def __str__(self) -> str:
        return self.label

    def __format__(self, spec: str) -> str:
        return format(self.label, spec)

    @classmethod
    def from_label(cls, label: str) -> Invariant:
        """The member whose label is ``label``; ``ValueError`` if none is."""
        for member in cls:
            if member.label == label:
                return member
        raise ValueError(f"no invariant is labelled {label!r}")


@attrs.frozen
class Violation:
    """An invariant that does not hold: which one, the key to blame (if one
    is) and a readable reason."""

    invariant: Invariant
    reason: str
    key: bytes | None = None

    def __str__(self) -> str:
        blame = f" (key {self.key!r})" if self.key is not None else ""
        return f"invariant {self.invariant.label}{blame}: {self.reason}"


class SpecViolation(Exception):
    """An implementation's choice that the specification forbids.

    Raised by a model's ``prepare_store`` when the ``victims`` or ``slots``
    handed in (the implementation's) are not allowed. ``invariant`` names the
    rule broken, ``reason`` says how.
    """

    def __init__(self, invariant: Invariant, reason: str) -> None:
        super().__init__(f"invariant {invariant.label}: {reason}")
        self.invariant = invariant
        self.reason = reason


__all__ = ["Invariant", "SpecViolation", "Violation"]
