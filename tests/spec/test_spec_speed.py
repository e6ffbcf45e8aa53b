"""How fast the models step: the kit needs a few thousand steps per second.

Drives each model with a seeded random call mix (no Hypothesis) and reports
steps per second, with and without checking every invariant after each step.
The default run checks the invariants over that mix; the speed floor is a
``slow`` test, deselected by default (``pytest -m slow -s`` runs it and
prints the figures).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from kvoffload.spec.errors import OffloadingError
from kvoffload.spec.invariants import Step, check_step
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    TakeEvents,
    Touch,
)
from kvoffload.spec.reuse import ReuseFilterModel

STEPS = 4000


def random_calls(rng: random.Random, keys: list[OffloadKey]) -> Iterator[Operation]:
    while True:
        roll = rng.random()
        chosen = tuple(rng.choices(keys, k=rng.randint(0, 4)))
        if roll < 0.3:
            yield PrepareStore(chosen)
        elif roll < 0.5:
            yield CompleteStore(chosen, rng.random() < 0.8)
        elif roll < 0.6:
            yield PrepareLoad(chosen)
        elif roll < 0.7:
            yield CompleteLoad(chosen)
        elif roll < 0.85:
            yield Touch(chosen)
        elif roll < 0.97:
            yield LookupPrefix(chosen)
        elif roll < 0.995:
            yield TakeEvents()
        else:
            yield ResetCache()


def steps_per_second(
    state: ManagerModel | ReuseFilterModel, num_keys: int, check: bool
) -> float:
    rng = random.Random(1234)
    keys = [OffloadKey(i.to_bytes(8, "big")) for i in range(num_keys)]
    calls = random_calls(rng, keys)
    start = time.perf_counter()
    for _ in range(STEPS):
        op = next(calls)
        try:
            after, result = state.apply(op)
        except OffloadingError:
            continue
        if check:
            violations = check_step(Step(state, op, after, result))
            assert not violations, violations
        state = after
    return STEPS / (time.perf_counter() - start)


PARAMS = [
    pytest.param(policy, blocks, keys, id=f"{policy}-{blocks}-{keys}")
    for policy in ("lru", "arc", "any")
    for blocks, keys in ((4, 6), (16, 32))
]


@pytest.mark.parametrize("policy,num_blocks,num_keys", PARAMS)
def test_models_keep_every_invariant_over_a_random_mix(
    policy: str, num_blocks: int, num_keys: int
) -> None:
    manager = ManagerModel.create(num_blocks, policy, enable_events=True)
    steps_per_second(manager, num_keys, check=True)  # asserts no violation
    steps_per_second(ReuseFilterModel(manager), num_keys, check=True)


@pytest.mark.slow
@pytest.mark.parametrize("policy,num_blocks,num_keys", PARAMS)
def test_models_step_fast_enough(policy: str, num_blocks: int, num_keys: int) -> None:
    """Wall-clock sensitive: deselected by default (``pytest -m slow``)."""
    manager = ManagerModel.create(num_blocks, policy, enable_events=True)
    filtered = ReuseFilterModel(manager)
    bare = steps_per_second(manager, num_keys, check=False)
    checked = steps_per_second(manager, num_keys, check=True)
    reuse = steps_per_second(filtered, num_keys, check=True)
    print(
        f"\n{policy} {num_blocks} slots/{num_keys} keys: model {bare:,.0f} steps/s, "
        f"with invariants {checked:,.0f}, reuse filter with invariants {reuse:,.0f}"
    )
    assert checked > 1000
