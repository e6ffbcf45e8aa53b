"""The engine-protocol driver: calls made as an inference engine makes them.

The random drivers make every call of the contract in any order. An engine's
scheduler is narrower and more repetitive, and some defects show only in its
rhythm: a reuse filter that counts ``lookup`` calls behind a scheduler that
asks ``lookup_prefix`` (which stops at the first miss) offloads a repeated
prompt one block per two requests, and no single call looks wrong.

:func:`run_engine` plays requests. A request is a *prompt*: a chain of block
hashes, each with one key per KV group (block-major). For each request the
driver, like a scheduler:

1. ``on_new_request``; ``lookup_prefix`` of the prompt's keys (the hit
   prefix: up to the first miss); ``touch`` of the keys;
2. ``prepare_load`` of the hit prefix, ``prepare_store`` of the rest;
3. later (other requests interleave) ``complete_store`` of what was stored
   (now and then a failure) and ``complete_load`` of the prefix;
4. ``on_request_finished``; ``on_schedule_end`` after each scheduler step;
   ``take_events`` every few steps.

Prompts are drawn from a small set that share prefixes, so prompts repeat.
Every call goes through :meth:`Harness.step` (checked against the model).
On top, protocol properties stated without the model:

- **repeated prompt is offloaded**: with nothing in flight and at least as
  many free slots as the prompt has keys, a prompt requested ``R`` times in
  a row is then read back whole (``lookup_prefix`` = its length). ``R`` is
  1 without a reuse filter, ``store_threshold`` with one (a filter counting
  offers: ``store_threshold + 1``). A filter that counts lookups only to the
  first miss (``FilterCounts.LOOKUPS_TO_FIRST_MISS``, vLLM 0.20 - 0.28) fails
  it by construction, model included: the profile names what the filter
  does call by call, and this property reports what that costs the engine
  (a repeated prompt offloaded one block per two requests).
- **a stored prompt reads back**: the keys a request stored and completed
  are hits for the next request of the same prompt, while nothing evicted
  them (checked in the same quiet phase).

A property that fails raises :class:`Discrepancy` with an invariant named
``protocol: ...``; the report's script ends with the failed assertion.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import attrs

from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    FinishRequest,
    LookupPrefix,
    PrepareLoad,
    PrepareStore,
    ScheduleEnd,
    StartRequest,
    TakeEvents,
    Touch,
)
from kvoffload.spec.profile import FilterCounts
from kvoffload.stateful.harness import Discrepancy, Harness, _keys, core_of

REPEATED_PROMPT = Invariant.REPEATED_PROMPT


@attrs.define
class Request:
    """One request in flight: its number, keys, hit prefix, and what is
    pending."""

    number: int
    keys: tuple[OffloadKey, ...]
    loading: tuple[OffloadKey, ...] = ()
    storing: tuple[OffloadKey, ...] = ()
    stage: int = 0


def prompt_keys(
    universe: Sequence[OffloadKey], groups: int, blocks: Sequence[int]
) -> tuple[OffloadKey, ...]:
    """The keys of a prompt whose block hashes are ``blocks`` (indices),
    block-major, one key per KV group (the universe lists each hash's
    groups together)."""
    return tuple(universe[b * groups + g] for b in blocks for g in range(groups))


def _repeats_needed(harness: Harness) -> int:
    reuse = harness.config.reuse_filter
    if reuse is None:
        return 1
    if harness.config.profile.filter_counts is FilterCounts.OFFERS:
        return reuse.store_threshold + 1
    return reuse.store_threshold


class Engine:
    """A toy scheduler over one harness (see the module docstring)."""

    def __init__(
        self,
        harness: Harness,
        rng: random.Random,
        *,
        groups: int = 2,
        probe: Callable[[Harness], None] | None = None,
    ) -> None:
        self.harness = harness
        self.rng = rng
        self.groups = groups
        self.probe = probe
        hashes = len(harness.keys) // groups
        self.hashes = max(1, hashes)
        self.prompts = self._draw_prompts()
        self.active: list[Request] = []
        self.next_request = 0

    def _draw_prompts(self) -> list[tuple[int, ...]]:
        """A few prompts that share prefixes (a tree of block chains)."""
        rng, n = self.rng, self.hashes
        prompts: list[tuple[int, ...]] = []
        for _ in range(rng.randint(2, 5)):
            base = list(rng.choice(prompts)) if prompts and rng.random() < 0.6 else []
            cut = rng.randint(0, len(base)) if base else 0
            chain = base[:cut]
            for _ in range(rng.randint(1, 3)):
                chain.append(rng.randrange(n))
            chain = list(dict.fromkeys(chain))  # a chain never repeats a block
            prompts.append(tuple(chain))
        return prompts

    def keys_of(self, prompt: Sequence[int]) -> tuple[OffloadKey, ...]:
        return prompt_keys(self.harness.keys, self.groups, prompt)

    # --- one request's life ------------------------------------------------

    def start(self, keys: tuple[OffloadKey, ...]) -> Request:
        """Steps 1-2: look up, touch, load the hits, store the rest."""
        h = self.harness
        number = self.next_request
        self.next_request += 1
        h.step(StartRequest(number))
        h.step(LookupPrefix(keys, request=number))
        hits = _answer(h, LookupPrefix(keys))
        if hits is None:  # no answer ("retry"): the model's
            hits = core_of(h.model).lookup_prefix(keys)[1]
        h.step(Touch(keys, request=number))
        request = Request(number, keys)
        if hits:
            request.loading = keys[:hits]
            h.step(PrepareLoad(request.loading, request=number))
        rest = keys[hits:]
        if rest:
            new = core_of(h.model).new_keys(rest)
            h.step(PrepareStore(rest, request=number))
            core = core_of(h.model)
            request.storing = tuple(k for k in new if core.phase(k).kind is PhaseKind.PENDING)
        return request

    def advance(self, request: Request, *, fail_share: float = 0.1) -> bool:
        """Step 3-4, one stage at a time; True when the request finished."""
        h = self.harness
        if request.stage == 0 and request.storing:
            success = self.rng.random() >= fail_share
            h.step(CompleteStore(request.storing, success, request=request.number))
        elif request.stage == 1 and request.loading:
            h.step(CompleteLoad(request.loading, request=request.number))
        elif request.stage >= 2:
            h.step(FinishRequest(request.number))
            return True
        request.stage += 1
        return False

    def finish_all(self) -> None:
        while self.active:
            request = self.active[0]
            if self.advance(request, fail_share=0.0):
                self.active.pop(0)

    # --- the scheduler loop -----------------------------------------------

    def schedule_step(self) -> None:
        rng, h = self.rng, self.harness
        if len(self.active) < 3 and rng.random() < 0.6:
            self.active.append(self.start(self.keys_of(rng.choice(self.prompts))))
        for request in list(self.active):
            if rng.random() < 0.7 and self.advance(request):
                self.active.remove(request)
        h.step(ScheduleEnd())
        if rng.random() < 0.2:
            h.step(TakeEvents())

    def repeated_prompt(self) -> None:
        """The quiet-phase property (see the module docstring)."""
        h = self.harness
        repeats = _repeats_needed(h)
        self.finish_all()
        room = core_of(h.model).free_count()
        reuse = h.config.reuse_filter
        if reuse is not None:  # the count table must hold the whole prompt too
            room = min(room, reuse.max_tracker_size)
        fitting = [p for p in self.prompts if len(self.keys_of(p)) <= room]
        if not fitting:
            return
        keys = self.keys_of(self.rng.choice(fitting))
        for _ in range(repeats):
            self.active.append(self.start(keys))
            self.finish_all()
        check = self.start(keys)  # the next request of the prompt reads it back
        got = _answer(h, LookupPrefix(keys))
        if got is not None and got != len(keys):
            raise Discrepancy(
                REPEATED_PROMPT,
                f"a prompt of {len(keys)} keys ({_keys(keys)}) requested {repeats} "
                f"time(s) in a row with room for {room} is read back only {got} keys "
                "long (the last request's lookup_prefix)",
                check=f"expect(out in (None, {len(keys)}), True, 'lookup_prefix reads the "
                f"repeated prompt back whole ({len(keys)} keys, or None: ask again)')",
            )
        self.active.append(check)
        self.finish_all()

    def run(self, steps: int) -> int:
        """About ``steps`` scheduler steps; the number made."""
        made = 0
        while made < steps:
            self.schedule_step()
            made += 1
            if self.rng.random() < 0.08:
                self.repeated_prompt()
            if self.probe is not None and self.rng.random() < 0.05:
                self.probe(self.harness)
        self.repeated_prompt()
        if self.probe is not None:
            self.probe(self.harness)
        return made


def _answer(harness: Harness, op: LookupPrefix) -> int | None:
    """What the manager answered to the ``lookup_prefix`` just made (the
    harness compared it with the model already; ``None``: no answer)."""
    answer = harness.last_answer
    return answer if isinstance(answer, int) and not isinstance(answer, bool) else None


def run_engine(
    harness: Harness,
    rng: random.Random,
    steps: int,
    *,
    groups: int = 2,
    probe: Callable[[Harness], None] | None = None,
) -> int:
    """Play requests on ``harness`` for about ``steps`` scheduler steps."""
    return Engine(harness, rng, groups=groups, probe=probe).run(steps)


__all__ = ["REPEATED_PROMPT", "Engine", "Request", "prompt_keys", "run_engine"]
