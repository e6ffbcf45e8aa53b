"""What a replay script runs: a manager whose every call the kit checks.

A replay script (:func:`kvoffload.stateful.harness.render_script`) is the
shrunk call sequence of a failure, written as plain manager calls
(``m.prepare_store([K[3]], ctx(1))``). ``m`` is a :class:`CheckedManager`:
each call goes to a fresh manager built by the audited factory *and* to the
specification's model, through the same :class:`~kvoffload.stateful.harness.Harness`
the audit used, so the call is judged exactly as the audit judged it: the
model follows the manager's own legal choices (free slots, victims under
policy ``any``, ``RETRY``/``None`` lookups), an illegal call must raise and
change nothing, a crash on a legal call is a finding. The script therefore
stops at the call that breaks the specification, raising
:class:`~kvoffload.stateful.harness.Discrepancy` (an ``AssertionError``),
and runs to its end for a manager that keeps the specification, whatever
other legal choices it makes: a fixed manager passes its old replay.

>>> replay = Replay(factory, 3, policy="lru")        # doctest: +SKIP
>>> m, K, ctx = replay.manager, replay.keys, replay.ctx  # doctest: +SKIP
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    FinishRequest,
    KeyListOperation,
    Lookup,
    LookupPrefix,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    ScheduleEnd,
    StartRequest,
    TakeEvents,
    Touch,
)
from kvoffload.spec.profile import DEFAULT, Profile, profile_named
from kvoffload.stateful.harness import (
    ContextFactory,
    Discrepancy,
    Harness,
    KitConfig,
    ManagerFactory,
    ReuseFilterParams,
    default_context,
    scale_key,
)

REPLAY_END = "# --- end of the replay script ---"
"""The line every replay script ends with: copy up to it, and it runs."""


def profile_from(name: str = DEFAULT.name, **options: object) -> Profile:
    """The preset ``name`` with ``options`` (option name to value, an
    enum option given by its value, e.g. ``errors="any"``) applied."""
    profile = profile_named(name)
    fields = {field.name: field for field in attrs.fields(Profile)}
    changes: dict[str, Any] = {}
    for option, value in options.items():
        field = fields.get(option)
        if field is None or option == "name":
            raise ValueError(f"no profile option named {option!r}")
        kind = field.type if isinstance(field.type, type) else None
        current = getattr(profile, option)
        if isinstance(current, enum.Enum) and not isinstance(value, enum.Enum):
            value = type(current)(value)
        elif kind is bool or isinstance(current, bool):
            value = bool(value)
        changes[option] = value
    return attrs.evolve(profile, **changes) if changes else profile


def profile_arguments(profile: Profile) -> str:
    """``profile`` as keyword arguments of :class:`Replay`: its name, and
    every option where it differs from the preset of that name (or, when no
    preset has that name, from the default one)."""
    try:
        base = profile_named(profile.name)
        name = profile.name
    except KeyError:
        base, name = DEFAULT, DEFAULT.name
    parts = [f"profile={name!r}"] if name != DEFAULT.name else []
    for field in attrs.fields(Profile):
        if field.name == "name":
            continue
        value, known = getattr(profile, field.name), getattr(base, field.name)
        if value != known:
            shown = value.value if isinstance(value, enum.Enum) else value
            parts.append(f"{field.name}={shown!r}")
    return ", ".join(parts)


def config_arguments(config: KitConfig) -> str:
    """The keyword arguments of :class:`Replay` that rebuild ``config``'s
    judgement (everything but the factory and the context factory)."""
    parts = [f"policy={config.policy!r}"]
    profile = profile_arguments(config.profile)
    if profile:
        parts.append(profile)
    if config.reuse_filter is not None:
        parts.append(
            f"reuse_filter=({config.reuse_filter.store_threshold}, "
            f"{config.reuse_filter.max_tracker_size})"
        )
    parts.append(f"num_keys={config.num_keys}")
    if not config.events:
        parts.append("events=False")
    if not config.illegal_calls:
        parts.append("illegal_calls=False")
    return ", ".join(parts)


class Replay:
    """A fresh manager from ``factory(num_blocks)`` and the model, judged
    as an audit with these parameters judges them (see the module
    docstring). ``manager`` takes the calls, ``keys`` is the audit's key
    universe (``K``), ``ctx(i)`` request ``i``'s context (built once by
    ``make_context``)."""

    def __init__(
        self,
        factory: ManagerFactory,
        num_blocks: int,
        *,
        policy: str = "any",
        profile: str = DEFAULT.name,
        reuse_filter: tuple[int, int] | None = None,
        num_keys: int = 16,
        make_context: ContextFactory = default_context,
        events: bool = True,
        illegal_calls: bool = True,
        **options: object,
    ) -> None:
        config = KitConfig(
            factory,
            policy=policy,
            reuse_filter=None if reuse_filter is None else ReuseFilterParams(*reuse_filter),
            profile=profile_from(profile, **options),
            events=events,
            num_keys=num_keys,
            context_factory=make_context,
            illegal_calls=illegal_calls,
        )
        self.harness = Harness(config, num_blocks)
        self.keys: list[object] = list(config.keys())
        self.manager = CheckedManager(self.harness)

    def ctx(self, request: int) -> object:
        """Request ``request``'s context (the same object every time)."""
        return self.harness.context(request)

    def passed(self) -> None:
        """Say that every call kept the specification (the script's last
        statement)."""
        print(
            f"replay passed: the manager kept the specification on all "
            f"{len(self.harness.trace)} calls"
        )


def _request(harness: Harness, context: object) -> int:
    for request, known in harness.contexts.items():
        if known is context:
            return request
    raise ValueError(
        f"{context!r} is not a context of this replay: pass ctx(i) (replay.ctx)"
    )


def _key_list(
    kind: type[KeyListOperation],
) -> Callable[[Harness, Sequence[Any], dict[str, Any]], Operation]:
    def build(harness: Harness, args: Sequence[Any], kwargs: dict[str, Any]) -> Operation:
        keys, context, *rest = [*args, *kwargs.values()]
        request = _request(harness, context)
        if kind is CompleteStore:
            success = bool(rest[0]) if rest else True
            return CompleteStore(tuple(keys), success=success, request=request)
        return kind(tuple(keys), request=request)

    return build


_BUILDERS: dict[str, Callable[[Harness, Sequence[Any], dict[str, Any]], Operation]] = {
    "lookup": lambda h, a, k: Lookup(a[0], request=_request(h, [*a, *k.values()][1])),
    "lookup_prefix": _key_list(LookupPrefix),
    "prepare_store": _key_list(PrepareStore),
    "complete_store": _key_list(CompleteStore),
    "prepare_load": _key_list(PrepareLoad),
    "complete_load": _key_list(CompleteLoad),
    "touch": _key_list(Touch),
    "reset_cache": lambda h, a, k: ResetCache(),
    "take_events": lambda h, a, k: TakeEvents(),
    "on_new_request": lambda h, a, k: StartRequest(_request(h, [*a, *k.values()][0])),
    "on_request_finished": lambda h, a, k: FinishRequest(_request(h, [*a, *k.values()][0])),
    "on_schedule_end": lambda h, a, k: ScheduleEnd(),
}


def S(block: int, group: int) -> OffloadKey:  # noqa: N802 - a key's name in replays
    """Key ``S(block, group)`` of a run at scale (block hash ``big%04d``)."""
    return scale_key(block, group)


def expect(actual: object, expected: object, what: str) -> None:
    """Raise ``AssertionError`` unless ``actual == expected`` (the check a
    script runs on the last answer where the harness does not judge it)."""
    if actual != expected:
        raise AssertionError(
            f"{what}: the manager gives {actual!r}, the specification expects {expected!r}"
        )


class CheckedManager:
    """The manager under test, each contract call checked by the harness
    (the call is made on the real manager by the harness; its answer is
    returned). Other attributes are the real manager's."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def __getattr__(self, name: str) -> Any:
        build = _BUILDERS.get(name)
        if build is None:
            return getattr(self._harness.manager, name)
        harness = self._harness

        def checked(*args: Any, **kwargs: Any) -> object:
            try:
                harness.step(build(harness, args, kwargs))
            except Discrepancy as found:  # the finding, without the kit's inner frames
                raise found.with_traceback(None) from None
            return harness.answer

        checked.__name__ = name
        return checked


__all__ = [
    "REPLAY_END",
    "CheckedManager",
    "Replay",
    "S",
    "config_arguments",
    "expect",
    "profile_from",
]
